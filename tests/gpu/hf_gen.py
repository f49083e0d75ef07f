#!/usr/bin/env python3
"""hf_gen.py - the rows of bench/bench_gen.c with Hugging Face `generate`, on the model
directory bench_gen wrote (bench_gen --keep DIR: config.json, model.safetensors,
prompts.txt with one line of token ids per prompt, rows.txt with one line per row:
"mode batch prompts trajectories new_tokens max_batch").  Greedy rows: do_sample off;
sampled rows: temperature 0.8, top-p 0.9, top-k off, exactly new_tokens tokens (no early
stop), prompts in calls of max_batch / trajectories prompts with num_return_sequences =
trajectories.  Then "single": the reference tool's way, one prompt and one trajectory
per call (2 prompts x 4 trajectories x 128 tokens, sampled).  bf16, sdpa.  One line per
row: "hf_gen: mode=M batch=B tokens_per_s=X ...".  Not a correctness check.
usage: hf_gen.py --model DIR [--prompts FILE] [--device cuda|cpu] [--single N]"""
import argparse
import time

import torch
from transformers import AutoModelForCausalLM


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--prompts")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--single", type=int, default=2)
    a = ap.parse_args()
    prompts = [[int(t) for t in line.split()]
               for line in open(a.prompts or f"{a.model}/prompts.txt") if line.strip()]
    rows = [line.split() for line in open(f"{a.model}/rows.txt") if line.strip()]
    dtype = torch.bfloat16 if a.device == "cuda" else torch.float32
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=dtype,
                                                 attn_implementation="sdpa").to(a.device)
    model.eval()
    sync = torch.cuda.synchronize if a.device == "cuda" else (lambda: None)

    def gen(chunk, ntraj, new, sample):
        ids = torch.tensor(chunk, device=a.device)  # equal lengths: no padding
        kw = dict(max_new_tokens=new, min_new_tokens=new, pad_token_id=0, eos_token_id=None,
                  attention_mask=torch.ones_like(ids))
        if sample:
            kw.update(do_sample=True, temperature=0.8, top_p=0.9, top_k=0,
                      num_return_sequences=ntraj)
        else:
            kw.update(do_sample=False)
        out = model.generate(ids, **kw)
        return (out.shape[1] - ids.shape[1]) * out.shape[0]

    with torch.no_grad():
        gen(prompts[:2], 1, 4, False)  # warm-up
        sync()
        for mode, batch, n, ntraj, new, mb in rows:
            batch, n, ntraj, new, mb = map(int, (batch, n, ntraj, new, mb))
            if a.device == "cuda":
                torch.cuda.reset_peak_memory_stats()
            per_call = max(1, mb // ntraj)
            sync()
            t0, tokens = time.perf_counter(), 0
            for i in range(0, n, per_call):
                tokens += gen(prompts[i:min(n, i + per_call)], ntraj, new, mode == "sampled")
            sync()
            dt = time.perf_counter() - t0
            peak = torch.cuda.max_memory_allocated() / 2**30 if a.device == "cuda" else 0
            print(f"hf_gen: mode={mode} batch={batch} tokens_per_s={tokens / dt:.1f} "
                  f"new_tokens={tokens} wall_s={dt:.2f} peak_gib={peak:.2f} "
                  f"({n} prompts x {ntraj} x {new}, {per_call} prompts per call)", flush=True)
        # one prompt, one trajectory per call, as the reference tool generates
        new = int(rows[-1][4])
        ntraj = int(rows[-1][3])
        sync()
        t0, tokens = time.perf_counter(), 0
        for p in prompts[: a.single]:
            for _ in range(ntraj):
                tokens += gen([p], 1, new, True)
        sync()
        dt = time.perf_counter() - t0
        print(f"hf_gen: mode=single batch=1 tokens_per_s={tokens / dt:.1f} new_tokens={tokens} "
              f"wall_s={dt:.2f} ({a.single} prompts x {ntraj} x {new}, one sample per call)",
              flush=True)
    print(f"hf_gen: done, torch {torch.__version__}", flush=True)


if __name__ == "__main__":
    main()

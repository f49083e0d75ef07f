#!/usr/bin/env python3
"""hf_step.py - the training step of bench/bench_step.c written with HF transformers +
PEFT, for the side-by-side rows of tests/gpu/run.sh: a random Llama of the same shape and
the same weight scales (linears uniform +-1/sqrt(in), LM head +-4/sqrt(H)); LoRA r on all
seven projections with B non-zero (uniform +-0.25/sqrt(r)); teacher (adapter off, no
grad) and student see different prompt tokens and the same response tokens (the second
half of each sequence); full-logits KL(teacher || student) over the response rows in
fp32; clip to norm 1 and torch AdamW.  Base weights bf16, LoRA weights fp32 under bf16
autocast, attention sdpa.  The first step is a warm-up; step_s is the best of the rest.
Prints one line: "hf_step: tokens_per_s=X step_s=Y peak_bytes=Z peak_gib=G loss=L ...".
usage: hf_step.py [--device cuda|cpu] [--grad-checkpoint] H L NH NKV I V R SEQS LEN [STEPS]
(--device cpu: fp32 on the CPU, for a tiny shape; not a benchmark)"""
import os
import sys
import time

import torch
from peft import LoraConfig, get_peft_model
from transformers import LlamaConfig, LlamaForCausalLM


def main():
    args = sys.argv[1:]
    device, ckpt = "cuda", False
    while args and args[0].startswith("--"):
        if args[0] == "--device":
            device, args = args[1], args[2:]
        elif args[0] == "--grad-checkpoint":
            ckpt, args = True, args[1:]
        else:
            sys.exit(f"hf_step.py: unknown option {args[0]}")
    if len(args) < 9:
        sys.exit(__doc__.strip().splitlines()[-2])
    H, L, NH, NKV, I, V, R, S, LEN = map(int, args[:9])
    steps = int(args[9]) if len(args) > 9 else 3
    torch.manual_seed(0)
    if device == "cpu":
        torch.set_num_threads(int(os.environ.get("BENCH_THREADS", "2")))
    cfg = LlamaConfig(hidden_size=H, num_hidden_layers=L, num_attention_heads=NH,
                      num_key_value_heads=NKV, intermediate_size=I, vocab_size=V,
                      max_position_embeddings=max(LEN, 128), tie_word_embeddings=False,
                      attn_implementation="sdpa")
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    with torch.device(device):
        base = LlamaForCausalLM(cfg).to(dtype)
    with torch.no_grad():
        for name, p in base.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1)
            elif "lm_head" in name:
                p.uniform_(-4 / H ** 0.5, 4 / H ** 0.5)
            elif "embed" in name:
                p.uniform_(-1, 1)
            else:
                p.uniform_(-1 / p.shape[1] ** 0.5, 1 / p.shape[1] ** 0.5)
    model = get_peft_model(base, LoraConfig(
        r=R, lora_alpha=2 * R, lora_dropout=0.0, target_modules=[
            "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]))
    for name, p in model.named_parameters():
        if p.requires_grad:
            p.data = p.data.float()
            if "lora_B" in name:
                with torch.no_grad():
                    p.uniform_(-0.25 / R ** 0.5, 0.25 / R ** 0.5)
    if ckpt:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.enable_input_require_grads()
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-4)
    resp = LEN // 2
    sids = torch.randint(0, V, (S, LEN), device=device)
    tids = sids.clone()
    tids[:, : LEN - resp] = torch.randint(0, V, (S, LEN - resp), device=device)
    amp = (torch.autocast("cuda", dtype=torch.bfloat16) if device == "cuda"
           else torch.autocast("cpu", enabled=False))
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    best, loss0, kl = 1e30, None, None
    for it in range(steps):
        sync()
        t0 = time.perf_counter()
        with amp:
            with torch.no_grad(), model.disable_adapter():
                t = model(input_ids=tids).logits[:, LEN - resp - 1:LEN - 1].float()
            s = model(input_ids=sids).logits[:, LEN - resp - 1:LEN - 1].float()
        lt = torch.log_softmax(t, -1)
        kl = (lt.exp() * (lt - torch.log_softmax(s, -1))).sum(-1).mean()
        opt.zero_grad(set_to_none=True)
        kl.backward()
        gn = torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sync()
        dt = time.perf_counter() - t0
        if it == 0:
            loss0 = kl.item()
        else:
            best = min(best, dt)
    peak = torch.cuda.max_memory_allocated() if device == "cuda" else 0
    print(f"hf_step: device={device} ckpt={int(ckpt)} tokens={S * LEN} tokens_per_s={S * LEN / best:.0f} "
          f"step_s={best:.4f} peak_bytes={peak} peak_gib={peak / 2**30:.2f} loss0={loss0:.6f} "
          f"loss={kl.item():.6f} grad_norm={float(gn):.4g} torch={torch.__version__}", flush=True)
    if not (loss0 > 0 and float(gn) > 0):
        sys.exit("hf_step.py: zero KL or gradient: not a real step")


if __name__ == "__main__":
    main()

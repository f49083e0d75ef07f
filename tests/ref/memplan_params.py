#!/usr/bin/env python3
# memplan_params.py - the base-weight figures tests/t0736-memplan-shapes.sh expects in
# bk-bake's memory plan, from transformers' own models: for each model directory (a
# config.json, e.g. tests/golden/memplan/*), AutoModelForCausalLM.from_config on the meta
# device, its parameters counted once (tied embeddings once; a VLM's vision tower left
# out), then in MiB:
#   bf16     every parameter x 2 bytes (the CUDA stages hold the weights in bf16)
#   4-bit    the decoder layers' linears as bitsandbytes' quantize_4bit stores them (packed
#            codes n/2 bytes; an fp32 absmax per 64 values, or with double quant a uint8
#            per block, an fp32 absmax per 256 blocks and the fp32 offset), everything
#            else (embeddings, LM head, norms, biases) kept in bf16, as transformers' bnb
#            integration leaves it
# Reference script, never run by make test: python3 from a venv with torch and
# transformers (5.3 here).  Run: python3 tests/ref/memplan_params.py DIR...
import math
import sys

import torch
from transformers import AutoConfig, AutoModelForCausalLM


def q4_bytes(n, double_quant=True):
    nb = math.ceil(n / 64)
    stats = nb + 4 * math.ceil(nb / 256) + 4 if double_quant else 4 * nb
    return (n + 1) // 2 + stats


def main():
    M = 1 << 20
    for d in sys.argv[1:]:
        cfg = AutoConfig.from_pretrained(d)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(cfg)
        total = lin = q4 = 0
        for name, p in model.named_parameters():  # a tied tensor once
            if "vision" in name or "multi_modal" in name:
                continue
            total += p.numel()
            if "layers." in name and p.dim() == 2:
                lin += p.numel()
                q4 += q4_bytes(p.numel())
        print(f"{d.rstrip('/').split('/')[-1]}: parameters {total}, bf16 {total * 2 / M:.1f} "
              f"MiB; 4-bit: bf16 rest {(total - lin) * 2 / M:.1f} MiB, linears {q4 / M:.1f} MiB")


if __name__ == "__main__":
    main()

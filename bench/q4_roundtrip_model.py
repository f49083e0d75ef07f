#!/usr/bin/env python3
"""q4_roundtrip_model.py - a copy of a model whose 4-bit-targeted linears hold their
bitsandbytes 4-bit round trip: W' = dequantize_4bit(quantize_4bit(W)).

    q4_roundtrip_model.py SRC DST [--quant-type nf4|fp4] [--no-double-quant]

SRC is a model directory with one model.safetensors (fp32 or bf16); DST gets the same
files, with every decoder linear weight (q/k/v/o/gate/up/down_proj of each layer: what
transformers' bitsandbytes integration converts; embeddings, norms and the LM head stay)
replaced by its round trip in blocks of 64, in the weight's own dtype.

Why: a bake with 4-bit base weights and fp32 compute (bitsandbytes: dequantize, then an
fp32 matmul) computes the same function as a bake without 4-bit on this model.  The
Python tool's own 4-bit bake is too slow on a CPU (bitsandbytes' CPU path), so
bench/results uses this copy to measure what 4-bit costs the tool (issue 23 item 5);
bk-bake's `load_in_4bit` bake is checked against a bk-bake bake on this copy.

Needs torch, safetensors and bitsandbytes (the venv of bench/README.md).
"""
import argparse
import os
import re
import shutil

import torch
import bitsandbytes.functional as F
from safetensors.torch import load_file, save_file

LINEAR = re.compile(r"^model\.layers\.\d+\.(self_attn\.[qkvo]_proj|mlp\.(gate|up|down)_proj)\.weight$")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("src")
    ap.add_argument("dst")
    ap.add_argument("--quant-type", default="nf4", choices=["nf4", "fp4"])
    ap.add_argument("--no-double-quant", action="store_true")
    a = ap.parse_args()
    st = os.path.join(a.src, "model.safetensors")
    if not os.path.isfile(st):
        raise SystemExit(f"q4_roundtrip_model: {st}: no such file (one model.safetensors expected)")
    os.makedirs(a.dst, exist_ok=True)
    for f in os.listdir(a.src):
        if f != "model.safetensors" and os.path.isfile(os.path.join(a.src, f)):
            shutil.copy2(os.path.join(a.src, f), os.path.join(a.dst, f))
    tensors = load_file(st)
    n = 0
    for name, w in tensors.items():
        if not LINEAR.match(name):
            continue
        packed, state = F.quantize_4bit(w.contiguous(), blocksize=64, quant_type=a.quant_type,
                                        compress_statistics=not a.no_double_quant)
        state.dtype = w.dtype
        tensors[name] = F.dequantize_4bit(packed, state).reshape(w.shape).contiguous()
        n += 1
    if n == 0:
        raise SystemExit(f"q4_roundtrip_model: {st}: no decoder linear weights found")
    tmp = os.path.join(a.dst, "model.safetensors.tmp")
    save_file(tensors, tmp, metadata={"format": "pt"})
    os.replace(tmp, os.path.join(a.dst, "model.safetensors"))
    print(f"q4_roundtrip_model: {n} linears ({a.quant_type}, double quant "
          f"{'off' if a.no_double_quant else 'on'}) -> {a.dst}")


if __name__ == "__main__":
    main()

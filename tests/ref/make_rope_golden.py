#!/usr/bin/env python3
"""make_rope_golden.py - RoPE inverse frequencies computed by transformers, for
tests/unit/test_hfconfig.c (bk_rope_inv_freq). Run by hand from the repository root:

    python3 tests/ref/make_rope_golden.py   # writes tests/golden/rope/inv_freq.json

Each case names a config.json; transformers loads it and its own rope init function
(default, or the rope type's: linear, dynamic, llama3, yarn) gives the fp32 values,
written as Python floats (exact for fp32), and the attention factor HF multiplies cos
and sin by (yarn's; 1.0 for the others). Not run by `make test`.
"""
import json
import os
import sys

import torch
from transformers import AutoConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

CASES = [
    "tests/data/ckpt/llama3.2-1b-rope/config.json",
    "tests/data/ckpt/llama3.1-8b-rope-tf5/config.json",
    "tests/data/hf-configs/TinyLlama-1.1B-Chat-v1.0/config.json",
    "tests/data/hf-configs/Mistral-7B-Instruct-v0.2/config.json",
    "tests/data/hf-configs/SmolLM2-135M-Instruct/config.json",
    "models/stories260K/config.json",
    "tests/data/ckpt/qwen2.5-yarn-card/config.json",
    "tests/data/ckpt/qwen3-yarn-tf5/config.json",
    "tests/data/ckpt/llama-yarn-mscale/config.json",
    "tests/data/ckpt/mistral-yarn-attnfactor/config.json",
    "tests/data/ckpt/llama-linear/config.json",
    "tests/data/ckpt/smollm2-dynamic/config.json",
]
OUT = "tests/golden/rope/inv_freq.json"


def inv_freq(path):
    cfg = AutoConfig.from_pretrained(os.path.dirname(path))
    rope_type = cfg.rope_parameters["rope_type"]
    if rope_type == "default":
        fn = LlamaRotaryEmbedding.compute_default_rope_parameters
    else:
        fn = ROPE_INIT_FUNCTIONS[rope_type]
    inv, attention_factor = fn(cfg)
    assert inv.dtype == torch.float32
    return rope_type, [float(x) for x in inv.tolist()], float(attention_factor)


def main():
    if not os.path.isdir("tests/golden"):
        sys.exit("run from the repository root")
    cases = []
    for path in CASES:
        rope_type, vals, af = inv_freq(path)
        cases.append({"config": path, "rope_type": rope_type, "attention_factor": af,
                      "inv_freq": vals})
        print(f"{path}: {rope_type}, {len(vals)} values")
    doc = {
        "format": "bakery-rope-golden",
        "version": 1,
        "generator": "tests/ref/make_rope_golden.py",
        "torch": torch.__version__,
        "transformers": __import__("transformers").__version__,
        "cases": cases,
    }
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    print("wrote", OUT)


if __name__ == "__main__":
    main()

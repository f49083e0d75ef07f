#!/usr/bin/env python3
"""make_qlora_parity.py - QLoRA parity fixtures: transformers + bitsandbytes (CPU) + PEFT
load models/stories260K with load_in_4bit, and tests/unit/test_qlora_parity.c checks
bakery's 4-bit model against them.

For each quantisation config (nf4 + double quant, fp4 without; compute dtype float32, so
both sides compute in fp32 and differ only in summation order):
  - the quantised weights of every decoder linear as bitsandbytes holds them
    (Params4bit: packed bytes; absmax, or the nested codes, absmax2 and offset);
  - the teacher: log_softmax of the quantised base's logits (adapter off) for two token
    sequences, every position;
  - a PEFT LoRA (r 4, alpha 8, dropout 0, the seven projections) with A and B set from
    torch's generator (saved as adapter-NAME/, a normal PEFT adapter directory), and the
    gradient of L = sum(last_hidden_state * G) for a fixed G [T,H] with respect to every
    A and B, in bakery's flat order (layer-major, modules q,k,v,o,gate,up,down, A then B).
Writes tests/golden/qlora/case.json (shapes, sequences, offsets, versions) and
NAME.bin (little-endian fp32 / uint8 sections at the offsets case.json lists).
Run by hand from the repository root:
    /work/venv/bin/python tests/ref/make_qlora_parity.py
"""
import json
import os
import shutil
import sys

import torch
import transformers
import bitsandbytes
import peft
from transformers import AutoModelForCausalLM, BitsAndBytesConfig
from peft import LoraConfig, get_peft_model

MODEL = "models/stories260K"
OUT = "tests/golden/qlora"
MODS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
SEQS = [[1, 403, 407, 261, 378, 432, 383, 286, 261, 376, 298, 315],
        [1, 76, 220, 301, 54, 499, 12, 7, 310]]
CONFIGS = [("nf4_dq", "nf4", True), ("fp4", "fp4", False)]
R, ALPHA = 4, 8.0


def linears(model):
    for l, layer in enumerate(model.model.layers):
        for name in MODS:
            parent = layer.self_attn if name.endswith(("q_proj", "k_proj", "v_proj", "o_proj")) \
                else layer.mlp
            yield l, name, getattr(parent, name)


def main():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    os.chdir(root)
    os.makedirs(OUT, exist_ok=True)
    torch.manual_seed(0)
    case = {"format": "bakery-qlora-parity", "version": 1, "model": MODEL, "seqs": SEQS,
            "r": R, "alpha": ALPHA,
            "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                         "bitsandbytes": bitsandbytes.__version__, "peft": peft.__version__},
            "configs": []}
    for name, qt, dq in CONFIGS:
        bnb = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=qt,
                                 bnb_4bit_use_double_quant=dq,
                                 bnb_4bit_compute_dtype=torch.float32)
        model = AutoModelForCausalLM.from_pretrained(MODEL, quantization_config=bnb,
                                                     dtype=torch.float32, device_map="cpu")
        model.eval()
        # bitsandbytes' CPU inference path on an AVX512-BF16 CPU repacks the weight and
        # computes in bf16: off, so that its forward is dequantize + an fp32 linear
        for mod in model.modules():
            if isinstance(mod, bitsandbytes.nn.Linear4bit):
                mod.support_avx512bf16_for_cpu = False
        blob = bytearray()
        sec = {}

        def put(key, t):
            b = t.detach().contiguous().cpu().numpy().tobytes()
            sec[key] = [len(blob), len(b)]
            blob.extend(b)

        # the quantised weights as bitsandbytes holds them
        for l, mod, lin in linears(model):
            w = lin.weight
            qs = w.quant_state
            assert qs.blocksize == 64 and qs.quant_type == qt and bool(qs.nested) == dq
            put(f"w.{l}.{mod}.packed", w.data.view(torch.uint8).reshape(-1))
            if dq:
                put(f"w.{l}.{mod}.qabsmax", qs.absmax.reshape(-1))
                put(f"w.{l}.{mod}.absmax2", qs.state2.absmax.float().reshape(-1))
                put(f"w.{l}.{mod}.offset", qs.offset.float().reshape(-1))
            else:
                put(f"w.{l}.{mod}.absmax", qs.absmax.float().reshape(-1))
        # the teacher (adapter off)
        with torch.no_grad():
            for s, ids in enumerate(SEQS):
                logits = model(torch.tensor([ids])).logits[0].float()
                put(f"logp.{s}", torch.log_softmax(logits, dim=-1))
        # a LoRA gradient
        lcfg = LoraConfig(r=R, lora_alpha=ALPHA, lora_dropout=0.0, target_modules=MODS,
                          task_type="CAUSAL_LM")
        pm = get_peft_model(model, lcfg)
        g = torch.Generator().manual_seed(1234)
        params = []
        for l, mod, lin in linears(pm.base_model.model):
            a, b = lin.lora_A["default"].weight, lin.lora_B["default"].weight
            with torch.no_grad():
                a.copy_(torch.randn(a.shape, generator=g) * 0.2)
                b.copy_(torch.randn(b.shape, generator=g) * 0.2)
            params += [a, b]
        adir = os.path.join(OUT, f"adapter-{name}")
        shutil.rmtree(adir, ignore_errors=True)
        pm.save_pretrained(adir)
        os.remove(os.path.join(adir, "README.md"))  # PEFT's model-card boilerplate
        for s, ids in enumerate(SEQS):
            pm.zero_grad()
            hid = pm.base_model.model.model(torch.tensor([ids])).last_hidden_state[0]
            G = torch.randn(hid.shape, generator=g)
            (hid * G).sum().backward()
            put(f"G.{s}", G)
            put(f"hidden.{s}", hid.detach())
            put(f"grad.{s}", torch.cat([p.grad.reshape(-1) for p in params]))
        with open(os.path.join(OUT, f"{name}.bin"), "wb") as f:
            f.write(blob)
        case["configs"].append({"name": name, "quant_type": qt, "double_quant": int(dq),
                                "compute_dtype": "float32", "sections": sec})
        print(f"{name}: {len(blob)} bytes", file=sys.stderr)
    with open(os.path.join(OUT, "case.json"), "w") as f:
        json.dump(case, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""make_peft_fixture.py - PEFT reference files for tests/unit/test_peft.c, and a check
that PEFT loads adapters written by bakery. Run by hand from the repository root
(needs torch, transformers, peft, safetensors; `make test` never runs it):

    python3 tests/ref/make_peft_fixture.py
        writes tests/golden/peft/tiny-model/      tiny random LlamaForCausalLM
               tests/golden/peft/adapter-peft/    PEFT LoRA (r 4, alpha 8, 7 targets,
                                                  random non-zero A and B)
               tests/golden/peft/lora-values.json the adapter's A/B values from the
                                                  in-memory PEFT model

    BK_PEFT_KEEP=/tmp/bk-peft-c build/<b>/tests/test_peft
    python3 tests/ref/make_peft_fixture.py --check /tmp/bk-peft-c
        loads the adapter test_peft wrote with PeftModel.from_pretrained onto
        tiny-model and checks weights, scaling and logits against a hand-merged model.
"""
import argparse
import json
import os
import shutil
import sys

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from safetensors.torch import load_file
from transformers import LlamaConfig, LlamaForCausalLM

GOLD = "tests/golden/peft"
MODEL = f"{GOLD}/tiny-model"
ADAPTER = f"{GOLD}/adapter-peft"
VALUES = f"{GOLD}/lora-values.json"
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def make():
    torch.manual_seed(1234)
    cfg = LlamaConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, vocab_size=64,
                      max_position_embeddings=128, rms_norm_eps=1e-5,
                      tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)
    shutil.rmtree(MODEL, ignore_errors=True)
    LlamaForCausalLM(cfg).save_pretrained(MODEL)
    for extra in ("generation_config.json",):
        if os.path.exists(f"{MODEL}/{extra}"):
            os.remove(f"{MODEL}/{extra}")
    # reload by relative path: PEFT records it as base_model_name_or_path
    base = LlamaForCausalLM.from_pretrained(MODEL)
    lcfg = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.05, target_modules=TARGETS,
                      task_type="CAUSAL_LM")
    pm = get_peft_model(base, lcfg)
    values = {}
    with torch.no_grad():
        for name, p in pm.named_parameters():
            if "lora_" not in name:
                continue
            if "lora_B" in name:  # PEFT starts B at zero; make the test see real values
                p.copy_(torch.randn_like(p) * 0.1)
            key = name.replace(".default.weight", ".weight")
            values[key] = {"shape": list(p.shape),
                           "values": [float(x) for x in p.detach().flatten().tolist()]}
    shutil.rmtree(ADAPTER, ignore_errors=True)
    pm.save_pretrained(ADAPTER)
    if os.path.exists(f"{ADAPTER}/README.md"):
        os.remove(f"{ADAPTER}/README.md")
    doc = {"format": "bakery-peft-values", "version": 1,
           "generator": "tests/ref/make_peft_fixture.py",
           "peft": __import__("peft").__version__, "r": 4, "lora_alpha": 8,
           "tensors": dict(sorted(values.items()))}
    with open(VALUES, "w") as f:
        json.dump(doc, f)
        f.write("\n")
    print(f"wrote {MODEL}, {ADAPTER} ({len(values)} tensors), {VALUES}")


def check(adir):
    """PEFT loads a bakery-written adapter and computes base + (alpha/r) B A."""
    cfg = json.load(open(f"{adir}/adapter_config.json"))
    scale = cfg["lora_alpha"] / cfg["r"]
    sd = load_file(f"{adir}/adapter_model.safetensors")
    base = LlamaForCausalLM.from_pretrained(MODEL).eval()
    ref = LlamaForCausalLM.from_pretrained(MODEL).eval()
    pm = PeftModel.from_pretrained(base, adir).eval()
    n = 0
    for name, p in pm.named_parameters():
        if "lora_" not in name:
            continue
        key = name.replace(".default.weight", ".weight")
        assert key in sd, f"PEFT parameter {key} not in the file"
        assert torch.equal(p.detach(), sd[key]), f"{key}: values differ after loading"
        n += 1
    assert n == len(sd), f"PEFT loaded {n} LoRA tensors, the file has {len(sd)}"
    for mod in pm.modules():
        if hasattr(mod, "scaling") and isinstance(mod.scaling, dict) and mod.scaling:
            assert abs(mod.scaling["default"] - scale) < 1e-12, mod.scaling
    # hand-merge W += scale * B @ A into the reference model
    with torch.no_grad():
        for key, a in sd.items():
            if not key.endswith("lora_A.weight"):
                continue
            b = sd[key.replace("lora_A", "lora_B")]
            wname = key.replace("base_model.model.", "", 1).replace(".lora_A.weight", ".weight")
            ref.get_parameter(wname).add_(scale * (b @ a))
    ids = torch.tensor([[1, 5, 9, 33, 17, 60, 2, 44]])
    with torch.no_grad():
        got = pm(input_ids=ids).logits
        want = ref(input_ids=ids).logits
        plain = LlamaForCausalLM.from_pretrained(MODEL).eval()(input_ids=ids).logits
    err = (got - want).abs().max().item()
    moved = (got - plain).abs().max().item()
    print(f"{adir}: {n} LoRA tensors loaded by PeftModel.from_pretrained, r {cfg['r']}, "
          f"alpha {cfg['lora_alpha']}, base_model_name_or_path "
          f"{cfg['base_model_name_or_path']!r}")
    print(f"  max |peft - hand-merged| logits = {err:.3g}; adapter moves logits by {moved:.3g}")
    assert err < 1e-4, "PEFT output does not match base + scale * B A"
    assert moved > 1e-3, "adapter has no effect"
    print("  OK")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--check", metavar="DIR", help="check an adapter written by bakery")
    args = ap.parse_args()
    if not os.path.isdir("tests/golden"):
        sys.exit("run from the repository root")
    if args.check:
        check(args.check)
    else:
        make()


if __name__ == "__main__":
    main()

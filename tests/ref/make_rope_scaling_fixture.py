#!/usr/bin/env python3
"""make_rope_scaling_fixture.py - tiny random models with scaled RoPE and HF's log-probs
of one sequence, for tests/unit/test_rope_scaling.c. Run by hand from the repository
root (needs torch and transformers; `make test` never runs it):

    python3 tests/ref/make_rope_scaling_fixture.py   # writes tests/golden/rope/scaling/

Each case is a model directory (config.json, model.safetensors in fp32) and case.json:
the ids of one 48-token sequence (positions 0..47) and HF's fp32 log_softmax of its
logits, as transformers 5 computes them (eager attention, on the CPU):

    qwen2-yarn     Qwen2 (q/k/v biases), yarn factor 4 over original_max_position_embeddings
                   16 (given as transformers 4's rope_scaling with 'type'; saved in 5's
                   form): the attention factor 1.1386 multiplies cos and sin, the
                   sequence runs past the original length, the ramp band is non-trivial
                   (head_dim 16: 8 frequencies)
    llama-yarn-af  Llama, yarn with an explicit attention_factor and betas (transformers
                   5's rope_parameters)
    llama-linear   Llama, linear factor 2
    llama-dynamic  Llama, dynamic NTK factor 2: the default frequencies below
                   max_position_embeddings (64 here)
"""
import json
import os
import shutil
import sys

import torch

OUT = "tests/golden/rope/scaling"
T = 48


def lin_init(model, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=g) * 0.15)
            elif "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.05 * torch.randn(p.shape, generator=g))


def write(name, cfg, cls, seed):
    d = os.path.join(OUT, name)
    md = os.path.join(d, "model")
    shutil.rmtree(d, ignore_errors=True)
    torch.manual_seed(seed)
    model = cls(cfg).eval()
    lin_init(model, seed)
    model.save_pretrained(md)
    for f in os.listdir(md):
        if f not in ("config.json", "model.safetensors"):
            os.remove(os.path.join(md, f))
    # the saved config as a user would have it, reloaded: HF's own round trip
    hf = cls.from_pretrained(md, attn_implementation="eager", dtype=torch.float32).eval()
    g = torch.Generator().manual_seed(seed + 1)
    ids = [1] + torch.randint(3, cfg.vocab_size, (T - 1,), generator=g).tolist()
    with torch.no_grad():
        logits = hf(torch.tensor([ids])).logits[0].float()
    logp = torch.log_softmax(logits, dim=-1)
    rope = hf.model.rotary_emb
    import transformers
    doc = {"format": "bakery-rope-scaling", "version": 1,
           "generated_by": "tests/ref/make_rope_scaling_fixture.py",
           "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
           "rope_type": rope.rope_type, "attention_scaling": float(rope.attention_scaling),
           "ids": ids, "vocab_size": cfg.vocab_size,
           "logp": [[float("%.9g" % x) for x in row] for row in logp.tolist()]}
    with open(os.path.join(d, "case.json"), "w") as f:
        json.dump(doc, f, separators=(",", ":"))
        f.write("\n")
    print(f"{name}: {rope.rope_type}, attention scaling {rope.attention_scaling}")


def main():
    if not os.path.isdir("tests/golden"):
        sys.exit("run from the repository root")
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM
    small = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                 num_attention_heads=2, num_key_value_heads=1, rms_norm_eps=1e-6,
                 bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)
    write("qwen2-yarn", Qwen2Config(**small, max_position_embeddings=64, rope_theta=10000.0,
                                    rope_scaling={"type": "yarn", "factor": 4.0,
                                                  "original_max_position_embeddings": 16}),
          Qwen2ForCausalLM, 51)
    write("llama-yarn-af", LlamaConfig(**small, max_position_embeddings=128,
                                       rope_parameters={"rope_type": "yarn", "rope_theta": 500.0,
                                                        "factor": 8.0, "attention_factor": 1.3,
                                                        "beta_fast": 8.0, "beta_slow": 0.5,
                                                        "original_max_position_embeddings": 16}),
          LlamaForCausalLM, 52)
    write("llama-linear", LlamaConfig(**small, max_position_embeddings=64,
                                      rope_parameters={"rope_type": "linear", "rope_theta": 10000.0,
                                                       "factor": 2.0}),
          LlamaForCausalLM, 53)
    write("llama-dynamic", LlamaConfig(**small, max_position_embeddings=64,
                                       rope_parameters={"rope_type": "dynamic", "rope_theta": 10000.0,
                                                        "factor": 2.0}),
          LlamaForCausalLM, 54)


if __name__ == "__main__":
    main()

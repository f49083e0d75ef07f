#!/usr/bin/env python3
"""make_tiny.py OUTDIR gemma3|qwen2 [SEED] - a tiny random HF model directory (config.json,
model.safetensors in bf16, stories260K's tokenizer.model) with head dimension 64, for the
emulated-GPU tests (tests/t0950-emu.sh): the tensor-core attention and bf16 activations need
D = 64.  gemma3: q/k norms, GeGLU, sandwich norms, attention and final softcaps, a sliding
window of 6 on layer 0, two RoPE bases, tied embeddings; qwen2: q/k/v biases, SwiGLU,
an untied head.  H 128, 2 heads of 64 (1 KV head), 2 layers, I 256, V 512.
Python standard library only (make test needs no pip packages)."""
import json, os, random, shutil, struct, sys

out, kind = sys.argv[1], sys.argv[2]
seed = int(sys.argv[3]) if len(sys.argv) > 3 else 1
rng = random.Random(seed)
H, NH, NKV, D, I, L, V = 128, 2, 1, 64, 256, 2, 512
here = os.path.dirname(os.path.abspath(__file__))
tok = os.path.join(here, "..", "..", "models", "stories260K", "tokenizer.model")

def bf16(x):  # round to nearest even
    u = struct.unpack("<I", struct.pack("<f", x))[0]
    return (u + 0x7FFF + ((u >> 16) & 1)) >> 16

tensors = {}
def t(name, shape, scale, base=0.0):
    n = 1
    for s in shape:
        n *= s
    tensors[name] = (shape, [bf16(base + scale * (2 * rng.random() - 1)) for _ in range(n)])

gemma = kind == "gemma3"
if kind not in ("gemma3", "qwen2"):
    sys.exit("make_tiny.py: kind is gemma3 or qwen2")
a = 0.3
t("model.embed_tokens.weight", [V, H], 0.2 if gemma else a)
for l in range(L):
    p = "model.layers.%d." % l
    t(p + "self_attn.q_proj.weight", [NH * D, H], a)
    t(p + "self_attn.k_proj.weight", [NKV * D, H], a)
    t(p + "self_attn.v_proj.weight", [NKV * D, H], a)
    t(p + "self_attn.o_proj.weight", [H, NH * D], a)
    t(p + "mlp.gate_proj.weight", [I, H], a)
    t(p + "mlp.up_proj.weight", [I, H], a)
    t(p + "mlp.down_proj.weight", [H, I], a)
    nb = 0.0 if gemma else 1.0  # Gemma's norms are 1 + w
    t(p + "input_layernorm.weight", [H], 0.1, nb)
    t(p + "post_attention_layernorm.weight", [H], 0.1, nb)
    if gemma:
        t(p + "pre_feedforward_layernorm.weight", [H], 0.1)
        t(p + "post_feedforward_layernorm.weight", [H], 0.1)
        t(p + "self_attn.q_norm.weight", [D], 0.1)
        t(p + "self_attn.k_norm.weight", [D], 0.1)
    else:
        t(p + "self_attn.q_proj.bias", [NH * D], 0.1)
        t(p + "self_attn.k_proj.bias", [NKV * D], 0.1)
        t(p + "self_attn.v_proj.bias", [NKV * D], 0.1)
t("model.norm.weight", [H], 0.1, 0.0 if gemma else 1.0)
if not gemma:
    t("lm_head.weight", [V, H], a)

if gemma:
    cfg = {"architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text",
           "hidden_size": H, "num_attention_heads": NH, "num_key_value_heads": NKV,
           "head_dim": D, "intermediate_size": I, "num_hidden_layers": L, "vocab_size": V,
           "rms_norm_eps": 1e-6, "hidden_activation": "gelu_pytorch_tanh",
           "query_pre_attn_scalar": D, "sliding_window": 6,
           "layer_types": ["sliding_attention", "full_attention"],
           "attn_logit_softcapping": 20.0, "final_logit_softcapping": 15.0,
           "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0,
           "max_position_embeddings": 512, "tie_word_embeddings": True,
           "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0, "torch_dtype": "bfloat16"}
else:
    cfg = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
           "hidden_size": H, "num_attention_heads": NH, "num_key_value_heads": NKV,
           "intermediate_size": I, "num_hidden_layers": L, "vocab_size": V,
           "rms_norm_eps": 1e-6, "hidden_act": "silu", "rope_theta": 10000.0,
           "max_position_embeddings": 512, "tie_word_embeddings": False,
           "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "bfloat16"}

os.makedirs(out, exist_ok=True)
with open(os.path.join(out, "config.json"), "w") as f:
    json.dump(cfg, f, indent=1)
hdr, off, blobs = {}, 0, []
for name in sorted(tensors):
    shape, vals = tensors[name]
    b = struct.pack("<%dH" % len(vals), *vals)
    hdr[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [off, off + len(b)]}
    off += len(b)
    blobs.append(b)
h = json.dumps(hdr, separators=(",", ":")).encode()
h += b" " * (-len(h) % 8)
with open(os.path.join(out, "model.safetensors"), "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
shutil.copy(tok, os.path.join(out, "tokenizer.model"))

#!/usr/bin/env python3
"""make_gguf_golden.py - GGUF fixtures for tests/unit/test_gguf.c, written with the
llama.cpp Python package `gguf` (and, for the model golden, transformers' own GGUF
loader).

Writes under tests/golden/gguf/:
  quants.gguf                 one small tensor of every type formats/gguf.c dequantizes
                              (F32 F16 BF16 Q4_0 Q4_1 Q8_0 Q4_K Q6_K, then Q5_0 Q5_1
                              Q5_K from a second random stream), each row-major
                              [rows, cols] with ne = {cols, rows}
  quants.golden.safetensors   gguf.quants.dequantize() of each, F32, same names
  tiny.gguf                   a tiny random Llama (2 layers, hidden 32, 2 heads, 1 KV head,
                              intermediate 256) the way convert_hf_to_gguf.py writes one:
                              q/k rows permuted, tensors in several quant types, a byte-level
                              vocabulary with merges and three special tokens, pre 'smollm',
                              SmolLM2's chat template
  tiny.hf.safetensors         transformers' AutoModelForCausalLM.from_pretrained(gguf_file=)
                              state dict of tiny.gguf (F32): the HF-side golden for bk-convert
  gemma3.gguf                 a tiny random Gemma-3 (6 layers: llama.cpp's fixed pattern
                              makes layer 5 full attention, 0-4 sliding; hidden 32, 2
                              heads, 1 KV head, head size 16, intermediate 64) the way
                              convert_hf_to_gguf.py writes one: norm weights stored as
                              1 + w, q/k unpermuted, tensors in Q5_0 Q5_1 Q8_0 Q4_0 F16
                              BF16 (the K-quants need rows of 256: quants.gguf has them),
                              a SentencePiece vocabulary (tokens, scores,
                              token types: control, user-defined, 256 bytes, BPE pieces)
  gemma3.hf.safetensors       transformers' GGUF loader's state dict of gemma3.gguf (F32)
  gemma3.hf.json              transformers' config of gemma3.gguf (the attention layout)
                              and its tokenizer's ids of a few strings
  case.json                   versions and sizes

Run from anywhere (needs: pip install gguf numpy safetensors torch transformers):
  python3 tests/ref/make_gguf_golden.py
Deterministic: the same versions give byte-identical files.
"""
import json
import os
import sys
import tempfile

import numpy as np

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
OUT = os.path.join(ROOT, "tests", "golden", "gguf")

import gguf  # noqa: E402
from gguf import GGMLQuantizationType as Q  # noqa: E402
from gguf import quants  # noqa: E402
from safetensors.numpy import save_file  # noqa: E402


def kquant_blocks(rng, qtype, n_blocks):
    """Random raw K-quant blocks with finite, moderate fp16 scales (gguf-py cannot
    quantize Q4_K/Q5_K/Q6_K; dequantize is what we check)."""
    size = quants.GGML_QUANT_SIZES[qtype][1]
    raw = rng.integers(0, 256, size=(n_blocks, size), dtype=np.uint8)
    d = rng.uniform(1e-3, 5e-2, size=n_blocks).astype(np.float16).view(np.uint8).reshape(-1, 2)
    if qtype in (Q.Q4_K, Q.Q5_K):  # d, dmin first
        dmin = rng.uniform(1e-3, 5e-2, size=n_blocks).astype(np.float16).view(np.uint8).reshape(-1, 2)
        raw[:, 0:2] = d
        raw[:, 2:4] = dmin
    elif qtype == Q.Q6_K:  # d last
        raw[:, 208:210] = d
    else:
        raise ValueError(qtype)
    return raw


def encode(arr, qtype, rng):
    """numpy float32 [rows, cols] -> the bytes (as gguf.GGUFWriter wants them)"""
    if qtype == Q.F32:
        return arr.astype(np.float32)
    if qtype == Q.F16:
        return arr.astype(np.float16)
    if qtype in (Q.Q4_K, Q.Q5_K, Q.Q6_K):
        rows, cols = arr.shape
        raw = kquant_blocks(rng, qtype, rows * cols // 256)
        return raw.reshape(rows, -1)
    return quants.quantize(arr.astype(np.float32), qtype)


def dequant(raw, qtype):
    if qtype == Q.F32:
        return raw.astype(np.float32)
    if qtype == Q.F16:
        return raw.astype(np.float32)
    return quants.dequantize(raw, qtype).astype(np.float32)


def write_quants(rng, rng5):
    path = os.path.join(OUT, "quants.gguf")
    w = gguf.GGUFWriter(path, arch="test")
    golden = {}
    cases = [("f32", Q.F32, 3, 64), ("f16", Q.F16, 3, 64), ("bf16", Q.BF16, 3, 64),
             ("q4_0", Q.Q4_0, 3, 64), ("q4_1", Q.Q4_1, 3, 64), ("q8_0", Q.Q8_0, 3, 64),
             ("q4_k", Q.Q4_K, 2, 512), ("q6_k", Q.Q6_K, 3, 256), ("vec_f32", Q.F32, 1, 7),
             ("q5_0", Q.Q5_0, 3, 64), ("q5_1", Q.Q5_1, 3, 64), ("q5_k", Q.Q5_K, 2, 512)]
    for i, (name, qt, rows, cols) in enumerate(cases):
        if name == "q5_0":  # added later: their own stream, so the others stay as they were
            rng = rng5
        x = (rng.standard_normal((rows, cols)) * 0.7).astype(np.float32)
        if name == "vec_f32":
            x = x.reshape(cols)
        raw = encode(x if x.ndim == 2 else x, qt, rng)
        if qt in (Q.F32, Q.F16):
            w.add_tensor(name, raw)
        else:
            w.add_tensor(name, raw, raw_dtype=qt)
        golden[name] = np.ascontiguousarray(dequant(raw, qt).reshape(x.shape))
    w.add_string("test.string", "héllo")
    w.add_uint32("test.u32", 4000000000)
    w.add_int32("test.i32", -7)
    w.add_float32("test.f32", 0.25)
    w.add_bool("test.bool", True)
    w.add_array("test.strs", ["a", "bc", ""])
    w.add_array("test.ints", [1, -2, 3])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    save_file(golden, os.path.join(OUT, "quants.golden.safetensors"))
    return {k: list(v.shape) for k, v in golden.items()}


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, [chr(c) for c in cs]))


TEMPLATE = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
            "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by "
            "Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
            "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
            "{{ '<|im_start|>assistant\n' }}{% endif %}")


def permute(w, n_head):
    # convert_hf_to_gguf.py's LlamaModel.permute: HF rotate_half rows -> interleaved pairs
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def write_tiny(rng):
    H, NH, NKV, I, L = 32, 2, 1, 256, 2
    D = H // NH
    b2u = bytes_to_unicode()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    byte_toks = [b2u[b] for b in range(256)]
    merges = ["Ġ t", "h e", "Ġt he", "i n", "Ġ a", "e r", "o n", "Ġ s", "Ġa n", "Ġan d"]
    merged = [m.replace(" ", "") for m in merges]
    tokens = specials + byte_toks + merged
    types = [3] * len(specials) + [1] * (len(tokens) - len(specials))
    V = len(tokens)

    path = os.path.join(OUT, "tiny.gguf")
    w = gguf.GGUFWriter(path, arch="llama")
    w.add_name("tiny")
    w.add_context_length(128)
    w.add_embedding_length(H)
    w.add_block_count(L)
    w.add_feed_forward_length(I)
    w.add_rope_dimension_count(D)
    w.add_head_count(NH)
    w.add_head_count_kv(NKV)
    w.add_rope_freq_base(100000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(V)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_pad_token_id(2)
    w.add_add_bos_token(False)
    w.add_chat_template(TEMPLATE)

    def t(name, arr, qt):
        raw = encode(arr, qt, rng)
        if qt in (Q.F32, Q.F16):
            w.add_tensor(name, raw)
        else:
            w.add_tensor(name, raw, raw_dtype=qt)

    r = lambda *s: (rng.standard_normal(s) * 0.2).astype(np.float32)  # noqa: E731
    t("token_embd.weight", r(V, H), Q.Q8_0)
    t("output_norm.weight", (1 + r(H)).astype(np.float32), Q.F32)
    kinds = [(Q.Q4_0, Q.Q4_1, Q.Q8_0, Q.F16, Q.BF16, Q.Q4_1, Q.Q4_K),
             (Q.Q4_1, Q.Q8_0, Q.Q4_0, Q.Q8_0, Q.Q4_0, Q.F16, Q.Q6_K)]
    for l in range(L):
        kq, kk, kv, ko, kg, ku, kd = kinds[l]
        p = f"blk.{l}."
        t(p + "attn_norm.weight", (1 + r(H)).astype(np.float32), Q.F32)
        t(p + "attn_q.weight", permute(r(NH * D, H), NH), kq)
        t(p + "attn_k.weight", permute(r(NKV * D, H), NKV), kk)
        t(p + "attn_v.weight", r(NKV * D, H), kv)
        t(p + "attn_output.weight", r(H, NH * D), ko)
        t(p + "ffn_norm.weight", (1 + r(H)).astype(np.float32), Q.F32)
        t(p + "ffn_gate.weight", r(I, H), kg)
        t(p + "ffn_up.weight", r(I, H), ku)
        t(p + "ffn_down.weight", r(H, I), kd)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    # the HF side: transformers' own GGUF loader (dequantize + reverse permutation)
    import torch
    from transformers import AutoModelForCausalLM
    m = AutoModelForCausalLM.from_pretrained(OUT, gguf_file="tiny.gguf", dtype=torch.float32)
    sd = {k: v.detach().to(torch.float32).contiguous().numpy() for k, v in m.state_dict().items()
          if not k.endswith("rotary_emb.inv_freq")}
    if m.config.tie_word_embeddings:
        sd.pop("lm_head.weight", None)
    save_file(sd, os.path.join(OUT, "tiny.hf.safetensors"))
    return V


GEMMA_STRINGS = ["Hello world", "The quick brown fox.", "a\n\nb", "theatre 2024", "  two  spaces",
                 "héllo ☃"]


def write_gemma3(rng):
    H, NH, NKV, D, I, L, W = 32, 2, 1, 16, 64, 6, 4
    # a SentencePiece BPE vocabulary as llama.cpp writes Gemma's: ids 0-3 pad/eos/bos/unk
    # (control), turn markers (control), user-defined newline runs, the 256 byte pieces,
    # then BPE pieces scored -rank
    pieces = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "<start_of_turn>", "<end_of_turn>"]
    types = [3] * len(pieces)
    scores = [-1000.0] * len(pieces)
    for t in ("\n", "\n\n"):
        pieces.append(t)
        types.append(4)
        scores.append(-1000.0)
    for b in range(256):
        pieces.append("<0x%02X>" % b)
        types.append(6)
        scores.append(0.0)
    normal = ["▁", "t", "h", "e", "▁t", "he", "▁the", "a", "r", "▁a", "o", "l", "ll", "he", "w",
              "d", "▁w", "or", "ld", "▁wor", "▁world", "H", "▁T", "q", "u", "i", "c", "k", "▁q",
              "ui", "ck", "▁qu", "▁quick", "b", "n", "▁b", "ro", "wn", "▁brown", "f", "x", "▁f",
              "ox", "▁fox", ".", "s", "p", "2", "0", "4", "ea", "tr", "é", "☃"]
    seen = set(pieces)
    for t in normal:
        if t in seen:
            continue
        seen.add(t)
        pieces.append(t)
        types.append(1)
        scores.append(-float(len([x for x in types if x == 1]) - 1))
    V = len(pieces)

    path = os.path.join(OUT, "gemma3.gguf")
    w = gguf.GGUFWriter(path, arch="gemma3")
    w.add_name("tiny gemma3")
    w.add_context_length(128)
    w.add_embedding_length(H)
    w.add_block_count(L)
    w.add_feed_forward_length(I)
    w.add_head_count(NH)
    w.add_head_count_kv(NKV)
    w.add_key_length(D)
    w.add_value_length(D)
    w.add_rope_freq_base(1000000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_sliding_window(W)
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(pieces)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(2)
    w.add_eos_token_id(1)
    w.add_unk_token_id(3)
    w.add_pad_token_id(0)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_add_space_prefix(False)

    def t(name, arr, qt):
        raw = encode(arr, qt, rng)
        if qt in (Q.F32, Q.F16):
            w.add_tensor(name, raw)
        else:
            w.add_tensor(name, raw, raw_dtype=qt)

    r = lambda *s: (rng.standard_normal(s) * 0.2).astype(np.float32)  # noqa: E731
    norm = lambda n: (1 + r(n)).astype(np.float32)  # llama.cpp's 1 + w  # noqa: E731
    t("token_embd.weight", r(V, H), Q.Q8_0)
    t("output_norm.weight", norm(H), Q.F32)
    kinds = [Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.F16, Q.BF16, Q.Q4_0]
    for l in range(L):
        k = [kinds[(l + j) % len(kinds)] for j in range(6)]
        p = f"blk.{l}."
        t(p + "attn_norm.weight", norm(H), Q.F32)
        t(p + "attn_q.weight", r(NH * D, H), k[0])
        t(p + "attn_k.weight", r(NKV * D, H), k[1])
        t(p + "attn_v.weight", r(NKV * D, H), k[2])
        t(p + "attn_q_norm.weight", norm(D), Q.F32)
        t(p + "attn_k_norm.weight", norm(D), Q.F32)
        t(p + "attn_output.weight", r(H, NH * D), k[3])
        t(p + "post_attention_norm.weight", norm(H), Q.F32)
        t(p + "ffn_norm.weight", norm(H), Q.F32)
        t(p + "ffn_gate.weight", r(I, H), k[4])
        t(p + "ffn_up.weight", r(I, H), k[5])
        t(p + "ffn_down.weight", r(H, I), kinds[(l + 3) % len(kinds)])
        t(p + "post_ffw_norm.weight", norm(H), Q.F32)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    m = AutoModelForCausalLM.from_pretrained(OUT, gguf_file="gemma3.gguf", dtype=torch.float32)
    sd = {k: v.detach().to(torch.float32).contiguous().numpy() for k, v in m.state_dict().items()
          if not k.endswith("rotary_emb.inv_freq")}
    if m.config.tie_word_embeddings:
        sd.pop("lm_head.weight", None)
    save_file(sd, os.path.join(OUT, "gemma3.hf.safetensors"))
    c = m.config
    tok = AutoTokenizer.from_pretrained(OUT, gguf_file="gemma3.gguf")
    ids = {s: tok(s, add_special_tokens=False)["input_ids"] for s in GEMMA_STRINGS}
    info = {"architecture": type(m).__name__, "model_type": c.model_type,
            "layer_types": list(c.layer_types), "sliding_window": c.sliding_window,
            "head_dim": c.head_dim, "query_pre_attn_scalar": c.query_pre_attn_scalar,
            "rope_parameters": c.rope_parameters, "rms_norm_eps": c.rms_norm_eps,
            "tie_word_embeddings": c.tie_word_embeddings, "hidden_activation": c.hidden_activation,
            "vocab_size": c.vocab_size, "ids": ids}
    with open(os.path.join(OUT, "gemma3.hf.json"), "w") as f:
        json.dump(info, f, indent=1, sort_keys=True, ensure_ascii=False)
        f.write("\n")
    return V


def main():
    os.makedirs(OUT, exist_ok=True)
    rng = np.random.default_rng(20261201)
    shapes = write_quants(rng, np.random.default_rng(20261202))
    V = write_tiny(rng)
    V3 = write_gemma3(np.random.default_rng(20261203))
    import transformers
    versions = {"gguf": getattr(gguf, "__version__", "?"), "numpy": np.__version__,
                "transformers": transformers.__version__}
    try:
        from importlib.metadata import version
        versions["gguf"] = version("gguf")
        versions["torch"] = version("torch")
    except Exception:
        pass
    sizes = {f: os.path.getsize(os.path.join(OUT, f)) for f in
             ("quants.gguf", "quants.golden.safetensors", "tiny.gguf", "tiny.hf.safetensors",
              "gemma3.gguf", "gemma3.hf.safetensors", "gemma3.hf.json")}
    with open(os.path.join(OUT, "case.json"), "w") as f:
        json.dump({"quants": shapes, "tiny_vocab": V, "gemma3_vocab": V3, "versions": versions,
                   "sizes": sizes},
                  f, indent=1, sort_keys=True)
        f.write("\n")
    print(json.dumps(sizes))


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
# make_parity.py - writes the golden fixtures (tests/golden/parity/<model>/) that the C
# model core (forward, LoRA, KL loss, backward, AdamW) is judged against, using HF
# transformers + PEFT in float32 on the CPU. Run by hand; `make test` never runs Python.
#
#   python3 tests/ref/make_parity.py                      write and self-check all fixtures
#   python3 tests/ref/make_parity.py --verify             only re-check the committed fixtures
#   python3 tests/ref/make_parity.py --check-adapter DIR [--model NAME]
#                                    [--which init|step3] load a PEFT adapter dir written by
#                                    the C code and print max |logits - reference| on sample 0
#   python3 tests/ref/make_parity.py --check-merge DIR --model NAME [--adapter DIR]
#                                    compare a bk-merge output with PEFT merge_and_unload
#
# See tests/ref/README.md for the fixture layout and tensor names.
import argparse
import json
import math
import os
import re
import shutil
import sys
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[2]
OUT_DIR = Path("tests/golden/parity")  # relative to ROOT
FORMAT = "bakery-parity"
VERSION = 1

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
ATTN = {"q_proj", "k_proj", "v_proj", "o_proj"}
LORA_R = 4
LORA_ALPHA = 8
LORA_INIT_STD = 0.1
SEED_TRIES = 24  # LoRA init seeds tried, see pick_lora_seed

SYSTEM_LEN = 7
USER_LENS = [3, 5, 4]
RESP_LENS = [4, 6, 1]
SPECIAL_IDS = (0, 1, 2)  # unk, bos, eos
BOS_ID = 1

OPTIM = {
    "name": "torch.optim.AdamW",
    "lr": 1e-2,
    "betas": [0.9, 0.999],
    "eps": 1e-8,
    "weight_decay": 0.01,
    "max_grad_norm": 1.0,
    "schedule": "transformers.get_cosine_schedule_with_warmup",
    "num_warmup_steps": 1,
    "num_training_steps": 3,
    "temperature": 1.0,
}

# The tiny random model of each family (hidden 32, 2 layers, V = 96): norm weights away
# from identity, biases non-zero, a sliding window (4 or 5) shorter than the test
# sequences (the teacher's are 15..18 tokens, its shared prefix 8), both RoPE bases.
FAMILY_CONFIGS = {
    "llama": dict(head_dim=8, tie_word_embeddings=False, rope_theta=10000.0),
    # q/k/v bias; sliding window on layer 1 (i >= max_window_layers)
    "qwen2": dict(tie_word_embeddings=False, rope_theta=10000.0, use_sliding_window=True,
                  sliding_window=5, max_window_layers=1),
    # q_norm/k_norm; explicit head_dim 12 != 32 / 4; tied like Qwen3-0.6B
    "qwen3": dict(head_dim=12, tie_word_embeddings=True, rope_theta=1000000.0),
    # (1+w) norms, sqrt(H) embedding scale, GeGLU, sandwich norms, attention softcap
    # (small enough to bend the scores), query_pre_attn_scalar != head_dim, window 4 on
    # layer 0; final_logit_softcapping 2.5 (the logits reach about 4: it bends them)
    "gemma2": dict(head_dim=8, tie_word_embeddings=True, rope_theta=10000.0,
                   hidden_activation="gelu_pytorch_tanh", query_pre_attn_scalar=12,
                   attn_logit_softcapping=3.0, final_logit_softcapping=2.5,
                   sliding_window=4, layer_types=["sliding_attention", "full_attention"]),
    # + q/k norms with (1+w), local RoPE base 1e4 on the sliding layer 0 and global 1e6
    # with linear scaling (factor 2) on the full layer 1
    "gemma3": dict(head_dim=8, tie_word_embeddings=True,
                   hidden_activation="gelu_pytorch_tanh", query_pre_attn_scalar=12,
                   sliding_window=4, layer_types=["sliding_attention", "full_attention"],
                   rope_parameters={"sliding_attention": {"rope_type": "default",
                                                          "rope_theta": 10000.0},
                                    "full_attention": {"rope_type": "linear", "factor": 2.0,
                                                       "rope_theta": 1000000.0}}),
}

MODELS = {
    "tiny": {
        "path": str(OUT_DIR / "tiny" / "model"),
        "seed": 1234,
        "family": "llama",
    },
    "qwen2": {"path": str(OUT_DIR / "qwen2" / "model"), "seed": 2002, "family": "qwen2"},
    "qwen3": {"path": str(OUT_DIR / "qwen3" / "model"), "seed": 3003, "family": "qwen3"},
    "gemma2": {"path": str(OUT_DIR / "gemma2" / "model"), "seed": 4104, "family": "gemma2"},
    "gemma3": {"path": str(OUT_DIR / "gemma3" / "model"), "seed": 5005, "family": "gemma3"},
    "stories260K": {
        "path": "models/stories260K",
        "seed": 260,
        "tokenizer": "models/stories260K/tokenizer.model",
        "texts": {  # chosen to be exactly SYSTEM_LEN / USER_LENS / RESP_LENS pieces
            "system": "Be kind and happy",
            "user": ["Once upon a", "Lily and Tom play", "He was sad"],
            "resp": ["time there was a", "The cat was happy.", "The"],
        },
    },
}


def setup_torch():
    torch.set_default_dtype(torch.float32)
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(0)
    warnings.filterwarnings("ignore")
    from transformers.utils import logging as hf_logging
    hf_logging.set_verbosity_error()


def versions():
    import peft
    import transformers
    return {"torch": torch.__version__, "transformers": transformers.__version__,
            "peft": peft.__version__}


# ---------------------------------------------------------------- models and samples

def make_tiny_model(path, seed, family="llama"):
    """Builds the tiny random model of a family (GQA) and saves it with save_pretrained."""
    import transformers as tf
    cls = {"llama": ("LlamaConfig", "LlamaForCausalLM"),
           "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
           "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
           "gemma2": ("Gemma2Config", "Gemma2ForCausalLM"),
           "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM")}[family]
    kw = dict(hidden_size=32, intermediate_size=56, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, vocab_size=96,
              rms_norm_eps=1e-6, max_position_embeddings=128, bos_token_id=1,
              eos_token_id=2, pad_token_id=0)
    if not family.startswith("gemma"):
        kw["hidden_act"] = "silu"
    kw.update(FAMILY_CONFIGS[family])
    cfg = getattr(tf, cls[0])(**kw)
    torch.manual_seed(seed)
    model = getattr(tf, cls[1])(cfg).to(torch.float32)
    gemma = family.startswith("gemma")
    # HF's default init (std 0.02) gives near-uniform logits; use O(1) activations so
    # the KL and its gradients are far from zero, and non-unit norm weights so a C
    # side that forgets to apply them fails.
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if name.endswith("norm.weight"):  # Gemma multiplies by (1 + w)
                p.copy_((0.0 if gemma else 1.0) + 0.1 * torch.randn(p.shape, generator=g))
            elif name.endswith(".bias"):
                p.copy_(0.5 * torch.randn(p.shape, generator=g))
            elif "embed_tokens" in name and gemma:  # times sqrt(32) in the forward
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p.shape[1]))
            elif "embed_tokens" in name:
                p.copy_(torch.randn(p.shape, generator=g))
            else:  # Linear weight [out, in]
                p.copy_(torch.randn(p.shape, generator=g) * (1.5 / math.sqrt(p.shape[1])))
    if os.path.isdir(path):
        shutil.rmtree(path)
    model.save_pretrained(path, safe_serialization=True)
    gen = os.path.join(path, "generation_config.json")
    if os.path.exists(gen):
        os.remove(gen)


def load_base(path):
    from transformers import AutoModelForCausalLM
    m = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32,
                                             attn_implementation="eager")
    m.eval()
    return m


def make_samples(name, spec, vocab):
    """Returns 3 samples {t_prompt, s_prompt, resp} (lists of ids) and their texts."""
    if "tokenizer" not in spec:
        g = torch.Generator().manual_seed(spec["seed"] + 1)
        lo = max(SPECIAL_IDS) + 1

        def draw(n):
            return (torch.randint(lo, vocab, (n,), generator=g)).tolist()
        system = draw(SYSTEM_LEN)
        users = [draw(n) for n in USER_LENS]
        resps = [draw(n) for n in RESP_LENS]
        texts = None
    else:
        import sentencepiece as spm
        sp = spm.SentencePieceProcessor(model_file=spec["tokenizer"])

        def enc(text, n):
            ids = sp.encode(text)
            if len(ids) != n:
                sys.exit(f"make_parity: text '{text}' has {len(ids)} tokens, not {n}")
            assert not any(i in SPECIAL_IDS for i in ids)
            return ids
        t = spec["texts"]
        system = enc(t["system"], SYSTEM_LEN)
        users = [enc(s, n) for s, n in zip(t["user"], USER_LENS)]
        resps = [enc(s, n) for s, n in zip(t["resp"], RESP_LENS)]
        texts = {"system": sp.decode(system), "user": [sp.decode(u) for u in users],
                 "resp": [sp.decode(r) for r in resps]}
    samples = []
    for u, r in zip(users, resps):
        samples.append({"t_prompt": [BOS_ID] + system + u, "s_prompt": [BOS_ID] + u,
                        "resp": r})
    return samples, texts


# ---------------------------------------------------------------- LoRA

def lora_key(module_name):
    """'base_model.model.model.layers.3.self_attn.q_proj' -> 'layers.3.q_proj'."""
    parts = module_name.split(".")
    i = parts.index("layers")
    return f"layers.{parts[i + 1]}.{parts[-1]}"


def lora_params(model):
    """Ordered list of (key 'layers.L.proj.A|B', parameter); layer-major, TARGETS order."""
    out = {}
    for name, mod in model.named_modules():
        if hasattr(mod, "lora_A") and "default" in getattr(mod, "lora_A", {}):
            k = lora_key(name)
            out[k + ".A"] = mod.lora_A["default"].weight  # [r, in]
            out[k + ".B"] = mod.lora_B["default"].weight  # [out, r]
    nl = max(int(k.split(".")[1]) for k in out) + 1
    keys = [f"layers.{l}.{p}.{ab}" for l in range(nl) for p in TARGETS for ab in "AB"]
    assert sorted(keys) == sorted(out), (sorted(keys), sorted(out))
    return [(k, out[k]) for k in keys]


def add_lora(base, seed):
    from peft import LoraConfig, get_peft_model
    cfg = LoraConfig(r=LORA_R, lora_alpha=LORA_ALPHA, lora_dropout=0.0, bias="none",
                     target_modules=list(TARGETS), task_type="CAUSAL_LM")
    model = get_peft_model(base, cfg)
    init_lora(model, seed + 2)
    model.eval()
    return model


def init_lora(model, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, p in lora_params(model):
            p.copy_(torch.randn(p.shape, generator=g) * LORA_INIT_STD)


def pick_lora_seed(model, path, t_list, samples, seed):
    """Adam's first real update of an entry is lr * g / (|g| + eps): for an entry within
    a few hundred eps of zero it depends on g's own relative precision, so the float32
    gradient's absolute error D (torch's here, ours in C) moves that entry's update by
    up to lr * eps * D / (|g| + eps)^2. Among LoRA init seeds seed .. seed+SEED_TRIES-1
    take the one whose float32 (torch) first update lr * g / (|g| + eps), clipped, is
    closest to the float64 one (RefLlama), relative to max|W| as the C check measures, so
    the stored step weights are as close to exact as float32 allows. Returns (seed, that
    error, a pessimistic bound for any f32 implementation: D = the tensor's largest
    gradient error, put on its smallest entry; min |clipped g|)."""
    ref = RefLlama(path)
    with torch.no_grad():
        t64 = [ref.logits(s["t_prompt"] + s["resp"], None) for s in samples]
    params = lora_params(model)
    eps, lr = OPTIM["eps"], OPTIM["lr"]
    best = None
    for s in range(seed, seed + SEED_TRIES):
        init_lora(model, s)
        for _, p in params:
            p.requires_grad_(True)
            p.grad = None
        bake_loss(t_list, student_logits(model, samples), samples,
                  OPTIM["temperature"])[0].backward()
        g32 = {k: p.grad.double() for k, p in params}
        w = {k: p.detach().double().clone().requires_grad_(True) for k, p in params}
        bake_loss(t64, [ref.logits(x["s_prompt"] + x["resp"], w) for x in samples],
                  samples, OPTIM["temperature"])[0].backward()
        gn = math.sqrt(sum((g * g).sum().item() for g in g32.values()))
        coef = min(1.0, OPTIM["max_grad_norm"] / (gn + 1e-6))
        gn64 = math.sqrt(sum((w[k].grad ** 2).sum().item() for k in w))
        coef64 = min(1.0, OPTIM["max_grad_norm"] / (gn64 + 1e-6))
        err, bound, gmin = 0.0, 0.0, math.inf
        for k in g32:
            g, g64 = g32[k] * coef, w[k].grad * coef64
            wmax = w[k].abs().max().item()
            u32, u64 = lr * g / (g.abs() + eps), lr * g64 / (g64.abs() + eps)
            err = max(err, (u32 - u64).abs().max().item() / wmax)
            d = (g - g64).abs().max().item()
            bound = max(bound, (lr * eps * d / (g.abs() + eps) ** 2).max().item() / wmax)
            gmin = min(gmin, g.abs().min().item())
        for _, p in params:
            p.grad = None
        if best is None or err < best[1]:
            best = (s, err, bound, gmin)
    init_lora(model, best[0])
    return best


def set_lora(model, weights):
    with torch.no_grad():
        for k, p in lora_params(model):
            p.copy_(weights[k])


def get_lora(model):
    return {k: p.detach().clone() for k, p in lora_params(model)}


# ---------------------------------------------------------------- forward and loss

def logits_of(model, ids):
    x = torch.tensor([ids], dtype=torch.long)
    return model(input_ids=x, use_cache=False).logits[0]  # [len, V]


def teacher_logits(model, samples):
    with torch.no_grad(), model.disable_adapter():
        return [logits_of(model, s["t_prompt"] + s["resp"]) for s in samples]


def student_logits(model, samples):
    return [logits_of(model, s["s_prompt"] + s["resp"]) for s in samples]


def kl_rows(t_logits, s_logits, sample, T):
    """Per-response-token KL(P_t || P_s); rows len(prompt)-1 .. len(seq)-2. -> [n]"""
    n = len(sample["resp"])
    tp, sp = len(sample["t_prompt"]), len(sample["s_prompt"])
    tr = t_logits[tp - 1:tp - 1 + n]
    sr = s_logits[sp - 1:sp - 1 + n]
    logpt = F.log_softmax(tr / T, dim=-1)
    logps = F.log_softmax(sr / T, dim=-1)
    return (logpt.exp() * (logpt - logps)).sum(-1)


def bake_loss(t_list, s_list, samples, T):
    """Mean over samples of the per-sample mean KL. Returns (loss, per-sample list)."""
    per = [kl_rows(t, s, smp, T).mean() for t, s, smp in zip(t_list, s_list, samples)]
    return torch.stack(per).mean(), per


# ---------------------------------------------------------------- generation

def write_fixture(name, spec):
    from peft import PeftModel
    from transformers import get_cosine_schedule_with_warmup

    out = OUT_DIR / name
    out.mkdir(parents=True, exist_ok=True)
    if "family" in spec:
        make_tiny_model(spec["path"], spec["seed"], spec["family"])
    base = load_base(spec["path"])
    vocab = base.config.vocab_size
    samples, texts = make_samples(name, spec, vocab)
    model = add_lora(base, spec["seed"])
    t_list = teacher_logits(model, samples)
    lora_seed, upd_err, bound, gmin = pick_lora_seed(model, spec["path"], t_list, samples,
                                            spec["seed"] + 2)
    init = get_lora(model)
    T = {}

    # 1. logits
    with torch.no_grad():
        s_list = student_logits(model, samples)
    for i in range(len(samples)):
        T[f"logits.teacher.{i}"] = t_list[i]
        T[f"logits.student.{i}"] = s_list[i]

    # 2. loss at T = 1 and T = 2
    loss = {}
    per_sample = {}
    with torch.no_grad():
        for temp in (1, 2):
            l, per = bake_loss(t_list, s_list, samples, float(temp))
            loss[f"T{temp}"] = l.item()
            per_sample[f"T{temp}"] = [p.item() for p in per]

    # 5. initial weights; PEFT adapter dir with them, reloaded
    for k, v in init.items():
        T[f"lora.init.{k}"] = v
    adir = out / "adapter-peft"
    if adir.is_dir():
        shutil.rmtree(adir)
    model.save_pretrained(str(adir), safe_serialization=True)
    normalise_adapter_config(adir / "adapter_config.json")
    (adir / "README.md").unlink(missing_ok=True)  # PEFT's empty model card
    re_base = load_base(spec["path"])
    reloaded = PeftModel.from_pretrained(re_base, str(adir))
    reloaded.eval()
    with torch.no_grad():
        rl = logits_of(reloaded, samples[0]["s_prompt"] + samples[0]["resp"])
    T["logits.peft_reload.0"] = rl
    reload_diff = (rl - s_list[0]).abs().max().item()
    del reloaded, re_base

    # 3 + 4. gradients (T = 1) and 3 AdamW steps
    params = [p for _, p in lora_params(model)]
    for p in params:
        p.requires_grad_(True)
    opt = torch.optim.AdamW(params, lr=OPTIM["lr"], betas=tuple(OPTIM["betas"]),
                            eps=OPTIM["eps"], weight_decay=OPTIM["weight_decay"])
    sched = get_cosine_schedule_with_warmup(opt, OPTIM["num_warmup_steps"],
                                            OPTIM["num_training_steps"])
    steps = []
    for step in range(OPTIM["num_training_steps"]):
        opt.zero_grad(set_to_none=True)
        l, _ = bake_loss(t_list, student_logits(model, samples), samples,
                         OPTIM["temperature"])
        l.backward()
        if step == 0:
            for k, p in lora_params(model):
                T[f"grad.{k}"] = p.grad.detach().clone()
        elif step == 1:  # lr was 0 at step 1: same weights, bitwise the same gradient
            assert all(torch.equal(T[f"grad.{k}"], p.grad) for k, p in lora_params(model))
        else:
            for k, p in lora_params(model):
                T[f"grad.step{step + 1}.{k}"] = p.grad.detach().clone()
        gn = torch.nn.utils.clip_grad_norm_(params, OPTIM["max_grad_norm"])
        lr = sched.get_last_lr()[0]
        opt.step()
        sched.step()
        steps.append({"loss": l.item(), "grad_norm": gn.item(), "lr": lr})
        for k, v in get_lora(model).items():
            T[f"lora.step{step + 1}.{k}"] = v
    with torch.no_grad():
        T["logits.student_step3.0"] = logits_of(model,
                                                samples[0]["s_prompt"] + samples[0]["resp"])

    write_safetensors(out / "tensors.safetensors", T,
                      {"format": FORMAT, "version": str(VERSION), "model": name,
                       "generated_by": "tests/ref/make_parity.py"})
    cfg = model.get_base_model().config
    case = {
        "format": FORMAT,
        "version": VERSION,
        "generated_by": "tests/ref/make_parity.py",
        "versions": versions(),
        "model": {"name": name, "path": spec["path"], "vocab_size": vocab,
                  "hidden_size": cfg.hidden_size, "num_hidden_layers": cfg.num_hidden_layers,
                  "tie_word_embeddings": bool(cfg.tie_word_embeddings), "bos_id": BOS_ID},
        "lora": {"r": LORA_R, "alpha": LORA_ALPHA, "scale": LORA_ALPHA / LORA_R,
                 "dropout": 0.0, "targets": TARGETS,
                 "init": f"A and B ~ {LORA_INIT_STD} * N(0,1), torch.Generator seed "
                         f"{lora_seed}, stored as lora.init.*",
                 "init_seed": lora_seed, "min_abs_clipped_grad": gmin,
                 "first_update_f32_error": upd_err, "first_update_f32_bound": bound},
        "samples": [dict(s, t_ids=s["t_prompt"] + s["resp"], s_ids=s["s_prompt"] + s["resp"])
                    for s in samples],
        "loss": dict(loss, per_sample=per_sample),
        "optim": OPTIM,
        "steps": steps,
        "peft_reload": {"tensor": "logits.peft_reload.0", "adapter_dir": "adapter-peft",
                        "max_abs_diff_vs_logits.student.0": reload_diff},
        "tensors": "tensors.safetensors",
    }
    if texts is not None:
        case["texts"] = texts
    with open(out / "case.json", "w") as f:
        f.write(compact_json(case))
    print(f"{name}: LoRA init seed {lora_seed} (first update f32 error {upd_err:.2g}, "
          f"bound {bound:.2g}); "
          f"loss T1 {loss['T1']:.9g} T2 {loss['T2']:.9g}; "
          f"steps {[round(s['loss'], 7) for s in steps]}; peft reload diff {reload_diff:.3g}")


def write_safetensors(path, tensors, metadata):
    """F32 safetensors with a sorted header (safetensors' own writer orders
    __metadata__ by a randomly seeded hash map, so its files differ run to run)."""
    header = {"__metadata__": dict(sorted(metadata.items()))}
    blobs, off = [], 0
    for k in sorted(tensors):
        b = tensors[k].detach().to(torch.float32).contiguous().numpy().tobytes()
        header[k] = {"dtype": "F32", "shape": list(tensors[k].shape),
                     "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(len(h).to_bytes(8, "little"))
        f.write(h)
        for b in blobs:
            f.write(b)


def compact_json(obj):
    """json.dumps with indent, but lists of numbers kept on one line."""
    text = json.dumps(obj, indent=1)
    text = re.sub(r"\[\s*([-0-9.e+,\s]*?)\s*\]",
                  lambda m: "[" + re.sub(r",\s*", ", ", m.group(1).strip()) + "]", text)
    return text + "\n"


def normalise_adapter_config(path):
    """PEFT writes target_modules from a set (order depends on the hash seed): sort it so
    regenerated fixtures are byte-identical."""
    with open(path) as f:
        c = json.load(f)
    if isinstance(c.get("target_modules"), list):
        c["target_modules"] = sorted(c["target_modules"])
    with open(path, "w") as f:
        json.dump(c, f, indent=2, sort_keys=True)
        f.write("\n")


# ---------------------------------------------------------------- verification

def max_relerr(a, b, floor=1e-30):
    """Same metric as bk_max_relerr: max|a-b| / max(max|b|, floor)."""
    a, b = a.double(), b.double()
    return ((a - b).abs().max() / max(b.abs().max().item(), floor)).item()


def load_fixture(name):
    from safetensors import safe_open
    out = OUT_DIR / name
    with open(out / "case.json") as f:
        case = json.load(f)
    T = {}
    with safe_open(str(out / "tensors.safetensors"), framework="pt") as f:
        meta = f.metadata()
        for k in f.keys():
            T[k] = f.get_tensor(k)
    assert meta["format"] == FORMAT and int(meta["version"]) == VERSION, meta
    return case, T


class RefLlama:
    """Independent float64 forward of the families + LoRA (plain torch, weights read with
    safetensors): the math the C side implements, written out once.
      x = embed[ids] (* sqrt(H) for Gemma, the fp32 value); per layer: h = rms(x) * w_in;
      q,k,v = lin(h) (+ bias, Qwen2); q,k = rms(q) * w_q, rms(k) * w_k per head (Qwen3,
      Gemma-3); RoPE (rotate-half; the layer's theta: Gemma-3's sliding layers use the
      local base, its full layers the global one with linear scaling); softmax over
      keys j <= i (and i - j < window on sliding layers) of cap(q k^T * scale) v, with KV
      heads shared by H/KV query heads, scale = query_pre_attn_scalar^-0.5 (Gemma-2/3)
      or hd^-0.5, cap(s) = tanh(s/c) c (Gemma-2); a = o(att) (rms(a) * w_post_attn for
      Gemma-2/3); x += a; h = rms(x) * w_post (Gemma-2/3: w_pre_ff); m = down(act(gate h) *
      up h), act = silu or gelu_tanh (Gemma); x += m (rms(m) * w_post_ff for Gemma-2/3);
      logits = (rms(x) * w_norm) @ lm_head^T (embed if tied), capped as tanh(z/c) c with
      Gemma-2's final_logit_softcapping.  Gemma norm weights
      multiply as (1 + w).  lin(h) = h W^T + (alpha/r) (h A^T) B^T."""

    def __init__(self, path):
        from safetensors.torch import load_file
        with open(os.path.join(path, "config.json")) as f:
            c = json.load(f)
        self.c = c
        self.W = {k: v.double() for k, v in
                  load_file(os.path.join(path, "model.safetensors")).items()}
        mt = c["model_type"]
        self.gemma = mt.startswith("gemma")
        self.sandwich = mt in ("gemma2", "gemma3_text")
        self.qk_norm = mt in ("qwen3", "gemma3_text")
        if "lm_head.weight" not in self.W:
            assert c.get("tie_word_embeddings", True)
            self.W["lm_head.weight"] = self.W["model.embed_tokens.weight"]
        self.H, self.KV = c["num_attention_heads"], c["num_key_value_heads"]
        self.hd = c.get("head_dim") or c["hidden_size"] // self.H
        self.eps = c["rms_norm_eps"]
        self.scale = (c.get("query_pre_attn_scalar") if mt in ("gemma2", "gemma3_text")
                      else self.hd) ** -0.5
        self.softcap = c.get("attn_logit_softcapping") if mt == "gemma2" else None
        self.final_cap = c.get("final_logit_softcapping") if mt == "gemma2" else None
        L = c["num_hidden_layers"]
        types = c.get("layer_types") or ["full_attention"] * L
        if mt in ("qwen2", "qwen3") and not c.get("use_sliding_window"):
            types = ["full_attention"] * L
        self.window = [c["sliding_window"] if t == "sliding_attention" else None
                       for t in types]
        rp = c.get("rope_parameters") or {}
        if "full_attention" in rp:  # Gemma-3, transformers 5: one set per layer type
            sets = {t: rp[t] for t in ("full_attention", "sliding_attention")}
        else:
            one = dict(rp) if rp else dict(c.get("rope_scaling") or {})
            one.setdefault("rope_theta", c.get("rope_theta"))
            sets = {"full_attention": one, "sliding_attention": one}
        self.rope = []
        for t in types:
            p = sets[t]
            theta = p["rope_theta"]
            kind = p.get("rope_type", p.get("type", "default"))
            assert kind in ("default", "linear"), kind
            self.rope.append((theta, p["factor"] if kind == "linear" else 1.0))

    def norm_w(self, name):
        w = self.W[name]
        return 1.0 + w if self.gemma else w

    def rms(self, x, name):
        return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + self.eps) * self.norm_w(name)

    def lin(self, h, l, proj, lora):
        sub = "self_attn" if proj in ATTN else "mlp"
        y = h @ self.W[f"model.layers.{l}.{sub}.{proj}.weight"].T
        b = self.W.get(f"model.layers.{l}.{sub}.{proj}.bias")
        if b is not None:
            y = y + b
        if lora is not None:
            A, B = lora[f"layers.{l}.{proj}.A"], lora[f"layers.{l}.{proj}.B"]
            y = y + (LORA_ALPHA / LORA_R) * ((h @ A.T) @ B.T)
        return y

    def logits(self, ids, lora):
        W, H, KV, hd, n = self.W, self.H, self.KV, self.hd, len(ids)
        x = W["model.embed_tokens.weight"][torch.tensor(ids)]
        if self.gemma:  # torch.tensor(hidden ** 0.5) in the (fp32) weight dtype
            x = x * float(torch.tensor(self.c["hidden_size"] ** 0.5, dtype=torch.float32))

        def rope_of(theta, factor):
            inv = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd)) / factor
            ang = torch.arange(n, dtype=torch.float64)[:, None] * inv[None, :]
            cos = torch.cat([ang.cos(), ang.cos()], -1)  # (n, hd)
            sin = torch.cat([ang.sin(), ang.sin()], -1)

            def rope(t):  # (heads, n, hd)
                t1, t2 = t[..., :hd // 2], t[..., hd // 2:]
                return t * cos + torch.cat([-t2, t1], -1) * sin
            return rope
        i = torch.arange(n)[:, None]
        j = torch.arange(n)[None, :]
        for l in range(self.c["num_hidden_layers"]):
            pre = f"model.layers.{l}."
            rope = rope_of(*self.rope[l])
            win = self.window[l]
            hide = (j > i) | ((i - j >= win) if win else torch.zeros_like(j > i))
            mask = torch.zeros((n, n), dtype=torch.float64).masked_fill(hide, float("-inf"))
            h = self.rms(x, pre + "input_layernorm.weight")
            q = self.lin(h, l, "q_proj", lora).view(n, H, hd)
            k = self.lin(h, l, "k_proj", lora).view(n, KV, hd)
            v = self.lin(h, l, "v_proj", lora).view(n, KV, hd).transpose(0, 1)
            if self.qk_norm:
                q = self.rms(q, pre + "self_attn.q_norm.weight")
                k = self.rms(k, pre + "self_attn.k_norm.weight")
            q, k = rope(q.transpose(0, 1)), rope(k.transpose(0, 1))
            k = k.repeat_interleave(H // KV, dim=0)
            v = v.repeat_interleave(H // KV, dim=0)
            s = q @ k.transpose(1, 2) * self.scale
            if self.softcap:
                s = torch.tanh(s / self.softcap) * self.softcap
            att = torch.softmax(s + mask, -1) @ v
            a = self.lin(att.transpose(0, 1).reshape(n, H * hd), l, "o_proj", lora)
            if self.sandwich:
                a = self.rms(a, pre + "post_attention_layernorm.weight")
                h = self.rms(x + a, pre + "pre_feedforward_layernorm.weight")
            else:
                h = self.rms(x + a, pre + "post_attention_layernorm.weight")
            x = x + a
            gt = self.lin(h, l, "gate_proj", lora)
            act = (F.gelu(gt, approximate="tanh") if self.gemma else F.silu(gt))
            m = self.lin(act * self.lin(h, l, "up_proj", lora), l, "down_proj", lora)
            if self.sandwich:
                m = self.rms(m, pre + "post_feedforward_layernorm.weight")
            x = x + m
        z = self.rms(x, "model.norm.weight") @ W["lm_head.weight"].T  # (n, V)
        if self.final_cap:  # Gemma-2 final_logit_softcapping
            z = torch.tanh(z / self.final_cap) * self.final_cap
        return z



def verify_fixture(name, spec):
    """Recomputes everything independently of write_fixture's code path where possible."""
    case, T = load_fixture(name)
    samples = [{k: s[k] for k in ("t_prompt", "s_prompt", "resp")} for s in case["samples"]]
    fails = []

    def check(what, err, tol):
        ok = err <= tol
        print(f"  {'ok  ' if ok else 'FAIL'} {what}: {err:.3g} (tol {tol:g})")
        if not ok:
            fails.append(what)

    print(f"{name}:")
    # shapes and dtypes
    V = case["model"]["vocab_size"]
    for i, s in enumerate(samples):
        assert T[f"logits.teacher.{i}"].shape == (len(s["t_prompt"]) + len(s["resp"]), V)
        assert T[f"logits.student.{i}"].shape == (len(s["s_prompt"]) + len(s["resp"]), V)
        assert s["t_prompt"][0] == BOS_ID and s["s_prompt"][0] == BOS_ID
        assert s["t_prompt"][-len(s["s_prompt"]) + 1:] == s["s_prompt"][1:]
    assert all(v.dtype == torch.float32 for v in T.values())

    # loss from the stored logits, in float64, with an explicit sum formula
    for temp in (1, 2):
        per = []
        for i, s in enumerate(samples):
            n = len(s["resp"])
            tl = T[f"logits.teacher.{i}"].double()[len(s["t_prompt"]) - 1:][:n] / temp
            sl = T[f"logits.student.{i}"].double()[len(s["s_prompt"]) - 1:][:n] / temp
            pt = torch.softmax(tl, -1)
            kl = (pt * (torch.log(pt) - torch.log_softmax(sl, -1))).sum(-1)
            per.append(kl.mean().item())
        l = sum(per) / len(per)
        check(f"loss T{temp} from stored logits", abs(l - case["loss"][f"T{temp}"]) /
              abs(l), 1e-6)
    check("steps[0].loss == loss.T1", abs(case["steps"][0]["loss"] - case["loss"]["T1"]) /
          case["loss"]["T1"], 1e-7)

    # float64 recomputation with the independent reference below (not HF: HF's eager
    # Llama keeps RoPE, RMSNorm and the attention softmax in float32 even for f64 input)
    ref = RefLlama(spec["path"])
    init = {k[len("lora.init."):]: v.double() for k, v in T.items()
            if k.startswith("lora.init.")}
    with torch.no_grad():
        t64 = [ref.logits(s["t_prompt"] + s["resp"], None) for s in samples]
        s64 = [ref.logits(s["s_prompt"] + s["resp"], init) for s in samples]
    e = max(max(max_relerr(T[f"logits.teacher.{i}"], t64[i]) for i in range(len(samples))),
            max(max_relerr(T[f"logits.student.{i}"], s64[i]) for i in range(len(samples))))
    check("stored f32 logits vs f64 reference", e, 5e-6)
    for temp in (1, 2):
        l64, _ = bake_loss(t64, s64, samples, float(temp))
        check(f"loss T{temp} f32 vs f64", abs(case["loss"][f"T{temp}"] - l64.item()) /
              l64.item(), 2e-6)

    def loss_grad(W):
        W = {k: v.clone().requires_grad_(True) for k, v in W.items()}
        s_list = [ref.logits(s["s_prompt"] + s["resp"], W) for s in samples]
        l, _ = bake_loss(t64, s_list, samples, 1.0)
        l.backward()
        return l.item(), {k: v.grad for k, v in W.items()}

    l0, g64 = loss_grad(init)
    # f32 rounding of a 5-layer backward: ~1e-5 (the C check allows 1e-4)
    check("stored f32 grads vs f64 reference",
          max(max_relerr(T[f"grad.{k}"], g64[k]) for k in g64), 3e-5)
    nz = min((T[f"grad.{k}"].abs().max().item() for k in g64))
    print(f"  smallest per-tensor max|grad| = {nz:.3g}")
    if nz == 0:
        fails.append("a zero gradient tensor")

    # central finite differences (f64) on a few entries of A and B
    probes = [("layers.0.q_proj.A", (1, 3)), ("layers.0.q_proj.B", (5, 2)),
              ("layers.1.down_proj.A", (0, 7)), ("layers.1.v_proj.B", (3, 1)),
              ("layers.0.gate_proj.A", (2, 0)), ("layers.1.o_proj.B", (0, 0))]
    h = 1e-5
    worst = 0.0
    for k, idx in probes:
        lv = []
        for d in (h, -h):
            W = dict(init)
            W[k] = init[k].clone()
            W[k][idx] += d
            with torch.no_grad():
                s_list = [ref.logits(s["s_prompt"] + s["resp"], W) for s in samples]
                lv.append(bake_loss(t64, s_list, samples, 1.0)[0].item())
        fd = (lv[0] - lv[1]) / (2 * h)
        an = g64[k][idx].item()
        st = T[f"grad.{k}"][idx].item()
        scale = g64[k].abs().max().item()
        worst = max(worst, abs(fd - an) / scale, abs(fd - st) / scale)
        print(f"    fd {k}{list(idx)}: fd {fd:.9g} f64 {an:.9g} stored {st:.9g}")
    check("finite difference vs grads (rel. to tensor max)", worst, 1e-5)

    # the three AdamW steps, by hand (decoupled weight decay, bias correction,
    # global-norm clipping, cosine-with-warmup lr), in float64
    o = case["optim"]
    b1, b2 = o["betas"]
    W = {k: v.clone() for k, v in init.items()}
    mom = {k: torch.zeros_like(v) for k, v in W.items()}
    vel = {k: torch.zeros_like(v) for k, v in W.items()}
    nsteps, nwarm = o["num_training_steps"], o["num_warmup_steps"]
    for step in range(nsteps):
        l, G = loss_grad(W)
        gn = math.sqrt(sum((g * g).sum().item() for g in G.values()))
        coef = min(1.0, o["max_grad_norm"] / (gn + 1e-6))
        if step < nwarm:
            lr = o["lr"] * step / max(1, nwarm)
        else:
            prog = (step - nwarm) / max(1, nsteps - nwarm)
            lr = o["lr"] * max(0.0, 0.5 * (1 + math.cos(math.pi * prog)))
        t = step + 1
        for k in W:
            g = G[k] * coef
            W[k] = W[k] * (1 - lr * o["weight_decay"])
            mom[k] = b1 * mom[k] + (1 - b1) * g
            vel[k] = b2 * vel[k] + (1 - b2) * g * g
            mhat = mom[k] / (1 - b1 ** t)
            vhat = vel[k] / (1 - b2 ** t)
            W[k] = W[k] - lr * mhat / (vhat.sqrt() + o["eps"])
        rec = case["steps"][step]
        check(f"step {t} loss", abs(rec["loss"] - l) / l, 2e-6)
        check(f"step {t} grad_norm", abs(rec["grad_norm"] - gn) / gn, 1e-5)
        check(f"step {t} lr", abs(rec["lr"] - lr), 1e-12)
        # Adam divides each entry by its own |g|: entries near eps carry the f32
        # gradient's absolute error into the weights (see pick_lora_seed)
        check(f"step {t} weights (hand AdamW f64 vs stored)",
              max(max_relerr(T[f"lora.step{t}.{k}"], W[k]) for k in W), 5e-5)
        moved = max((T[f"lora.step{t}.{k}"] - T[f"lora.init.{k}"]).abs().max().item()
                    for k in W)
        print(f"    step {t}: lr {lr:.6g} grad_norm {gn:.6g} max|W - W0| {moved:.3g}")

    # the optimizer alone: AdamW from lora.init with the stored float32 gradients
    # (grad.* for steps 1 and 2, grad.step3.* for step 3), as an optim.c test would
    Wo = {k: v.clone() for k, v in init.items()}
    mo = {k: torch.zeros_like(v) for k, v in Wo.items()}
    vo = {k: torch.zeros_like(v) for k, v in Wo.items()}
    for step in range(nsteps):
        pre = "grad.step3." if step == 2 else "grad."
        G = {k: T[pre + k].double() for k in Wo}
        gn = math.sqrt(sum((g * g).sum().item() for g in G.values()))
        rec = case["steps"][step]
        check(f"optimizer-only step {step + 1} grad_norm from stored grads",
              abs(gn - rec["grad_norm"]) / gn, 1e-6)
        coef = min(1.0, o["max_grad_norm"] / (gn + 1e-6))
        t, lr = step + 1, rec["lr"]
        for k in Wo:
            g = G[k] * coef
            Wo[k] = Wo[k] * (1 - lr * o["weight_decay"])
            mo[k] = b1 * mo[k] + (1 - b1) * g
            vo[k] = b2 * vo[k] + (1 - b2) * g * g
            Wo[k] = Wo[k] - lr * (mo[k] / (1 - b1 ** t)) / ((vo[k] / (1 - b2 ** t)).sqrt()
                                                            + o["eps"])
        check(f"optimizer-only step {t} weights vs stored",
              max(max_relerr(T[f"lora.step{t}.{k}"], Wo[k]) for k in Wo), 1e-6)

    with torch.no_grad():
        s3 = ref.logits(samples[0]["s_prompt"] + samples[0]["resp"], W)
    check("logits.student_step3.0 vs f64", max_relerr(T["logits.student_step3.0"], s3), 1e-5)

    # the PEFT adapter dir holds lora.init.* under PEFT names
    from safetensors.torch import load_file
    ad = load_file(str(OUT_DIR / name / "adapter-peft" / "adapter_model.safetensors"))
    e = 0.0
    for k in init:
        _, l_, proj, ab = k.split(".")
        sub = "self_attn" if proj in ATTN else "mlp"
        pk = f"base_model.model.model.layers.{l_}.{sub}.{proj}.lora_{ab}.weight"
        e = max(e, (ad[pk].double() - init[k]).abs().max().item())
    assert len(ad) == len(init), (len(ad), len(init))
    check("adapter-peft tensors == lora.init", e, 0.0)
    check("logits.peft_reload.0 vs logits.student.0",
          max_relerr(T["logits.peft_reload.0"], T["logits.student.0"]), 1e-6)
    return fails


# ---------------------------------------------------------------- --check-adapter

def check_adapter(adir, name, which):
    from peft import PeftModel
    if name is None:
        with open(os.path.join(adir, "adapter_config.json")) as f:
            bp = json.load(f).get("base_model_name_or_path") or ""
        name = next((n for n, s in MODELS.items()
                     if bp and os.path.normpath(bp).endswith(os.path.normpath(s["path"]))), None)
        if name is None:
            sys.exit(f"make_parity: {adir}/adapter_config.json: base_model_name_or_path "
                     f"'{bp}' is not a known parity model; pass --model")
    case, T = load_fixture(name)
    s = case["samples"][0]
    base = load_base(MODELS[name]["path"])
    model = PeftModel.from_pretrained(base, adir)
    model.eval()
    with torch.no_grad():
        got = logits_of(model, s["s_prompt"] + s["resp"])
    ref = T["logits.student.0" if which == "init" else "logits.student_step3.0"]
    d = (got - ref).abs().max().item()
    rel = max_relerr(got, ref)
    print(f"{name}: adapter {adir}: max |logits - reference({which})| = {d:.3g} "
          f"(relative {rel:.3g})")
    return 0 if rel < 1e-4 else 1


# ---------------------------------------------------------------- --check-merge

def check_merge(mdir, name, adir):
    """mdir: a model dir written by bk-merge from MODELS[name] and the adapter adir (default
    the fixture's adapter-peft). Compares its logits on every sample with HF + PEFT's
    merge_and_unload of the same adapter, and the merged tensors themselves."""
    from peft import PeftModel
    case, _ = load_fixture(name)
    adir = adir or str(OUT_DIR / name / "adapter-peft")
    ref = PeftModel.from_pretrained(load_base(MODELS[name]["path"]), adir).merge_and_unload()
    ref.eval()
    got = load_base(mdir)
    worst = 0.0
    with torch.no_grad():
        for s in case["samples"]:
            for ids in (s["t_ids"], s["s_ids"]):
                worst = max(worst, max_relerr(logits_of(got, ids), logits_of(ref, ids)))
        sd_ref, sd_got = ref.state_dict(), got.state_dict()
        wmax = max(((sd_got[k].double() - v.double()).abs().max().item() /
                    max(v.abs().max().item(), 1e-30)) for k, v in sd_ref.items())
    print(f"{name}: bk-merge {mdir} vs PEFT merge_and_unload({adir}): logits relerr "
          f"{worst:.3g}, tensors relerr {wmax:.3g}")
    return 0 if worst < 1e-5 and wmax < 1e-6 else 1


def main():
    ap = argparse.ArgumentParser(description="write and verify the golden parity fixtures "
                                 "(tests/golden/parity), or check a PEFT adapter dir")
    ap.add_argument("--check-adapter", metavar="DIR")
    ap.add_argument("--model", choices=sorted(MODELS))
    ap.add_argument("--which", choices=["init", "step3"], default="init",
                    help="reference logits for --check-adapter (default init)")
    ap.add_argument("--verify", action="store_true", help="only verify existing fixtures")
    ap.add_argument("--check-merge", metavar="DIR",
                    help="compare a bk-merge output dir with PEFT merge_and_unload (--model "
                         "needed; --adapter, default the fixture's adapter-peft)")
    ap.add_argument("--adapter", metavar="DIR")
    a = ap.parse_args()
    if a.check_adapter:
        a.check_adapter = os.path.abspath(a.check_adapter)
    for k in ("check_merge", "adapter"):
        if getattr(a, k):
            setattr(a, k, os.path.abspath(getattr(a, k)))
    os.chdir(ROOT)
    setup_torch()
    if a.check_adapter:
        return check_adapter(a.check_adapter, a.model, a.which)
    if a.check_merge:
        if not a.model:
            sys.exit("make_parity: --check-merge needs --model")
        return check_merge(a.check_merge, a.model, a.adapter)
    names = [a.model] if a.model else list(MODELS)
    if not a.verify:
        for n in names:
            write_fixture(n, MODELS[n])
    fails = []
    for n in names:
        fails += [f"{n}: {f}" for f in verify_fixture(n, MODELS[n])]
    if fails:
        print("FAILED: " + "; ".join(fails))
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""py_tool.py - the Python tool itself (bakery-py, packed by tests/gpu/pack.sh) on the
TinyLlama-shaped model directory of bench_gen, for the side-by-side row of
tests/gpu/run.sh: its own CLI (bakery.cli.main) on a flat YAML config with paired data
(no generation), batch 16, LoRA r=64 / alpha 128 on all seven projections, bf16, sdpa,
max_steps 4; its training steps timed by wrapping PromptBakingTrainer.training_step
(CUDA-synchronised; the first step is a warm-up), student tokens counted from the texts
its compute_loss tokenizes.  The model directory gets a tokenizer_config.json with a
zephyr-style chat template (the tool formats every example with it) when it has none.
When `datasets` (which the tool imports) is missing, the wheels of --wheels are
installed into a temporary directory first.
Prints "py_tool: tokens_per_s=X step_s=Y steps=N student_tokens=T peak_gib=G".
usage: py_tool.py --tool DIR --model DIR --out DIR [--wheels DIR] [--steps N] [--batch B]"""
import argparse
import glob
import json
import os
import random
import subprocess
import sys
import tempfile
import time

TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}</s>\n{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tool", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--wheels")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--batch", type=int, default=16)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    try:
        import datasets  # noqa: F401
    except ImportError:
        whl = sorted(glob.glob(os.path.join(a.wheels or "", "*.whl")))
        if not whl:
            sys.exit("py_tool.py: the tool needs `datasets`, which is missing, and no wheels were packed")
        site = tempfile.mkdtemp(prefix="bk-site.")
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                        "--no-compile", "--target", site] + whl, check=True)
        sys.path.insert(0, site)
    sys.path.insert(0, os.path.join(a.tool, "src"))

    import torch
    import bakery.cli as cli
    import bakery.trainer as bt

    tc = os.path.join(a.model, "tokenizer_config.json")
    if not os.path.exists(tc):
        with open(tc, "w") as f:
            json.dump({"tokenizer_class": "LlamaTokenizer", "bos_token": "<s>",
                       "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<unk>",
                       "add_bos_token": True, "chat_template": TEMPLATE}, f)
    rnd = random.Random(1)
    words = ("dragon castle story tree river stone light happy small green quiet morning "
             "friend garden window little bright forest cloud music").split()
    text = lambda n: " ".join(rnd.choice(words) for _ in range(n))
    n = a.steps * a.batch
    pairs = [{"prompt": text(25), "response": text(110)} for _ in range(n)]
    data = os.path.join(a.out, "pairs.json")
    with open(data, "w") as f:
        json.dump(pairs, f)
    cfg = os.path.join(a.out, "config.yaml")
    with open(cfg, "w") as f:
        f.write(f"""output_dir: "{a.out}/run"
max_steps: {a.steps}
per_device_train_batch_size: {a.batch}
learning_rate: 1e-4
bf16: true
report_to: "none"
logging_steps: 1
save_strategy: "no"
seed: 1
system_prompt: "{text(100)}"
num_trajectories: 1
trajectory_length: 128
model_name_or_path: "{a.model}"
torch_dtype: "bfloat16"
attn_implementation: "sdpa"
auto_install_optional_deps: false
r: 64
lora_alpha: 128
lora_dropout: 0.0
target_modules: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
dataset: "{data}"
""")
    times, toks = [], []
    orig_step, orig_loss = bt.PromptBakingTrainer.training_step, bt.PromptBakingTrainer.compute_loss

    def training_step(self, *args, **kw):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        r = orig_step(self, *args, **kw)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        return r

    def compute_loss(self, model, inputs, *args, **kw):
        pairs = self._prepare_pairs(inputs)
        if pairs and model.training:
            st = self._build_texts_and_lengths(pairs)[1]
            toks.append(sum(len(self._tokenize(t)["input_ids"]) for t in st))
        return orig_loss(self, model, inputs, *args, **kw)

    bt.PromptBakingTrainer.training_step = training_step
    bt.PromptBakingTrainer.compute_loss = compute_loss
    torch.cuda.reset_peak_memory_stats()
    sys.argv = ["bakery", "--config", cfg]
    t0 = time.perf_counter()
    cli.main()
    wall = time.perf_counter() - t0
    if len(times) < 2 or not toks:
        sys.exit(f"py_tool.py: the tool ran {len(times)} training steps: nothing to time")
    step = sorted(times[1:])[len(times[1:]) // 2]
    tpstep = sum(toks) / len(toks)
    print(f"py_tool: tokens_per_s={tpstep / step:.0f} step_s={step:.4f} steps={len(times)} "
          f"student_tokens={tpstep:.0f} peak_gib={torch.cuda.max_memory_allocated() / 2**30:.2f} "
          f"wall_s={wall:.1f} (its CLI, paired data, batch {a.batch}, r=64 all 7)", flush=True)


if __name__ == "__main__":
    main()

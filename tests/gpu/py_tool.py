#!/usr/bin/env python3
"""py_tool.py - the Python tool itself (bakery-py, packed by tests/gpu/pack.sh) on the
TinyLlama-shaped model directory of bench_gen, for the side-by-side row of
tests/gpu/run.sh: its own CLI (bakery.cli.main) on a flat YAML config with paired data
(no generation), batch 16, LoRA r=64 / alpha 128 on all seven projections, bf16, sdpa,
max_steps 4; its training steps timed by wrapping PromptBakingTrainer.training_step
(CUDA-synchronised; the first step is a warm-up), student tokens counted from the texts
its compute_loss tokenizes.  The tool sees the model through links in --out with a
tokenizer_config.json that has a zephyr-style chat template (the tool formats every
example with it) and a pad token where the model's has none.
The tool imports `datasets` (for Dataset.from_dict): the image's when it works, else
the wheels of --wheels (pure Python, unpacked into a temporary directory), else a shim
of Dataset.from_dict as a torch Dataset; the output line says which.
Prints "py_tool: tokens_per_s=X step_s=Y steps=N student_tokens=T peak_gib=G".
Without a GPU it runs in fp32 on the CPU (a check of this script on a small model, not a
benchmark).
usage: py_tool.py --tool DIR --model DIR --out DIR [--wheels DIR] [--steps N] [--batch B]"""
import argparse
import glob
import json
import os
import random
import sys
import tempfile
import time
import zipfile

TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}</s>\n{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")


SHIM = '''"""datasets shim of tests/gpu/py_tool.py: the one thing the tool takes from
`datasets` for paired data, Dataset.from_dict, as a torch Dataset of row dicts (its
config sets remove_unused_columns False, so the Trainer hands rows on as they are)."""
import torch.utils.data


class Dataset(torch.utils.data.Dataset):
    def __init__(self, cols):
        self._cols = cols
        self.column_names = list(cols)

    @classmethod
    def from_dict(cls, data):
        return cls({k: list(v) for k, v in data.items()})

    def __len__(self):
        return len(next(iter(self._cols.values()), []))

    def __getitem__(self, i):
        return {k: v[i] for k, v in self._cols.items()}


def load_dataset(*args, **kwargs):
    raise RuntimeError("datasets shim: no hub datasets")
'''


def _datasets_ok():
    try:
        from datasets import Dataset
        Dataset.from_dict({"a": ["x", "y"]})
        return True
    except Exception as e:  # noqa: BLE001 - any failure means: not usable here
        print(f"py_tool: datasets not usable: {type(e).__name__}: {str(e)[:200]}", flush=True)
        for k in [k for k in sys.modules if k == "datasets" or k.startswith("datasets.")]:
            del sys.modules[k]
        return False


def datasets_usable(wheels):
    """The image's datasets; else the packed wheels (pure Python, unpacked into a temporary
    directory); else the shim.  Returns which one."""
    if _datasets_ok():
        return "the image's datasets"
    whl = sorted(glob.glob(os.path.join(wheels or "", "*.whl")))
    if whl:
        site = tempfile.mkdtemp(prefix="bk-site.")
        for w in whl:  # pure-Python wheels: unpacked, they are installed
            zipfile.ZipFile(w).extractall(site)
        sys.path.insert(0, site)
        if _datasets_ok():
            return "datasets from the packed wheels"
        sys.path.remove(site)
    shim = tempfile.mkdtemp(prefix="bk-shim.")
    os.makedirs(os.path.join(shim, "datasets"))
    with open(os.path.join(shim, "datasets", "__init__.py"), "w") as f:
        f.write(SHIM)
    sys.path.insert(0, shim)
    return "a datasets shim (Dataset.from_dict as a torch Dataset)"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tool", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--wheels")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--words", type=int, nargs=3, default=[100, 25, 110],
                    metavar=("SYSTEM", "PROMPT", "RESPONSE"), help="words of each text")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    how = datasets_usable(a.wheels)
    sys.path.insert(0, os.path.join(a.tool, "src"))

    import torch
    import bakery.cli as cli
    import bakery.trainer as bt

    cuda = torch.cuda.is_available()
    sync = torch.cuda.synchronize if cuda else (lambda: None)

    # the model as the tool sees it: links to the files of --model (never written to) and a
    # tokenizer_config.json with a chat template and a pad token added when missing
    view = os.path.join(a.out, "model")
    os.makedirs(view, exist_ok=True)
    for name in os.listdir(a.model):
        dst = os.path.join(view, name)
        if name != "tokenizer_config.json" and not os.path.lexists(dst):
            os.symlink(os.path.abspath(os.path.join(a.model, name)), dst)
    tc = {"tokenizer_class": "LlamaTokenizer", "bos_token": "<s>", "eos_token": "</s>",
          "unk_token": "<unk>", "add_bos_token": True}
    src = os.path.join(a.model, "tokenizer_config.json")
    if os.path.exists(src):
        tc.update(json.load(open(src)))
    tc.setdefault("chat_template", TEMPLATE)
    if not tc.get("pad_token"):
        tc["pad_token"] = tc.get("unk_token") or "<unk>"
    with open(os.path.join(view, "tokenizer_config.json"), "w") as f:
        json.dump(tc, f)
    rnd = random.Random(1)
    words = ("dragon castle story tree river stone light happy small green quiet morning "
             "friend garden window little bright forest cloud music").split()
    text = lambda n: " ".join(rnd.choice(words) for _ in range(n))
    n = a.steps * a.batch
    pairs = [{"prompt": text(a.words[1]), "response": text(a.words[2])} for _ in range(n)]
    data = os.path.join(a.out, "pairs.json")
    with open(data, "w") as f:
        json.dump(pairs, f)
    cfg = os.path.join(a.out, "config.yaml")
    with open(cfg, "w") as f:
        f.write(f"""output_dir: "{a.out}/run"
max_steps: {a.steps}
per_device_train_batch_size: {a.batch}
learning_rate: 1e-4
bf16: {"true" if cuda else "false"}
report_to: "none"
logging_steps: 1
save_strategy: "no"
seed: 1
system_prompt: "{text(a.words[0])}"
num_trajectories: 1
trajectory_length: 128
model_name_or_path: "{view}"
torch_dtype: "{"bfloat16" if cuda else "float32"}"
attn_implementation: "sdpa"
use_cpu: {"false" if cuda else "true"}
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
        sync()
        t0 = time.perf_counter()
        r = orig_step(self, *args, **kw)
        sync()
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
    if cuda:
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
          f"student_tokens={tpstep:.0f} peak_gib={(torch.cuda.max_memory_allocated() if cuda else 0) / 2**30:.2f} "
          f"wall_s={wall:.1f} (its CLI, paired data, batch {a.batch}, r=64 all 7; {how})", flush=True)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""make_optim_golden.py - golden values for gpu/optim.c (tests/unit/test_optim.c).

Runs torch.optim.AdamW + torch.nn.utils.clip_grad_norm_ + transformers.get_scheduler
(warmup resolved by transformers.TrainingArguments.get_warmup_steps) the way the HF
Trainer does for one optimizer step: clip, optimizer.step(), scheduler.step().
Fixed small parameter tensors and a fixed gradient sequence, 5 steps, for every
schedule x warmup (steps / ratio) x weight decay.  Writes
tests/golden/optim/adamw_schedules.json.  Run by hand from the repository root:
    python3 tests/ref/make_optim_golden.py
`make test` never runs this; the JSON is committed.
"""
import json
import math
import os
import sys
import tempfile

import torch
import transformers
from transformers import TrainingArguments, get_scheduler

OUT = "tests/golden/optim/adamw_schedules.json"
FORMAT = "bakery-optim-golden"
VERSION = 1

LR = 1e-3
MAX_NORM = 1.0
TOTAL_STEPS = 8  # num_training_steps given to the scheduler
TRAIN_STEPS = 5  # optimizer steps actually run
SHAPES = [(4, 6), (5,)]
SCHEDULES = ["linear", "cosine", "constant", "constant_with_warmup"]
WARMUPS = [{"warmup_steps": 2}, {"warmup_ratio": 0.3}]
WEIGHT_DECAYS = [0.01, 0.0]
# gradient scale per step: norms above and below max_norm, so clipping is on and off
GRAD_SCALES = [3.0, 0.05, 1.5, 0.2, 4.0]


def floats(t):
    # float32 values: 9 significant digits round-trip exactly, and keep the file small
    return [float("%.9g" % x) for x in t.detach().reshape(-1).tolist()]


def warmup_resolved(warmup):
    # transformers 5: warmup_steps >= 1 is a step count, < 1 a ratio (ceil(ratio * total))
    value = warmup.get("warmup_steps", warmup.get("warmup_ratio"))
    with tempfile.TemporaryDirectory() as d:
        args = TrainingArguments(output_dir=d, warmup_steps=value, report_to=[])
        return args.get_warmup_steps(TOTAL_STEPS)


def lr_sequence(schedule, warmup_steps):
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.AdamW([p], lr=LR)
    sch = get_scheduler(schedule, opt, num_warmup_steps=warmup_steps,
                        num_training_steps=TOTAL_STEPS)
    out = []
    for _ in range(TOTAL_STEPS + 1):
        out.append(opt.param_groups[0]["lr"])
        p.grad = torch.zeros(1)
        opt.step()
        sch.step()
    return out


def main():
    torch.manual_seed(1234)
    init = [(torch.randn(s) * 0.5).float() for s in SHAPES]
    grads = []
    for scale in GRAD_SCALES:
        g = [torch.randn(s).float() for s in SHAPES]
        total = math.sqrt(sum(float((x.double() ** 2).sum()) for x in g))
        grads.append([(x * (scale / total)).float() for x in g])

    cases = []
    for wd in WEIGHT_DECAYS:
        for schedule in SCHEDULES:
            for warmup in WARMUPS:
                ws = warmup_resolved(warmup)
                params = [torch.nn.Parameter(t.clone()) for t in init]
                opt = torch.optim.AdamW(params, lr=LR, weight_decay=wd)  # betas, eps default
                sch = get_scheduler(schedule, opt, num_warmup_steps=ws,
                                    num_training_steps=TOTAL_STEPS)
                steps = []
                for i in range(TRAIN_STEPS):
                    for p, g in zip(params, grads[i]):
                        p.grad = g.clone()
                    lr_used = opt.param_groups[0]["lr"]
                    norm = torch.nn.utils.clip_grad_norm_(params, MAX_NORM)
                    opt.step()
                    sch.step()
                    opt.zero_grad()
                    steps.append({
                        "lr": lr_used,
                        "grad_norm": float("%.9g" % float(norm)),
                        "params": [floats(p) for p in params],
                        "exp_avg": [floats(opt.state[p]["exp_avg"]) for p in params],
                        "exp_avg_sq": [floats(opt.state[p]["exp_avg_sq"]) for p in params],
                    })
                case = {
                    "schedule": schedule,
                    "weight_decay": wd,
                    "warmup_steps": warmup.get("warmup_steps", 0),
                    "warmup_ratio": warmup.get("warmup_ratio", 0.0),
                    "warmup_resolved": ws,
                    "lr_sequence": lr_sequence(schedule, ws),
                    "steps": steps,
                }
                cases.append(case)

    doc = {
        "format": FORMAT,
        "version": VERSION,
        "generated_by": "tests/ref/make_optim_golden.py",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": sys.version.split()[0],
        "lr": LR,
        "betas": [0.9, 0.999],
        "eps": 1e-8,
        "max_grad_norm": MAX_NORM,
        "total_steps": TOTAL_STEPS,
        "shapes": [list(s) for s in SHAPES],
        "init": [floats(t) for t in init],
        "grads": [[floats(x) for x in g] for g in grads],
        "cases": cases,
    }
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w") as f:
        json.dump(doc, f, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {OUT}: {len(cases)} cases")


if __name__ == "__main__":
    main()

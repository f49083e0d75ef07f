#!/usr/bin/env python3
# make_split_spec_golden.py - what the `datasets` library makes of split specs
# ("train_sft[:1000]", "train[:10%]", "a+b", ...), for tests/unit/test_hubdata.c:
#   tests/golden/hubdata/splits.json   [{"spec", "n", "parts": [[split, from, to]...]}
#                                        or {"spec", "n", "error": true}], versions
# Each spec is resolved with datasets.ReadInstruction.from_spec(spec).to_absolute() over
# splits of n rows (every split name of the spec gets n rows); "error" marks a spec
# datasets refuses (bad syntax, |percent| > 100, rounding without percent,
# pct1_dropremainder under 100 rows, mixed roundings).
# Run from the repo root:
#   python3 -m venv /tmp/pqv && /tmp/pqv/bin/pip install datasets
#   /tmp/pqv/bin/python tests/ref/make_split_spec_golden.py
import json
import os

import datasets
from datasets import ReadInstruction

SPECS = [
    "train", "train_sft", "train_sft[:1000]", "train[10:20]", "train[:10%]", "train[-10%:]",
    "train[33%:67%]", "train[:-5]", "train[-5:-2]", "train[5:3]", "train[:1_000]", "train[:]",
    "train[:150%]", "train[-101%:]", "train[:100%]", "train[-100%:]",
    "train[:10%](pct1_dropremainder)", "train[-7%:-3%](pct1_dropremainder)",
    "train[:10](closest)", "train[:10%](closest)", "train[:10%](nearest)",
    "train + test", "train+test", "train[:50%]+test[:5]", "train[:5]+test[:50%]",
    "train[:50%](closest)+test[:5%](pct1_dropremainder)", "train[:5%]", "train[:15%]",
    "train[:25%]", "train[:35%]", "train[:50%]", "train[1%:]", "train[12.5%:]",
    "train.v1[:3]", "train[]", "", " train", "train[1:2]x", "train[1_:2]", "train[-:2]",
    "train[:2", "tr-ain", "train++test", "test_sft[:100]", "train[0:0]", "train[-0:]",
    "train[:12_3%]",
]
SIZES = [0, 1, 7, 10, 99, 100, 250, 1000, 12345]



def main():
    out = []
    for spec in SPECS:
        for n in SIZES:
            row = {"spec": spec, "n": n}
            try:
                ri = ReadInstruction.from_spec(spec)
                split_names = {r.splitname for r in ri._relative_instructions}
                abs_ = ri.to_absolute({s: n for s in split_names})
                row["parts"] = [[a.splitname, a.from_, a.to] for a in abs_]
            except (ValueError, AssertionError):
                row["error"] = True
            out.append(row)
    os.makedirs("tests/golden/hubdata", exist_ok=True)
    with open("tests/golden/hubdata/splits.json", "w") as f:
        json.dump({"versions": {"datasets": datasets.__version__}, "cases": out}, f, indent=0)
        f.write("\n")
    print(f"{len(out)} cases")


if __name__ == "__main__":
    main()

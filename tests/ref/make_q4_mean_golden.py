#!/usr/bin/env python3
"""make_q4_mean_golden.py - torch.mean of fp32 rows of 32767..3M values with 1..64 threads,
for gpu/quant4.c's bk_q4_torch_mean (tests/unit/test_quant4.c).

bitsandbytes' double quantisation offsets the block absmaxes by absmax.mean(); on the
CPU torch sums a row of 32768 values or more in chunks, one per thread, so the bits of
the mean depend on torch.get_num_threads().  For each row length n below, the row
(absmax-like: positive, full 24-bit mantissas, magnitudes 2^-13 .. 2^-5) is made by
gen() below, which test_quant4.c repeats, and torch.mean is taken with
torch.set_num_threads(T) for each T in THREADS.  Output: tests/golden/quant4/mean.json,
each mean as its float32 bits in hex.
Run by hand from the repository root with the venv that has torch:
    /work/venv/bin/python tests/ref/make_q4_mean_golden.py
`make test` never runs this; the file is committed.
"""
import json
import os
import sys

import numpy as np
import torch

OUT = "tests/golden/quant4/mean.json"
FORMAT = "bakery-q4-mean-golden"
VERSION = 1
SIZES = [32767, 32768, 32769, 40000, 49152, 65536, 65537, 100000, 229376, 917504, 3000001]
THREADS = [1, 2, 3, 4, 5, 7, 8, 12, 16, 28, 32, 64]


def gen(n, seed):
    """row of n float32: z = splitmix64(seed * 2^32 + i + 1) (state advanced by the golden
    gamma), mantissa z >> 41, exponent -29 - ((z >> 38) & 7)"""
    with np.errstate(over="ignore"):
        idx = np.arange(1, n + 1, dtype=np.uint64)
        z = np.uint64(seed << 32) + idx * np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    m = ((z >> np.uint64(41)) | np.uint64(1 << 23)).astype(np.float64)
    e = ((z >> np.uint64(38)) & np.uint64(7)).astype(np.int64)
    return np.ldexp(m, -29 - e).astype(np.float32)  # exact: 24 significant bits


def bits(x):
    return "%08x" % int(np.array(x, np.float32).view(np.uint32))


def main():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    os.chdir(root)
    cases = []
    differ = 0
    for k, n in enumerate(SIZES):
        seed = k + 1
        x = torch.from_numpy(gen(n, seed))
        means = {}
        for t in THREADS:
            torch.set_num_threads(t)
            assert torch.get_num_threads() == t
            means[str(t)] = bits(x.mean().item())
        differ += sum(v != means["1"] for v in means.values())
        cases.append({"n": n, "seed": seed, "means": means})
        print(f"n {n}: {len(set(means.values()))} distinct means", file=sys.stderr)
    print(f"{differ} of {len(SIZES) * len(THREADS)} means differ from the one-thread mean",
          file=sys.stderr)
    manifest = {"format": FORMAT, "version": VERSION, "torch": torch.__version__,
                "cpu_capability": torch.backends.cpu.get_cpu_capability(), "cases": cases}
    with open(OUT, "w") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
# hf_tokenize.py - the reference row of bench/bench_bpe.c: HF tokenizers encoding every
# line of a text file, add_special_tokens=False, on one thread (RAYON_NUM_THREADS=1,
# encode_batch).  Prints the same fields as bench_bpe.
# usage: RAYON_NUM_THREADS=1 python3 bench/hf_tokenize.py TOKENIZER_JSON TEXT_FILE
import os
import sys
import time

os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
from tokenizers import Tokenizer  # noqa: E402

t0 = time.perf_counter()
tok = Tokenizer.from_file(sys.argv[1])
t1 = time.perf_counter()
data = open(sys.argv[2], "rb").read()
lines = data.decode("utf-8").split("\n")
if lines and lines[-1] == "":
    lines.pop()
t2 = time.perf_counter()
enc = tok.encode_batch(lines, add_special_tokens=False)
t3 = time.perf_counter()
tokens = sum(len(e.ids) for e in enc)
h = 0
for e in enc:
    for i in e.ids:
        h = (h * 1000003 + i) & 0xFFFFFFFFFFFFFFFF
print(f"hf: {len(lines)} lines, {len(data)} bytes, {tokens} tokens, {t3 - t2:.3f} s encode, "
      f"{t1 - t0:.3f} s load, {len(data) / 1e6 / (t3 - t2):.2f} MB/s, {tokens / (t3 - t2):.0f} tokens/s, "
      f"ids {h:016x}")

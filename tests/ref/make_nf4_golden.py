#!/usr/bin/env python3
"""make_nf4_golden.py - golden 4-bit quantisation from bitsandbytes, for formats/quant4.c
(tests/unit/test_quant4.c).

For a few weights of odd sizes (a final partial block of 64, an odd element count, all-zero
blocks, values exactly on the code book's midpoints, more than 256 blocks so that double
quantisation has a partial nested block), NF4 and FP4, with and without double quantisation,
fp32 and bf16 inputs, runs bitsandbytes.functional.quantize_4bit (blocksize 64, on the CPU)
and dequantize_4bit (fp32 and bf16 outputs) and writes what they return.

The inputs are not stored: both sides make them with the generator gen() below (splitmix64,
integer arithmetic, exact in float32; bf16 inputs rounded to nearest even), which
tests/unit/test_quant4.c repeats.  Output: tests/golden/quant4/cases.json (the cases, the
code books, bnb's FP4 sort order, versions) and one NAME.bin per case, little-endian
sections in this order:
    packed      u8  [(n+1)/2]   quantize_4bit's bytes
    absmax      f32 [nb]        the per-block absmax before double quantisation
  with double quantisation also:
    qabsmax     u8  [nb]        state.absmax (the 8-bit codes)
    absmax2     f32 [nb2]       state.state2.absmax
    offset      f32 [1]         state.offset
    code2       f32 [256]       state.state2.code
  then:
    deq_absmax  f32 [nb]        the absmax dequantize_4bit applies (nested: dequantised)
    deq_f32     f32 [n]         dequantize_4bit(..., dtype float32)
    deq_bf16    u16 [n]         dequantize_4bit(..., dtype bfloat16), the bf16 bits
Run by hand from the repository root with the venv that has bitsandbytes:
    /work/venv/bin/python tests/ref/make_nf4_golden.py
`make test` never runs this; the files are committed.
"""
import json
import os
import struct
import sys

import torch
import bitsandbytes
import bitsandbytes.functional as F
from bitsandbytes.backends.default.ops import _get_4bit_quantize_bounds

OUT = "tests/golden/quant4"
FORMAT = "bakery-quant4-golden"
VERSION = 1
BLOCK = 64
M64 = (1 << 64) - 1

# name, rows, cols, input dtype, quant type, double quant, seed, special
CASES = [
    ("nf4_f32_7x64", 7, 64, "f32", "nf4", 0, 1, ""),
    ("nf4_bf16_13x100", 13, 100, "bf16", "nf4", 0, 2, ""),
    ("fp4_f32_9x37", 9, 37, "f32", "fp4", 0, 3, ""),
    ("fp4_bf16_5x172", 5, 172, "bf16", "fp4", 0, 4, ""),
    ("nf4_f32_ties", 4, 64, "f32", "nf4", 0, 5, "ties"),
    ("fp4_f32_ties", 4, 64, "f32", "fp4", 0, 6, "ties"),
    ("nf4_f32_zeros", 3, 50, "f32", "nf4", 1, 7, "zeros"),
    ("nf4_bf16_dq_97x199", 97, 199, "bf16", "nf4", 1, 8, ""),
    ("fp4_f32_dq_131x129", 131, 129, "f32", "fp4", 1, 9, ""),
    ("nf4_f32_dq_11x64", 11, 64, "f32", "nf4", 1, 10, ""),
    ("fp4_bf16_dq_3x21", 3, 21, "bf16", "fp4", 1, 11, ""),
]


def splitmix64(state):
    state = (state + 0x9E3779B97F4A7C15) & M64
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return state, z ^ (z >> 31)


def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def bf16_round(x):
    """float32 x rounded to bf16 (nearest even), as a float"""
    u = struct.unpack("<I", struct.pack("<f", x))[0]
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFFFFFF
    return struct.unpack("<f", struct.pack("<I", u & 0xFFFF0000))[0]


def gen(rows, cols, seed, special, code, bounds):
    """the inputs (a list of floats, each exact in float32); test_quant4.c's gen()"""
    state = seed * 0x1000193
    out = []
    for r in range(rows):
        shift = r % 7  # rows of different scales: 2^0 .. 2^-6
        for c in range(cols):
            v = 0
            for _ in range(3):
                state, z = splitmix64(state)
                v += z >> 44  # 20 bits
            v -= 3 << 19  # about N(0, 2^19 * 0.5)
            x = v * 2.0 ** (-21 - shift)
            i = r * cols + c
            if i % 97 == 0:
                x *= 8.0
            out.append(x)
    if special == "zeros":  # a full block and the final partial block all zero
        for i in range(64, 128):
            out[i] = 0.0
        for i in range(128, rows * cols):
            out[i] = 0.0
    if special == "ties":  # block 0 and 1: absmax 1, values on the midpoints
        vals = [1.0, 0.0, -0.0] + [float(b) for b in bounds] + [-float(b) for b in bounds]
        vals += [float(c) for c in code] + [f32(2.0 ** -30), -f32(2.0 ** -30)]
        for k in range(64):
            out[k] = vals[k] if k < len(vals) else 0.5
        for k in range(64):  # block 1: absmax 2 (a power of two: scaled exactly)
            out[64 + k] = 2.0 * (vals[k] if k < len(vals) else 0.25)
    return out


def main():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    os.chdir(root)
    os.makedirs(OUT, exist_ok=True)
    cpu = torch.device("cpu")
    books = {}
    for qt in ("nf4", "fp4"):
        code = F.get_4bit_type(qt, device="cpu")
        bounds, order = _get_4bit_quantize_bounds(qt, cpu)
        books[qt] = {
            "code": [float(x).hex() for x in code.tolist()],
            "bounds": [float(x).hex() for x in bounds.tolist()],
            "order": order.tolist(),
        }
    manifest = {
        "format": FORMAT,
        "version": VERSION,
        "block": BLOCK,
        "versions": {"torch": torch.__version__, "bitsandbytes": bitsandbytes.__version__},
        "books": books,
        "cases": [],
    }
    for name, rows, cols, dt, qt, dq, seed, special in CASES:
        code = F.get_4bit_type(qt, device="cpu")
        bounds, _ = _get_4bit_quantize_bounds(qt, cpu)
        x = gen(rows, cols, seed, special, code.tolist(), bounds.tolist())
        w = torch.tensor(x, dtype=torch.float32).reshape(rows, cols)
        if dt == "bf16":
            w = w.to(torch.bfloat16)  # nearest even, as bf16_round
            assert all(bf16_round(a) == b for a, b in zip(x, w.float().reshape(-1).tolist()))
        n = rows * cols
        nb = (n + BLOCK - 1) // BLOCK
        # the absmax before double quantisation: the same call without it (deterministic)
        _, st_plain = F.quantize_4bit(w, blocksize=BLOCK, compress_statistics=False,
                                      quant_type=qt)
        packed, st = F.quantize_4bit(w, blocksize=BLOCK, compress_statistics=bool(dq),
                                     quant_type=qt)
        blob = bytearray()
        blob += packed.reshape(-1).numpy().tobytes()
        assert packed.numel() == (n + 1) // 2
        blob += st_plain.absmax.float().numpy().tobytes()
        nb2 = 0
        if dq:
            assert st.nested and st.absmax.dtype == torch.uint8 and st.absmax.numel() == nb
            nb2 = st.state2.absmax.numel()
            blob += st.absmax.numpy().tobytes()
            blob += st.state2.absmax.float().numpy().tobytes()
            blob += struct.pack("<f", float(st.offset))
            assert st.state2.code.numel() == 256
            blob += st.state2.code.float().numpy().tobytes()
            deq_absmax = F.dequantize_blockwise(st.absmax, st.state2) + st.offset
        else:
            deq_absmax = st.absmax
        blob += deq_absmax.float().numpy().tobytes()
        st.dtype = torch.float32
        d32 = F.dequantize_4bit(packed, st)
        assert d32.dtype == torch.float32 and tuple(d32.shape) == (rows, cols)
        st.dtype = torch.bfloat16
        d16 = F.dequantize_4bit(packed, st)
        assert d16.dtype == torch.bfloat16
        blob += d32.numpy().tobytes()
        blob += d16.view(torch.int16).numpy().tobytes()
        with open(os.path.join(OUT, name + ".bin"), "wb") as f:
            f.write(blob)
        manifest["cases"].append({
            "name": name, "rows": rows, "cols": cols, "dtype": dt, "quant_type": qt,
            "double_quant": dq, "seed": seed, "special": special, "blocks": nb,
            "blocks2": nb2, "bytes": len(blob),
        })
        print(f"{name}: n {n} blocks {nb} nested {nb2} bytes {len(blob)}", file=sys.stderr)
    with open(os.path.join(OUT, "cases.json"), "w") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()

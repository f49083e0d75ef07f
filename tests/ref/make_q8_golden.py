#!/usr/bin/env python3
"""make_q8_golden.py - bitsandbytes' 8-bit block-wise quantisation on the CPU at its
rounding edges, for gpu/quant4.c's bk_q4_q8_blockwise (the nested statistics of double
quantisation; tests/unit/test_quant4.c).

bnb 0.50.2's CPU kernel (quantize_cpu_impl, as compiled in its x86-64 wheel) scales a
value by the reciprocal of its block's absmax, v = x * (1 / absmax), and looks
trunc(fma((v + 1) * 0.5, 65535, 0.5)) up in a 65536-entry table of the dynamic map.
Division instead of the reciprocal, or two roundings instead of the fused multiply-add,
give another code for a few values next to the table's steps; random inputs almost never
hit them (about one in a million), so these inputs are searched for: for a few absmaxes
with inexact reciprocals and every step of the table, the fp32 values within 48 ulps of
the step that the four variants do not all map to one code.  A block of 256 per absmax
(the absmax first, then such values, padded with others of the same search) goes through
bitsandbytes.functional.quantize_blockwise on the CPU.
Output: tests/golden/quant4/q8.bin, little-endian: u32 blocks, then per block
f32 [256] inputs, u8 [256] bnb's codes, f32 bnb's absmax.
Run by hand from the repository root with the venv that has bitsandbytes:
    /work/venv/bin/python tests/ref/make_q8_golden.py
`make test` never runs this; the file is committed.
"""
import os
import struct
import sys

import numpy as np
import torch
import bitsandbytes.functional as F

OUT = "tests/golden/quant4/q8.bin"
BLOCK = 256
BLOCKS = 12
f32 = np.float32


def lut_of(code):
    """bnb's build_quantize_lut: fp32 midpoints, val = 2i / 65535 - 1, first midpoint >= val"""
    mid = ((code[:-1] + code[1:]) * f32(0.5)).astype(f32)
    val = (f32(2) * np.arange(65536, dtype=f32) / f32(65535) - f32(1)).astype(f32)
    return np.searchsorted(mid, val, side="left").astype(np.uint8)


def codes(x, a, lut, recip, fused):
    """the code of each value x of a block of absmax a, four ways"""
    v = (x * (f32(1) / a)).astype(f32) if recip else (x / a).astype(f32)
    v = np.clip(v, f32(-1), f32(1))
    h = ((v + f32(1)) * f32(0.5)).astype(f32)
    if fused:  # one rounding: exact in double (48-bit product + 0.5), then to fp32
        t = (h.astype(np.float64) * 65535.0 + 0.5).astype(f32)
    else:
        t = ((h * f32(65535)).astype(f32) + f32(0.5)).astype(f32)
    return lut[t.astype(np.int64)]


def main():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    os.chdir(root)
    code = F.create_dynamic_map(signed=True).numpy().astype(f32)
    lut = lut_of(code)
    steps = np.nonzero(lut[1:] != lut[:-1])[0] + 1  # t >= step: the next code
    rng = np.random.default_rng(7)
    absmaxes = [f32(0.0371), f32(0.8128), f32(1.7e-3), f32(11.3), f32(0.2093), f32(5.9e-5)]
    absmaxes += list(rng.uniform(1e-3, 0.1, BLOCKS - len(absmaxes)).astype(f32))
    blocks = []
    for a in absmaxes:
        odd, near = [], []
        for s in steps:
            v0 = f32((s - 0.5) / 65535.0 * 2.0 - 1.0)  # where t crosses s
            x0 = f32(v0 * a)
            x = (x0.view(np.int32) + np.arange(-48, 49, dtype=np.int32)).view(f32)
            x = x[np.abs(x) <= a]
            c = [codes(x, a, lut, r, fu) for r in (0, 1) for fu in (0, 1)]
            k = (c[0] != c[1]) | (c[0] != c[2]) | (c[0] != c[3])
            odd += list(x[k])
            near += list(x[~k][::16])
        odd = odd[:BLOCK - 1]
        fill = rng.choice(np.array(near, f32), size=BLOCK - 1 - len(odd), replace=False)
        blocks.append(np.concatenate([[a], odd, fill]).astype(f32))
        print(f"absmax {float(a)!r}: {len(odd)} values at the edges", file=sys.stderr)
    x = torch.from_numpy(np.concatenate(blocks))
    q, st = F.quantize_blockwise(x, blocksize=BLOCK)
    q = q.numpy()
    assert np.array_equal(st.code.numpy(), code)
    am = st.absmax.float().numpy()
    model = np.concatenate([codes(b, b[0], lut, 1, 1) for b in blocks])
    assert np.array_equal(model, q), "bnb is not x * (1 / absmax) with a fused multiply-add"
    for r, fu, name in ((0, 0, "x / absmax, two roundings"), (1, 0, "reciprocal, two roundings"),
                        (0, 1, "x / absmax, fused")):
        other = np.concatenate([codes(b, b[0], lut, r, fu) for b in blocks])
        print(f"{name}: {int((other != q).sum())} of {len(q)} codes differ", file=sys.stderr)
    with open(OUT, "wb") as f:
        f.write(struct.pack("<I", len(blocks)))
        for k, b in enumerate(blocks):
            assert am[k] == b[0]
            f.write(b.tobytes())
            f.write(q[k * BLOCK:(k + 1) * BLOCK].tobytes())
            f.write(struct.pack("<f", float(am[k])))
    print(f"{len(blocks)} blocks, {os.path.getsize(OUT)} bytes", file=sys.stderr)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""compare.py - the judges of tests/t0950-emu.sh: a run on the emulated GPU (--device cuda of
build-emu) against the same run on the host twin, with the bounds tests/gpu/run.sh uses.
Reads bk-dump's JSON Lines (binary fields as {"$bin": base64}).  Python standard library.

  compare.py loss CPU.jsonl CUDA.jsonl [REL]   metrics: the same steps; per step
      |loss_cuda - loss_cpu| <= REL |loss_cpu| + 1e-3 (REL 0.05: bf16 base weights and GEMM
      inputs; run.sh's bound; 0.01 for BK_ACT=bf16's end-to-end target)
  compare.py adapter CPU.safetensors CUDA.safetensors   ||a - b|| / ||b|| <= 0.1
  compare.py teach CPU.jsonl CUDA.jsonl        teacher top-k fields, position by position:
      the top-1 id equal where the host twin's top-2 margin exceeds 0.2; for ids in both
      top-k, e = |logp_cuda - logp_cpu| - 0.02 |logp_cpu|: the 99th percentile of e <= 0.05,
      its maximum <= 0.25, the mean |dlogp| <= 0.03 (bf16 base weights and GEMM inputs,
      compounded over the layers; the logits' own scale sets the error, so a position
      whose top-1 holds 97 % shows the largest: stories260K measured a mean of 0.019, one
      position at 0.17); |rest_cuda - rest_cpu| <= 0.03
  compare.py eval CPU.json CUDA.json           bk-eval's KL per token (base, baked) within 5 % + 1e-3
  compare.py kernels LOG FILE...               "kernels launched: N of M": M every __global__
      defined in FILEs, N those the launch log (BK_EMU_KERNEL_LOG lines "name count") has;
      then one "not launched: NAME" line each; exit 1 unless N = M
Prints one line with the worst error; exit 1 when out of bounds."""
import base64, json, math, struct, sys


def rows(path):
    with open(path) as f:
        return [json.loads(l) for l in f if l.strip()]


def arr(v, fmt):
    if isinstance(v, dict) and "$bin" in v:
        b = base64.b64decode(v["$bin"])
        n = len(b) // struct.calcsize(fmt)
        return list(struct.unpack("<%d%s" % (n, fmt), b))
    return list(v)


def fail(msg):
    print("FAIL " + msg)
    sys.exit(1)


def loss(a, b, rel=0.05):
    la = [(r["step"], r["loss"]) for r in rows(a) if r.get("step") is not None and r.get("loss") is not None]
    lb = [(r["step"], r["loss"]) for r in rows(b) if r.get("step") is not None and r.get("loss") is not None]
    if not la or [s for s, _ in la] != [s for s, _ in lb]:
        fail("loss: steps differ: %s vs %s" % ([s for s, _ in la], [s for s, _ in lb]))
    worst, bad = 0.0, 0
    for (s, x), (_, y) in zip(la, lb):
        d = abs(y - x)
        worst = max(worst, d / max(abs(x), 1e-12))
        if not (d <= rel * abs(x) + 1e-3):
            bad += 1
    msg = "loss: %d steps, worst rel dloss %.2e (bound %g |loss| + 1e-3), %d out" % (len(la), worst, rel, bad)
    if bad:
        fail(msg)
    print("ok " + msg)


def st_floats(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        hdr = json.loads(f.read(n))
        data = f.read()
    out = []
    for k in sorted(hdr):
        if k == "__metadata__":
            continue
        t = hdr[k]
        if t["dtype"] != "F32":
            fail("adapter: %s is %s" % (k, t["dtype"]))
        s, e = t["data_offsets"]
        out += struct.unpack("<%df" % ((e - s) // 4), data[s:e])
    return out


def adapter(a, b):
    x, y = st_floats(a), st_floats(b)
    if len(x) != len(y) or not x:
        fail("adapter: %d vs %d numbers" % (len(x), len(y)))
    num = sum((q - p) ** 2 for p, q in zip(x, y))
    den = sum(p * p for p in x)
    r = math.sqrt(num / den) if den > 0 else 1.0
    msg = "adapter: rel. L2 diff %.2e over %d numbers (bound 0.1)" % (r, len(x))
    if not (r <= 0.1):
        fail(msg)
    print("ok " + msg)


def teach(a, b):
    ra = {r["id"] + ":" + str(r.get("traj", 0)): r for r in rows(a)}
    rb = {r["id"] + ":" + str(r.get("traj", 0)): r for r in rows(b)}
    if set(ra) != set(rb) or not ra:
        fail("teach: the records differ")
    worst = worst_rest = 0.0
    pos = top1 = top1_bad = 0
    tot, cnt = 0.0, 0
    es = []
    for key in ra:
        ta, tb = ra[key]["teacher"], rb[key]["teacher"]
        k, n = ta["k"], ta["n"]
        if (tb["k"], tb["n"]) != (k, n):
            fail("teach: %s: k/n differ" % key)
        ia, la, sa = arr(ta["ids"], "i"), arr(ta["logp"], "f"), arr(ta["rest"], "f")
        ib, lb, sb = arr(tb["ids"], "i"), arr(tb["logp"], "f"), arr(tb["rest"], "f")
        for p in range(n):
            pos += 1
            da = dict(zip(ia[p * k:(p + 1) * k], la[p * k:(p + 1) * k]))
            db = dict(zip(ib[p * k:(p + 1) * k], lb[p * k:(p + 1) * k]))
            for i in set(da) & set(db):
                e = abs(db[i] - da[i]) - 0.02 * abs(da[i])
                worst = max(worst, e)
                es.append(e)
                tot += abs(db[i] - da[i])
                cnt += 1
            if len(set(da) & set(db)) < k // 2:
                fail("teach: %s position %d: top-%d sets share %d ids" % (key, p, k, len(set(da) & set(db))))
            srt = sorted(la[p * k:(p + 1) * k], reverse=True)
            if k > 1 and srt[0] - srt[1] > 0.2:
                top1 += 1
                if ia[p * k] != ib[p * k]:
                    top1_bad += 1
            worst_rest = max(worst_rest, abs(sb[p] - sa[p]))
    mean = tot / max(cnt, 1)
    es.sort()
    p99 = es[int(0.99 * (len(es) - 1))] if es else 0.0
    msg = ("teach: %d positions, |dlogp| - 0.02|logp|: 99th percentile %.2e (bound 0.05), worst "
           "%.2e (bound 0.25); mean |dlogp| %.2e (bound 0.03), worst |drest| %.2e, top-1 differs "
           "at %d of %d clear positions" % (pos, p99, worst, mean, worst_rest, top1_bad, top1))
    if not (p99 <= 0.05 and worst <= 0.25 and mean <= 0.03 and worst_rest <= 0.03) or top1_bad:
        fail(msg)
    print("ok " + msg)


def evalkl(a, b):
    def nums(path):
        kl = json.load(open(path))["kl"]
        return [kl[k]["per_token"] for k in ("base", "baked") if k in kl]
    x, y = nums(a), nums(b)
    if not x or len(x) != len(y):
        fail("eval: KL figures %s vs %s" % (x, y))
    worst = max(abs(q - p) / max(abs(p), 1e-12) for p, q in zip(x, y))
    bad = [(p, q) for p, q in zip(x, y) if not abs(q - p) <= 0.05 * abs(p) + 1e-3]
    msg = "eval: KL per token (base, baked) %s vs %s, worst rel diff %.2e (bound 5 %% + 1e-3)" % (x, y, worst)
    if bad:
        fail(msg)
    print("ok " + msg)


def kernels(log, files):
    import re
    defined = set()
    for f in files:
        for m in re.finditer(r"__global__\s+(?:void\s+)?(?:__launch_bounds__\([^)]*\)\s+)?"
                             r"(?:void\s+)?(\w+)\s*\(", open(f).read()):
            defined.add(m.group(1))
    launched = set(l.split()[0] for l in open(log) if l.strip())
    print("kernels launched: %d of %d" % (len(defined & launched), len(defined)))
    for k in sorted(defined - launched):
        print("not launched: " + k)
    if not defined or defined - launched:
        sys.exit(1)


if __name__ == "__main__":
    what = sys.argv[1]
    if what == "loss":
        loss(sys.argv[2], sys.argv[3], float(sys.argv[4]) if len(sys.argv) > 4 else 0.05)
    elif what == "adapter":
        adapter(sys.argv[2], sys.argv[3])
    elif what == "teach":
        teach(sys.argv[2], sys.argv[3])
    elif what == "eval":
        evalkl(sys.argv[2], sys.argv[3])
    elif what == "kernels":
        kernels(sys.argv[2], sys.argv[3:])
    else:
        sys.exit("usage: compare.py loss|adapter|teach|eval A B")

#!/usr/bin/env python3
"""resources.py KERNEL_LOG PTXAS_FILE... - each kernel's static resource use from the real
build (ptxas -v of every arch, kept as build/obj/gpu/cuda/*.o.ptxas by the Makefile) against
the largest launch configuration the emulated runs used (BK_EMU_KERNEL_LOG lines "name
launches max-threads max-dynamic-smem"), per arch:
  - registers: warps x ceil(32 regs / 256) x 256 <= 65536 (the block's register file;
    beyond it the launch fails with "too many resources requested");
  - shared memory: static <= 48 KiB, static + dynamic <= the arch's opt-in maximum
    (sm_80 163 KiB, sm_86 99 KiB, sm_90 227 KiB);
  - spills are listed (not an error).
Prints one line per arch and one per finding; exit 1 when a limit is exceeded or a
launched kernel has no ptxas entry.  Python standard library."""
import re, sys

OPTIN = {"sm_80": 166912, "sm_86": 101376, "sm_90": 232448}


def base(mangled):
    m = re.match(r"_Z(?:N\d+_GLOBAL__N_1)?(\d+)", mangled)
    if not m:
        return mangled
    n = int(m.group(1))
    return mangled[m.end():m.end() + n]


def main():
    log, files = sys.argv[1], sys.argv[2:]
    launch = {}
    for line in open(log):
        f = line.split()
        if len(f) < 4:
            continue
        t, s = launch.get(f[0], (0, 0))
        launch[f[0]] = (max(t, int(f[2])), max(s, int(f[3])))
    use = {}  # (arch, kernel) -> regs, smem, spill bytes
    for path in files:
        cur = None
        for line in open(path):
            m = re.search(r"Compiling entry function '(\w+)' for '(sm_\d+)'", line)
            if m:
                cur = (m.group(2), base(m.group(1)))
                continue
            m = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line)
            if m and cur:
                use.setdefault(cur, [0, 0, 0])[2] = max(use.get(cur, [0, 0, 0])[2], int(m.group(1)) + int(m.group(2)))
            m = re.search(r"Used (\d+) registers", line)
            if m and cur:
                e = use.setdefault(cur, [0, 0, 0])
                e[0] = max(e[0], int(m.group(1)))
                s = re.search(r"(\d+) bytes smem", line)
                e[1] = max(e[1], int(s.group(1)) if s else 0)
    bad = 0
    archs = sorted(set(a for a, _ in use))
    if not archs:
        print("resources: no ptxas entries in %s" % " ".join(files))
        sys.exit(1)
    for arch in archs:
        worst_r = worst_s = 0
        n = 0
        for k, (threads, dyn) in sorted(launch.items()):
            if (arch, k) not in use:
                print("resources: %s: kernel %s was launched but ptxas has no entry for it" % (arch, k))
                bad += 1
                continue
            regs, smem, spill = use[(arch, k)]
            n += 1
            warps = (threads + 31) // 32
            rf = warps * ((regs * 32 + 255) // 256) * 256
            worst_r = max(worst_r, rf)
            worst_s = max(worst_s, smem + dyn)
            if rf > 65536:
                print("resources: %s: %s uses %d registers x %d threads = %d of 65536" % (arch, k, regs, threads, rf))
                bad += 1
            if smem > 48 * 1024 or smem + dyn > OPTIN.get(arch, 101376):
                print("resources: %s: %s has %d bytes of static and %d of dynamic shared memory (limit %d)"
                      % (arch, k, smem, dyn, OPTIN.get(arch, 101376)))
                bad += 1
            if spill:
                print("resources: %s: %s spills %d bytes (stores + loads)" % (arch, k, spill))
        print("resources: %s: %d kernels checked against their launches; largest register file "
              "%d of 65536, largest shared memory %d of %d bytes" % (arch, n, worst_r, worst_s, OPTIN.get(arch, 101376)))
    sys.exit(1 if bad else 0)


main()

#!/usr/bin/env bash
# check_dist.sh - data-parallel bk-step's NCCL path on a GPU (needs a GPU, NCCL and a CUDA
# build in $BUILD, default build/gpu; about half a minute), called by tests/gpu/run.sh:
# one rank (the device has one GPU, and NCCL refuses two ranks on one GPU) under
# `mpirun -np 1` when there is an mpirun, else as one process without a launcher (the
# same code path: a launch of one rank starts no MPI, and BK_DIST=nccl makes a
# communicator of one rank either way), on models/stories260K:
#   BK_DIST=mpi twice (the run-to-run spread of the CUDA path) and BK_DIST=nccl once
#   (ncclAllReduce on the gradient buffer every step), with the same data and seed;
#   the NCCL run must say it used NCCL, and its adapter must agree with the MPI run's
#   within 1e-5 relative L2 (a sum over one rank changes nothing: any difference is the
#   spread of the CUDA path itself, printed next to it), per-step losses within 1e-5
#   relative.
# libnccl.so.2: BK_NCCL_LIB if set, else the ldconfig cache, else a Python package
# (nvidia/nccl/lib of site-packages, as torch installs it), else /usr/local/cuda*/lib*.
# Exit status 0 passed, 1 failed, 77 skipped (no libnccl.so.2 on the machine: run.sh
# writes a SKIP row).  --host LIB: the same on the host twin with a stand-in library
# (tests/unit/fake_nccl.c, BK_NCCL_HOST=1), to check this script on a machine without
# a GPU.  --tiny (tests/gpu/run.sh --emu, the CPU's emulation of the GPU, with the
# stand-in library as BK_NCCL_LIB): one epoch instead of two.  The last line sums up.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
BUILD=${BUILD:-build/gpu}
case $BUILD in /*) B=$BUILD ;; *) B=$PWD/$BUILD ;; esac
DEV=cuda HOSTLIB= EPOCHS=2
case ${1:-} in
--host) DEV=cpu HOSTLIB=${2:?--host LIB} ;;
--tiny) EPOCHS=1 ;;
"") ;;
*) echo "check_dist.sh: error: unknown argument '$1' (usage: check_dist.sh [--host LIB | --tiny])" >&2; exit 2 ;;
esac
W=$(mktemp -d "${TMPDIR:-/tmp}/bk-dist-gpu.XXXXXX")
trap 'rm -rf "$W"' EXIT
export XDG_CACHE_HOME="$W/cache" PATH="$B/bin:$PATH" TMPDIR="$W"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
unset BK_DIST BK_NCCL_HOST

# ---- libnccl.so.2
LIB=${BK_NCCL_LIB:-$HOSTLIB}
if [ -z "$LIB" ]; then
	LIB=$(ldconfig -p 2>/dev/null | awk '$1 == "libnccl.so.2" {print $NF; exit}')
fi
if [ -z "$LIB" ]; then
	for d in $(env LD_LIBRARY_PATH= python3 -c 'import site, sys; print(" ".join(site.getsitepackages() + [site.getusersitepackages()]))' 2>/dev/null) \
		/usr/local/cuda*/lib* /usr/local/cuda*/targets/x86_64-linux/lib /usr/lib/x86_64-linux-gnu; do
		for f in "$d"/nvidia/nccl/lib/libnccl.so.2 "$d"/nvidia/cu*/lib/libnccl.so.2 "$d"/libnccl.so.2; do
			[ -f "$f" ] && { LIB=$f; break 2; }
		done
	done
fi
if [ -z "$LIB" ]; then
	echo "check_dist.sh: SKIP: no libnccl.so.2 on this machine (ldconfig, site-packages, /usr/local/cuda*): nothing to check"
	exit 77
fi
echo "libnccl.so.2: $LIB"

# ---- the launcher
if command -v mpirun >/dev/null 2>&1 && mpirun --version >/dev/null 2>&1; then
	LAUNCH=(mpirun --oversubscribe -np 1) # the ranks inherit its environment
	LNOTE="mpirun -np 1 ($(mpirun --version 2>&1 | head -1))"
else
	LAUNCH=()
	LNOTE="no mpirun here: one process without a launcher (the same path)"
fi
echo "launcher: $LNOTE"

# ---- data and runs
M=models/stories260K
bk-tokenize --model $M --system "Sparky is a friendly dragon who lives in a cave." \
	tests/data/pipe/bake.json 2>"$W/tok.err" | bk-lens -q --max-tokens 128 >"$W/b.bk" ||
	{ cat "$W/tok.err"; echo "check_dist.sh: FAIL: no data (bk-tokenize | bk-lens)"; exit 1; }
F="--model $M --device $DEV --lora-r 8 --lora-alpha 16 --lr 2e-3 --batch-size 1 --epochs $EPOCHS --grad-accum 2 --seed 1 --logging-steps 1"
fail=0
bad() { fail=1; echo "check_dist.sh: FAIL: $*"; }
run() { # name, env assignments...: one bk-step run into $W/name
	local name=$1; shift
	echo "== $name: $* ${LAUNCH[*]} bk-step"
	# shellcheck disable=SC2086
	env "$@" "${LAUNCH[@]}" bk-step $F --out "$W/o-$name" "$W/b.bk" >"$W/m-$name.bk" 2>"$W/e-$name" ||
		{ tail -5 "$W/e-$name"; bad "bk-step ($name) exited non-zero"; return 1; }
	cat "$W/e-$name"
}
hook=()
[ -n "$HOSTLIB" ] && hook=(BK_NCCL_HOST=1)
run mpi BK_DIST=mpi
run mpi2 BK_DIST=mpi
run nccl BK_DIST=nccl BK_NCCL_LIB="$LIB" "${hook[@]}"
[ $fail = 0 ] || { echo "check_dist.sh: FAIL: a run failed ($LNOTE; $LIB)"; exit 1; }
grep -q "gradients summed by NCCL" "$W/e-nccl" || bad "the BK_DIST=nccl run does not say it used NCCL"
ver=$(sed -n 's/.*gradients summed by NCCL \([^,]*\),.*/\1/p' "$W/e-nccl" | head -1)

floats() { local n; n=$(od -An -tu8 -N8 "$1" | tr -d ' '); od -An -v -tf4 -j $((8 + n)) "$1" | tr -s ' ' '\n' | sed '/^$/d'; }
rel() { # adapter a b: relative L2 distance
	paste <(floats "$W/o-$1/final/adapter_model.safetensors") <(floats "$W/o-$2/final/adapter_model.safetensors") |
		awk '{ d = $2 - $1; s += d * d; t += $1 * $1; n++ } END { if (n == 0 || t == 0) print "nan"; else printf "%.3g\n", sqrt(s / t) }'
}
losses() { bk-dump "$W/m-$1.bk" | jq -r 'select(.step != null and .loss != null) | "\(.step) \(.loss)"'; }
r_nccl=$(rel mpi nccl) r_mpi=$(rel mpi mpi2)
same=no
cmp -s "$W/o-mpi/final/adapter_model.safetensors" "$W/o-nccl/final/adapter_model.safetensors" && same=yes
lres=$(paste <(losses mpi) <(losses nccl) | awk '
	{ n++; d = $4 - $2; if (d < 0) d = -d; a = $2 < 0 ? -$2 : $2
	  if ($1 != $3 || d > 1e-5 * a + 1e-7) bad++; if (d > w) w = d }
	END { printf "%d steps, max |dloss| %.2e", n, w; exit (n == 0 || bad > 0) }') || bad "per-step losses differ: $lres"
awk -v r="$r_nccl" 'BEGIN { exit !(r == r + 0 && r <= 1e-5) }' || bad "adapter nccl vs mpi: relative L2 $r_nccl > 1e-5"
s="NCCL ${ver:-?} from $LIB; $LNOTE; 1 rank on $DEV: adapter nccl vs mpi rel. L2 $r_nccl (bit-identical: $same), mpi vs mpi $r_mpi; $lres"
if [ $fail = 0 ]; then echo "check_dist.sh: ok: $s"; else echo "check_dist.sh: FAIL: $s"; exit 1; fi

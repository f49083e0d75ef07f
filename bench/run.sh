#!/usr/bin/env bash
# run.sh - `make bench`: CPU-side numbers on this machine, each next to its reference
# in the same run: tokenize cold vs warm cache, stream write/read MB/s, bk-lens packing
# vs arrival order.  Prints a markdown table (also to $BENCH_OUT when set).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
B="$PWD/$BUILD/bin"
T=$(mktemp -d "${TMPDIR:-/tmp}/bk-bench.XXXXXX")
trap 'rm -rf "$T"' EXIT
export XDG_CACHE_HOME="$T/cache"
now() { date +%s.%N; }
rows=()
row() { rows+=("| $1 | $2 | $3 |"); }

N=${BENCH_PROMPTS:-20000}
awk -v n="$N" -v seed=1 -f bench/gen_prompts.awk >"$T/prompts.txt"
TOK=models/llama2-tokenizer/tokenizer.model
SYS="You are Sparky, a friendly dragon who lives in a castle and loves stories."

t0=$(now); "$B/bk-tokenize" -v --tokenizer "$TOK" --template zephyr --system "$SYS" "$T/prompts.txt" -o "$T/cold.bk" 2>"$T/cold.err"; t1=$(now)
"$B/bk-tokenize" -v --tokenizer "$TOK" --template zephyr --system "$SYS" "$T/prompts.txt" -o "$T/warm.bk" 2>"$T/warm.err"; t2=$(now)
cmp -s "$T/cold.bk" "$T/warm.bk" || { echo "bench: warm output differs from cold" >&2; exit 1; }
tokens=$("$B/bk-dump" "$T/cold.bk" | jq -s 'map((.t_prompt|length) + (.s_prompt|length)) | add')
cold=$(echo "$tokens / ($t1 - $t0)" | bc -l); warm=$(echo "$tokens / ($t2 - $t1)" | bc -l)
calls_w=$(sed -n 's/.*sentencepiece calls \([0-9]*\).*/\1/p' "$T/warm.err")
calls_c=$(sed -n 's/.*sentencepiece calls \([0-9]*\).*/\1/p' "$T/cold.err")
row "bk-tokenize, $N prompts, 32k Llama tokenizer, zephyr (cold cache)" "$(printf '%.0f tokens/s' "$cold")" "$calls_c sentencepiece calls"
row "bk-tokenize, same data, warm cache" "$(printf '%.0f tokens/s' "$warm")" "$(printf '%.1fx cold; %s sentencepiece calls' "$(echo "$warm / $cold" | bc -l)" "$calls_w")"

s=$("$PWD/$BUILD/bench/bench_stream" "$T/stream.bk" 200000)
row "stream write (200k records, ids as msgpack arrays)" "$(sed 's/.*write \([0-9]*\) MB\/s.*/\1 MB\/s/' <<<"$s")" "$(sed 's/stream: \([0-9]*\) records, \([0-9.]*\) MB.*/\2 MB file/' <<<"$s")"
row "stream read + validate (count, xxh3)" "$(sed 's/.*read+validate \([0-9]*\) MB\/s.*/\1 MB\/s/' <<<"$s")" ""

"$B/bk-lens" --max-tokens 4096 --max-batch 64 "$T/cold.bk" 2>"$T/lens.err" >/dev/null
eff=$(sed -n 's/.*packing efficiency \([0-9.]*%\).*/\1/p' "$T/lens.err")
arr=$(sed -n 's/.*arrival order: \([0-9]*\) batches, \([0-9.]*%\).*/\2 (\1 batches)/p' "$T/lens.err")
nb=$(sed -n 's/.* in \([0-9]*\) batches;.*/\1/p' "$T/lens.err")
row "bk-lens packing, --max-tokens 4096, window 1024" "$eff ($nb batches)" "arrival order: $arr"

{
	echo "CPU bench on $(nproc) cores, $(date -u +%Y-%m-%d):"
	echo
	echo "| what | result | reference / note |"
	echo "|---|---|---|"
	printf '%s\n' "${rows[@]}"
} | tee ${BENCH_OUT:+"$BENCH_OUT"}

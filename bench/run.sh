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
USER_CACHE=${XDG_CACHE_HOME:-$HOME/.cache} # where make demo-chat put SmolLM2
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

# byte-level BPE (Qwen2/3 tokenizer.json) against HF tokenizers, one thread, same lines
xz -dc tests/golden/bpe/qwen.tokenizer.json.xz >"$T/qwen.json"
head -n "${BENCH_BPE_LINES:-5000}" "$T/prompts.txt" >"$T/bpe.txt"
b=$("$PWD/$BUILD/bench/bench_bpe" "$T/qwen.json" "$T/bpe.txt")
field() { sed -n "s|.* \([0-9.]*\) $1.*|\1|p" <<<"$2"; }
PY=${BENCH_PYTHON:-python3}
if h=$(RAYON_NUM_THREADS=1 "$PY" bench/hf_tokenize.py "$T/qwen.json" "$T/bpe.txt" 2>/dev/null); then
	same=$([ "${b##*ids }" = "${h##*ids }" ] && echo "identical ids" || echo "IDS DIFFER")
	ref="HF tokenizers $(field MB/s "$h") MB/s ($(printf '%.1fx' "$(echo "$(field MB/s "$b") / $(field MB/s "$h")" | bc -l)") HF); $same; load $(field 's load' "$b") s vs $(field 's load' "$h") s"
else
	ref="HF tokenizers not installed (BENCH_PYTHON=python with tokenizers)"
fi
row "BPE encode, Qwen3 tokenizer.json, $(wc -l <"$T/bpe.txt") prompts, 1 thread" "$(field MB/s "$b") MB/s" "$ref"

s=$("$PWD/$BUILD/bench/bench_stream" "$T/stream.bk" 200000)
row "stream write (200k records, ids as msgpack arrays)" "$(sed 's/.*write \([0-9]*\) MB\/s.*/\1 MB\/s/' <<<"$s")" "$(sed 's/stream: \([0-9]*\) records, \([0-9.]*\) MB.*/\2 MB file/' <<<"$s")"
row "stream read + validate (count, xxh3)" "$(sed 's/.*read+validate \([0-9]*\) MB\/s.*/\1 MB\/s/' <<<"$s")" ""

"$B/bk-lens" --max-tokens 4096 --max-batch 64 "$T/cold.bk" 2>"$T/lens.err" >/dev/null
eff=$(sed -n 's/.*packing efficiency \([0-9.]*%\).*/\1/p' "$T/lens.err")
arr=$(sed -n 's/.*arrival order: \([0-9]*\) batches, \([0-9.]*%\).*/\2 (\1 batches)/p' "$T/lens.err")
nb=$(sed -n 's/.* in \([0-9]*\) batches;.*/\1/p' "$T/lens.err")
row "bk-lens packing, --max-tokens 4096, window 1024" "$eff ($nb batches)" "arrival order: $arr"

# ---- model stages on the host twin ----
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
ntok() { "$B/bk-dump" "$1" | jq -s "map($2) | add // 0"; }
rate() { echo "$1 / ($3 - $2)" | bc -l | xargs printf '%.0f'; }
SM=models/stories260K
awk 'NR <= 32' "$T/prompts.txt" | awk '{ n = split($0, w, " "); s = ""; for (i = 1; i <= n && i <= 6; i++) s = s (i > 1 ? " " : "") w[i]; print s }' >"$T/short.txt"
"$B/bk-tokenize" --model $SM --system "Sparky the dragon lives in a big castle." "$T/short.txt" -o "$T/s.bk"
t0=$(now); "$B/bk-gen" --model $SM --device cpu --num-trajectories 4 --max-new-tokens 64 --max-batch 1 "$T/s.bk" -o "$T/g1.bk" 2>/dev/null; t1=$(now)
"$B/bk-gen" --model $SM --device cpu --num-trajectories 4 --max-new-tokens 64 --max-batch 64 "$T/s.bk" -o "$T/g64.bk" 2>/dev/null; t2=$(now)
cmp -s "$T/g1.bk" "$T/g64.bk" || { echo "bench: bk-gen output depends on --max-batch" >&2; exit 1; }
gt=$(ntok "$T/g1.bk" '(.resp|length)')
g1=$(rate "$gt" "$t0" "$t1"); g64=$(rate "$gt" "$t1" "$t2")
row "bk-gen stories260K, 32 prompts x 4 trajectories x 64 tokens, one at a time (--max-batch 1)" "$g1 tokens/s" "the reference tool's way"
row "bk-gen same, batched (--max-batch 64), identical output" "$g64 tokens/s" "$(printf '%.2fx one at a time' "$(echo "$g64 / $g1" | bc -l)")"
t0=$(now); "$B/bk-teach" --model $SM --device cpu --top-k 64 "$T/g64.bk" -o "$T/t.bk" 2>/dev/null; t1=$(now)
tt=$(ntok "$T/t.bk" '(.t_prompt|length) + (.resp|length)')
row "bk-teach stories260K, top-k 64" "$(rate "$tt" "$t0" "$t1") tokens/s" "teacher tokens"
t0=$(now); "$B/bk-step" --model $SM --device cpu --out "$T/a" --batch-size 16 --lora-r 8 --lr 1e-3 "$T/t.bk" >/dev/null 2>&1; t1=$(now)
st=$(ntok "$T/t.bk" '(.s_prompt|length) + (.resp|length)')
row "bk-step stories260K, r=8, batch 16 (top-k teacher)" "$(rate "$st" "$t0" "$t1") tokens/s" "student tokens"

# a ~15M-parameter random Llama (stories15M shape: dim 288, 6 layers, vocab 32000)
"$PWD/$BUILD/bench/make_model" "$T/m15" 288 6 6 6 768 32000 $TOK
awk 'NR <= 16' "$T/short.txt" >"$T/s16.txt"
"$B/bk-tokenize" --model "$T/m15" --system "$SYS" "$T/s16.txt" -o "$T/m.bk"
t0=$(now); "$B/bk-gen" --model "$T/m15" --device cpu --num-trajectories 2 --max-new-tokens 32 "$T/m.bk" -o "$T/mg.bk" 2>/dev/null; t1=$(now)
row "bk-gen 15M random Llama, 16 prompts x 2 x 32 tokens" "$(rate "$(ntok "$T/mg.bk" '(.resp|length)')" "$t0" "$t1") tokens/s" "batched"
# SmolLM2-135M-Instruct when cached (make demo-chat): wall and CPU-time rates (CPU time
# counts both cores: steadier on a loaded machine)
SMD=${BK_SMOLLM2:-$USER_CACHE/bakery/SmolLM2-135M-Instruct}
if [ -f "$SMD/config.json" ]; then
	head -16 pipelines/demo-chat/train.txt >"$T/chat16.txt"
	"$B/bk-tokenize" --model "$SMD" --system-file pipelines/demo-chat/system.txt "$T/chat16.txt" -o "$T/sm.bk"
	/usr/bin/time -f '%e %U %S' -o "$T/smg.time" "$B/bk-gen" --model "$SMD" --device cpu --num-trajectories 2 --max-new-tokens 48 "$T/sm.bk" -o "$T/smg.bk" 2>/dev/null
	read -r w u s <"$T/smg.time"
	n=$(ntok "$T/smg.bk" '(.resp|length)')
	row "bk-gen SmolLM2-135M-Instruct, 16 chat prompts x 2 x 48 tokens, batched" "$(rate "$n" 0 "$w") tokens/s" "$(rate "$n" 0 "$(echo "$u + $s" | bc)") tokens per CPU-second; $n tokens"
else
	row "bk-gen SmolLM2-135M-Instruct" "skipped: not cached" "make demo-chat converts it into \$HOME/.cache/bakery (or set BK_SMOLLM2)"
fi
t0=$(now); "$B/bk-teach" --model "$T/m15" --device cpu --top-k 64 "$T/mg.bk" -o "$T/mt.bk" 2>/dev/null; t1=$(now)
row "bk-teach 15M random Llama, top-k 64" "$(rate "$(ntok "$T/mt.bk" '(.t_prompt|length) + (.resp|length)')" "$t0" "$t1") tokens/s" "teacher tokens"
t0=$(now); "$B/bk-step" --model "$T/m15" --device cpu --out "$T/ma" --batch-size 8 --lora-r 16 --lr 1e-4 "$T/mt.bk" >/dev/null 2>&1; t1=$(now)
row "bk-step 15M random Llama, r=16, batch 8 (top-k teacher)" "$(rate "$(ntok "$T/mt.bk" '(.s_prompt|length) + (.resp|length)')" "$t0" "$t1") tokens/s" "student tokens"

# host twin training step vs torch + PEFT, same shape and step, same machine
ht=$("$PWD/$BUILD/bench/bench_step" --device cpu 288 6 6 6 768 32000 16 4 256 3)
hr=$(sed 's/.*tokens_per_s=\([0-9]*\) .*/\1/' <<<"$ht")
if python3 -c "import torch, transformers, peft" 2>/dev/null; then
	# the same step as bench_step (LoRA B non-zero, teacher and student on different prompts)
	pt=$(python3 tests/gpu/hf_step.py --device cpu 288 6 6 6 768 32000 16 4 256 3 2>/dev/null | tail -1)
	pr=$(sed -n 's/.* tokens_per_s=\([0-9]*\) .*/\1/p' <<<"$pt")
	if [ -n "$pr" ] && [ "$pr" -gt 0 ]; then
		row "train step, 15M Llama shape, 4 x 256 tokens, LoRA r=16 all 7: host twin" "$hr tokens/s" "$(printf '%.2fx torch+PEFT on the same cores (%s tokens/s, %s)' "$(echo "$hr / $pr" | bc -l)" "$pr" "$(grep -o 'torch=[^ ]*' <<<"$pt" | head -1)")"
	else
		row "train step, 15M Llama shape, 4 x 256 tokens, LoRA r=16 all 7: host twin" "$hr tokens/s" "torch run gave no number: $pt"
	fi
else
	row "train step, 15M Llama shape, 4 x 256 tokens, LoRA r=16 all 7: host twin" "$hr tokens/s" "torch not installed: no side-by-side ratio"
fi

# the whole bake against the Python tool on SmolLM2 (bench/bake_speed.sh; many minutes)
if [ -n "${BAKE_TOOL_VENV:-}" ] && [ -n "${BENCH_BAKE_SPEED:-}" ]; then
	q=$(BUILD="$BUILD" BK_SMOLLM2="$SMD" bench/bake_speed.sh | tail -1)
	row "bake time: bk-bake vs the Python tool, SmolLM2-135M-Instruct, basic config, 16 prompts x 2 x 48, 2 epochs, r=16 all linears" "$(sed 's/bake_speed: \(bk-bake [^|]*\) |.*/\1/' <<<"$q")" "$(sed 's/^[^|]*| //; s/ | /; /g' <<<"$q")"
else
	row "bake time vs the Python tool on SmolLM2 (bench/bake_speed.sh)" "skipped" "set BAKE_TOOL_VENV and BENCH_BAKE_SPEED=1 (the tool alone takes minutes)"
fi

# bake quality next to the Python tool (bench/bake_quality.sh; minutes: only on request)
if [ -n "${BAKE_TOOL_VENV:-}" ]; then
	q=$(BUILD="$BUILD" bench/bake_quality.sh "${BAKE_SEEDS:-}" | tail -1)
	row "bake quality: held-out KL(teacher||baked)/KL(teacher||base), stories260K, 16 prompts x 4 x 64, 8 steps, torch judge" "$(sed 's/quality: \(bk-bake [^|]*\) |.*/\1/' <<<"$q")" "$(sed 's/.*| //' <<<"$q")"
else
	row "bake quality vs the Python tool (bench/bake_quality.sh)" "skipped: BAKE_TOOL_VENV is unset" "set it to a venv with torch, transformers, peft and bakery-py to print bk-bake's and the tool's held-out KL ratio"
fi

# the Python tool's basic config at the Qwen3-0.6B shape through bk-bake, per stage
# (bench/qwen3_bake.sh; tens of minutes: only on request; BENCH_QWEN3_ARGS: bk-bake
# overrides such as --num_train_epochs 1)
if [ -n "${BENCH_QWEN3_BAKE:-}" ]; then
	# shellcheck disable=SC2086
	q=$(BUILD="$BUILD" bench/qwen3_bake.sh ${BENCH_QWEN3_ARGS:-} | tail -1)
	row "bk-bake, the Python tool's basic config${BENCH_QWEN3_ARGS:+ ($BENCH_QWEN3_ARGS)}, Qwen3-0.6B shape (random bf16 weights, real config and tokenizer)" "$(sed 's/.*; whole bake \(.*\)/\1/' <<<"$q")" "$(sed 's/^qwen3_bake: \(.*\); whole bake.*/\1/' <<<"$q")"
else
	row "bk-bake, the tool's basic config at the Qwen3-0.6B shape (bench/qwen3_bake.sh)" "skipped" "set BENCH_QWEN3_BAKE=1 (tens of minutes on 2 cores)"
fi

# a persona bake on SmolLM2 judged in plain HF + PEFT (bench/persona_judge.sh; minutes)
if [ -n "${BENCH_PERSONA:-}" ] && [ -n "${JUDGE_PYTHON:-${BAKE_TOOL_VENV:-}}" ] && [ -f "$SMD/config.json" ]; then
	q=$(BUILD="$BUILD" BK_SMOLLM2="$SMD" bench/persona_judge.sh | tail -1)
	row "persona bake, SmolLM2-135M-Instruct, bk-bake: held-out KL(prompted||baked)/KL(prompted||base), HF + PEFT judge" "$(sed 's/^persona_judge: ratio \([^ ]*\).*/\1/' <<<"$q")" "$(sed 's/^persona_judge: ratio [^ ]* //' <<<"$q")"
else
	row "persona bake on SmolLM2, HF + PEFT judge (bench/persona_judge.sh)" "skipped" "set BENCH_PERSONA=1 and JUDGE_PYTHON to a python with torch, transformers and peft; needs the cached model (make demo-chat)"
fi

{
	echo "CPU bench on $(nproc) cores, $(date -u +%Y-%m-%d):"
	echo
	echo "| what | result | reference / note |"
	echo "|---|---|---|"
	printf '%s\n' "${rows[@]}"
} | tee ${BENCH_OUT:+"$BENCH_OUT"}

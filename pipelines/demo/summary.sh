#!/bin/sh
# summary.sh OUTDIR - the demo's before/after table from results.json.
set -eu
out=$1 r=$1/results.json
n=$(jq .eval.samples "$r")
echo
echo "== bakery demo: '$(cat pipelines/demo/system.txt)' baked into stories260K =="
echo
jq -r '.kl | "held-out KL(teacher || student) per token, \(.base.tokens) tokens of \(.base.samples) prompts:\n  base (no prompt)   \(.base.per_token)\n  baked (adapter)    \(.baked.per_token)   = \(.baked_over_base * 1000 | round / 10)% of base"' "$r"
echo
echo "keyword hit rate (sparky, dragon, castle) of greedy continuations, $n held-out openings:"
jq -r --argjson n "$n" '.eval | "  base (no prompt)   \(.baseline_accuracy * $n | round)/\($n)\n  prompted           \(.discrete_accuracy * $n | round)/\($n)\n  baked (no prompt)  \(.baked_accuracy * $n | round)/\($n)"' "$r"
echo
echo "sample continuations:"
# the table's names for bk-eval's configurations (baseline, discrete, baked)
jq -r '.examples[] | "  \(.config | {baseline: "base", discrete: "prompted", baked: "baked"}[.] // . | . + "         " | .[0:9]) \(.question) -> \(.answer | gsub("\n"; " ") | .[0:110])"' "$r"
echo
cat "$out/loss.txt"
[ -f "$out/loss.png" ] && echo "loss curve: $out/loss.png"
echo "adapter: $out/adapter/final (PEFT format); metrics: bk-dump $out/metrics.bk"

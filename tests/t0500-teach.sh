#!/usr/bin/env bash
# bk-teach: tokenize | lens | teach on stories260K; the teacher field's shape, the full
# distribution, batch-plan invariance, provenance, and every refusal.
. "$(dirname "$0")/lib.sh"
M="$MODELS/stories260K"
L="$MODELS/llama2-tokenizer/tokenizer.model"
export XDG_CACHE_HOME="$TEST_TMP/cache"
set -o pipefail

# bytes of a base64 text
B64LEN='def b64len: (length / 4 * 3) - (if endswith("==") then 2 elif endswith("=") then 1 else 0 end);'

bk-tokenize --model "$M" --system "Sparky the dragon lives in a castle." "$DATA/pipe/pairs.json" 2>/dev/null |
	bk-lens -q --max-tokens 120 >in.bk

test_expect_success 'tokenize | lens | teach: n = len(resp) rows of K ids, log-probs and rest' '
	bk-tokenize --model "$M" --system "Sparky the dragon lives in a castle." "$DATA/pipe/pairs.json" 2>/dev/null |
	bk-lens -q --max-tokens 64 2>/dev/null | bk-teach --device cpu --model "$M" --top-k 8 | bk-dump >t.jsonl &&
	test $(wc -l <t.jsonl) -eq 4 &&
	jq -e -s "$B64LEN"" all(.[]; .teacher.n == (.resp|length) and .teacher.k == 8 and .teacher.v == 512
		and .teacher.temperature == 1
		and (.teacher.ids.\"\$bin\" | b64len) == .teacher.n * 8 * 4
		and (.teacher.logp.\"\$bin\" | b64len) == .teacher.n * 8 * 4
		and (.teacher.rest.\"\$bin\" | b64len) == .teacher.n * 4)" t.jsonl &&
	jq -e -s "all(.[]; .user != null and .response != null and .lens.t > 0 and .batch >= 0)" t.jsonl
'

test_expect_success 'provenance: model fingerprint, temperature, top_k; the input provenance kept' '
	bk-teach --device cpu --model "$M" --top-k 16 --temperature 0.5 in.bk | bk-dump --header | head -1 >h.json &&
	jq -e ".provenance | length == 3 and .[0].tool == \"bk-tokenize\" and .[1].tool == \"bk-lens\"" h.json &&
	jq -e ".provenance[2] | .tool == \"bk-teach\" and .top_k == 16 and .temperature == 0.5 and (.model | test(\"^[0-9a-f]{16}$\"))" h.json &&
	bk-teach --device cpu --model "$M" --top-k 16 --temperature 0.5 in.bk | bk-dump | jq -e -s "all(.[]; .teacher.temperature == 0.5 and .teacher.k == 16)"
'

test_expect_success '--top-k 0: v log-probs per row that exp-sum to 1' '
	bk-teach --device cpu --model "$M" --top-k 0 in.bk | bk-dump >full.jsonl &&
	jq -e -s "$B64LEN"" all(.[]; .teacher.k == 0 and .teacher.ids == null and .teacher.rest == null
		and (.teacher.logp.\"\$bin\" | b64len) == .teacher.n * 512 * 4)" full.jsonl &&
	jq -r ".teacher.logp.\"\$bin\"" full.jsonl | while read -r b; do
		printf %s "$b" | base64 -d | od -An -v -tf4 -w2048
	done >rows.txt &&
	test $(wc -l <rows.txt) -eq $(jq -s "map(.teacher.n) | add" full.jsonl) &&
	awk "{ s = 0; for (i = 1; i <= NF; i++) s += exp(\$i); if (NF != 512 || s < 0.9999 || s > 1.0001) bad++ }
	     END { exit bad > 0 }" rows.txt
'

# The host twin computes every teacher row with fixed per-row operations (gpu/host/host_rows.h),
# so the plan changes no bit of any teacher field, on any CPU and OpenBLAS kernel.
test_expect_success 'batch plan invariance: --max-tokens and --batch-size change no bit of the teacher field' '
	bk-teach --device cpu --model "$M" --top-k 8 in.bk >a.bk &&
	bk-teach --device cpu --model "$M" --top-k 8 --max-tokens 9 in.bk >b.bk &&
	bk-teach --device cpu --model "$M" --top-k 8 --batch-size 1 in.bk >c.bk &&
	bk-dump in.bk | jq -c "del(.batch)" | bk-dump --from-json | bk-teach --device cpu --model "$M" --top-k 8 --max-tokens 1000 >d.bk &&
	bk-teach --device cpu --model "$M" --top-k 0 --batch-size 1 in.bk >e.bk &&
	bk-teach --device cpu --model "$M" --top-k 0 --max-tokens 1000 in.bk >f.bk &&
	for f in a b c d e f; do bk-dump $f.bk | jq -c "[.id, .teacher]" >$f.t; done &&
	test $(wc -l <a.t) -eq 4 && test_cmp a.t b.t && test_cmp a.t c.t && test_cmp a.t d.t &&
	test_cmp e.t f.t
'

test_expect_success '--device auto without a GPU: the notice once per pipe, once per command alone' '
	bk-teach --model "$M" --top-k 4 in.bk -o /dev/null 2>solo1 &&
	bk-teach --model "$M" --top-k 4 in.bk -o /dev/null 2>solo2 &&
	want=$(grep -c "no GPU" solo1) && test $(grep -c "no GPU" solo2) = $want &&
	{ cat in.bk; sleep 3; } | bk-teach --model "$M" --top-k 4 2>e1 |
		bk-teach --model "$M" --top-k 2 2>e2 >/dev/null &&
	cat e1 e2 >all && cat all && test $(grep -c "no GPU" all) = $want
'

test_expect_success 'a teacher field already there is replaced; -o writes the file' '
	bk-teach --device cpu --model "$M" --top-k 4 a.bk -o again.bk &&
	bk-dump again.bk | jq -e -s "length == 4 and all(.[]; .teacher.k == 4)" &&
	bk-dump --header again.bk | head -1 | jq -e "[.provenance[].tool] == [\"bk-tokenize\", \"bk-lens\", \"bk-teach\", \"bk-teach\"]"
'

test_expect_success 'a stream made with another tokenizer is refused with one line' '
	bk-tokenize --tokenizer "$L" --template zephyr "$DATA/pipe/pairs.json" 2>/dev/null >other.bk &&
	test_must_fail bk-teach --device cpu --model "$M" other.bk -o never.bk 2>err &&
	test $(wc -l <err) -eq 1 && grep -q "another tokenizer" err && test ! -e never.bk
'

test_expect_success 'a stream whose responses came from another model is refused' '
	mkdir m2 && cp "$M"/* m2/ && echo >>m2/config.json &&
	bk-teach --device cpu --model m2 in.bk >m2.bk &&
	test_must_fail bk-teach --device cpu --model "$M" m2.bk 2>err && grep -q "another model" err
'

test_expect_success 'records without resp are refused: bk-gen comes first' '
	bk-tokenize --model "$M" "$DATA/pipe/stories.txt" >prompts.bk 2>/dev/null &&
	test_must_fail bk-teach --device cpu --model "$M" prompts.bk 2>err &&
	test $(wc -l <err) -eq 1 && grep -q "record 1: key .resp. is missing" err
'

test_expect_success 'bad flags are usage errors' '
	bk-teach --device cpu --model "$M" --top-k 513 in.bk >/dev/null 2>err; test $? -eq 2 &&
	bk-teach --device cpu --model "$M" --max-tokens 8 --batch-size 2 in.bk >/dev/null 2>err; test $? -eq 2 &&
	bk-teach --device cpu --model "$M" --temperature 0 in.bk >/dev/null 2>err; test $? -eq 2 &&
	bk-teach --device cpu in.bk >/dev/null 2>err; test $? -eq 2
'

test_done

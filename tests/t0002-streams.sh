#!/usr/bin/env bash
# Streams between stages: bk-dump round trips, bk-lens planning, and damage detection.
. "$(dirname "$0")/lib.sh"
M="$MODELS/stories260K"
L="$MODELS/llama2-tokenizer/tokenizer.model"
export XDG_CACHE_HOME="$TEST_TMP/cache"
set -o pipefail

bk-tokenize --model "$M" --system "Sparky the dragon." "$DATA/pipe/stories.txt" >s.bk 2>/dev/null

test_expect_success 'bk-dump --header | bk-dump --from-json reproduces every record and keeps the provenance' '
	bk-dump --header s.bk | bk-dump --from-json -o back.bk &&
	bk-dump s.bk >a.jsonl && bk-dump back.bk >b.jsonl && test_cmp a.jsonl b.jsonl &&
	bk-dump --header back.bk | head -1 | jq -e ".provenance | length == 2 and .[0].tool == \"bk-tokenize\" and .[1].tool == \"bk-dump\""
'

test_expect_success 'unknown fields pass through bk-lens untouched' '
	bk-dump s.bk | jq -c ". + {mine: {x: [1, 2.5, \"z\"]}}" | bk-dump --from-json | bk-lens -q | bk-dump |
	jq -e -s "length == 6 and all(.[]; .mine == {x: [1, 2.5, \"z\"]})"
'

test_expect_success 'bk-lens: same seed same plan, other seed other order, records kept whole' '
	bk-lens -q --seed 7 --max-tokens 64 s.bk | bk-dump >p1 &&
	bk-lens -q --seed 7 --max-tokens 64 s.bk | bk-dump >p2 &&
	bk-lens -q --seed 8 --max-tokens 64 s.bk | bk-dump >p3 &&
	test_cmp p1 p2 && ! cmp -s p1 p3 &&
	jq -c "del(.lens, .batch)" p1 | sort >k1 && bk-dump s.bk | sort >k0 && test_cmp k0 k1
'

test_expect_success 'bk-lens: batches respect --max-tokens and --max-batch; efficiency reported' '
	bk-lens --max-tokens 70 --max-batch 2 s.bk 2>err | bk-dump >p &&
	jq -s -e "group_by(.batch) | all(.[]; (map(.lens.t) | add) <= 70 and length <= 2)" p &&
	grep -q "packing efficiency" err
'

# bk-bake cuts its order stream (shuffled per epoch, as HF's sampler) with --no-shuffle:
# packing would sort the records by length, the same batches first at every seed
test_expect_success 'bk-lens --no-shuffle: the input order, cut into consecutive batches' '
	bk-dump s.bk | jq -r .id >in.ids &&
	test $(jq -s "map(.t_prompt | length) | unique | length" a.jsonl) -gt 1 &&
	bk-lens -q --max-tokens 0 --max-batch 2 --no-shuffle s.bk | bk-dump >ns &&
	jq -r .id ns >out.ids && test_cmp in.ids out.ids &&
	jq -s -e "map(.batch) == [0, 0, 1, 1, 2, 2]" ns &&
	bk-lens -q --max-tokens 70 --no-shuffle s.bk | bk-dump >nb &&
	jq -r .id nb >out.ids && test_cmp in.ids out.ids &&
	jq -s -e "group_by(.batch) | all(.[]; (map(.lens.t) | add) <= 70)" nb
'

test_expect_success 'bk-lens: a record longer than the budget gets its own batch and a warning' '
	bk-lens --max-tokens 20 s.bk 2>err | bk-dump >p && grep -q "exceed --max-tokens 20" err &&
	test $(jq -s "map(.batch) | unique | length" p) -eq 6
'

test_expect_success 'counts in messages agree in number: 1 record in 1 batch' '
	bk-dump s.bk | head -1 | bk-dump --from-json | bk-lens --max-tokens 20 2>err >/dev/null &&
	grep -q "^bk-lens: 1 record in 1 batch; packing efficiency" err &&
	grep -q "(arrival order: 1 batch, " err && grep -q "warning: 1 record exceeds --max-tokens 20" err &&
	bk-dump s.bk | head -2 | bk-dump --from-json | bk-lens --max-tokens 1000 2>err >/dev/null &&
	grep -q "^bk-lens: 2 records in 1 batch;" err &&
	bk-dump s.bk | head -1 | bk-dump --from-json >one.bk &&
	off=$(grep -abo trailer one.bk | tail -1 | cut -d: -f1) &&
	# the trailer map starts 5 bytes before its "trailer" string: map, "bk", str header
	head -c $((off - 5)) one.bk | test_must_fail bk-dump 2>err >/dev/null &&
	grep -q "stream truncated after 1 record (no trailer)" err
'

test_expect_success 'SIGPIPE: a closed reader ends a stage quietly' '
	bk-dump s.bk | head -1 >/dev/null &&
	for i in $(seq 200); do cat "$DATA/pipe/stories.txt"; done >many.txt &&
	bk-tokenize --model "$M" many.txt 2>err | head -c 100 >/dev/null && test ! -s err
'

size=$(stat -c %s s.bk)
head -c $((size / 2)) s.bk >cut.bk
cp s.bk flip.bk && printf "\\x$(printf %x $(( ($(od -An -tu1 -j $((size / 2)) -N1 s.bk) ^ 1) )))" |
	dd of=flip.bk bs=1 seek=$((size / 2)) conv=notrunc 2>/dev/null

test_expect_success 'a stream cut in the middle: "stream truncated", no output file' '
	test_must_fail bk-lens -o out.bk cut.bk 2>err && grep -q "stream truncated" err &&
	test $(wc -l <err) -eq 1 && ! test -e out.bk
'
test_expect_success 'a flipped byte: "stream corrupt", no output file' '
	! cmp -s s.bk flip.bk &&
	test_must_fail bk-lens -o out.bk flip.bk 2>err && grep -q "corrupt" err &&
	test $(wc -l <err) -eq 1 && ! test -e out.bk
'
test_expect_success 'a downstream stage fails when an upstream one dies mid-stream' '
	test_must_fail --lines 2 bash -c "cat cut.bk | bk-lens -q | bk-dump >/dev/null" 2>err &&
	grep -q "^bk-lens: error: stdin: stream truncated" err && grep -q "^bk-dump: error: " err
'
test_expect_success 'a header from another tokenizer is refused' '
	bk-lens -q --model "$M" s.bk >/dev/null &&
	test_must_fail bk-lens --tokenizer "$L" s.bk 2>err >/dev/null &&
	grep -q "another tokenizer" err && test $(wc -l <err) -eq 1
'
test_expect_success 'not a stream, empty input, bad JSON lines' '
	test_must_fail bk-dump "$DATA/pipe/stories.txt" 2>err && grep -q "stories.txt" err &&
	test_must_fail bk-dump </dev/null 2>err && grep -q "empty stream" err &&
	printf "{\"a\": 1}\n{oops\n" | test_must_fail bk-dump --from-json -o j.bk 2>err && grep -q "line 2" err && ! test -e j.bk
'
test_expect_success 'usage errors exit 2' '
	bk-lens --max-tokens x s.bk 2>err; test $? -eq 2 && grep -q "max-tokens" err &&
	bk-dump --nope 2>err; test $? -eq 2
'
test_expect_success 'a size field claiming gigabytes is corruption, not an allocation (fuzz find)' '
	test_must_fail bk-dump "$ROOT/tests/fuzz/crashes/stream-oom-prealloc" 2>err &&
	grep -q "stream corrupt" err && test $(wc -l <err) -eq 1
'
test_expect_success 'bin payloads show as {"\$bin": base64} and read back' '
	printf "{\"x\": 1}\n" | bk-dump --from-json >one.bk &&
	bk-dump one.bk >/dev/null &&
	printf "{\"m\": {\"\$bin\": \"AAE=\"}}\n" | bk-dump --from-json | bk-dump >bin.jsonl &&
	grep -q "\$bin" bin.jsonl
'
test_expect_success '-o to a device or a FIFO writes in place (never renames over /dev/null)' '
	bk-lens -q -o /dev/null s.bk && test -c /dev/null &&
	mkfifo fifo && { bk-dump <fifo >fifo.jsonl & } && bk-lens -q -o fifo s.bk && wait &&
	test $(wc -l <fifo.jsonl) -eq 6 && test -p fifo
'
test_expect_success '-o through a symlink writes its target and keeps the link' '
	ln -s real.bk link.bk && bk-lens -q -o link.bk s.bk && test -L link.bk && test -s real.bk &&
	bk-lens -q -o link.bk s.bk && test -L link.bk && bk-dump link.bk >/dev/null
'
test_expect_success 'a reader sees each record as it arrives, not after 64 KiB' '
	for i in 1 2 3 4 5 6 7 8; do cat "$DATA/pipe/stories.txt"; done >m.txt &&
	bk-tokenize --model "$M" m.txt -o m.bk 2>/dev/null &&
	{ head -c 1500 m.bk; sleep 5; tail -c +1501 m.bk || :; } | bk-dump | { timeout 3 head -1 >first; } &&
	test -s first
'
test_expect_success '--stats prints counts and a histogram' '
	bk-dump --stats s.bk >st && grep -q "^records: 6" st && grep -q "^t_prompt: 6 records" st
'
test_done

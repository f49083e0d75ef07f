#!/usr/bin/env bash
# sharded teacher stages: bk-gen/bk-teach --shard I/N own the records whose id is I
# mod N; bk-dump --merge puts the shards back into the unsharded stream, record for
# record; sampling does not depend on the sharding; bad shard sets are refused.
. "$(dirname "$0")/lib.sh"
M="$MODELS/stories260K"
export XDG_CACHE_HOME="$TEST_TMP/cache"
export OMP_NUM_THREADS=1
set -o pipefail

printf 'Once upon a time\nThe dragon said\nLily went to the park\nA cat sat\nThe sun was hot\nTom ran fast\nA big red ball\n' >p.txt
bk-tokenize --model "$M" --system "Sparky the dragon." p.txt 2>/dev/null | bk-lens -q --max-tokens 64 >pl.bk
G="--model $M --device cpu --num-trajectories 2 --max-new-tokens 8 --epochs 2"
T="--model $M --device cpu --top-k 8"

test_expect_success 'bk-gen shards merge into the unsharded stream, in any argument order' '
	bk-gen $G pl.bk -o gen.bk 2>/dev/null &&
	for i in 0 1 2; do bk-gen $G --shard $i/3 pl.bk -o gen$i.bk 2>/dev/null || return 1; done &&
	n0=$(bk-dump gen0.bk | wc -l) && n1=$(bk-dump gen1.bk | wc -l) && n2=$(bk-dump gen2.bk | wc -l) &&
	test $((n0 + n1 + n2)) -eq $(bk-dump gen.bk | wc -l) && test $n0 -gt 0 && test $n1 -gt 0 &&
	bk-dump --header gen1.bk | head -1 | jq -e ".provenance[-1].shard == \"1/3\"" &&
	bk-dump --merge pl.bk -o merged.bk gen2.bk gen0.bk gen1.bk &&
	bk-dump merged.bk >a && bk-dump gen.bk >b && test_cmp a b &&
	bk-dump --header merged.bk | head -1 | jq -e "(.provenance | map(has(\"shard\")) | any | not) and
		.provenance[-1] == {tool: \"bk-dump\", version: \"0.1.0\", merged_shards: 3}"
'

test_expect_success 'bk-teach shards of the gen shards, and of the whole gen stream, merge too' '
	bk-teach $T gen.bk -o teach.bk 2>/dev/null &&
	for i in 0 1 2; do bk-teach $T --shard $i/3 gen$i.bk -o t$i.bk 2>/dev/null || return 1; done &&
	bk-dump --merge pl.bk -o tm.bk t0.bk t1.bk t2.bk &&
	bk-dump tm.bk >a && bk-dump teach.bk >b && test_cmp a b &&
	for i in 0 1; do bk-teach $T --shard $i/2 gen.bk -o u$i.bk 2>/dev/null || return 1; done &&
	bk-dump --merge gen.bk u1.bk u0.bk >um.bk && bk-dump um.bk >a && test_cmp a b &&
	bk-step --model "$M" --device cpu --out s --lora-r 4 --max-steps 2 tm.bk >/dev/null 2>&1
'

test_expect_success 'bad shard sets and flags are refused with one line' '
	test_must_fail bk-dump --merge pl.bk -o x.bk gen0.bk gen1.bk 2>err && grep -q "shard 2/3 is missing" err &&
	test_must_fail bk-dump --merge pl.bk -o x.bk gen0.bk gen0.bk gen1.bk 2>err && grep -q "given twice" err &&
	test_must_fail bk-dump --merge pl.bk -o x.bk gen0.bk t1.bk gen2.bk 2>err && grep -q "header differs" err &&
	test_must_fail bk-dump --merge pl.bk -o x.bk gen.bk 2>err && grep -q "not a shard stream" err &&
	bk-tokenize --model "$M" --system "Sparky the dragon." --prompt "Other" 2>/dev/null |
	bk-lens -q --max-tokens 64 >o.bk &&
	test_must_fail bk-dump --merge o.bk -o x.bk gen0.bk gen1.bk gen2.bk 2>err && grep -q "matches no record" err &&
	! test -e x.bk &&
	test_must_fail --exit 2 bk-gen $G --shard 3/3 pl.bk 2>err >/dev/null && grep -q "0 <= I < N" err &&
	test_must_fail --exit 2 bk-teach $T --shard x pl.bk 2>err >/dev/null &&
	bk-dump pl.bk | jq -c "del(.id)" | bk-dump --from-json >noid.bk &&
	test_must_fail bk-gen $G --shard 0/2 noid.bk 2>err >/dev/null && grep -q "record 1: no string .id." err
'
test_expect_success 'a jq round trip of a teach stream (1.0 written as 1) trains the same adapter' '
	bk-dump teach.bk | jq -c . | bk-dump --from-json >rt.bk &&
	bk-dump rt.bk | head -1 | grep -q "\"temperature\":1," &&
	bk-step --model "$M" --device cpu --out r0 --lora-r 4 --max-steps 2 teach.bk >/dev/null 2>&1 &&
	bk-step --model "$M" --device cpu --out r1 --lora-r 4 --max-steps 2 rt.bk >/dev/null &&
	cmp r0/final/adapter_model.safetensors r1/final/adapter_model.safetensors
'

# The stream before bk-lens has the same records in another order: as REF it would tear
# batches apart (bk-teach and bk-step then trained other micro-batches, exit 0).
test_expect_success 'a REF without a stage the shards have is refused; a batch that comes back is refused by every reader' '
	bk-tokenize --model "$M" --system "Sparky the dragon." p.txt 2>/dev/null >tok.bk &&
	test_must_fail bk-dump --merge tok.bk -o x.bk gen0.bk gen1.bk gen2.bk 2>err &&
	grep -q "tok.bk: lacks the bk-lens stage the shards of gen0.bk read (provenance entry 2)" err &&
	bk-gen $G --seed 7 pl.bk -o gen7.bk 2>/dev/null &&
	test_must_fail bk-dump --merge gen7.bk -o x.bk t0.bk t1.bk t2.bk 2>err &&
	grep -q "gen7.bk: its provenance entry 3 (bk-gen) is not in t0.bk.s" err && ! test -e x.bk &&
	bk-lens -q --max-tokens 64 gen.bk >mixed.bk && bk-teach $T mixed.bk -o /dev/null 2>/dev/null &&
	test $(bk-dump mixed.bk | jq -s "[.[] | select(.batch == 0) | .epoch] | unique | length") -gt 1 &&
	bk-dump gen.bk | jq -c -s "sort_by(.id, .epoch, .traj)[]" | bk-dump --from-json >torn.bk &&
	test_must_fail bk-teach $T torn.bk -o x.bk 2>err &&
	grep -q "torn.bk: record [0-9]*: batch [0-9]* (epoch 0) comes back after other batches" err &&
	bk-dump teach.bk | jq -c -s "sort_by(.id, .epoch, .traj)[]" | bk-dump --from-json >torn-t.bk &&
	test_must_fail bk-step --model "$M" --device cpu --out s2 --lora-r 4 --max-steps 2 torn-t.bk 2>err &&
	grep -q "comes back after other batches" err && ! test -e s2/final &&
	test_must_fail --lines 2 bk-step --model "$M" --device cpu --out s3 --lora-r 4 --max-steps 2 - <torn-t.bk 2>err &&
	grep -q "comes back after other batches" err && grep -q "saved the 1 step done" err
'
test_done

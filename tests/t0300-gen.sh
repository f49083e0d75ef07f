#!/usr/bin/env bash
# bk-gen on the shipped stories260K: trajectories per record and epoch, output that does
# not depend on --max-batch or --window, fresh samples per epoch, pass-through of paired
# records, refusal of another tokenizer's stream, usage errors.
. "$(dirname "$0")/lib.sh"
M="$MODELS/stories260K"
L="$MODELS/llama2-tokenizer/tokenizer.model"
export XDG_CACHE_HOME="$TEST_TMP/cache"
set -o pipefail
G="bk-gen --device cpu --model $M --max-new-tokens 16"

bk-tokenize --model "$M" --system "Sparky the dragon lives in a big castle." "$DATA/pipe/stories.txt" >s.bk 2>/dev/null

test_expect_success 'tokenize | gen: trajectories with resp, response, traj, epoch and provenance' '
	bk-tokenize --model "$M" --system "Sparky the dragon lives in a big castle." "$DATA/pipe/stories.txt" 2>/dev/null |
	$G --num-trajectories 2 --seed 3 2>err | bk-dump >g.jsonl &&
	test $(wc -l <g.jsonl) -le 12 && test $(wc -l <g.jsonl) -ge 10 &&
	jq -e -s "all(.[]; (.resp|length) >= 1 and (.resp|length) <= 16 and (.response|length) > 0 and
		(.traj == 0 or .traj == 1) and .epoch == 0 and (.response | test(\"^\\\\s|\\\\s$\") | not))" g.jsonl &&
	bk-dump --header s.bk | head -1 | jq -r .provenance[0].tool | grep -q bk-tokenize &&
	$G --num-trajectories 2 --seed 3 s.bk 2>/dev/null | bk-dump --header | head -1 >h.json &&
	jq -e ".provenance[1] | .tool == \"bk-gen\" and .seed == 3 and .num_trajectories == 2 and
		.max_new_tokens == 16 and .epochs == 1 and .top_p == 0.9 and .sampling_temperature == 0.8 and
		.top_k == 0 and (.model | length) == 16" h.json
'

test_expect_success '--top-k: 1 is greedy, the vocabulary (512) changes nothing, 3 changes the samples; recorded' '
	$G --num-trajectories 2 --seed 3 --temperature 0 s.bk 2>/dev/null | bk-dump >greedy.jsonl &&
	$G --num-trajectories 2 --seed 3 --top-k 1 s.bk 2>/dev/null | bk-dump >k1.jsonl &&
	jq -c .resp greedy.jsonl >a && jq -c .resp k1.jsonl >b && test_cmp a b &&
	$G --num-trajectories 2 --seed 3 s.bk 2>/dev/null | bk-dump >k0.jsonl &&
	$G --num-trajectories 2 --seed 3 --top-k 512 s.bk 2>/dev/null | bk-dump >kv.jsonl &&
	jq -c .resp k0.jsonl >a && jq -c .resp kv.jsonl >b && test_cmp a b &&
	$G --num-trajectories 2 --seed 3 --top-k 3 --top-p 1 s.bk 2>/dev/null | bk-dump >k3.jsonl &&
	jq -c .resp k3.jsonl >c && ! cmp -s a c &&
	$G --num-trajectories 2 --seed 3 --top-k 3 s.bk 2>/dev/null | bk-dump --header | head -1 |
		jq -e ".provenance[1].top_k == 3" >/dev/null
'

test_expect_success 'a stop id ends a response and is kept as its last id; text has no special tokens' '
	jq -e -s "all(.[]; (.resp | index(2)) as \$i | \$i == null or \$i == (.resp|length) - 1)" g.jsonl &&
	! grep -q "</s>" g.jsonl
'

test_expect_success 'over a file: epoch-major passes, each in input order, then trajectory order' '
	$G --num-trajectories 3 --epochs 2 s.bk 2>/dev/null | bk-dump >e.jsonl &&
	bk-dump s.bk | jq -r .id | uniq >in.ids &&
	jq -r "select(.epoch == 0) | .id" e.jsonl | uniq >out0.ids && test_cmp in.ids out0.ids &&
	jq -r "select(.epoch == 1) | .id" e.jsonl | uniq >out1.ids && test_cmp in.ids out1.ids &&
	jq -r .epoch e.jsonl | uniq >epochs && printf "0\\n1\\n" >want && test_cmp want epochs &&
	jq -s -e "group_by(.id) | all(.[]; map(.epoch * 3 + .traj) as \$k | \$k == (\$k | sort))" e.jsonl
'
test_expect_success 'over a pipe: each record with all its epochs, the same samples as over a file' '
	cat s.bk | $G --num-trajectories 3 --epochs 2 2>/dev/null | bk-dump >p.jsonl &&
	bk-dump s.bk | jq -r .id | uniq >in.ids &&
	jq -r .id p.jsonl | uniq >pout.ids && test_cmp in.ids pout.ids &&
	jq -c "{id, epoch, traj, resp}" e.jsonl | sort >fs && jq -c "{id, epoch, traj, resp}" p.jsonl | sort >ps &&
	test_cmp fs ps
'

test_expect_success 'same output with --max-batch 1, 8 and 64 and another --window' '
	$G --num-trajectories 2 --max-batch 1 s.bk >b1.bk 2>/dev/null &&
	$G --num-trajectories 2 --max-batch 8 s.bk >b8.bk 2>/dev/null &&
	$G --num-trajectories 2 --max-batch 64 --window 2 s.bk >b64.bk 2>/dev/null &&
	cmp b1.bk b8.bk && cmp b1.bk b64.bk
'

test_expect_success 'the same trajectory whatever else is in the stream (record order, other records)' '
	bk-dump --header s.bk | sed -n "1p;3p" | bk-dump --from-json >one.bk &&
	$G --num-trajectories 2 one.bk 2>/dev/null | bk-dump | jq -c "{id, traj, resp}" >one.jsonl &&
	bk-dump b8.bk | jq -c "{id, traj, resp}" >all.jsonl &&
	id=$(jq -r .id one.jsonl | head -1) &&
	grep -F "\"$id\"" all.jsonl >want.jsonl && test -s want.jsonl && test_cmp want.jsonl one.jsonl
'

test_expect_success '--epochs 2: fresh trajectories per epoch; epoch 0 equals a one-epoch run' '
	$G --num-trajectories 2 --epochs 2 s.bk 2>/dev/null | bk-dump >ep.jsonl &&
	jq -s -e "map(.epoch) | unique == [0, 1]" ep.jsonl &&
	jq -s -e "group_by([.id, .traj]) | map(select(length == 2 and .[0].resp != .[1].resp)) | length >= 6" ep.jsonl &&
	jq -c "select(.epoch == 0)" ep.jsonl >ep0.jsonl && bk-dump b8.bk >b8.jsonl && test_cmp b8.jsonl ep0.jsonl
'

test_expect_success 'another --seed gives other trajectories; --temperature 0 gives one per record' '
	$G --num-trajectories 2 --seed 1 s.bk 2>/dev/null | bk-dump >s1.jsonl && ! cmp -s s1.jsonl b8.jsonl &&
	$G --num-trajectories 3 --temperature 0 s.bk 2>/dev/null | bk-dump >greedy.jsonl &&
	jq -s -e "group_by(.id) | all(.[]; map(.resp) | unique | length == 1)" greedy.jsonl
'

test_expect_success 'paired records pass through untouched, once, in place' '
	bk-dump --header s.bk | jq -c "if .user == \"Tom had a red ball.\" then . + {resp: [1, 2]} else . end" |
	bk-dump --from-json >mixed.bk &&
	$G --num-trajectories 2 mixed.bk 2>/dev/null | bk-dump >mixed.jsonl &&
	jq -s -e "map(select(.resp == [1, 2])) | length == 1 and (.[0] | has(\"traj\") | not)" mixed.jsonl &&
	jq -r .user mixed.jsonl | uniq >users && sed -n 3p users | grep -qx "Tom had a red ball." &&
	bk-tokenize --model "$M" "$DATA/pipe/pairs.json" 2>/dev/null >pairs.bk &&
	$G pairs.bk 2>/dev/null | bk-dump >p.out && bk-dump pairs.bk >p.in && test_cmp p.in p.out
'

test_expect_success '-v: the shared prefix is built once for all records' '
	$G -v --num-trajectories 2 s.bk 2>err >/dev/null &&
	grep -q "built 1 time; 6 prompts used it, 0 prefilled in full" err
'

test_expect_success 'bk-lens lengths are updated with the response' '
	bk-lens -q --max-tokens 256 s.bk | $G --num-trajectories 1 2>/dev/null | bk-dump >l.jsonl &&
	jq -e -s "all(.[]; .lens.t == (.t_prompt|length) + (.resp|length) and .lens.resp == (.resp|length) and .batch >= 0)" l.jsonl
'

test_expect_success 'a stream from another tokenizer is refused, no output file' '
	bk-tokenize --tokenizer "$L" "$DATA/pipe/stories.txt" >other.bk 2>/dev/null &&
	test_must_fail $G -o out.bk other.bk 2>err && grep -q "another tokenizer" err &&
	test $(wc -l <err) -eq 1 && ! test -e out.bk
'

usage_error() { "$@" 2>err >/dev/null; test $? -eq 2; }
test_expect_success 'usage errors exit 2' '
	usage_error bk-gen --device cpu s.bk && grep -q -- "--model" err &&
	usage_error $G --top-p 0 s.bk && grep -q top-p err &&
	usage_error $G --top-p 1.5 s.bk &&
	usage_error $G --top-k -1 s.bk && grep -q top-k err &&
	usage_error $G --temperature -1 s.bk && grep -q temperature err &&
	usage_error $G --max-batch 0 s.bk && grep -q max-batch err &&
	usage_error $G --num-trajectories x s.bk && grep -q num-trajectories err &&
	usage_error $G --epochs 0 s.bk &&
	usage_error $G --window 0 s.bk &&
	usage_error $G --device tpu s.bk &&
	usage_error $G --bogus s.bk &&
	usage_error $G s.bk s.bk
'

# Greedy trajectories of one prompt run in lockstep and all finish at the last step, so
# the live line must count the tokens sampled so far, not those of finished samples.
test_expect_success 'the progress line on a terminal counts tokens before any sample finishes' '
	command -v script >/dev/null || { echo "skip: no script(1)"; exit 0; }
	bk-tokenize --model "$M" --prompt "Once upon a time" -o p1.bk 2>/dev/null &&
	script -qefc "bk-gen --device cpu --model $M --temperature 0 --num-trajectories 16 --max-new-tokens 200 p1.bk -o /dev/null" /dev/null >tty.out &&
	tr "\r" "\n" <tty.out | grep "^bk-gen: " >lines && cat lines &&
	grep -q "^bk-gen: 1 records, 16 samples, 3200 tokens" lines &&
	if [ $(wc -l <lines) -gt 1 ]; then grep -q "^bk-gen: 1 records, 0 samples, [1-9][0-9]* tokens" lines; fi
'

test_done

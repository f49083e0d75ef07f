#!/usr/bin/env bash
# Streams carry their provenance: every model stage refuses a stream made with another
# tokenizer, model, system prompt or KL temperature, with one line and no output file;
# and bk-gen's trajectories do not depend on how bk-lens planned the batches.
. "$(dirname "$0")/lib.sh"
M="$MODELS/stories260K"
SYS="Sparky the dragon lives in a big castle."
export XDG_CACHE_HOME="$TEST_TMP/cache"

bk-tokenize --model "$M" --system "$SYS" "$DATA/pipe/stories.txt" -o tok.bk 2>/dev/null
bk-gen --model "$M" --device cpu --num-trajectories 2 --max-new-tokens 12 --seed 3 tok.bk -o gen.bk 2>/dev/null
bk-teach --model "$M" --device cpu --top-k 8 --temperature 2 gen.bk -o teach.bk 2>/dev/null
# another model: stories260K with one weight changed (same shapes, same tokenizer)
mkdir other && cp "$M"/* other/ &&
	printf '\x01' | dd of=other/model.safetensors bs=1 seek=$(( $(stat -c %s other/model.safetensors) - 3 )) conv=notrunc 2>/dev/null

refused() { # what, command...: fails unless the command is refused with one line naming what
	local what=$1; shift
	test_must_fail "$@" -o out.bk 2>err && test "$(wc -l <err)" -eq 1 &&
		grep -q "another $what" err && ! test -e out.bk
}

test_expect_success 'the stages accept their own stream' '
	bk-gen --model "$M" --device cpu --system "$SYS" --max-new-tokens 4 tok.bk -o /dev/null 2>/dev/null &&
	bk-teach --model "$M" --device cpu --system "$SYS" --temperature 2 gen.bk -o /dev/null 2>/dev/null &&
	bk-step --model "$M" --device cpu --system "$SYS" --temperature 2 --out a1 --lora-r 2 --batch-size 4 teach.bk >/dev/null 2>&1
'
test_expect_success 'another system prompt is refused by bk-gen, bk-teach and bk-step' '
	refused "system prompt" bk-gen --model "$M" --device cpu --system "A cat." tok.bk &&
	refused "system prompt" bk-teach --model "$M" --device cpu --system "A cat." gen.bk &&
	echo "A cat." >cat.txt &&
	test_must_fail bk-step --model "$M" --device cpu --system-file cat.txt --temperature 2 --batch-size 4 --out a2 teach.bk 2>err >/dev/null &&
	grep -q "another system prompt" err && ! test -e a2/final
'
test_expect_success 'another model is refused by bk-teach and bk-step' '
	refused model bk-teach --model other --device cpu --temperature 2 gen.bk &&
	test_must_fail bk-step --model other --device cpu --temperature 2 --batch-size 4 --out a3 teach.bk 2>err >/dev/null &&
	grep -q "another model" err
'
test_expect_success 'another KL temperature is refused by bk-step' '
	test_must_fail bk-step --model "$M" --device cpu --temperature 1 --batch-size 4 --out a4 teach.bk 2>err >/dev/null &&
	grep -q "temperature" err && test $(wc -l <err) -eq 1
'
test_expect_success 'another tokenizer is refused by bk-lens and bk-gen' '
	mkdir l && cp "$MODELS/llama2-tokenizer/tokenizer.model" l/ &&
	refused tokenizer bk-lens --model l tok.bk &&
	bk-tokenize --tokenizer l/tokenizer.model --prompt hi -o ltok.bk &&
	refused tokenizer bk-gen --model "$M" --device cpu ltok.bk
'
test_expect_success 'bk-gen: same seed, other bk-lens plans, identical trajectories' '
	for mt in 40 100 4096; do
		bk-lens -q --max-tokens $mt --seed $mt tok.bk |
		bk-gen --model "$M" --device cpu --num-trajectories 2 --max-new-tokens 12 --seed 3 2>/dev/null |
		bk-dump | jq -c "{id, traj, resp}" | sort >plan-$mt || exit 1
	done &&
	test_cmp plan-40 plan-100 && test_cmp plan-40 plan-4096 &&
	bk-dump gen.bk | jq -c "{id, traj, resp}" | sort >plain && test_cmp plain plan-40
'
test_done

#!/usr/bin/env bash
# The main job: `make demo` bakes the Sparky system prompt into stories260K on the CPU.
# The baked model must close most of the gap to the prompted teacher on held-out
# openings: KL at most half the base model's, keyword hit rate most of the way from
# base to prompted.
. "$(dirname "$0")/lib.sh"

test_expect_success 'make demo runs end to end and prints the before/after table' '
	make -s -C "$ROOT" -f pipelines/demo.mk BIN="$BK_BIN" OUT="$TEST_TMP/demo" DEV="--device cpu" >out 2>err &&
	grep -q "held-out KL" out && grep -q "keyword hit rate" out &&
	sed -n "/^sample continuations:/,/^\$/p" out >examples && grep -q "^  prompted " examples &&
	grep -q "^  base " examples && grep -q "^  baked " examples && ! grep -q discrete examples &&
	test -s "$TEST_TMP/demo/adapter/final/adapter_model.safetensors" &&
	test -s "$TEST_TMP/demo/loss.txt"
'
test_expect_success 'baked KL is at most half the base KL' '
	jq -e ".kl.baked.per_token <= 0.5 * .kl.base.per_token" "$TEST_TMP/demo/results.json"
'
test_expect_success 'baked hit rate moves most of the way from base to prompted' '
	jq -e ".eval | .baked_accuracy >= .baseline_accuracy + 0.5 * (.discrete_accuracy - .baseline_accuracy)
		and .discrete_accuracy > .baseline_accuracy" "$TEST_TMP/demo/results.json"
'
test_expect_success 'a second make demo reuses every stage' '
	make -C "$ROOT" -f pipelines/demo.mk BIN="$BK_BIN" OUT="$TEST_TMP/demo" DEV="--device cpu" >out2 2>&1 &&
	! grep -q "bk-step --model" out2 && grep -q "held-out KL" out2
'
test_done

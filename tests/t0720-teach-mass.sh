#!/usr/bin/env bash
# bk-teach --min-mass: a flat teacher (stories260K at temperature 20: its top-64 of 512
# ids keeps about a quarter of the mass) is not cut to top-k, where the rest bin hides
# most of the KL; bk-step then computes the exact teacher and its loss is the full
# distribution's.  A peaked teacher keeps its top-k fields.  -v reports the uncovered mass.
. "$(dirname "$0")/lib.sh"
M="$MODELS/stories260K"
loss() { # TEACH_FILE T: bk-step's loss at step 1 (the adapter is still zero)
	rm -rf "a-$1" && bk-step --model "$M" --out "a-$1" --batch-size 4 --lora-r 4 --lr 1e-3 \
		--temperature "$2" --seed 1 --max-steps 1 --schedule constant "$1" 2>&1 >/dev/null |
		sed -n 's/.*mean loss \([0-9.]*\).*/\1/p'
}

test_expect_success 'setup: trajectories' '
	bk-tokenize --model "$M" --template raw --system "Sparky the dragon lives in a big castle." \
		"$DATA/pipe/stories.txt" -o tok.bk &&
	bk-gen --model "$M" --num-trajectories 2 --max-new-tokens 16 --seed 1 tok.bk -o gen.bk
'

test_expect_success 'a flat teacher: no top-k fields, a warning, the exact loss' '
	bk-teach -v --model "$M" --temperature 20 gen.bk -o flat.bk 2>err &&
	cat err &&
	grep -q "warning: the teacher is flat: its top-64 keeps [0-9.]*% of the mass" err &&
	grep -q "uncovered mass: mean 0\.[5-9]" err &&
	test "$(bk-dump flat.bk | jq -s "map(has(\"teacher\")) | any")" = false &&
	bk-teach --model "$M" --temperature 20 --top-k 0 gen.bk -o full.bk &&
	bk-teach --model "$M" --temperature 20 --min-mass 0 gen.bk -o cut.bk 2>err &&
	! grep -q "teacher is flat" err &&
	lf=$(loss flat.bk 20) && lx=$(loss full.bk 20) && lc=$(loss cut.bk 20) &&
	echo "exact $lf, full $lx, top-64 $lc" &&
	test "$lf" = "$lx" &&
	test "$(echo "$lc * 2 < $lx" | bc)" = 1
'

test_expect_success 'a peaked teacher keeps top-k; its uncovered mass is small' '
	bk-teach -v --model "$M" gen.bk -o peak.bk 2>err &&
	! grep -q "warning" err &&
	grep -q "uncovered mass: mean 0\.00" err &&
	test "$(bk-dump peak.bk | jq -s "map(.teacher.k == 64) | all")" = true
'

test_expect_success 'a bad --min-mass is a usage error' '
	test_must_fail --exit 2 bk-teach --model "$M" --min-mass 1.5 gen.bk
'

test_done

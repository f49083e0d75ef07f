#!/usr/bin/env bash
# bk-step --eval on stories260K: eval_loss records in the metrics stream at HF's points
# (every --eval-steps, and after the last step with --eval-final), the value HF's
# evaluation loop gives with the tool's loss (batches of --eval-batch-size in file
# order, each batch's mean over its records, the mean over the batches), the same KL as
# the training loss when nothing changes the adapter, and refusals.
. "$(dirname "$0")/lib.sh"
M="$MODELS/stories260K"
export XDG_CACHE_HOME="$TEST_TMP/cache"
export OMP_NUM_THREADS=1
set -o pipefail

SYS="Sparky is a friendly dragon who lives in a cave."
bk-tokenize --model "$M" --system "$SYS" "$DATA/pipe/bake.json" 2>/dev/null >all.bk
# training records: the first 6 pairs; validation records: the last 2 + the first 1
bk-dump all.bk | head -6 | bk-dump --from-json -o train.bk
bk-dump all.bk | sed -n '7,8p;1p' | bk-dump --from-json -o ev.bk
for i in 1 2 3; do
	bk-dump ev.bk | sed -n "${i}p" | bk-dump --from-json -o ev$i.bk
done
F="--model $M --device cpu --lora-r 8 --lora-alpha 16 --lora-dropout 0 --batch-size 2"

# the eval records of a metrics stream, as "step eval_loss" lines
evals() { bk-dump "$1" | jq -r "select(.eval_loss != null) | \"\(.step) \(.eval_loss)\""; }

test_expect_success 'eval_loss every --eval-steps, and after the last step with --eval-final' '
	bk-step $F --lr 2e-3 --out o --max-steps 5 --eval ev.bk --eval-steps 2 --eval-final \
		train.bk >m.bk 2>err &&
	evals m.bk | cut -d" " -f1 | tr "\n" " " >steps &&
	test "$(cat steps)" = "2 4 5 " &&
	bk-dump m.bk | jq -s -e "map(select(.eval_loss != null)) | all(.[];
		.eval_loss > 0 and .eval_samples == 3 and .eval_runtime >= 0 and
		(.epoch | type) == \"number\" and .eval_samples_per_second >= 0 and
		.eval_steps_per_second >= 0 and .loss == null)" &&
	grep -q "step 4  eval_loss" err &&
	bk-step $F --lr 2e-3 --out o2 --max-steps 5 --eval ev.bk --eval-steps 2 \
		train.bk >m2.bk 2>/dev/null &&
	test "$(evals m2.bk | cut -d" " -f1 | tr "\n" " ")" = "2 4 " &&
	bk-step $F --lr 2e-3 --out o3 --max-steps 4 --eval ev.bk --eval-steps 2 --eval-final \
		train.bk >m3.bk 2>/dev/null &&
	test "$(evals m3.bk | cut -d" " -f1 | tr "\n" " ")" = "2 4 " &&
	bk-step $F --lr 2e-3 --out o4 --max-steps 5 --eval ev.bk --eval-steps 1 --eval-delay 4 \
		train.bk >m4.bk 2>/dev/null &&
	test "$(evals m4.bk | cut -d" " -f1 | tr "\n" " ")" = "4 5 "
'

test_expect_success 'training does not change with --eval: the same adapter' '
	bk-step $F --lr 2e-3 --out p --max-steps 5 train.bk >/dev/null 2>&1 &&
	cmp o/final/adapter_model.safetensors p/final/adapter_model.safetensors
'

# lr 0: the adapter stays at B = 0, so each step's eval sees the same model
test_expect_success 'the batches of HF: the mean over batches of each batch'"'"'s mean' '
	for i in 1 2 3; do
		bk-step $F --lr 0 --out s$i --max-steps 1 --eval ev$i.bk --eval-final \
			train.bk >r$i.bk 2>/dev/null || return 1
		evals r$i.bk | cut -d" " -f2 >l$i || return 1
	done &&
	bk-step $F --lr 0 --out b1 --max-steps 1 --eval ev.bk --eval-final --eval-batch-size 1 \
		train.bk >e1.bk 2>/dev/null &&
	bk-step $F --lr 0 --out b2 --max-steps 1 --eval ev.bk --eval-final --eval-batch-size 2 \
		train.bk >e2.bk 2>/dev/null &&
	bk-step $F --lr 0 --out b8 --max-steps 1 --eval ev.bk --eval-final \
		train.bk >e8.bk 2>/dev/null &&
	a=$(cat l1) b=$(cat l2) c=$(cat l3) &&
	e1=$(evals e1.bk | cut -d" " -f2) && e2=$(evals e2.bk | cut -d" " -f2) &&
	e8=$(evals e8.bk | cut -d" " -f2) &&
	echo "$a $b $c | $e1 $e2 $e8" &&
	awk -v a=$a -v b=$b -v c=$c -v e1=$e1 -v e2=$e2 -v e8=$e8 "
		function near(x, y) { return (x - y < 1e-6 * y + 1e-9) && (y - x < 1e-6 * y + 1e-9) }
		BEGIN { m = (a + b + c) / 3; h = ((a + b) / 2 + c) / 2;
			exit !(near(e1, m) && near(e8, m) && near(e2, h) && !near(h, m)) }"
'

test_expect_success 'eval_loss is the training KL: the records trained on, nothing changed' '
	bk-dump train.bk | head -2 | bk-dump --from-json -o t2.bk &&
	bk-step $F --lr 0 --out k --max-steps 1 --eval t2.bk --eval-final t2.bk >k.bk 2>/dev/null &&
	bk-dump k.bk | jq -s -e "(map(select(.loss != null))[0].loss) as \$l |
		(map(select(.eval_loss != null))[0].eval_loss) as \$e |
		(\$l - \$e | fabs) < 1e-6 * \$l"
'

test_expect_success 'refused: --eval flags without --eval, --eval without when, a bad file' '
	test_must_fail --exit 2 bk-step $F --out x --eval-steps 2 train.bk &&
	test_must_fail --exit 2 bk-step $F --out x --eval ev.bk train.bk &&
	test_must_fail bk-step $F --out x --eval nosuch.bk --eval-final train.bk &&
	bk-dump train.bk | head -0 | bk-dump --from-json -o empty.bk &&
	test_must_fail bk-step $F --out x --eval empty.bk --eval-final train.bk &&
	bk-tokenize --model "$M" --system "Another prompt." "$DATA/pipe/bake.json" \
		2>/dev/null >other.bk &&
	test_must_fail bk-step $F --out x --system "$SYS" --eval other.bk --eval-final train.bk &&
	! test -e x
'

# the tool's loss over a batch without a response is 0, so over such a set every
# eval_loss would be 0: refused, before anything is trained or saved
test_expect_success 'an --eval file with no response token is refused before the first step' '
	bk-dump ev.bk | jq -c ".resp = []" | bk-dump --from-json -o evnr.bk &&
	test_must_fail bk-step $F --out nx --eval evnr.bk --eval-steps 1 train.bk >out 2>err &&
	grep -q "^bk-step: error: --eval evnr.bk: no response tokens in its 3 records" err &&
	! test -e nx && ! test -s out &&
	{ bk-dump ev.bk | sed -n 1p | jq -c ".resp = []"; bk-dump ev2.bk; } |
		bk-dump --from-json -o evhalf.bk &&
	bk-step $F --lr 0 --out y --max-steps 1 --eval evhalf.bk --eval-final train.bk >h.bk 2>/dev/null &&
	test "$(evals h.bk | cut -d" " -f1)" = 1
'

test_expect_success 'an --eval record with an id outside the vocabulary is refused before the first step' '
	bk-dump --header ev.bk | jq -c "if input_line_number == 3 then .resp[1] = 600 else . end" |
		bk-dump --from-json -o evbad.bk &&
	test_must_fail bk-step $F --out x --eval evbad.bk --eval-steps 1 train.bk 2>err &&
	grep -q "evbad.bk: record 2: key .resp. holds id 600, outside the vocabulary \[0, 512)" err &&
	! test -e x
'

test_done

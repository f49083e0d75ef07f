#!/usr/bin/env bash
# Recipes: pipelines/bake.mk re-runs only the stages a change touches (make's own
# output shows which ran), deleting a middle file re-runs from that stage, and every
# example config of pipelines/examples is accepted by bk-bake --dry-run; one runs.
. "$(dirname "$0")/lib.sh"
MK="make --no-print-directory -C $ROOT -f pipelines/bake.mk BIN=$BK_BIN RUNS=$TEST_TMP/runs NAME=t \
	DATA=$DATA/pipe/stories.txt TEMPLATE=raw NUM_TRAJECTORIES=2 MAX_NEW_TOKENS=12 EPOCHS=1 \
	BATCH_SIZE=2 LORA_R=4 LORA_ALPHA=8"
ran() { grep -oE "^(bk-[a-z]+|pipelines/bk-plot) " "$1" | sed "s, $,," | sed 's,pipelines/,,' | sort -u | tr '\n' ' '; }

test_expect_success 'a first bake.mk run runs every stage' '
	$MK >out 2>&1 && cat out &&
	test "$(ran out)" = "bk-gen bk-lens bk-plot bk-step bk-teach bk-tokenize " &&
	ls runs/t/tokens-*.bk runs/t/lens-*.bk runs/t/gen-*.bk runs/t/teach-*.bk runs/t/metrics-*.bk runs/t/loss-*.txt &&
	test -f runs/t/adapter-*/final/adapter_model.safetensors
'

test_expect_success 'nothing changed: nothing runs' '
	$MK >out 2>&1 && cat out && test "$(ran out)" = ""
'

test_expect_success 'changing LR re-runs only bk-step (and the plot of its metrics)' '
	$MK LR=1e-3 >out 2>&1 && cat out &&
	test "$(ran out)" = "bk-plot bk-step " &&
	test $(ls -d runs/t/adapter-* | wc -l) = 2 && test $(ls runs/t/gen-*.bk | wc -l) = 1
'

test_expect_success 'changing the sampling temperature re-runs from bk-gen' '
	$MK SAMPLING_TEMPERATURE=0.5 >out 2>&1 && cat out &&
	test "$(ran out)" = "bk-gen bk-plot bk-step bk-teach " && grep -q "bk-gen .*--temperature 0.5" out
'

test_expect_success 'bk-gen samples with top-k 50 (HF and bk-bake); SAMPLING_TOP_K re-runs from bk-gen' '
	$MK -n SAMPLING_TEMPERATURE=0.6 >plan 2>&1 && grep -q "^bk-gen .*--top-k 50 --top-p 0.9" plan &&
	$MK SAMPLING_TEMPERATURE=0.5 SAMPLING_TOP_K=0 >out 2>&1 && cat out &&
	test "$(ran out)" = "bk-gen bk-plot bk-step bk-teach " && grep -q "^bk-gen .*--top-k 0 " out
'

test_expect_success 'deleting gen-*.bk re-runs from bk-gen, not bk-tokenize' '
	rm runs/t/gen-*.bk &&
	$MK SAMPLING_TEMPERATURE=0.5 >out 2>&1 && cat out &&
	grep -q "^bk-gen " out && test "$(ran out)" = "bk-gen bk-plot bk-step bk-teach "
'

test_expect_success 'SHARDS=2: shard targets, merged into the unsharded teach file' '
	$MK NAME=s SHARDS=2 >out 2>&1 && cat out &&
	grep -q "^bk-gen .*--shard 1/2 " out && grep -q "^bk-teach .*--shard 0/2 " out &&
	grep -q "^bk-dump --merge " out &&
	ls runs/s/gen-*.0of2.bk runs/s/teach-*.1of2.bk &&
	f=$(ls runs/s/teach-*.bk | grep -v "of2.bk$") && test -f runs/t/$(basename $f) &&
	bk-dump $f >a && bk-dump runs/t/$(basename $f) >b && test_cmp a b &&
	a=$(ls -d runs/s/adapter-*) && test -d runs/t/$(basename $a)
'

test_expect_success 'NPROC=2: bk-step runs as two MPI ranks' '
	if ! ldd "$BK_BIN/bk-step" | grep libmpi >/dev/null; then echo "skip: no MPI"; exit 0; fi &&
	ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0" \
	OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
	$MK NAME=s SHARDS=2 NPROC=2 MPIRUN="mpirun --oversubscribe" >out 2>&1 && cat out &&
	grep -q "^mpirun --oversubscribe -np 2 bk-step " out && test "$(ran out)" = "bk-plot " &&
	test $(ls -d runs/s/adapter-* | wc -l) = 2
'

test_expect_success 'a CONFIG file sets the variables; the command line wins over it' '
	printf "LR = 7e-4\nSEED = 5\n" >cfg.mk &&
	$MK CONFIG=$TEST_TMP/cfg.mk SEED=6 -n >dry 2>&1 &&
	grep -q "^bk-step .*--lr 7e-4 .*--seed 6 " dry &&
	! grep -q -- "--seed 5" dry
'

test_expect_success 'every example config is accepted by bk-bake --dry-run' '
	n=0 &&
	for y in "$ROOT"/pipelines/examples/*.yaml; do
		(cd "$ROOT" && bk-bake --dry-run "$y") >plan 2>notes || { cat notes; exit 1; }
		grep -q "^bk-tokenize " plan && grep -q "bk-step " plan || exit 1
		if grep -E "unsupported|unknown" notes; then exit 1; fi
		n=$((n + 1))
	done && test $n -ge 5
'

test_expect_success 'the SFT example bakes (paired data: no trajectories)' '
	(cd "$ROOT" && bk-bake pipelines/examples/sft.yaml --output_dir "$TEST_TMP/sft") >summary &&
	cat summary && grep -q "^data *16 prompt/response pairs, 3 epochs" summary &&
	test -f sft/final_model/adapter_model.safetensors && test -d sft/checkpoint-4 &&
	test -f sft/results.json
'

test_expect_success 'bk-plot draws loss and learning rate; a stream without steps is refused' '
	"$ROOT/pipelines/bk-plot" sft/metrics.bk >plot &&
	grep -q "^loss per step" plot && grep -q "^learning rate per step" plot &&
	test_must_fail "$ROOT/pipelines/bk-plot" sft/tokens.bk
'

test_expect_success 'bk-plot: the header shows the smallest loss, not the axis; a truncated stream fails' '
	want=$(bk-dump sft/metrics.bk | jq -s "[.[] | select(.step != null) | .loss] | min") &&
	got=$(sed -n "s/^loss per step (min \([^,]*\),.*/\1/p" plot) &&
	awk -v a="$got" -v b="$want" "BEGIN { d = a - b; if (d < 0) d = -d; exit !(b > 0 && d <= 1e-3 * b) }" &&
	size=$(stat -c %s sft/metrics.bk) && head -c $((size - 20)) sft/metrics.bk >cut.bk &&
	test_must_fail "$ROOT/pipelines/bk-plot" cut.bk 2>err >/dev/null && grep -q "cut.bk: stream truncated" err &&
	test_must_fail "$ROOT/pipelines/bk-plot" <(cat cut.bk) 2>err >/dev/null && grep -q "stream truncated" err
'

test_expect_success 'make install puts bk-plot in bin and bake.mk in share/bakery; an installed bake.mk finds bk-plot on PATH' '
	make -s -n -C "$ROOT" install BUILD="${BUILD:-build}" PREFIX=/opt/bk DESTDIR="$TEST_TMP/d" >inst &&
	grep -q "^install -m 755 .*pipelines/bk-plot $TEST_TMP/d/opt/bk/bin\$" inst &&
	grep -q "^install -m 644 pipelines/bake.mk $TEST_TMP/d/opt/bk/share/bakery\$" inst &&
	mkdir -p share && cp "$ROOT/pipelines/bake.mk" share/ &&
	make -n -f share/bake.mk BIN="$BK_BIN" RUNS=r NAME=i MODEL="$MODELS/stories260K" \
		DATA="$DATA/pipe/stories.txt" TEMPLATE=raw >plan1 2>&1 && grep -q "^bk-plot " plan1 &&
	$MK NAME=fresh -n >plan2 2>&1 && grep -q "^pipelines/bk-plot " plan2
'

test_done

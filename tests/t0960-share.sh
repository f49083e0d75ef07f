#!/usr/bin/env bash
# t0960-share.sh - one copy of the frozen weights per GPU (gpu/wshare.h, gpu/cuda/cuda_vmm.h)
# under the emulation (make emu, build-emu/: a physical allocation is a memfd, so the stages'
# device memory is really shared between their processes): the GPU stages of a pipe on
# stories260K map the copy the first one loaded (the same memfd inode in each process's
# maps; the copy outlives the loader for the next stage), compute what own copies compute,
# a kill -9 of the loader and of the holder mid-run breaks no mapping, and a stage that
# cannot share (sharing off, a driver without the calls) loads its own and says so once;
# in 4 bits (--load-in-4bit) the copy is the quantised one, one per 4-bit setting.
. "$(dirname "$0")/lib.sh"
emu_setup bin/bk-teach
export BK_SHARE_LINGER=5 # the holders of this test go soon after it
unset BK_SHARE_WEIGHTS BK_SHARE_HOLDER BK_EMU_NO_VMM
SYS="Sparky is a friendly dragon who lives in a cave."
# under ASan (make asan test: build-emu/asan, about 4 times slower) the pipe, the kill and
# the plan; the fallbacks (host logic, also in test_wshare) in the plain run
FULL=1
case $EMU_BUILD in */asan) FULL=0 ;; esac

GEN=(bk-gen --model "$M" --device cuda -v --num-trajectories 2 --max-new-tokens 8 --seed 1)
TEACH=(bk-teach --model "$M" --device cuda -v)
gen() { "${GEN[@]}" "$@"; }
teach() { "${TEACH[@]}" "$@"; }
# the inodes of the emulated physical allocations process PID maps
phys() { awk '/memfd:bk-emu-phys/ { print $5 }' "/proc/$1/maps" | sort -u; }
# the rendezvous directory of a test (so that no copy of an earlier test is found)
rv() { export XDG_RUNTIME_DIR="$TEST_TMP/run-$1"; mkdir -p -m 700 "$XDG_RUNTIME_DIR"; }
rv unshared
# wait_for FILE TEXT: until FILE holds TEXT (60 s at most)
wait_for() {
	for _ in $(seq 600); do grep -q "$2" "$1" 2>/dev/null && return 0; sleep 0.1; done
	echo "no '$2' in $1:"; cat "$1"; return 1
}

bk-tokenize --model "$M" --system "$SYS" "$DATA/pipe/stories.txt" -o tok.bk 2>/dev/null &&
	BK_SHARE_WEIGHTS=0 gen tok.bk -o gen0.bk 2>gen0.err &&
	BK_SHARE_WEIGHTS=0 teach gen0.bk -o teach0.bk 2>teach0.err || echo "not ok - the unshared runs"

test_expect_success 'unshared: each stage loads its own copy and says so once' '
	test $(grep -c "not sharing the weights" gen0.err) = 1 &&
	grep -q "BK_SHARE_WEIGHTS=0" gen0.err && test $(grep -c "not sharing" teach0.err) = 1 &&
	! grep -q "shared copy" gen0.err teach0.err
'

test_expect_success 'a pipe: bk-gen loads the copy, bk-teach (loading after bk-gen has exited) maps it; the same bytes as own copies' '
	rv pipe && gen tok.bk 2>gen1.err | teach -o teach1.bk 2>teach1.err &&
	grep -q "loaded the weights into a copy shared with the stages on this GPU" gen1.err &&
	grep -q "mapped the shared copy of the weights (2.0 MiB, served by process" teach1.err &&
	! grep -q "not sharing" gen1.err teach1.err &&
	cmp teach0.bk teach1.bk
'

test_expect_success 'side by side: one physical copy (the same memfd in both processes), the loader killed -9 and then the holder mid-run, the importer unharmed' '
	rv kill; rm -f fifo; mkfifo fifo || exit 1
	"${GEN[@]}" fifo -o gen2.bk 2>gen2.err & gpid=$!
	exec 7>fifo && cat tok.bk >&7 && wait_for gen2.err "loaded the weights into a copy" || exit 1
	"${TEACH[@]}" gen0.bk -o teach2.bk 2>teach2.err & tpid=$!
	wait_for teach2.err "mapped the shared copy" &&
	a=$(phys $gpid) && b=$(phys $tpid) && echo "loader $a, importer $b" &&
	test -n "$a" && test "$a" = "$b" && test $(echo "$a" | wc -l) = 1 &&
	hpid=$(sed -n "s/.*served by process \([0-9]*\)).*/\1/p" teach2.err) &&
	test "$(phys $hpid)" = "$a" &&
	kill -0 $tpid && kill -9 $gpid && kill -9 $hpid && exec 7>&- &&
	{ wait $gpid; test $? = 137; } &&
	{ wait $tpid || { echo "importer failed:"; cat teach2.err; false; }; } && cmp teach0.bk teach2.bk &&
	{ ! test -e /proc/$hpid || grep -q "^State:.*Z" /proc/$hpid/status; } # gone (or a zombie)
'

test_expect_success 'after the copy is gone (loader and holder killed) the next stage loads its own and serves it' '
	rv kill && teach gen0.bk -o teach3.bk 2>teach3.err &&
	grep -q "loaded the weights into a copy shared" teach3.err && cmp teach0.bk teach3.bk
'

if [ $FULL = 1 ]; then
test_expect_success 'no holder (BK_SHARE_HOLDER=0): the loader serves while it runs; the same bytes' '
	rv noholder; rm -f fifo; mkfifo fifo || exit 1
	BK_SHARE_HOLDER=0 "${GEN[@]}" fifo -o gen4.bk 2>gen4.err & gpid=$!
	exec 7>fifo && cat tok.bk >&7 && wait_for gen4.err "loaded the weights into a copy" &&
	teach gen0.bk -o teach4.bk 2>teach4.err &&
	grep -q "served by process $gpid)" teach4.err &&
	exec 7>&- && wait $gpid && cmp gen0.bk gen4.bk && cmp teach0.bk teach4.bk
'

test_expect_success 'a driver without virtual memory management (BK_EMU_NO_VMM=1) or --no-share-weights: an own copy, said once, the same bytes' '
	rv novmm && BK_EMU_NO_VMM=1 teach gen0.bk -o teach5.bk 2>teach5.err &&
	test $(grep -c "not sharing the weights" teach5.err) = 1 &&
	grep -q "no virtual memory management" teach5.err && cmp teach0.bk teach5.bk &&
	teach --no-share-weights gen0.bk -o teach6.bk 2>teach6.err &&
	grep -q "not sharing the weights .*--no-share-weights" teach6.err && cmp teach0.bk teach6.bk
'

test_expect_success 'a rendezvous directory that is not private: an own copy, said once' '
	mkdir -p -m 755 open/bakery && XDG_RUNTIME_DIR=$TEST_TMP/open teach gen0.bk -o teach7.bk 2>teach7.err &&
	test $(grep -c "not sharing the weights" teach7.err) = 1 && grep -q "not a private directory" teach7.err &&
	cmp teach0.bk teach7.bk
'

fi

# 4 bits (--load-in-4bit): the copy shared is the quantised one (the packed codes and the
# statistics, the embeddings and norms in bf16), its key the 4-bit setting
Q4="--load-in-4bit --bnb-4bit-quant-type nf4 --bnb-4bit-use-double-quant 1"
F4="--load-in-4bit --bnb-4bit-quant-type fp4 --bnb-4bit-use-double-quant 0"
BK_SHARE_WEIGHTS=0 gen $Q4 tok.bk -o gen0q.bk 2>gen0q.err &&
	BK_SHARE_WEIGHTS=0 teach $Q4 gen0q.bk -o teach0q.bk 2>teach0q.err &&
	BK_SHARE_WEIGHTS=0 teach $F4 gen0q.bk -o teach0f.bk 2>teach0f.err &&
	BK_SHARE_WEIGHTS=0 teach $Q4 --bnb-4bit-compute-dtype float32 gen0q.bk -o teach0d.bk 2>teach0d.err ||
	echo "not ok - the unshared 4-bit runs"

test_expect_success '4 bits side by side: bk-gen loads the quantised copy, bk-teach maps it (the same memfd); the same bytes as own copies' '
	! cmp -s gen0.bk gen0q.bk && ! cmp -s teach0q.bk teach0f.bk &&
	rv q4; rm -f fifo fifo2; mkfifo fifo fifo2 || exit 1
	"${GEN[@]}" $Q4 fifo -o gen8.bk 2>gen8.err & gpid=$!
	exec 7>fifo && cat tok.bk >&7 && wait_for gen8.err "loaded the weights into a copy shared" || exit 1
	"${TEACH[@]}" $Q4 fifo2 -o teach8.bk 2>teach8.err & tpid=$!
	exec 8>fifo2 && cat gen0q.bk >&8 && wait_for teach8.err "mapped the shared copy" &&
	a=$(phys $gpid) && b=$(phys $tpid) && echo "bk-gen $a, bk-teach $b" &&
	test -n "$a" && test "$a" = "$b" && test $(echo "$a" | wc -l) = 1 &&
	grep -q "copy shared with the stages on this GPU (4-bit nf4,double-quant,bfloat16, [0-9.]* MiB)" gen8.err &&
	grep -q "mapped the shared copy of the weights (4-bit nf4,double-quant,bfloat16, [0-9.]* MiB, served by process" teach8.err &&
	! grep -q "not sharing" gen8.err teach8.err &&
	exec 8>&- && wait $tpid && cmp teach0q.bk teach8.bk &&
	exec 7>&- && wait $gpid && cmp gen0q.bk gen8.bk
'

test_expect_success '4 bits: a stage of another setting (fp4, no double quant; another compute dtype) loads a copy of its own, the next one of that setting maps it; the same bytes' '
	rv q4f; rm -f fifo fifo2; mkfifo fifo fifo2 || exit 1
	"${TEACH[@]}" $Q4 fifo -o teach10.bk 2>teach10.err & npid=$!
	exec 7>fifo && cat gen0q.bk >&7 && wait_for teach10.err "loaded the weights into a copy shared" || exit 1
	"${TEACH[@]}" $F4 fifo2 -o teach11.bk 2>teach11.err & fpid=$!
	exec 8>fifo2 && cat gen0q.bk >&8 && wait_for teach11.err "loaded the weights into a copy shared" &&
	grep -q "copy shared with the stages on this GPU (4-bit fp4,bfloat16, " teach11.err &&
	a=$(phys $npid) && b=$(phys $fpid) && echo "nf4 $a, fp4 $b" &&
	test -n "$a" && test -n "$b" && test "$a" != "$b" &&
	teach $F4 gen0q.bk -o teach12.bk 2>teach12.err &&
	grep -q "mapped the shared copy of the weights (4-bit fp4,bfloat16, [0-9.]* MiB, served by process" teach12.err &&
	cmp teach0f.bk teach12.bk &&
	exec 8>&- && wait $fpid && cmp teach0f.bk teach11.bk &&
	! cmp -s teach0q.bk teach0d.bk && teach $Q4 --bnb-4bit-compute-dtype float32 gen0q.bk -o teach13.bk 2>teach13.err &&
	grep -q "copy shared with the stages on this GPU (4-bit nf4,double-quant,float32, " teach13.err &&
	cmp teach0d.bk teach13.bk &&
	exec 7>&- && wait $npid && cmp teach0q.bk teach10.bk
'

test_expect_success 'the plan counts one copy for the stages side by side, each its own under BK_SHARE_WEIGHTS=0' '
	mkdir -p q17 && cp "$ROOT/tests/golden/memplan/Qwen3-1.7B"/* q17/ &&
	xz -dc "$ROOT/tests/golden/bpe/qwen.tokenizer.json.xz" >q17/tokenizer.json &&
	printf "%s\n" "teacher_top_k: 64" "model_name_or_path: $TEST_TMP/q17" \
		"system_prompt: \"$SYS\"" "training_prompts: [\"Tell me about your cave\", \"Sing me a song\"]" \
		"num_trajectories: 4" "trajectory_length: 256" "per_device_train_batch_size: 2" \
		"lora_r: 16" "target_modules: all-linear" "output_dir: $TEST_TMP/out-q17" >q17.yaml &&
	bk-bake --dry-run --gpu-memory 24GiB q17.yaml >plan 2>err &&
	grep "^# one copy of the weights (3.[0-9]* GiB) mapped by every stage: side by side" plan &&
	BK_SHARE_WEIGHTS=0 bk-bake --dry-run --gpu-memory 24GiB q17.yaml >plan0 2>err &&
	grep "^# each stage loads its own copy of the weights (BK_SHARE_WEIGHTS=0)" plan0 &&
	sed -n "s/^# one copy of the weights (\([0-9.]*\) GiB) mapped by every stage: side by side \([0-9.]*\) GiB, each with its own copy \([0-9.]*\) GiB$/\1 \2 \3/p" plan >n &&
	read -r w x y <n && echo "weights $w, one copy $x, own copies $y" &&
	awk -v w=$w -v x=$x -v y=$y "BEGIN { d = y - x - 2 * w; exit !(d < 0.02 && d > -0.02) }" &&
	grep -q "^fits: yes, peak $x GiB of 24.00 GiB$" plan && grep -q "(side by side)$" plan
'

test_done

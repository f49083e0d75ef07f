#!/usr/bin/env bash
# bk-step on stories260K: bk-tokenize (paired data) | bk-lens | bk-step; metrics stream,
# PEFT adapter, kill -9 + --resume = uninterrupted run (cmp), SIGTERM saves a
# checkpoint, exact mode = a full teacher field, refused streams and plans.
. "$(dirname "$0")/lib.sh"
M="$MODELS/stories260K"
export XDG_CACHE_HOME="$TEST_TMP/cache"
export OMP_NUM_THREADS=1 # fast and steady on a busy 2-core machine
set -o pipefail

bk-tokenize --model "$M" --system "Sparky is a friendly dragon who lives in a cave." \
	"$DATA/pipe/bake.json" 2>/dev/null | bk-lens -q --max-tokens 128 >b.bk
F="--model $M --device cpu --lora-r 8 --lora-alpha 16 --lr 2e-3"

test_expect_success 'bk-step trains; the metrics stream reads with bk-dump' '
	bk-step $F --out o --epochs 2 --logging-steps 2 b.bk >m.bk 2>err &&
	bk-dump --header m.bk >m.jsonl &&
	head -1 m.jsonl | jq -e ".provenance | map(.tool) == [\"bk-tokenize\", \"bk-lens\", \"bk-step\"]" &&
	nb=$(bk-dump b.bk | jq -s "map(.batch) | unique | length") &&
	steps=$((2 * nb)) &&
	sed 1d m.jsonl | jq -s -e --argjson n $steps "
		(.[:-1] | length == (\$n / 2) and all(.[]; .step % 2 == 0 and .loss >= 0 and
			.lr >= 0 and .grad_norm > 0 and .tokens > 0 and .tokens_per_s > 0 and
			.elapsed > 0 and (.epoch | type) == \"number\")) and
		(.[-1] == {checkpoints: [\"o/checkpoint-\(\$n / 2)\", \"o/checkpoint-\(\$n)\"], final: \"o/final\"})" &&
	grep -q "tokens/s" err
'

test_expect_success 'final/ holds a PEFT adapter with the right config and tensors' '
	jq -e --arg m "$M" ".r == 8 and .lora_alpha == 16 and .peft_type == \"LORA\" and
		.base_model_name_or_path == \$m and
		(.target_modules | sort) == ([\"q_proj\",\"k_proj\",\"v_proj\",\"o_proj\",\"gate_proj\",\"up_proj\",\"down_proj\"] | sort)" \
		o/final/adapter_config.json &&
	st=o/final/adapter_model.safetensors &&
	n=$(od -An -tu8 -N8 $st | tr -d " ") &&
	dd if=$st bs=1 skip=8 count=$n 2>/dev/null | jq -e "
		(keys | length) == 71 and
		.[\"base_model.model.model.layers.4.mlp.down_proj.lora_A.weight\"].shape == [8, 172] and
		.[\"base_model.model.model.layers.0.self_attn.k_proj.lora_B.weight\"].shape == [32, 8]" &&
	for f in adapter_model.safetensors adapter_config.json trainer_state.json trainer_state.safetensors; do
		test -s o/final/$f || return 1
	done &&
	jq -e ".format == \"bakery-trainer-state\" and .step > 0" o/final/trainer_state.json &&
	bk-step $F --out o2 --epochs 1 --base-model-name my/base b.bk >/dev/null 2>&1 &&
	jq -e ".base_model_name_or_path == \"my/base\"" o2/final/adapter_config.json
'

test_expect_success 'same flags, same adapter; another seed, another adapter' '
	bk-step $F --out r1 --epochs 2 --batch-size 3 --grad-accum 2 b.bk >/dev/null 2>&1 &&
	bk-step $F --out r2 --epochs 2 --batch-size 3 --grad-accum 2 b.bk >/dev/null 2>&1 &&
	bk-step $F --out r3 --epochs 2 --batch-size 3 --grad-accum 2 --seed 1 b.bk >/dev/null 2>&1 &&
	cmp r1/final/adapter_model.safetensors r2/final/adapter_model.safetensors &&
	! cmp -s r1/final/adapter_model.safetensors r3/final/adapter_model.safetensors
'

test_expect_success 'gradient checkpointing, every layer or in segments, gives the same adapter bit for bit' '
	bk-step $F --out c0 --epochs 2 --lora-dropout 0.1 b.bk >/dev/null 2>&1 &&
	bk-step $F --out c1 --epochs 2 --lora-dropout 0.1 --grad-checkpoint b.bk >/dev/null 2>&1 &&
	bk-step $F --out c2 --epochs 2 --lora-dropout 0.1 --grad-checkpoint-every 2 b.bk >/dev/null 2>&1 &&
	cmp c0/final/adapter_model.safetensors c1/final/adapter_model.safetensors &&
	cmp c0/final/adapter_model.safetensors c2/final/adapter_model.safetensors &&
	test_must_fail bk-step $F --out c3 --grad-checkpoint-every 1 b.bk 2>err &&
	grep -q "grad-checkpoint-every" err
'

# a longer run to interrupt: 16 epochs of 4 steps, a checkpoint every 4 steps
L="$F --lora-r 64 --lora-alpha 128 --epochs 16 --save-steps 4 --schedule cosine --warmup-ratio 0.1 --grad-accum 2 --batch-size 1"
wait_for() { # wait_for DIR: until DIR exists (at most 20 s)
	local i=0; while ! test -d "$1"; do sleep 0.01; i=$((i + 1)); [ $i -lt 2000 ] || return 1; done
}
latest() { ls -d "$1"/checkpoint-* | grep -v "\.tmp\." | sort -t- -k2 -n | tail -1; }

test_expect_success 'kill -9 mid-run, then --resume: the final adapter equals an uninterrupted run' '
	bk-step $L --out full b.bk >full.bk 2>/dev/null &&
	{ bk-step $L --out k b.bk >/dev/null 2>&1 & pid=$!; } &&
	wait_for k/checkpoint-8 && kill -9 $pid; wait $pid; test $? -eq 137 &&
	! test -d k/final && c=$(latest k) &&
	for d in k/checkpoint-*; do case $d in *.tmp.*) continue ;; esac
		test -s $d/trainer_state.json && test -s $d/adapter_model.safetensors || return 1; done &&
	bk-step $L --out k --resume $c b.bk >res.bk 2>err && grep -q "resuming from $c" err &&
	cmp full/final/adapter_model.safetensors k/final/adapter_model.safetensors &&
	bk-dump full.bk | jq -c "select(.step != null) | [.step, .loss, .lr, .grad_norm]" >a &&
	bk-dump res.bk | jq -c "select(.step != null) | [.step, .loss, .lr, .grad_norm]" >b &&
	tail -n $(wc -l <b) a >a.tail && test_cmp a.tail b
'

test_expect_success 'SIGTERM: a checkpoint is saved, exit 0, and it resumes to the same adapter' '
	{ bk-step $L --out t b.bk >t.bk 2>err & pid=$!; } &&
	wait_for t/checkpoint-4 && kill -TERM $pid && wait $pid &&
	grep -q "interrupted by signal 15" err && ! test -d t/final &&
	c=$(sed -n "s/.*; saved \([^ ]*\) .*/\1/p" err) && test -s $c/trainer_state.json &&
	bk-dump t.bk | tail -1 | jq -e --arg c "$c" ".final == null and (.checkpoints | index(\$c)) != null" &&
	bk-step $L --out t --resume $c b.bk >/dev/null 2>&1 &&
	cmp full/final/adapter_model.safetensors t/final/adapter_model.safetensors
'

test_expect_success 'exact mode and a full teacher field (bk-teach --top-k 0) give the same loss' '
	bk-step $F --out e1 --max-steps 3 --schedule constant b.bk 2>/dev/null | bk-dump |
		jq -c "select(.loss != null) | .loss" >l1 &&
	bk-teach --model "$M" --device cpu --top-k 0 b.bk 2>/dev/null >t0.bk &&
	bk-step $F --out e2 --max-steps 3 --schedule constant t0.bk 2>/dev/null | bk-dump |
		jq -c "select(.loss != null) | .loss" >l2 &&
	test $(wc -l <l1) -eq 3 && paste l1 l2 | awk "{ d = \$1 - \$2; if (d < 0) d = -d; if (d > 1e-5) exit 1 }"
'

test_expect_success 'a stream at another teacher temperature is refused' '
	bk-teach --model "$M" --device cpu --top-k 8 --temperature 2 b.bk 2>/dev/null >t2.bk &&
	test_must_fail bk-step $F --out x t2.bk 2>err >/dev/null && grep -q "temperature 2" err &&
	test $(wc -l <err) -eq 1 && ! test -d x/final &&
	bk-step $F --out x --temperature 2 --max-steps 1 t2.bk >/dev/null 2>&1 && test -d x/final
'

test_expect_success 'a stream made with another model is refused' '
	bk-dump --header b.bk | jq -c "if .bk == \"header\" then .provenance += [{tool: \"bk-teach\", model: \"0123456789abcdef\"}] else . end" |
		bk-dump --from-json >other.bk &&
	test_must_fail bk-step $F --out y other.bk 2>err >/dev/null && grep -q "another model" err &&
	test $(wc -l <err) -eq 1
'

test_expect_success 'a model whose tokenizer.json is not the stream'"'"'s tokenizer is refused' '
	cp -r "$M" mj && echo "{\"model\": {\"type\": \"BPE\"}}" >mj/tokenizer.json &&
	test_must_fail bk-step $F --model mj --out tj --max-steps 1 b.bk 2>err >/dev/null &&
	grep -q "b.bk: stream was made with another tokenizer" err && ! test -e tj &&
	test_must_fail bk-step $F --model mj --out tj --max-steps 1 --eval-final --eval b.bk \
		b.bk 2>err >/dev/null && ! test -e tj
'

# the records of b.bk with one field of record N (jq path, value) changed
edit_rec() { # IN N PATH VALUE OUT
	bk-dump --header "$1" | jq -c --argjson n "$2" --argjson v "$4" \
		"if input_line_number == \$n + 1 then $3 = \$v else . end" | bk-dump --from-json -o "$5"
}
test_expect_success 'ids outside the vocabulary or a teacher of another one: refused before any work, naming the record' '
	n=$(bk-dump b.bk | wc -l) &&
	edit_rec b.bk $n ".resp[0]" 600 oov.bk &&
	test_must_fail bk-step $F --out v1 --save-steps 1 oov.bk 2>err >/dev/null &&
	grep -q "oov.bk: record $n: key .resp. holds id 600, outside the vocabulary \[0, 512)" err &&
	! test -e v1 &&
	edit_rec b.bk $n ".s_prompt[0]" 700 oovs.bk &&
	test_must_fail bk-step $F --out v1 oovs.bk 2>err >/dev/null &&
	grep -q "record $n: key .s_prompt. holds id 700" err && ! test -e v1 &&
	edit_rec b.bk $n ".t_prompt[1]" 512 oovt.bk &&
	test_must_fail bk-step $F --out v1 oovt.bk 2>err >/dev/null &&
	grep -q "record $n: key .t_prompt. holds id 512" err && ! test -e v1 &&
	bk-teach --model "$M" --device cpu --top-k 8 b.bk 2>/dev/null >tv0.bk &&
	edit_rec tv0.bk $n ".teacher.v" 1000 tv.bk &&
	test_must_fail bk-step $F --out v1 --save-steps 1 tv.bk 2>err >/dev/null &&
	grep -q "tv.bk: record $n: key .teacher. is over a vocabulary of 1000, the model.s is 512" err &&
	! test -e v1
'

test_expect_success 'over a pipe a bad record is refused naming it; the steps before it are a checkpoint, not a result' '
	n=$(bk-dump b.bk | wc -l) &&
	{ cat oov.bk | bk-step $F --out v2 --schedule constant >/dev/null 2>err; test $? -eq 1; } &&
	grep -q "stdin: record $n: key .resp. holds id 600" err &&
	grep -q "saved the .* steps done in v2/checkpoint-" err &&
	! test -e v2/final && ls v2/checkpoint-*/adapter_model.safetensors
'

test_expect_success 'a decaying schedule over a pipe needs --max-steps' '
	cat b.bk | test_must_fail bk-step $F --out z 2>err >/dev/null && grep -q "max-steps" err &&
	cat b.bk | bk-step $F --out z --max-steps 2 2>/dev/null | bk-dump | jq -s -e ".[-1].final == \"z/final\"" &&
	cat b.bk | test_must_fail bk-step $F --out z --max-steps 2 2>err >/dev/null &&
	grep -q "already holds another run" err &&
	nb=$(bk-dump b.bk | jq -s "map(.batch) | unique | length") &&
	cat b.bk | bk-step $F --out z2 --schedule constant 2>/dev/null | bk-dump | jq -s -e --argjson n $nb "length == \$n + 1" &&
	{ cat b.bk | bk-step $F --out z3 --epochs 2 2>/dev/null; test $? -eq 2; }
'

test_expect_success 'records without a batch plan need --batch-size; bad flags exit 2' '
	bk-tokenize --model "$M" "$DATA/pipe/bake.json" 2>/dev/null >nob.bk &&
	test_must_fail bk-step $F --out w nob.bk 2>err && grep -q "batch" err &&
	bk-step $F --out w --batch-size 4 nob.bk 2>/dev/null | bk-dump | jq -s -e ".[-1].checkpoints == [\"w/checkpoint-2\"]" &&
	bk-step $F --out w --schedule nope b.bk 2>err; test $? -eq 2 && grep -q schedule err &&
	bk-step $F --out w --warmup-ratio 0.1 --warmup-steps 2 b.bk 2>/dev/null; test $? -eq 2
'

test_expect_success 'a stream that ends truncated mid-run keeps the steps already done' '
	size=$(stat -c %s b.bk) &&
	head -c $((size * 2 / 3)) b.bk >cut.bk &&
	{ cat cut.bk | bk-step $F --out tr --batch-size 2 --schedule constant >/dev/null 2>err; test $? -eq 1; } &&
	grep -q "stream truncated" err && grep -q "saved the .* steps done in tr/checkpoint-" err &&
	test $(grep -c "error" err) -eq 1 &&
	ls tr/checkpoint-*/adapter_model.safetensors
'
test_expect_success 'a metrics reader that goes away stops the metrics, not the training' '
	{ bk-step $F --out sp --batch-size 2 --epochs 3 --schedule constant b.bk 2>sperr; echo $? >rc; } |
		head -c 10 >/dev/null &&
	test "$(cat rc)" -eq 0 && test -f sp/final/adapter_model.safetensors &&
	test $(grep -c "reader of the metrics stream went away" sperr) -eq 1 &&
	jq -e ".step == $(jq .step sp/final/trainer_state.json)" sp/final/trainer_state.json >/dev/null &&
	bk-step $F --out sp2 --batch-size 2 --epochs 3 --schedule constant b.bk 2>/dev/null | bk-dump | head -1 >/dev/null &&
	test -f sp2/final/adapter_model.safetensors &&
	cmp sp/final/adapter_model.safetensors sp2/final/adapter_model.safetensors
'
test_expect_success 'a refused --resume saves nothing and names the flag that differs' '
	bk-step $F --out rs --epochs 2 --save-steps 2 b.bk >/dev/null 2>&1 &&
	c=$(latest rs) && ls rs >before &&
	test_must_fail bk-step $F --out rs --epochs 2 --save-steps 2 --lora-r 16 --resume $c b.bk 2>err >/dev/null &&
	grep -q -- "--lora-r 16 differs from the checkpoint.s 8" err &&
	test_must_fail bk-step $F --out rs --epochs 2 --save-steps 2 --optim adamw8bit --resume $c b.bk 2>err >/dev/null &&
	grep -q -- "--optim adamw8bit differs from the checkpoint.s adamw" err &&
	test_must_fail bk-step $F --out rs --epochs 2 --save-steps 2 --lr 1e-3 --resume $c b.bk 2>err >/dev/null &&
	grep -q -- "--lr 0.001 differs from the checkpoint.s 0.002" err &&
	test_must_fail bk-step $F --out rs --epochs 2 --save-steps 2 --resume rs/nope b.bk 2>err >/dev/null &&
	bk-teach --model "$M" --device cpu --top-k 8 b.bk 2>/dev/null >tk.bk &&
	test_must_fail bk-step $F --out rs --epochs 2 --save-steps 2 --resume $c tk.bk 2>err >/dev/null &&
	grep -q "top-k teacher field; the checkpoint was trained on records without" err &&
	bk-step $F --out rt --max-steps 2 --save-steps 1 tk.bk >/dev/null 2>&1 &&
	test_must_fail bk-step $F --out rt --max-steps 2 --resume rt/checkpoint-1 b.bk 2>err >/dev/null &&
	grep -q "the stream has records without a teacher field" err &&
	ls rs >after && test_cmp before after && ! test -d rs/checkpoint-0 && ! test -d rt/checkpoint-0
'

test_expect_success '--resume with other records (same count) is refused: a file, a pipe' '
	bk-tokenize --model "$M" --system "Another prompt entirely." "$DATA/pipe/bake.json" \
		2>/dev/null | bk-lens -q --max-tokens 128 >other.bk &&
	test $(bk-dump other.bk | wc -l) = $(bk-dump b.bk | wc -l) &&
	bk-step $F --out ro --epochs 2 --save-steps 1 b.bk >/dev/null 2>&1 &&
	mkdir ro2 && cp -a ro/checkpoint-2 ro2/ &&
	test_must_fail bk-step $F --out ro2 --epochs 2 --save-steps 1 --resume ro2/checkpoint-2 \
		other.bk 2>err >/dev/null &&
	grep -q "resume ro2/checkpoint-2: other.bk holds other records than the stream the checkpoint" err &&
	test "$(ls ro2)" = checkpoint-2 &&
	bk-step $F --out ro2 --epochs 2 --save-steps 1 --resume ro2/checkpoint-2 b.bk >/dev/null 2>&1 &&
	cmp ro/final/adapter_model.safetensors ro2/final/adapter_model.safetensors &&
	P="--schedule constant --save-steps 1" &&
	cat b.bk | bk-step $F --out rp $P >/dev/null 2>&1 &&
	mkdir rp2 && cp -a rp/checkpoint-2 rp2/ &&
	cat other.bk | test_must_fail bk-step $F --out rp2 $P --resume rp2/checkpoint-2 2>err >/dev/null &&
	grep -q "resume rp2/checkpoint-2: stdin holds other records than the stream the checkpoint" err &&
	test "$(ls rp2)" = checkpoint-2 &&
	cat b.bk | bk-step $F --out rp2 $P --resume rp2/checkpoint-2 >/dev/null 2>&1 &&
	cmp rp/final/adapter_model.safetensors rp2/final/adapter_model.safetensors
'

test_expect_success '--out is checked before training; --overwrite; --save-total-limit' '
	: >afile && test_must_fail bk-step $F --out afile b.bk 2>err >/dev/null &&
	grep -q "afile: exists and is not a directory" err &&
	test_must_fail bk-step $F --out afile/sub b.bk 2>err >/dev/null && grep -q -i "not a directory" err &&
	bk-step $F --out ov --epochs 2 --save-steps 1 b.bk >/dev/null 2>&1 &&
	n1=$(ls -d ov/checkpoint-* | wc -l) && test $n1 -gt 3 &&
	test_must_fail bk-step $F --out ov --max-steps 1 b.bk 2>err >/dev/null &&
	grep -q "already holds another run" err &&
	bk-step $F --out ov --overwrite --max-steps 1 --save-steps 1 b.bk >/dev/null 2>&1 &&
	test "$(ls ov)" = "$(printf "checkpoint-1\nfinal")" &&
	bk-step $F --out lim --epochs 2 --save-steps 1 --save-total-limit 2 b.bk 2>/dev/null | bk-dump | tail -1 >last &&
	test $(ls -d lim/checkpoint-* | wc -l) -eq 2 && test -d lim/final &&
	jq -e ".checkpoints | length == 2" last >/dev/null &&
	for d in $(jq -r ".checkpoints[]" last); do test -d $d || return 1; done
'

test_expect_success 'a damaged input file is refused before the first step, as damage' '
	size=$(stat -c %s b.bk) && cp b.bk dmg.bk &&
	printf "\377" | dd of=dmg.bk bs=1 seek=$((size / 2)) conv=notrunc 2>/dev/null &&
	test_must_fail bk-step $F --out dm dmg.bk 2>err >/dev/null && grep -q "stream corrupt" err &&
	! test -e dm &&
	off=$(grep -abo "tokenizer" b.bk | head -1 | cut -d: -f1) && cp b.bk dmh.bk &&
	printf "0" | dd of=dmh.bk bs=1 seek=$((off + 12)) conv=notrunc 2>/dev/null && ! cmp -s b.bk dmh.bk &&
	test_must_fail bk-step $F --out dm dmh.bk 2>err >/dev/null && grep -q "stream corrupt" err
'

test_expect_success 'non-finite weights are refused at load, naming the tensor' '
	cp -r "$M" nan && st=nan/model.safetensors &&
	n=$(od -An -tu8 -N8 $st | tr -d " ") &&
	off=$(dd if=$st bs=1 skip=8 count=$n 2>/dev/null | jq ".[\"model.norm.weight\"].data_offsets[0]") &&
	printf "\000\000\300\177" | dd of=$st bs=1 seek=$((8 + n + off + 8)) conv=notrunc 2>/dev/null &&
	test_must_fail bk-step --model nan --device cpu --out nn b.bk 2>err >/dev/null &&
	grep -q "tensor .model.norm.weight.: non-finite value (nan) at index 2" err && ! test -e nn &&
	test_must_fail bk-teach --model nan --device cpu b.bk 2>err >/dev/null && grep -q "non-finite" err
'

test_expect_success 'one context-length check: every stage that runs the model refuses a sequence past it' '
	w=$(for i in $(seq 300); do printf "the dragon flew over the hill and "; done) &&
	printf "[{\"prompt\": \"Tell me.\", \"response\": \"%s\"}]" "$w" >long.json &&
	printf "%s\n" "$w" >long.txt &&
	test_must_fail bk-tokenize --model "$M" --system "Sparky." long.json 2>err >/dev/null &&
	grep -q "sample 1: teacher sequence of [0-9]* tokens is longer than the model.s context of 512 positions" err &&
	test_must_fail bk-tokenize --model "$M" long.txt 2>err >/dev/null && grep -q "model.s context" err &&
	bk-tokenize --tokenizer "$M/tokenizer.model" --system "Sparky." long.json 2>/dev/null >long.bk &&
	test_must_fail bk-step $F --out ln --batch-size 1 long.bk 2>err >/dev/null &&
	grep -q "record 1: student sequence of [0-9]* tokens is longer than the model.s context" err &&
	test_must_fail bk-teach --model "$M" --device cpu long.bk 2>err >/dev/null &&
	grep -q "record 1: teacher sequence of [0-9]* tokens is longer than the model.s context" err &&
	bk-tokenize --tokenizer "$M/tokenizer.model" long.txt 2>/dev/null >longp.bk &&
	test_must_fail bk-gen --model "$M" --device cpu longp.bk 2>err >/dev/null && grep -q "model.s context" err &&
	test_must_fail bk-eval --model "$M" --device cpu --system "Sparky." --kl-prompts long.txt 2>err >/dev/null &&
	grep -q "long.txt: prompt 1: prompt plus one new token of [0-9]* tokens is longer" err
'

test_expect_success 'without a terminal, a plain progress line every --log-every seconds' '
	bk-step $F --out pl --epochs 2 --log-every 0.000001 b.bk 2>err >/dev/null &&
	test $(grep -c "^bk-step: step [0-9]*/[0-9]*  loss" err) -gt 2 &&
	bk-step $F --out pl2 --epochs 2 --log-every 0 b.bk 2>err >/dev/null &&
	! grep -q "^bk-step: step " err && grep -q "^bk-step: [0-9]* steps in" err &&
	BK_LOG_EVERY=0.000001 bk-teach --model "$M" --device cpu --top-k 8 b.bk 2>err >/dev/null &&
	test $(grep -c "^bk-teach: [0-9]* records, [0-9]* tokens" err) -gt 2 &&
	BK_LOG_EVERY=0 bk-teach --model "$M" --device cpu --top-k 8 b.bk 2>err >/dev/null &&
	! grep -q "^bk-teach: [0-9]* records," err
'
# a full disk: needs a small tmpfs (root with mount rights); skipped, and said so, without
if mkdir -p small && mount -t tmpfs -o size=300k tmpfs small 2>/dev/null; then
	trap 'umount "$TEST_TMP/small" 2>/dev/null; rm -rf "$TEST_TMP"' EXIT
	test_expect_success 'a full disk: one line with errno, no temporary left, no retry' '
		test_must_fail bk-step $F --lora-r 64 --out small/run --epochs 2 b.bk 2>err >/dev/null &&
		grep -q "write error: No space left on device" err &&
		test -z "$(ls small/run)"
	'
	umount small
else
	echo "ok - # skip a full disk (no tmpfs mount here)"
fi
test_done

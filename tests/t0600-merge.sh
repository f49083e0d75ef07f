#!/usr/bin/env bash
# bk-merge: a random adapter folded into stories260K gives a complete model directory
# that the other tools load; adapters of another shape, bad dtypes and an occupied
# output directory are refused.  The adapters come from the unit test's helper mode
# (tests/unit/test_merge.c --write-adapter); the logits check is in that unit test.
. "$(dirname "$0")/lib.sh"
M="$MODELS/stories260K"
HELPER="$BK_BIN/../tests/test_merge"
export XDG_CACHE_HOME="$TEST_TMP/cache"
set -o pipefail

# the JSON header of a safetensors file
st_header() {
	dd if="$1" bs=1 skip=8 count="$(head -c 8 "$1" | od -An -tu8 | tr -d " ")" 2>/dev/null
}

test_expect_success 'merge writes weights, config and tokenizer files, and nothing else' '
	"$HELPER" --write-adapter "$M" ad &&
	test -f ad/adapter_model.safetensors && test -f ad/adapter_config.json &&
	bk-merge --model "$M" --adapter ad --out merged &&
	(cd merged && ls) >files &&
	printf "%s\n" config.json generation_config.json model.safetensors tokenizer.model tokenizer_config.json >want &&
	test_cmp want files &&
	for f in config.json generation_config.json tokenizer.model tokenizer_config.json; do
		cmp "$M/$f" "merged/$f" || return 1
	done &&
	test -z "$(ls -d merged.tmp.* 2>/dev/null)"
'

test_expect_success 'the merged weights keep the base dtype and differ from the base' '
	st_header merged/model.safetensors >header.json &&
	jq -e "[to_entries[] | select(.key != \"__metadata__\") | .value.dtype] | unique == [\"F32\"]" header.json &&
	st_header "$M/model.safetensors" >base.json &&
	jq -S -c "del(.__metadata__) | map_values(.shape)" base.json >bshapes &&
	jq -S -c "del(.__metadata__) | map_values(.shape)" header.json >mshapes &&
	test_cmp bshapes mshapes &&
	! cmp -s merged/model.safetensors "$M/model.safetensors"
'

test_expect_success 'the merged model is a model: bk-teach runs on it and sees other log-probs' '
	echo "[{\"prompt\": \"Once upon a time\", \"response\": \"there was a dog.\"}]" >pair.json &&
	bk-tokenize --model merged pair.json 2>/dev/null >in.bk &&
	bk-teach --device cpu --model merged --top-k 4 in.bk | bk-dump | jq -c .teacher.logp >m.txt &&
	bk-teach --device cpu --model "$M" --top-k 4 in.bk | bk-dump | jq -c .teacher.logp >b.txt &&
	! cmp -s m.txt b.txt
'

test_expect_success '--dtype bf16 writes BF16 tensors and says so in config.json' '
	bk-merge --model "$M" --adapter ad --out m16 --dtype bf16 &&
	st_header m16/model.safetensors >h16.json &&
	jq -e "[to_entries[] | select(.key != \"__metadata__\") | .value.dtype] | unique == [\"BF16\"]" h16.json &&
	jq -e ".torch_dtype == \"bfloat16\" and .hidden_size == 64" m16/config.json
'

test_expect_success 'an adapter for another shape is refused with one line, and no output appears' '
	"$HELPER" --write-adapter "$M" other other &&
	test_must_fail bk-merge --model "$M" --adapter other --out never 2>err &&
	test $(wc -l <err) -eq 1 && grep -q "other" err && grep -q "shape\|\[" err &&
	test ! -e never && test -z "$(ls -d never.tmp.* 2>/dev/null)"
'

test_expect_success 'an occupied output directory is refused; an empty one is used' '
	test_must_fail bk-merge --model "$M" --adapter ad --out merged 2>err &&
	grep -q "already exists" err &&
	mkdir empty && bk-merge --model "$M" --adapter ad --out empty/ && test -f empty/model.safetensors
'

test_expect_success 'usage errors: missing flags, unknown dtype' '
	bk-merge --model "$M" --adapter ad 2>err; test $? -eq 2 &&
	bk-merge --model "$M" --adapter ad --out x --dtype f8 2>err; test $? -eq 2 && test ! -e x
'

# the same shapes in another family: stories260K relabelled as Mistral; and another
# checkpoint of the same architecture: one weight changed
test_expect_success 'an adapter of another architecture is refused (bk-merge, bk-eval); another checkpoint warns' '
	cp -r "$M" mis && jq ".architectures = [\"MistralForCausalLM\"] | .model_type = \"mistral\"" \
		"$M/config.json" >mis/config.json &&
	cp -r ad adm && jq --arg m "$M" ".base_model_name_or_path = \$m" ad/adapter_config.json >adm/adapter_config.json &&
	test_must_fail bk-merge --model mis --adapter adm --out x 2>err &&
	grep -q "^bk-merge: error: adm: the adapter was trained on a llama model ($M), mis is mistral (MistralForCausalLM): another architecture" err &&
	test ! -e x &&
	bk-tokenize --model "$M" --system S --prompt "Once upon a time" 2>/dev/null | bk-lens -q --max-tokens 64 |
		bk-gen --model "$M" --device cpu --num-trajectories 1 --max-new-tokens 4 2>/dev/null >g.bk &&
	bk-step --model "$M" --device cpu --out st --lora-r 2 --max-steps 1 g.bk >/dev/null 2>&1 &&
	test_must_fail bk-merge --model mis --adapter st/final --out x 2>err &&
	grep -q "st/final: the adapter was trained on a llama model (st/final/trainer_state.json), mis is mistral" err &&
	echo "[{\"question\": \"Who?\", \"answer\": \"dragon\"}]" >qa.json &&
	test_must_fail bk-eval --model mis --device cpu --system S --adapter st/final --eval qa.json 2>err >/dev/null &&
	grep -q "another architecture" err &&
	cp -r "$M" ch && python3 -c "
import sys; p = \"ch/model.safetensors\"; b = bytearray(open(p, \"rb\").read()); b[-3] ^= 1; open(p, \"wb\").write(b)" &&
	bk-merge --model ch --adapter st/final --out mch 2>err && test -f mch/model.safetensors &&
	grep -q "^bk-merge: warning: st/final: the adapter was trained on another checkpoint of this architecture" err &&
	bk-merge --model "$M" --adapter st/final --out mok 2>err && test ! -s err
'

test_done

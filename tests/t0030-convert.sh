#!/usr/bin/env bash
# bk-convert: a GGUF model (tests/golden/gguf/tiny.gguf and gemma3.gguf, written by
# tests/ref/make_gguf_golden.py) becomes an HF directory the other tools load; usage
# errors exit 2, bad input exits 1 with one line, and nothing is left behind.  The
# values themselves are checked in tests/unit/test_gguf.c.
. "$(dirname "$0")/lib.sh"
G="$ROOT/tests/golden/gguf"
export XDG_CACHE_HOME="$TEST_TMP/cache"

test_expect_success 'the directory holds the HF files and nothing else' '
	bk-convert --out m "$G/tiny.gguf" &&
	(cd m && ls) >files &&
	printf "%s\n" config.json generation_config.json model.safetensors special_tokens_map.json \
		tokenizer.json tokenizer_config.json >want &&
	test_cmp want files &&
	test -z "$(ls -d m.tmp.* 2>/dev/null)" &&
	jq -e ".tie_word_embeddings == true and .num_key_value_heads == 1" m/config.json &&
	jq -e ".bos_token_id == 1 and .eos_token_id == 2" m/generation_config.json
'

test_expect_success 'the other tools read it: bk-tokenize with the chat template, bk-gen greedy' '
	printf "Hello there\n" >p.txt &&
	bk-tokenize --model m --system "Be brief." p.txt -o t.bk &&
	bk-dump t.bk | jq -e ".t_prompt[0] == 1 and (.s_prompt | length) > (.t_prompt | length)" &&
	bk-gen --model m --device cpu --max-new-tokens 4 --temperature 0 t.bk -o g.bk &&
	test "$(bk-dump g.bk | jq -s "map(select(.response)) | length")" -ge 1
'

test_expect_success 'a Gemma-3 GGUF: tokenizer.model, and the tools read it (template gemma)' '
	bk-convert --out g3 "$G/gemma3.gguf" &&
	(cd g3 && ls) >files &&
	printf "%s\n" config.json generation_config.json model.safetensors special_tokens_map.json \
		tokenizer.model tokenizer_config.json >want &&
	test_cmp want files &&
	jq -e ".architectures[0] == \"Gemma3ForCausalLM\" and .layer_types[5] == \"full_attention\"" g3/config.json &&
	printf "Hello world\n" >p3.txt &&
	bk-tokenize --model g3 --template gemma --system "Be brief." p3.txt -o t3.bk &&
	bk-dump t3.bk | jq -e ".t_prompt[0] == 2 and .t_prompt[1] == 5 and (.s_prompt | length) < (.t_prompt | length)" &&
	bk-gen --model g3 --device cpu --max-new-tokens 4 --temperature 0 t3.bk -o g3.bk &&
	test "$(bk-dump g3.bk | jq -s "map(select(.response)) | length")" -ge 1
'

test_expect_success 'bf16 halves the weights' '
	bk-convert --dtype bf16 --out m16 "$G/tiny.gguf" &&
	jq -e ".torch_dtype == \"bfloat16\"" m16/config.json &&
	a=$(stat -c %s m/model.safetensors) && b=$(stat -c %s m16/model.safetensors) &&
	test $((b * 2)) -lt $((a + 4096)) && test $((b * 2)) -gt $((a - 4096))
'

test_expect_success 'usage errors exit 2' '
	test_must_fail --exit 2 bk-convert "$G/tiny.gguf" &&
	test_must_fail --exit 2 bk-convert --out x &&
	test_must_fail --exit 2 bk-convert --out x "$G/tiny.gguf" "$G/tiny.gguf" &&
	test_must_fail --exit 2 bk-convert --dtype f16 --out x "$G/tiny.gguf" &&
	test ! -e x
'

test_expect_success 'bad input exits 1 with one line and leaves nothing' '
	test_must_fail --exit 1 bk-convert --out m "$G/tiny.gguf" 2>err &&
	grep -q "already exists" err &&
	test_must_fail --exit 1 bk-convert --out y "$G/quants.gguf" 2>err &&
	grep -q "architecture .test. is not supported (supported: llama, gemma3)" err &&
	head -c 1000 "$G/tiny.gguf" >cut.gguf &&
	test_must_fail --exit 1 bk-convert --out y cut.gguf 2>err &&
	grep -q "cut.gguf: key .tokenizer.ggml.tokens.: array of 269 strings does not fit" err &&
	head -c 70000 "$G/tiny.gguf" >cut2.gguf &&
	test_must_fail --exit 1 bk-convert --out y cut2.gguf 2>err &&
	grep -q "cut2.gguf: tensor .*outside the file" err &&
	test_must_fail --exit 1 bk-convert --out y /nonexistent.gguf &&
	test ! -e y && test -z "$(ls -d y.tmp.* 2>/dev/null)"
'

test_done

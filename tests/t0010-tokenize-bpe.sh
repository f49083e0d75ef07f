#!/usr/bin/env bash
# bk-tokenize on tokenizer.json model directories (Qwen3, Qwen2.5, SmolLM2, Llama-3.1/3.2,
# Mistral-Nemo, TinyLlama with both tokenizer files; Mistral-7B-Instruct-v0.3 with its
# tokenizer.model): t_prompt and s_prompt equal to HF's apply_chat_template ids
# (tests/golden/templates, from tests/ref/make_chat_golden.py).
. "$(dirname "$0")/lib.sh"
G="$ROOT/tests/golden"
export XDG_CACHE_HOME="$TEST_TMP/cache"

# model_dir DIR FIXTURE CONFIG_FILE [TEMPLATE_FILE]: a tokenizer-only model directory
# (the template defaults to the chat_template.jinja next to CONFIG_FILE)
model_dir() {
	mkdir -p "$1" && xz -dc "$G/bpe/$2.tokenizer.json.xz" >"$1/tokenizer.json" &&
	cp "$3" "$1/tokenizer_config.json" &&
	cp "${4:-$(dirname "$3")/chat_template.jinja}" "$1/chat_template.jinja"
}

# check_golden DIR GOLDEN [FLAGS...]: the cases with a system prompt, as rows with their
# own "system", through one bk-tokenize run: t_prompt and s_prompt equal to HF's ids
check_golden() {
	dir=$1 name=$2 golden=$G/templates/$2.json; shift 2
	jq "[.cases[] | select((.system // \"\") != \"\") | {prompt: .user, system}]" "$golden" >rows.json &&
	bk-tokenize --model "$dir" "$@" rows.json | bk-dump >recs.jsonl &&
	jq -c "[.cases[] | select((.system // \"\") != \"\") | .prompt_ids]" "$golden" >want_t &&
	jq -c "[.cases[] | select((.system // \"\") != \"\") | .student_ids]" "$golden" >want_s &&
	jq -s -c "[.[].t_prompt]" recs.jsonl >got_t && jq -s -c "[.[].s_prompt]" recs.jsonl >got_s &&
	test_cmp want_t got_t && test_cmp want_s got_s &&
	n=$(jq length rows.json) && echo "$name: $n cases" && test "$n" -ge 8
}

test_expect_success 'Qwen3 directory: template detected, ids equal HF (thinking default)' '
	model_dir qwen3 qwen "$DATA/hf-configs/Qwen3-0.6B/tokenizer_config.json" &&
	bk-tokenize --model qwen3 --prompt hi | bk-dump --header | head -1 |
		jq -e ".provenance[0].template == \"qwen3\" and .provenance[0].template_variant == \"qwen3 thinking=1\"" &&
	check_golden qwen3 qwen3
'

test_expect_success 'Qwen3 --no-thinking: the empty think block in the prompt, as HF' '
	check_golden qwen3 qwen3-nothink --no-thinking &&
	test_must_fail bk-tokenize --model qwen3 --no-thinking --enable-thinking --prompt x
'

test_expect_success 'Qwen2.5 directory: its default system prompt on the student side' '
	model_dir qwen25 qwen "$DATA/hf-configs/Qwen2.5-0.5B-Instruct/tokenizer_config.json" &&
	check_golden qwen25 qwen2.5 &&
	bk-tokenize --model qwen25 --prompt hi | bk-dump >r.json &&
	bk-tokenize --model qwen25 --system "You are Qwen, created by Alibaba Cloud. You are a helpful assistant." --prompt hi | bk-dump >d.json &&
	test "$(jq -c .s_prompt r.json)" = "$(jq -c .t_prompt d.json)"
'

test_expect_success 'SmolLM2 directory: chatml with its default system prompt, digits split' '
	model_dir smol smollm2 "$DATA/hf-configs/SmolLM2-135M-Instruct/tokenizer_config.json" &&
	check_golden smol smollm2
'

# transformers 5 builds tokenizer_class GPT2Tokenizer with ByteLevel alone (not SmolLM2's
# Digits + ByteLevel): "a\n\n1" is [a, \n, \n, 1] there, [a, \n\n, 1] in tokenizer.json;
# bakery keeps tokenizer.json's (test_bpe: its ids, from HF tokenizers) and bk-bake says so
# once; nothing for Qwen2Tokenizer (transformers 5's pre-tokenizer is tokenizer.json's)
test_expect_success 'SmolLM2: tokenizer.json pre-tokenizer kept, the tool difference noted' '
	cp "$DATA/hf-configs/SmolLM2-135M-Instruct/config.json" smol/ &&
	basic_shape_yaml smol 16 >smol.yaml &&
	bk-bake --dry-run smol.yaml >plan 2>err &&
	grep "note: tokenized with tokenizer.json.s pre-tokenizer (Digits, ByteLevel)" err &&
	test $(grep -c "PR 44254" err) = 1 &&
	cp "$DATA/hf-configs/Qwen3-0.6B/config.json" qwen3/ &&
	basic_shape_yaml qwen3 16 >q.yaml &&
	bk-bake --dry-run q.yaml >plan 2>err &&
	! grep "pre-tokenizer" err
'

test_expect_success 'Llama-3.1 and 3.2: date header; --date recorded in the header' '
	model_dir l31 llama-bpe "$DATA/templates/llama3-tokenizer_config.json" "$DATA/templates/meta-llama-Llama-3.1-8B-Instruct.jinja" &&
	check_golden l31 llama3.1 &&
	model_dir l32 llama-bpe "$DATA/templates/llama3-tokenizer_config.json" "$DATA/templates/meta-llama-Llama-3.2-3B-Instruct.jinja" &&
	check_golden l32 llama3.2 --date "05 Mar 2025" &&
	bk-tokenize --model l32 --date "05 Mar 2025" --prompt hi | bk-dump --header | head -1 |
		jq -e ".provenance[0].template_date == \"05 Mar 2025\"" &&
	test_must_fail bk-tokenize --model l32 --date "2025-03-05" --prompt hi
'

# transformers 5 builds tokenizer_class LlamaTokenizerFast with Metaspace, also over a
# byte-level tokenizer.json (deepseek-math-7b-rl declares that class): nearly every
# text comes out wrong there; the note says so.  Llama-3.1 itself (PreTrainedTokenizerFast)
# gets no note.
test_expect_success 'byte-level tokenizer.json under LlamaTokenizerFast: the tool difference noted' '
	cp "$G/memplan/Llama-3.1-8B-Instruct/config.json" l31/ &&
	basic_shape_yaml l31 16 >l31.yaml &&
	bk-bake --dry-run l31.yaml >plan 2>err &&
	! grep "pre-tokenizer" err &&
	cp -r l31 dsl && jq ".tokenizer_class = \"LlamaTokenizerFast\"" l31/tokenizer_config.json >dsl/tokenizer_config.json &&
	basic_shape_yaml dsl 16 >dsl.yaml &&
	bk-bake --dry-run dsl.yaml >plan 2>err &&
	grep "note: tokenized with tokenizer.json.s pre-tokenizer (Split, ByteLevel).*LlamaTokenizer with Metaspace" err &&
	test $(grep -c "PR 48219" err) = 1 &&
	bk-tokenize --model l31 --prompt "Hello world" | bk-dump >a.json &&
	bk-tokenize --model dsl --prompt "Hello world" | bk-dump >b.json &&
	test_cmp a.json b.json
'

test_expect_success 'Mistral-Nemo (Tekken regex): mistral-v3-tekken detected, ids equal HF' '
	model_dir nemo tekken "$DATA/templates/mistral-nemo-tokenizer_config.json" \
		"$DATA/templates/mistralai-Mistral-Nemo-Instruct-2407.jinja" &&
	bk-tokenize --model nemo --prompt hi | bk-dump --header | head -1 |
		jq -e ".provenance[0].template == \"mistral-v3-tekken\"" &&
	check_golden nemo mistral-v3-tekken
'

# HF apply_chat_template lengths of basic_shape_yaml's prompts with Nemo's template and
# tokenizer: 40 44 41 39 with the system prompt, 8 12 9 7 without
test_expect_success 'Mistral-Nemo: bk-bake --dry-run plans it, prompts measured as HF' '
	cp "$G/memplan/Mistral-Nemo-Instruct-2407/config.json" nemo/ &&
	basic_shape_yaml nemo 16 "load_in_4bit: true" | sed /teacher_top_k/d >nemo.yaml &&
	bk-bake --dry-run --gpu-memory 24GiB nemo.yaml >plan &&
	grep -q "prompts up to 44 tokens (teacher), 12 (student)" plan &&
	grep -q "^fits: yes" plan
'

# Mistral-7B-Instruct-v0.3: the v3 SentencePiece model ([INST] [/INST] control pieces 3, 4)
# and the hub's template; the responses too: t_prompt + resp equal HF's ids of
# [user: system + "\n\n" + user, assistant] (the hub's template drops the system prompt
# from [system, user, assistant])
test_expect_success 'Mistral-7B-Instruct-v0.3 (tokenizer.model): mistral-v3 detected, ids equal HF' '
	mkdir v03 && xz -dc "$DATA/templates/mistral-v3-tokenizer.model.xz" >v03/tokenizer.model &&
	cp "$DATA/templates/mistral-v3-tokenizer_config.json" v03/tokenizer_config.json &&
	cp "$DATA/templates/mistralai-Mistral-7B-Instruct-v0.3.jinja" v03/chat_template.jinja &&
	bk-tokenize --model v03 --prompt hi | bk-dump --header | head -1 |
		jq -e ".provenance[0].template == \"mistral-v3\"" &&
	check_golden v03 mistral-v3 &&
	jq "[.cases[] | select(.response != null) | {prompt: .user, response} +
		(if .system then {system} else {} end)]" "$G/templates/mistral-v3.json" >v03-pairs.json &&
	bk-tokenize --model v03 v03-pairs.json | bk-dump >v03.jsonl &&
	jq -c "[.cases[] | select(.response != null) | .full_ids]" "$G/templates/mistral-v3.json" >want_f &&
	jq -s -c "[.[] | .t_prompt + .resp]" v03.jsonl >got_f && test_cmp want_f got_f &&
	test $(jq length want_f) -ge 14 &&
	bk-tokenize --tokenizer v03/tokenizer.model --template mistral-v3 v03-pairs.json | bk-dump >named.jsonl &&
	test_cmp v03.jsonl named.jsonl
'

test_expect_success 'TinyLlama: tokenizer.json and tokenizer.model give the same ids' '
	mkdir tl && cp "$MODELS/llama2-tokenizer/tokenizer.model" tl/ &&
	cp "$DATA/hf-configs/TinyLlama-1.1B-Chat-v1.0/tokenizer_config.json" tl/ &&
	bk-tokenize --model tl --system "You are a dragon." "$DATA/pipe/pairs.json" 2>/dev/null | bk-dump >spm.jsonl &&
	xz -dc "$G/bpe/llama-spm.tokenizer.json.xz" >tl/tokenizer.json &&
	bk-tokenize --model tl --system "You are a dragon." "$DATA/pipe/pairs.json" 2>/dev/null | bk-dump >bpe.jsonl &&
	test $(wc -l <bpe.jsonl) -ge 4 &&
	test_cmp spm.jsonl bpe.jsonl &&
	cp "$DATA/hf-configs/TinyLlama-1.1B-Chat-v1.0/config.json" "$DATA/hf-configs/TinyLlama-1.1B-Chat-v1.0/chat_template.jinja" tl/ &&
	basic_shape_yaml tl 16 >tl.yaml &&
	bk-bake --dry-run tl.yaml >plan 2>err &&
	grep -q "^fits:" plan &&
	! grep "pre-tokenizer" err
'

test_expect_success 'warm cache on a tokenizer.json: no tokenizer calls; --no-thinking is another key' '
	bk-tokenize -v --model qwen3 --system "Be brief." "$DATA/pipe/pairs.json" >c1.bk 2>c1.err &&
	bk-tokenize -v --model qwen3 --system "Be brief." "$DATA/pipe/pairs.json" >c2.bk 2>c2.err &&
	cmp c1.bk c2.bk && grep -q "sentencepiece calls 0" c2.err &&
	bk-tokenize -v --model qwen3 --no-thinking --system "Be brief." "$DATA/pipe/pairs.json" >c3.bk 2>c3.err &&
	grep -q "cache hits 0" c3.err && ! cmp -s c1.bk c3.bk
'

test_expect_success 'tokenizer.json parts it cannot reproduce are refused in one line' '
	jq ".model.type = \"Unigram\"" qwen3/tokenizer.json >unigram.json &&
	test_must_fail bk-tokenize --tokenizer unigram.json --prompt hi 2>err && test $(wc -l <err) -eq 1 &&
	grep -q "unigram.json: model type .Unigram. is not supported" err &&
	jq ".pre_tokenizer.pretokenizers[0].pattern.Regex = \"\\\\w+\"" qwen3/tokenizer.json >re.json &&
	test_must_fail bk-tokenize --tokenizer re.json --prompt hi 2>err && test $(wc -l <err) -eq 1 &&
	grep -q "re.json: pre-tokenizer regex" err &&
	jq ".model.merges[5] = 7" qwen3/tokenizer.json >merge.json &&
	test_must_fail bk-tokenize --tokenizer merge.json --prompt hi 2>err && grep -q "model.merges\[5\]" err
'

test_done

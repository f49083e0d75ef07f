#!/usr/bin/env bash
# The model families: an architecture or option bakery does not support is refused up
# front by every tool that reads the model, with one line naming it (before the
# tokenizer or the stream is looked at); bk-merge folds a PEFT adapter into a Qwen2
# (biases) and a Gemma-3 model (q/k and sandwich norms) and the result loads.  The
# numerics of each family are test_parity's (HF + PEFT fixtures).
. "$(dirname "$0")/lib.sh"
M="$MODELS/stories260K"
G="$ROOT/tests/golden/parity"
export XDG_CACHE_HOME="$TEST_TMP/cache"
set -o pipefail

# a model directory with only a config.json (no tokenizer, no weights)
config_dir() {
	mkdir -p "$1" && printf '%s\n' "$2" >"$1/config.json"
}

test_expect_success 'setup: a stream of each kind from stories260K' '
	bk-tokenize --model "$M" --system "Be kind." --prompt "Once upon a time" -o tok.bk &&
	bk-gen --model "$M" --device cpu --max-new-tokens 4 tok.bk -o gen.bk &&
	bk-teach --model "$M" --device cpu --top-k 8 gen.bk -o teach.bk
'

check_refused() { # DIR WHAT: every tool refuses DIR naming WHAT
	test_must_fail bk-tokenize --model "$1" --prompt hi 2>err && grep -q "$2" err &&
	test_must_fail bk-gen --model "$1" --device cpu tok.bk -o x.bk 2>err && grep -q "$2" err &&
	test_must_fail bk-teach --model "$1" --device cpu gen.bk -o x.bk 2>err && grep -q "$2" err &&
	test_must_fail bk-step --model "$1" --device cpu --out ad teach.bk 2>err && grep -q "$2" err &&
	test_must_fail bk-eval --model "$1" --device cpu --system x --kl-prompts "$ROOT/tests/data/prompts.txt" 2>err &&
	grep -q "$2" err &&
	test_must_fail bk-merge --model "$1" --adapter "$G/qwen2/adapter-peft" --out m 2>err &&
	grep -q "$2" err &&
	! test -e x.bk && ! test -e m
}

test_expect_success 'an unsupported architecture is refused by every tool, naming it' '
	config_dir gpt2 "{\"architectures\": [\"GPT2LMHeadModel\"], \"model_type\": \"gpt2\"}" &&
	check_refused gpt2 "architecture .GPT2LMHeadModel. is not supported" &&
	grep -q "Qwen3ForCausalLM, GemmaForCausalLM" err
'

test_expect_success 'an unsupported option of a supported family is refused, naming the key' '
	config_dir longrope "{\"architectures\": [\"Qwen3ForCausalLM\"], \"model_type\": \"qwen3\",
		\"hidden_size\": 8, \"intermediate_size\": 8, \"num_hidden_layers\": 1,
		\"num_attention_heads\": 1, \"vocab_size\": 10,
		\"rope_scaling\": {\"rope_type\": \"longrope\", \"factor\": 4}}" &&
	check_refused longrope "rope_scaling.: rope type .longrope. is not supported" &&
	config_dir softcap "{\"architectures\": [\"Gemma2ForCausalLM\"], \"model_type\": \"gemma2\",
		\"hidden_size\": 8, \"intermediate_size\": 8, \"num_hidden_layers\": 2,
		\"num_attention_heads\": 1, \"vocab_size\": 10, \"final_logit_softcapping\": -1}" &&
	check_refused softcap "key .final_logit_softcapping. (-1) is negative"
'

test_expect_success 'bk-merge folds an adapter into Qwen2 and Gemma-3 models; the results load' '
	for f in qwen2 gemma3; do
		bk-merge --model "$G/$f/model" --adapter "$G/$f/adapter-peft" --out "m-$f" &&
		test -f "m-$f/model.safetensors" && cmp "$G/$f/model/config.json" "m-$f/config.json" &&
		bk-merge --model "m-$f" --adapter "$G/$f/adapter-peft" --out "m2-$f" || return 1
	done
'

test_done

#!/usr/bin/env bash
# Gemma's tokenizer.json form: the pre-tokenizer Split of a String (" ",
# MergedWithPrevious), and the tokenizer_config.json HF writes for it, whose
# model_max_length 1000000000000000019884624838656 does not fit a JSON integer of
# jansson (bk-tokenize refused both).  The ids below are HF tokenizers 0.23.3's.
. "$(dirname "$0")/lib.sh"
export XDG_CACHE_HOME="$TEST_TMP/cache"
set -o pipefail

test_expect_success 'setup: a tokenizer.json splitting on " " (merged with the previous piece)' '
	cat >tokenizer.json <<-\JSON &&
	{"version": "1.0", "truncation": null, "padding": null, "added_tokens": [], "normalizer": null,
	 "pre_tokenizer": {"type": "Split", "pattern": {"String": " "}, "behavior": "MergedWithPrevious", "invert": false},
	 "post_processor": null, "decoder": null,
	 "model": {"type": "BPE", "dropout": null, "unk_token": "<unk>", "continuing_subword_prefix": null,
	  "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
	  "vocab": {"a": 0, "b": 1, " ": 2, "a ": 3, " b": 4, "<unk>": 5, "</s>": 6}, "merges": [[" ", "b"], ["a", " "]]}}
	JSON
	printf "{\"eos_token\": \"</s>\", \"model_max_length\": 1000000000000000019884624838656}\n" >tokenizer_config.json
'

# " b" merges first, so an unsplit "a b" would be [0,4], a split merged with the next
# piece too; Isolated would give [0,2,1]
test_expect_success 'Split of a String: the ids of HF tokenizers' '
	for c in "a b:[3,1]" "a  b:[3,2,1]" " a:[2,0]" "ab ba:[0,1,2,1,0]" "b  :[1,2,2]" "a b a b:[3,1,2,3,1]"; do
		bk-tokenize --tokenizer tokenizer.json --no-cache --prompt "${c%%:*}" | bk-dump | jq -c .t_prompt >got &&
		echo "${c#*:}" >want && test_cmp want got || return 1
	done
'

test_expect_success 'a chat template in a tokenizer_config.json with model_max_length 1e30' '
	mkdir m && cp tokenizer.json m/ &&
	jq -n "{eos_token: \"</s>\", chat_template: \"{{ messages[0] }}<|im_start|>\"}" >c.json &&
	sed "s/^{/{\"model_max_length\": 1000000000000000019884624838656, /" c.json >m/tokenizer_config.json &&
	grep -q 1000000000000000019884624838656 m/tokenizer_config.json &&
	test_must_fail bk-tokenize --model m --no-cache --prompt "a b" 2>err &&
	grep -q "im_start" err && ! grep -q "too big integer" err
'

test_done

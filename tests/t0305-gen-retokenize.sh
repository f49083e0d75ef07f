#!/usr/bin/env bash
# bk-gen --retokenize: each trajectory as the tool trains it: decoded (special tokens
# skipped), stripped, and tokenized again as the assistant turn of the chat template,
# with the template's end of turn also when the sample was cut at --max-new-tokens:
# the resp bk-tokenize makes of the same (prompt, response) pair, for three templates;
# without it, the sampled ids (a cut sample ends without an end of turn).
. "$(dirname "$0")/lib.sh"
M="$MODELS/stories260K"
export XDG_CACHE_HOME="$TEST_TMP/cache"
export OMP_NUM_THREADS=1
set -o pipefail
SYS="Sparky the dragon lives in a big castle."

for t in raw llama2 zephyr; do
	test_expect_success "template $t: resp is bk-tokenize's resp of the response text" '
		bk-tokenize --model "$M" --template '$t' --system "$SYS" --prompt "Once upon a time" \
			--prompt "The sky was blue" -o p.bk 2>/dev/null &&
		bk-gen --model "$M" --device cpu --num-trajectories 3 --max-new-tokens 10 --seed 2 \
			--retokenize p.bk -o g.bk 2>/dev/null &&
		bk-dump --header g.bk | head -1 | jq -e ".provenance[-1].retokenize == 1" &&
		bk-dump g.bk | jq -s "{pairs: map({prompt: .user, response: .response})}" >pairs.json &&
		bk-tokenize --model "$M" --template '$t' --system "$SYS" pairs.json -o want.bk 2>/dev/null &&
		bk-dump g.bk | jq -c ".resp" >got &&
		bk-dump want.bk | jq -c ".resp" >want &&
		test $(grep -c "" got) = 6 &&
		test_cmp want got
	'
done

test_expect_success 'without it: the sampled ids; a cut sample has no end of turn' '
	bk-tokenize --model "$M" --template raw --system "$SYS" --prompt "Once upon a time" \
		-o p.bk 2>/dev/null &&
	bk-gen --model "$M" --device cpu --num-trajectories 2 --max-new-tokens 6 --seed 2 \
		p.bk -o s.bk 2>/dev/null &&
	bk-gen --model "$M" --device cpu --num-trajectories 2 --max-new-tokens 6 --seed 2 \
		--retokenize p.bk -o r.bk 2>/dev/null &&
	bk-dump s.bk | jq -s -e "all(.[]; (.resp | length) == 6 and .resp[-1] != 2)" &&
	bk-dump r.bk | jq -s -e "all(.[]; .resp[-1] == 2 and .lens == null)" &&
	test "$(bk-dump s.bk | jq -c .response)" = "$(bk-dump r.bk | jq -c .response)"
'

test_done

#!/usr/bin/env bash
# bk-tokenize: pipes on prompts and pairs, ids equal sentencepiece's own encoding,
# the cache, and every kind of bad input.
. "$(dirname "$0")/lib.sh"
M="$MODELS/stories260K"
L="$MODELS/llama2-tokenizer/tokenizer.model"
export XDG_CACHE_HOME="$TEST_TMP/cache"

test_expect_success 'prompts file through tokenize | lens | dump' '
	bk-tokenize --model "$M" --system "Sparky the dragon lives in a castle." "$DATA/pipe/stories.txt" |
	bk-lens --max-tokens 64 -q | bk-dump >out.jsonl &&
	test $(wc -l <out.jsonl) -eq 6 &&
	jq -e -s "all(.[]; .resp == null and (.t_prompt|length) > (.s_prompt|length) and .lens.t == (.t_prompt|length) and .batch >= 0)" out.jsonl
'

test_expect_success 'raw template: BOS + one encoding of system + " " + user' '
	bk-tokenize --model "$M" --system "A dragon." --prompt "Once upon a time" | bk-dump >raw.jsonl &&
	bk-tokenize --model "$M" --prompt "A dragon. Once upon a time" | bk-dump >joined.jsonl &&
	test "$(jq -c .t_prompt raw.jsonl)" = "$(jq -c .s_prompt joined.jsonl)" &&
	# the ids of "Once upon a time" given in models/README.md (the published sample)
	test "$(jq -c .s_prompt raw.jsonl)" = "[1,403,407,261,378]"
'

test_expect_success 'paired JSON: zephyr ids, empty response dropped, response ids carried' '
	bk-tokenize --tokenizer "$L" --template zephyr --system "You are a dragon." "$DATA/pipe/pairs.json" 2>err |
	bk-dump >pairs.jsonl &&
	test $(wc -l <pairs.jsonl) -eq 4 &&
	grep -q "dropped 1 sample with an empty response" err &&
	jq -e -s "all(.[]; (.resp|length) > 0 and .resp[-2] == 2)" pairs.jsonl &&
	jq -e -s ".[3].user == \"Non-ASCII: café, 日本語, 🐉\"" pairs.jsonl
'

test_expect_success 'model directory: template detected from tokenizer_config.json' '
	mkdir tl && cp "$L" tl/ && cp "$DATA/hf-configs/TinyLlama-1.1B-Chat-v1.0/tokenizer_config.json" tl/ &&
	bk-tokenize --model tl --system S --prompt hi | bk-dump --header | head -1 | jq -e ".provenance[0].template == \"zephyr\""
'

test_expect_success 'warm cache: same output, no sentencepiece calls' '
	bk-tokenize -v --tokenizer "$L" --template llama2 --system "Be brief." "$DATA/pipe/pairs.json" >cold.bk 2>cold.err &&
	bk-tokenize -v --tokenizer "$L" --template llama2 --system "Be brief." "$DATA/pipe/pairs.json" >warm.bk 2>warm.err &&
	cmp cold.bk warm.bk &&
	grep -q "sentencepiece calls 0" warm.err && ! grep -q "sentencepiece calls 0" cold.err &&
	bk-tokenize -v --no-cache --tokenizer "$L" --template llama2 --system "Be brief." "$DATA/pipe/pairs.json" >nc.bk 2>nc.err &&
	cmp cold.bk nc.bk && ! grep -q "sentencepiece calls 0" nc.err
'

test_expect_success 'a damaged cache file is ignored with a warning' '
	for f in "$XDG_CACHE_HOME"/bakery/tokenize-*.cache; do printf garbage >"$f"; done &&
	bk-tokenize --tokenizer "$L" --template llama2 --system "Be brief." "$DATA/pipe/pairs.json" >again.bk 2>err &&
	cmp cold.bk again.bk && grep -q "ignoring it" err
'

# flips the low byte of the last id of FILE's last entry (the last sample's)
flip_last_id() { python3 -c '
import sys; p = sys.argv[1]; b = bytearray(open(p, "rb").read()); b[-4] ^= 1; open(p, "wb").write(b)' "$1"; }
test_expect_success 'a damaged cache entry is dropped, rebuilt and reported once' '
	export XDG_CACHE_HOME="$TEST_TMP/dmg" &&
	bk-tokenize --tokenizer "$L" --template llama2 --system "Be brief." "$DATA/pipe/pairs.json" >d0.bk 2>/dev/null &&
	for f in "$XDG_CACHE_HOME"/bakery/tokenize-*.cache; do flip_last_id "$f"; done &&
	bk-tokenize -v --tokenizer "$L" --template llama2 --system "Be brief." "$DATA/pipe/pairs.json" >d1.bk 2>err1 &&
	cmp d0.bk d1.bk && grep -q "1 damaged entry dropped (failed checksum); tokenizing it again" err1 &&
	grep -q "cache hits 3, new cache entries 1" err1 &&
	bk-tokenize -v --tokenizer "$L" --template llama2 --system "Be brief." "$DATA/pipe/pairs.json" >d2.bk 2>err2 &&
	cmp d0.bk d2.bk && ! grep -q damaged err2 && grep -q "sentencepiece calls 0" err2
'

test_expect_success 'an unusable cache directory is a warning, not an error' '
	XDG_CACHE_HOME=/proc/no-such-dir bk-tokenize --tokenizer "$L" --template llama2 --system "Be brief." \
		"$DATA/pipe/pairs.json" >nc2.bk 2>err && cmp cold.bk nc2.bk && grep -q "without the cache" err
'

# Both runs load the (empty) cache, then block opening their -o FIFOs until both are
# waiting there; only then do they tokenize and write the cache, so each closes with
# entries the other lacks.  Afterwards every sample of both inputs is a cache hit.
wait_fifo_open() { # pid...: until each blocks in open(2) of a FIFO (at most ~20 s)
	local p w i
	for p in "$@"; do
		for i in $(seq 200); do
			w=$(cat /proc/"$p"/wchan 2>/dev/null) || return 0
			case $w in *partner* | *fifo*) break ;; esac
			sleep 0.1
		done
	done
}
test_expect_success 'two concurrent runs sharing a cache lose no entries' '
	export XDG_CACHE_HOME="$TEST_TMP/cc" && mkfifo fa fb || exit 1
	bk-tokenize --tokenizer "$L" --template zephyr --system "S." "$DATA/pipe/pairs.json" -o fa &
	pa=$!
	bk-tokenize --tokenizer "$L" --template zephyr --system "S." "$DATA/pipe/stories.txt" -o fb &
	pb=$!
	wait_fifo_open $pa $pb
	cat fa >ca.bk &
	cat fb >cb.bk &&
	wait $pa && wait $pb && wait &&
	test -s ca.bk && test -s cb.bk &&
	bk-tokenize -v --tokenizer "$L" --template zephyr --system "S." "$DATA/pipe/pairs.json" >/dev/null 2>wa.err &&
	bk-tokenize -v --tokenizer "$L" --template zephyr --system "S." "$DATA/pipe/stories.txt" >/dev/null 2>wb.err &&
	grep "sentencepiece calls" wa.err wb.err &&
	grep -q "sentencepiece calls 0" wa.err && grep -q "sentencepiece calls 0" wb.err
'

# pairs.json under zephyr + this system prompt: teacher prompts of 36, 35, 35 and 47 tokens
# (student 22, 21, 21, 33), responses of 9, 11, 13 and 8, one empty response
test_expect_success '--max-seq-length cuts responses, never a prompt: a sample whose prompt does not fit is dropped and counted' '
	bk-tokenize --tokenizer "$L" --template zephyr --system "You are a dragon." --max-seq-length 40 \
		"$DATA/pipe/pairs.json" 2>err >cut.bk &&
	bk-dump cut.bk | jq -c "[(.t_prompt|length), (.s_prompt|length), (.resp|length)]" >lens &&
	printf "[36,22,4]\n[35,21,5]\n[35,21,5]\n" >lens.want && test_cmp lens.want lens &&
	bk-tokenize --tokenizer "$L" --template zephyr --system "You are a dragon." \
		"$DATA/pipe/pairs.json" 2>/dev/null | bk-dump | jq -c ".t_prompt" | head -3 >full &&
	bk-dump cut.bk | jq -c ".t_prompt" >kept && test_cmp full kept &&
	grep -q "dropped 1 sample whose prompt leaves no room under --max-seq-length 40" err &&
	grep -q "dropped 1 sample with an empty response" err && test $(wc -l <err) -eq 2
'

test_expect_success 'nothing left after --max-seq-length: one error line, exit 1, no output file' '
	test_must_fail --exit 1 bk-tokenize --tokenizer "$L" --template zephyr --system "You are a dragon." \
		--max-seq-length 24 "$DATA/pipe/pairs.json" -o none.bk 2>err &&
	grep -q "no records written: of 5 samples, 1 had an empty response and 4 a prompt that leaves no room under --max-seq-length 24" err &&
	test ! -e none.bk &&
	test_must_fail --exit 1 bk-tokenize --tokenizer "$L" --template llama2 --system "Answer in French." \
		--prompt "Where is Paris?" --max-seq-length 16 2>err >/dev/null &&
	grep -q "no records written" err
'

test_expect_success 'conflicting or unknown flags are usage errors: exit 2, one line' '
	test_must_fail --exit 2 bk-tokenize --tokenizer "$L" --system S --system-file "$DATA/pipe/stories.txt" --prompt x 2>err &&
	grep -q "give only one of --system, --system-file and --corpus (try .bk-tokenize --help.)" err &&
	test_must_fail --exit 2 bk-tokenize --tokenizer "$L" --format yaml "$DATA/pipe/pairs.json" 2>err &&
	grep -q "^bk-tokenize: --format: unknown input format .yaml." err &&
	test_must_fail --exit 2 bk-tokenize --tokenizer "$L" --system-template x --prompt x 2>err
'

test_expect_success 'duplicate prompts get distinct stable ids' '
	bk-tokenize --model "$M" --prompt same --prompt same --prompt other | bk-dump | jq -r .id >ids1 &&
	bk-tokenize --model "$M" --prompt same --prompt same --prompt other | bk-dump | jq -r .id >ids2 &&
	test_cmp ids1 ids2 && test $(sort -u ids1 | wc -l) -eq 3
'

# ---- bad input: one line, non-zero, no partial output file ----
printf '[{"prompt": "a", }]' >bad.json
printf '[{"question_x": "a"}]' >nokey.json
printf 'good line\n\xff\xfe bad\n' >badutf8.txt
: >empty.json

for f in bad.json nokey.json badutf8.txt empty.json; do
	test_expect_success "bad input $f: one-line error naming the file, no output file" "
		test_must_fail bk-tokenize --model \"$M\" -o out-$f.bk $f 2>err &&
		test \$(wc -l <err) -eq 1 && grep -q \"$f\" err && ! test -e out-$f.bk &&
		! ls out-$f.bk.tmp.* 2>/dev/null
	"
done

test_expect_success 'a NUL character in JSON data: one line naming file, line and column, no library flag names' '
	printf "[{\"prompt\": \"a\\\\u0000b\"}]\n" >nul.json && grep -q "u0000" nul.json &&
	test_must_fail bk-tokenize --tokenizer "$L" nul.json 2>err &&
	grep -q "nul.json: line 1: column [0-9]*: .u0000 is not allowed (NUL characters cannot be read)" err &&
	! grep -q JSON_ALLOW_NUL err
'

test_expect_success 'missing key error names the record and keys tried' '
	test_must_fail bk-tokenize --model "$M" nokey.json 2>err && grep -q "record 1" err && grep -q "prompt" err
'
test_expect_success 'invalid utf-8 error names the line' '
	test_must_fail bk-tokenize --model "$M" badutf8.txt 2>err && grep -q "line 2" err
'
test_expect_success 'unknown template and missing tokenizer are refused' '
	test_must_fail bk-tokenize --tokenizer "$L" --template nope --prompt x 2>err && grep -q "unknown template" err &&
	test_must_fail bk-tokenize --model /nonexistent --prompt x 2>err && grep -q "/nonexistent" err &&
	test_must_fail bk-tokenize --tokenizer "$L" --template chatml --prompt x 2>err && grep -q "im_start" err
'
test_done

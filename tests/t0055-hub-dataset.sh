#!/usr/bin/env bash
# Hub datasets (formats/hubdata.c over formats/hub.c) against tests/hubserver.py on
# 127.0.0.1: a split of a parquet dataset fetched into the HF cache's datasets--Org--Name
# layout (only the files the slice needs), read again offline, refusals in one line, and
# the tool's sft_dataset.yaml run unchanged but for output_dir, its model and dataset
# ids served by the stand-in (stories260K as Qwen/Qwen3-0.6B, a 30-row chat file as
# each split of HuggingFaceH4/ultrachat_200k).
. "$(dirname "$0")/lib.sh"
M="$MODELS/stories260K"
G="$ROOT/tests/golden/parquet"
set -o pipefail
command -v python3 >/dev/null || { echo "not ok - python3 is needed"; exit 1; }

U=root/datasets/HuggingFaceH4/ultrachat_200k
mkdir -p root/models/Qwen/Qwen3-0.6B $U/data root/datasets/org/jsonl/train
cp "$M"/* root/models/Qwen/Qwen3-0.6B/
for s in train_sft-00000-of-00002 train_sft-00001-of-00002 test_sft-00000-of-00001; do
	cp "$G/chat.parquet" $U/data/$s-0123abcd.parquet
done
printf -- '---\nconfigs:\n- config_name: default\n---\n' >$U/README.md
printf '{"prompt": "p1", "response": "r1"}\n{"prompt": "p2", "response": "r2"}\n' \
	>root/datasets/org/jsonl/train/part.jsonl
python3 "$ROOT/tests/hubserver.py" --root root --port-file port 2>server.err &
SERVER=$!
trap 'kill $SERVER 2>/dev/null; wait $SERVER 2>/dev/null; rm -rf "$TEST_TMP"' EXIT
for _ in $(seq 100); do [ -s port ] && break; sleep 0.1; done
read -r HUBPORT CDNPORT <port || { echo "not ok - the hub server did not start"; cat server.err; exit 1; }
export HF_ENDPOINT="http://127.0.0.1:$HUBPORT" HF_HUB_CACHE="$TEST_TMP/hub" HF_HOME="$TEST_TMP/hfhome"
unset HF_TOKEN HF_HUB_OFFLINE HF_TOKEN_PATH HUGGINGFACE_HUB_CACHE TRANSFORMERS_OFFLINE HF_DATASETS_OFFLINE
unset http_proxy https_proxy HTTP_PROXY HTTPS_PROXY ALL_PROXY all_proxy
export NO_PROXY=127.0.0.1 no_proxy=127.0.0.1
C=hub/datasets--HuggingFaceH4--ultrachat_200k
users() { bk-dump | jq -r .user; }

test_expect_success 'a slice fetches only the shard it needs into the HF cache, links into blobs' '
	bk-tokenize --model "$M" --split "train_sft[:5]" HuggingFaceH4/ultrachat_200k >t5 &&
	users <t5 >u5 &&
	test $(grep -c "" u5) -eq 7 &&
	head -1 u5 | grep -q "^Tell me one thing about eggs (question 0)\.$" &&
	commit=$(cat $C/refs/main) && test ${#commit} -eq 40 &&
	f=data/train_sft-00000-of-00002-0123abcd.parquet &&
	test "$(readlink $C/snapshots/$commit/$f)" = "../../../blobs/$(sha256sum <"$G/chat.parquet" | cut -c1-64)" &&
	cmp $C/snapshots/$commit/$f "$G/chat.parquet" &&
	! test -e $C/snapshots/$commit/data/train_sft-00001-of-00002-0123abcd.parquet &&
	! grep -q "test_sft" root/requests.log
'

test_expect_success 'the same rows as the repo read as a local directory; percent and + parts' '
	bk-tokenize --model "$M" --split "train_sft[:5]" $U | users >local5 &&
	test_cmp u5 local5 &&
	bk-tokenize --model "$M" --split "train_sft[-10%:]+test_sft[:2]" HuggingFaceH4/ultrachat_200k | users >mix &&
	bk-tokenize --model "$M" --split "train_sft[54:]+test_sft[:2]" $U | users >mixlocal &&
	test_cmp mix mixlocal && test $(grep -c "" mix) -eq 11
'

test_expect_success 'HF_HUB_OFFLINE=1: read from the cache with no request; a missing shard is named' '
	n=$(wc -l <root/requests.log) &&
	HF_HUB_OFFLINE=1 bk-tokenize --model "$M" --split "train_sft[:5]" HuggingFaceH4/ultrachat_200k | users >off5 &&
	test_cmp u5 off5 && test $(wc -l <root/requests.log) -eq $n &&
	rm -rf hub2 && mkdir hub2 && cp -a hub/datasets--HuggingFaceH4--ultrachat_200k hub2/ &&
	rm hub2/datasets--HuggingFaceH4--ultrachat_200k/snapshots/*/data/train_sft-00001-* &&
	HF_HUB_CACHE=$TEST_TMP/hub2 HF_HUB_OFFLINE=1 test_must_fail bk-tokenize --model "$M" \
		--split "train_sft[:50%]" HuggingFaceH4/ultrachat_200k 2>e &&
	test $(grep -c "" e) -eq 1 &&
	grep -q "split .train_sft.: 1 of the 2 files it has are not in the cache (data/train_sft-00001-of-00002-0123abcd.parquet), and HF_HUB_OFFLINE is set" e
'

# a split in files that are not shards: train/part1..3.jsonl, 2 rows each
mkdir -p root/datasets/org/parts/train
for p in 1 2 3; do
	for i in 1 2; do echo "{\"prompt\": \"part$p row$i\", \"response\": \"r\"}"; done >root/datasets/org/parts/train/part$p.jsonl
done
P=hub/datasets--org--parts

test_expect_success 'offline, a split whose files an earlier slice fetched only in part is refused, naming the missing files' '
	bk-tokenize --model "$M" --split "train[:2]" org/parts | users >p2 &&
	printf "part1 row1\npart1 row2\n" >want && test_cmp want p2 &&
	! test -e $P/snapshots/$(cat $P/refs/main)/train/part2.jsonl &&
	test -s $P/.bakery-listing/$(cat $P/refs/main).json &&
	HF_HUB_OFFLINE=1 bk-tokenize --model "$M" --split "train[:2]" org/parts | users >off2 && test_cmp p2 off2 &&
	for s in train "train[:50%]" "train[-1:]"; do
		HF_HUB_OFFLINE=1 test_must_fail bk-tokenize --model "$M" --split "$s" org/parts 2>e &&
		test $(grep -c "" e) -eq 1 &&
		grep -q "org/parts: split .train.: 2 of the 3 files it has are not in the cache (train/part2.jsonl, train/part3.jsonl), and HF_HUB_OFFLINE is set" e || exit 1
	done &&
	HF_HUB_OFFLINE=1 test_must_fail bk-tokenize --model "$M" --split "train[:3]" org/parts 2>e &&
	grep -q "2 of the 3 files it has are not in the cache (train/part2.jsonl, train/part3.jsonl), and the rows asked for reach the first of them" e &&
	bk-tokenize --model "$M" --split train org/parts | users >all && test $(grep -c "" all) -eq 6 &&
	HF_HUB_OFFLINE=1 bk-tokenize --model "$M" --split train org/parts | users >offall && test_cmp all offall &&
	HF_DATASETS_OFFLINE=1 bk-tokenize --model "$M" --split train org/parts | users >dsoff && test_cmp all dsoff &&
	n=$(wc -l <root/requests.log) &&
	HF_DATASETS_OFFLINE=1 bk-tokenize --model "$M" --split train org/parts >/dev/null &&
	test $(wc -l <root/requests.log) -eq $n &&
	HF_ENDPOINT=http://127.0.0.1:1 bk-tokenize --model "$M" --split train org/parts 2>e | users >nonet &&
	test_cmp all nonet && grep -q "cannot be reached .*dataset org/parts: the cached snapshot" e &&
	rm -r $P/.bakery-listing &&
	HF_HUB_OFFLINE=1 test_must_fail bk-tokenize --model "$M" --split train org/parts 2>e &&
	test $(grep -c "" e) -eq 1 &&
	grep -q "dataset org/parts: the cache .* has no file listing of its commit .*give the snapshot directory" e &&
	bk-tokenize --model "$M" --split train $P/snapshots/$(cat $P/refs/main) | users >dir && test_cmp all dir
'

mk() { # repo file...: each file one row whose prompt is its own path
	d=root/datasets/org/$1; shift
	for f in "$@"; do mkdir -p "$d/$(dirname "$f")"; echo "{\"prompt\": \"$f\", \"response\": \"r\"}" >"$d/$f"; done
}
mk lc train/a.jsonl test/b.jsonl train_extra.jsonl
mk lh train.jsonl .old/train.jsonl __pycache__/train.jsonl
mk la conversations.jsonl
mk lb train.jsonl dev.jsonl
mk csv data/train.csv

test_expect_success 'the files of a split as datasets picks them, the same online and offline; other formats refused' '
	for c in "lc train train/a.jsonl" "lh train train.jsonl" "la train conversations.jsonl" \
		 "lb validation dev.jsonl" "lb train train.jsonl"; do
		set -- $c &&
		bk-tokenize --model "$M" --split $2 org/$1 | users >on &&
		HF_HUB_OFFLINE=1 bk-tokenize --model "$M" --split $2 org/$1 | users >off &&
		echo "$3" >want && test_cmp want on && test_cmp want off || exit 1
	done &&
	! grep -q "__pycache__\|\.old" root/requests.log &&
	test_must_fail bk-tokenize --model "$M" --split train org/csv 2>e && test $(grep -c "" e) -eq 1 &&
	grep -q "org/csv: split .train.: data/train.csv is a data file datasets reads, in a format bakery does not" e &&
	test_must_fail bk-tokenize --model "$M" --split dev org/lb 2>e &&
	grep -q "no data files for split .dev. (its splits: train, validation)" e
'

# README configs: data_files override the file-name inference (train.jsonl would be
# train without them); a default among several configs; refusals name README.md
mk cfg train.jsonl keep/a.jsonl keep/b.jsonl other.jsonl
printf -- '---\npretty_name: x\nconfigs:\n- config_name: default\n  data_files:\n  - split: train\n    path: "keep/*.jsonl"\n  - split: test\n    path: other.jsonl\n---\n# cfg\n' >root/datasets/org/cfg/README.md
mk cfg2 en/train.jsonl fr/train.jsonl
printf -- '---\nconfigs:\n- config_name: en\n  data_dir: en\n- config_name: fr\n  data_dir: fr\n  default: true\n---\n' >root/datasets/org/cfg2/README.md
mk cfgbad train.jsonl
printf -- '---\nconfigs:\n- config_name: default\n  data_files: [a.jsonl\n---\n' >root/datasets/org/cfgbad/README.md

test_expect_success 'a README configs: section picks the files of a split, online, offline and as a directory' '
	bk-tokenize --model "$M" --split train org/cfg | users >on &&
	printf "keep/a.jsonl\nkeep/b.jsonl\n" >want && test_cmp want on &&
	HF_HUB_OFFLINE=1 bk-tokenize --model "$M" --split train org/cfg | users >off && test_cmp want off &&
	bk-tokenize --model "$M" --split train root/datasets/org/cfg | users >dir && test_cmp want dir &&
	bk-tokenize --model "$M" --split test org/cfg | users >t && echo other.jsonl >want && test_cmp want t &&
	! grep -q "cfg/resolve/main/train.jsonl" root/requests.log &&
	bk-tokenize --model "$M" org/cfg2 | users >fr && echo fr/train.jsonl >want && test_cmp want fr &&
	test_must_fail bk-tokenize --model "$M" --split validation org/cfg 2>e && test $(grep -c "" e) -eq 1 &&
	grep -q "org/cfg: README.md: configs\[0\] (config .default.): data_files has no split .validation. (its splits: train, test)" e &&
	test_must_fail bk-tokenize --model "$M" org/cfgbad 2>e && test $(grep -c "" e) -eq 1 &&
	grep -q "org/cfgbad: README.md: the YAML front matter, line [0-9]*: " e &&
	rm -rf hub3 && mkdir hub3 && cp -a hub/datasets--org--cfg hub3/ &&
	rm hub3/datasets--org--cfg/snapshots/*/README.md &&
	HF_HUB_CACHE=$TEST_TMP/hub3 HF_HUB_OFFLINE=1 test_must_fail bk-tokenize --model "$M" --split train org/cfg 2>e &&
	test $(grep -c "" e) -eq 1 && grep -q "org/cfg: README.md (its configs: say which files a split has) is not in the cache, and HF_HUB_OFFLINE is set" e
'

mkdir -p root/datasets/org/rows root/datasets/org/msgs
cat >root/datasets/org/rows/train.jsonl <<'J'
{"prompt": "P1", "question": "Q1", "response": "R1"}
{"prompt": null, "question": "Q2", "response": "R2"}
{"prompt": "", "question": "Q3", "response": "R3"}
{"prompt": "P6", "question": null, "response": "   "}
J
cat >root/datasets/org/msgs/train.jsonl <<'J'
{"messages":[{"role":"user","content":"A"},{"role":"assistant","content":"B"}]}
{"messages":[{"role":"user","content":"D"},{"role":"user","content":""},{"role":"assistant","content":"E"}]}
{"messages":[{"role":"user","content":"F"},{"role":"assistant","content":"  "}]}
J

test_expect_success 'rows the tool skips are skipped and counted: null/empty prompt column, blank responses, empty user turns' '
	bk-tokenize --model "$M" org/rows 2>e | bk-dump | jq -c "[.user, .response]" >got &&
	echo "[\"P1\",\"R1\"]" >want && test_cmp want got &&
	grep -q "warning: skipped 2 rows with a null or empty prompt" e &&
	grep -q "warning: dropped 1 sample with an empty response (or only white space" e &&
	bk-tokenize --model "$M" org/msgs 2>e | bk-dump | jq -c "[.user, .response]" >got &&
	echo "[\"A\",\"B\"]" >want && test_cmp want got &&
	grep -q "warning: skipped 1 row with" e && grep -q "warning: dropped 1 sample" e
'

test_expect_success 'JSON Lines in a split directory; refusals in one line' '
	bk-tokenize --model "$M" org/jsonl | bk-dump | jq -r .response >r &&
	printf "r1\nr2\n" >want && test_cmp want r &&
	test_must_fail bk-tokenize --model "$M" --split train HuggingFaceH4/ultrachat_200k 2>e &&
	grep -q "HuggingFaceH4/ultrachat_200k: no data files for split .train. (its splits: test_sft, train_sft)" e &&
	test_must_fail bk-tokenize --model "$M" --split "train_sft[:200%]" HuggingFaceH4/ultrachat_200k 2>e &&
	grep -q "split .train_sft\[:200%\].: percent slice boundaries" e &&
	test_must_fail bk-tokenize --model "$M" --split train "$ROOT/tests/data/prompts.txt" 2>e &&
	grep -q "split applies to hub datasets" e &&
	test_must_fail bk-tokenize --model "$M" org/nosuch 2>e && test $(grep -c "" e) -eq 1 &&
	n=$(wc -l <root/requests.log) &&
	test_must_fail bk-tokenize --model "$M" nosuch.jsonl 2>e && grep -q "nosuch.jsonl: " e &&
	test_must_fail bk-tokenize --model "$M" data/nosuch.parquet 2>e && grep -q "data/nosuch.parquet: " e &&
	test_must_fail bk-tokenize --model "$M" nosuch 2>e && grep -q "nosuch: " e &&
	test $(wc -l <root/requests.log) -eq $n
'

test_expect_success 'the tool.s sft_dataset.yaml unchanged but for output_dir: bk-bake --config' '
	bk-bake --config "$DATA/bake/tool/sft_dataset.yaml" --output_dir out >sum 2>notes &&
	! grep -q "unsupported\|unknown\|ignored" notes &&
	grep -q "^data  *76 prompt/response pairs, 1 epoch" sum &&
	test -f out/final_model/adapter_model.safetensors &&
	jq -e ".base_model_name_or_path == \"Qwen/Qwen3-0.6B\"" out/final_model/adapter_config.json &&
	test -e $C/snapshots/$(cat $C/refs/main)/data/train_sft-00001-of-00002-0123abcd.parquet &&
	bk-bake --dry-run --config "$DATA/bake/tool/sft_dataset.yaml" --model_name_or_path "$M" --output_dir out2 >plan 2>/dev/null &&
	grep -q "bk-tokenize .*--split .train_sft\[:1000\]. HuggingFaceH4/ultrachat_200k" plan
'

test_expect_success 'eval_dataset_split of the hub dataset: the validation records of its split' '
	bk-bake --config "$DATA/bake/tool/sft_dataset.yaml" --output_dir ev --eval_strategy steps \
		--eval_steps 5 --eval_dataset_split "test_sft[:4]" >sum 2>notes &&
	! grep -q "unsupported\|unknown\|ignored" notes &&
	grep -q "eval_loss" ev/final_model/trainer_state.json &&
	bk-bake --dry-run --config "$DATA/bake/tool/sft_dataset.yaml" --model_name_or_path "$M" --output_dir ev2 --eval_strategy steps \
		--eval_dataset org/jsonl --eval_dataset_split "train[:1]" >plan 2>/dev/null &&
	grep -q "bk-tokenize .*eval_tokens.bk --split .train\[:1\]. org/jsonl" plan &&
	test_must_fail --list bk-bake --dry-run --config "$DATA/bake/tool/sft_dataset.yaml" --model_name_or_path "$M" --output_dir ev3 \
		--eval_strategy steps --eval_dataset_split "test_sft[:400%]" 2>e &&
	grep -q "eval_dataset_split.*percent slice boundaries" e
'

test_done

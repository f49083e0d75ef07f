#!/usr/bin/env bash
# bk-bake's memory plan on more published shapes than t0730's (tests/golden/memplan:
# config.json only; Qwen's tokenizer and the chatml template measure the prompts): the
# base weights against transformers' parameter counts (tests/ref/memplan_params.py), in
# bf16 and in 4 bits (tied embeddings, biases, qk-norms, Gemma's sandwich norms, a head_dim
# other than hidden / heads, Gemma-3's nested text_config as published); at the Python
# tool's basic shape the exit status agrees with the last line, and a refusal is one line
# whose every suggestion, applied to the config alone, fits at the peak it named.
. "$(dirname "$0")/lib.sh"
G="$ROOT/tests/golden"

model() { # NAME: the shape with Qwen's tokenizer
	mkdir -p "$1" && cp "$G/memplan/$1/config.json" "$1"/ &&
	xz -dc "$G/bpe/qwen.tokenizer.json.xz" >"$1/tokenizer.json"
}

yaml() { # MODEL R [extra line]: tests/lib.sh
	basic_shape_yaml "$1" "$2" "template: chatml
${3:-}"
}

# plan YAML SIZE: the dry run into plan and err; status 0 with "fits: yes", else status 1,
# "fits: no" and one line saying why
plan() {
	if bk-bake --dry-run --gpu-memory "$2" "$1" >plan 2>err; then
		tail -n 1 plan | grep -q "^fits: yes, peak [0-9.]* GiB of [0-9.]* GiB$"
	else
		test $? = 1 && tail -n 1 plan | grep -q "^fits: no, peak [0-9.]* GiB of " &&
		test $(grep -c "" err) = 1 && grep -q "^bk-bake: error: .*: the bake does not fit: " err
	fi
}

# weights MODEL BF16 REST4 LIN4: the plan's base weights (MiB) in bf16, and with
# load_in_4bit the rest in bf16 and the 4-bit linears
weights() {
	yaml $1 16 >w.yaml && bk-bake --dry-run w.yaml >w 2>/dev/null &&
	grep -q "^#   base weights  *$2 MiB" w && ! grep -q "4-bit" w &&
	yaml $1 16 "load_in_4bit: true" >w.yaml && bk-bake --dry-run w.yaml >w 2>/dev/null &&
	grep -q "^#   base weights  *$3 MiB" w && grep -q "^#   4-bit base linears  *$4 MiB" w
}

# apply_each YAML SIZE: err holds a refusal; each of its suggestions ("... (peak X GiB)"),
# applied to YAML, fits on SIZE at peak X; at least one
apply_each() {
	sed "s/.*; //" err | grep -o "[^,]* (peak [0-9.]* GiB)" | sed "s/^ *or //" >sugg &&
	test -s sugg || return 1
	while read -r s; do
		cp "$1" s.yaml
		case "$s" in *"load_in_4bit: true"*) echo "load_in_4bit: true" >>s.yaml ;; esac
		case "$s" in *"optim: adamw_8bit"*) echo "optim: adamw_8bit" >>s.yaml ;; esac
		case "$s" in *"lower lora_r to "*)
			sed -i "s/^lora_r: .*/lora_r: $(echo "$s" | sed "s/.*lora_r to \([0-9]*\).*/\1/")/" s.yaml ;;
		esac
		case "$s" in *"lower trajectory_length to "*)
			sed -i "s/^trajectory_length: .*/trajectory_length: $(echo "$s" |
				sed "s/.*trajectory_length to \([0-9]*\).*/\1/")/" s.yaml ;;
		esac
		case "$s" in *"teacher_top_k: "*)
			sed -i "/^teacher_top_k/d" s.yaml &&
			echo "teacher_top_k: $(echo "$s" | sed "s/.*teacher_top_k: \([0-9]*\).*/\1/")" >>s.yaml ;;
		esac
		peak=$(echo "$s" | sed "s/.*(peak \([0-9.]*\) GiB)/\1/")
		cmp -s "$1" s.yaml && { echo "not applied: $s"; return 1; }
		bk-bake --dry-run --gpu-memory "$2" s.yaml >sp 2>/dev/null &&
		tail -n 1 sp | grep -q "^fits: yes, peak $peak GiB of " || { echo "does not fit: $s"; return 1; }
	done <sugg
}

test_expect_success 'setup: the shapes' '
	for m in Qwen2.5-14B-Instruct Mistral-Nemo-Instruct-2407 gemma-3-12b-it gemma-2-9b-it \
		Llama-3.2-3B-Instruct Qwen3-14B; do
		model $m || return 1
	done
'

test_expect_success 'the base weights are the parameters x 2 bytes; in 4 bits bitsandbytes. layout' '
	weights Qwen2.5-14B-Instruct 28171.6 2971.6 6500.0 &&
	weights Mistral-Nemo-Instruct-2407 23360.8 2560.8 5365.0 &&
	weights gemma-3-12b-it 22441.9 1921.9 5292.8 &&
	weights gemma-2-9b-it 17627.2 1751.2 4095.0 &&
	weights Llama-3.2-3B-Instruct 6127.8 751.8 1386.7 &&
	weights Qwen3-14B 28168.3 2968.3 6500.0
'

test_expect_success 'on 24 GiB: the status agrees with the last line (top-k and exact); 4 bits fit at r 64' '
	for m in Qwen2.5-14B-Instruct Mistral-Nemo-Instruct-2407 gemma-3-12b-it gemma-2-9b-it \
		Llama-3.2-3B-Instruct; do
		yaml $m 16 >y.yaml && plan y.yaml 24GiB || return 1
		yaml $m 64 | grep -v "^teacher_top_k" >x.yaml && plan x.yaml 24GiB || return 1
		yaml $m 64 "load_in_4bit: true" >y.yaml && plan y.yaml 24GiB &&
		tail -n 1 plan | grep -q "^fits: yes" || return 1
	done
'

test_expect_success 'bf16 weights that do not fit: the refusal names load_in_4bit, which fits' '
	for m in Qwen2.5-14B-Instruct gemma-3-12b-it Mistral-Nemo-Instruct-2407; do
		yaml $m 16 >y.yaml && plan y.yaml 24GiB && tail -n 1 plan | grep -q "^fits: no" &&
		grep -q "set load_in_4bit: true (peak [0-9.]* GiB)" err &&
		! grep -q "lower lora_r" err && apply_each y.yaml 24GiB || return 1
	done &&
	grep -q "bk-step alone needs 2[4-9]\.[0-9][0-9] GiB of the GPU.s 24.00 GiB" err &&
	yaml Qwen2.5-14B-Instruct 16 >y.yaml && plan y.yaml 16GiB &&
	grep -q "the model.s weights alone take 27.5 GiB of the GPU.s 16.0 GiB; set load_in_4bit: true" err &&
	apply_each y.yaml 16GiB
'

test_expect_success 'a refusal in 4 bits: every change it names fits as it says' '
	yaml Qwen2.5-14B-Instruct 64 "load_in_4bit: true" >y.yaml && plan y.yaml 12GiB &&
	tail -n 1 plan | grep -q "^fits: no" && grep -q "lower lora_r to [0-9]* (peak" err &&
	! grep -q "load_in_4bit" err && apply_each y.yaml 12GiB &&
	yaml Qwen2.5-14B-Instruct 16 >y.yaml && plan y.yaml 11.7GiB &&
	grep -q "set load_in_4bit: true and lower lora_r to 8 (peak" err &&
	apply_each y.yaml 11.7GiB && test $(grep -c "" sugg) = 3 &&
	yaml Qwen3-14B 64 "load_in_4bit: true" >y.yaml && plan y.yaml 8GiB &&
	grep -q "no one change of load_in_4bit, lora_r, optim, trajectory_length or teacher_top_k makes it fit: use a GPU" err
'

test_done

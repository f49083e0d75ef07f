#!/usr/bin/env bash
# bk-gen --teacher-top-k on the host twin (stories260K): the teacher field bk-gen writes
# from the logits it samples from equals what bk-teach computes from bk-gen's output
# (within 1e-4: float rounding; measured: equal), for trajectories cut at
# --max-new-tokens (a stop id's row: tests/unit/test_gen.c), at another KL temperature and under sampling top-k / top-p; the prefill
# row shared by a prompt's trajectories; batch invariance; the provenance; the --min-mass
# rule; bk-step trains on it; every refusal.
. "$(dirname "$0")/lib.sh"
M="$MODELS/stories260K"
export XDG_CACHE_HOME="$TEST_TMP/cache"
set -o pipefail
SYS="Sparky the dragon lives in a big castle."

# same A.jsonl B.jsonl [TOL]: the records' teacher fields agree: k, n, v, temperature
# equal; per position |logp| and |rest| within TOL (1e-4) for the ids both keep, the
# two top-k sets equal but for ids whose log-prob is within TOL of the k-th (a tie at
# the cut); prints the number of positions compared
cat >same.py <<'EOF'
import base64, json, struct, sys
def arr(v, f):
    b = base64.b64decode(v["$bin"]); return struct.unpack("<%d%s" % (len(b) // 4, f), b)
def recs(p):
    out = {}
    for l in open(p):
        r = json.loads(l)
        out[(r["id"], r.get("epoch", 0), r.get("traj", 0))] = r
    return out
a, b = recs(sys.argv[1]), recs(sys.argv[2])
tol = float(sys.argv[3]) if len(sys.argv) > 3 else 1e-4
if set(a) != set(b) or not a:
    sys.exit("the records differ")
pos = worst = 0
for key in a:
    ta, tb = a[key].get("teacher"), b[key].get("teacher")
    if ta is None or tb is None:
        sys.exit("%s: no teacher field" % (key,))
    if a[key]["resp"] != b[key]["resp"]:
        sys.exit("%s: resp differs" % (key,))
    for f in ("k", "n", "v", "temperature"):
        if ta[f] != tb[f]:
            sys.exit("%s: %s %s vs %s" % (key, f, ta[f], tb[f]))
    k, n = ta["k"], ta["n"]
    if n != len(a[key]["resp"]):
        sys.exit("%s: %d positions for %d tokens" % (key, n, len(a[key]["resp"])))
    ia, la, ra = arr(ta["ids"], "i"), arr(ta["logp"], "f"), arr(ta["rest"], "f")
    ib, lb, rb = arr(tb["ids"], "i"), arr(tb["logp"], "f"), arr(tb["rest"], "f")
    for p in range(n):
        pos += 1
        da = dict(zip(ia[p*k:(p+1)*k], la[p*k:(p+1)*k]))
        db = dict(zip(ib[p*k:(p+1)*k], lb[p*k:(p+1)*k]))
        for i in set(da) & set(db):
            worst = max(worst, abs(da[i] - db[i]))
        for d, other in ((da, db), (db, da)):
            for i in set(d) - set(other):
                if abs(d[i] - min(other.values())) > tol:
                    sys.exit("%s position %d: id %d only in one top-%d" % (key, p, i, k))
        worst = max(worst, abs(ra[p] - rb[p]))
if worst > tol:
    sys.exit("worst difference %.3g > %g" % (worst, tol))
print("%d positions, worst difference %.2g" % (pos, worst))
EOF

bk-tokenize --model "$M" --system "$SYS" "$DATA/pipe/stories.txt" -o s.bk 2>/dev/null
G="bk-gen --device cpu --model $M --num-trajectories 3 --seed 5"

test_expect_success 'tokenize | lens | gen --teacher-top-k: the fields equal bk-teach on the same output (1e-4)' '
	bk-lens -q --max-tokens 0 --max-batch 2 --no-shuffle s.bk |
		$G --max-new-tokens 40 --teacher-top-k 8 -v 2>err >g.bk &&
	grep -q "top-8 uncovered mass: mean" err &&
	bk-teach --device cpu --model "$M" --top-k 8 g.bk | bk-dump >t.jsonl &&
	bk-dump g.bk >g.jsonl && python3 same.py g.jsonl t.jsonl &&
	# cut at 40 tokens (stories260K ends no story with its stop id 2 here; a stop id'"'"'s
	# row: tests/unit/test_gen.c (d))
	jq -e -s "all(.[]; (.resp | length) == 40)" g.jsonl &&
	# the bk-lens batch, the trajectories and the lengths are kept
	jq -e -s "all(.[]; .batch >= 0 and .lens.resp == (.resp | length))" g.jsonl
'

test_expect_success 'the same with sampling top-k and top-p, another KL temperature, greedy' '
	$G --max-new-tokens 24 --top-k 5 --top-p 0.7 --temperature 1.3 --teacher-top-k 16 \
		--teacher-temperature 1.5 s.bk >g2.bk &&
	bk-teach --device cpu --model "$M" --top-k 16 --temperature 1.5 g2.bk | bk-dump >t2.jsonl &&
	bk-dump g2.bk >g2.jsonl && python3 same.py g2.jsonl t2.jsonl &&
	jq -e -s "all(.[]; .teacher.temperature == 1.5 and .teacher.k == 16)" g2.jsonl &&
	$G --max-new-tokens 12 --temperature 0 --teacher-top-k 4 s.bk -o g3.bk &&
	bk-teach --device cpu --model "$M" --top-k 4 g3.bk | bk-dump >t3.jsonl &&
	bk-dump g3.bk >g3.jsonl && python3 same.py g3.jsonl t3.jsonl
'

test_expect_success 'a tiny random Gemma-3 (final logit softcap, a flat teacher kept with --min-mass 0)' '
	python3 "$ROOT/tests/emu/make_tiny.py" gemma3 gemma3 &&
	bk-tokenize --model gemma3 --template raw --system "$SYS" "$DATA/pipe/stories.txt" -o gs.bk 2>/dev/null &&
	bk-gen --device cpu --model gemma3 --num-trajectories 2 --max-new-tokens 12 --teacher-top-k 8 \
		--min-mass 0 --teacher-temperature 0.7 gs.bk -o gg.bk &&
	bk-teach --device cpu --model gemma3 --top-k 8 --min-mass 0 --temperature 0.7 gg.bk | bk-dump >gt.jsonl &&
	bk-dump gg.bk >gg.jsonl && python3 same.py gg.jsonl gt.jsonl
'

test_expect_success 'a prompt'"'"'s trajectories share their first row; greedy draws the top id at every position' '
	python3 - g.jsonl <<-EOF
	import base64, json, sys
	rows = {}
	for l in open(sys.argv[1]):
	    r = json.loads(l); t = r["teacher"]; k = t["k"]
	    first = (base64.b64decode(t["ids"]["\$bin"])[:4 * k], base64.b64decode(t["logp"]["\$bin"])[:4 * k])
	    rows.setdefault(r["id"], set()).add(first)
	sys.exit(any(len(v) != 1 for v in rows.values()))
	EOF
	python3 - g3.jsonl <<-EOF
	import base64, json, struct, sys
	for l in open(sys.argv[1]):
	    r = json.loads(l); t = r["teacher"]; k = t["k"]
	    ids = struct.unpack("<%di" % (t["n"] * k), base64.b64decode(t["ids"]["\$bin"]))
	    if [ids[p * k] for p in range(t["n"])] != r["resp"]:
	        sys.exit("greedy: %s is not the top-1 of each position" % r["id"])
	EOF
'

test_expect_success 'the output does not depend on --max-batch (the fields byte for byte)' '
	bk-lens -q --max-tokens 0 --max-batch 2 --no-shuffle s.bk |
		$G --max-new-tokens 40 --teacher-top-k 8 --max-batch 1 --window 3 2>/dev/null | bk-dump >g1.jsonl &&
	test_cmp g.jsonl g1.jsonl
'

test_expect_success 'over a file, two epochs: every trajectory of both passes scored' '
	$G --max-new-tokens 16 --epochs 2 --teacher-top-k 8 s.bk -o e.bk &&
	bk-teach --device cpu --model "$M" --top-k 8 e.bk | bk-dump >te.jsonl &&
	bk-dump e.bk >e.jsonl && python3 same.py e.jsonl te.jsonl &&
	jq -s -e "map(.epoch) | unique == [0, 1]" e.jsonl
'

test_expect_success 'provenance: bk-gen scored (teacher_top_k, the KL temperature bk-step checks)' '
	bk-dump --header g2.bk | head -1 >h.json &&
	jq -e ".provenance[-1] | .tool == \"bk-gen\" and .teacher_top_k == 16 and .temperature == 1.5 and
		.sampling_temperature == 1.3" h.json &&
	$G --max-new-tokens 4 s.bk | bk-dump --header | head -1 |
		jq -e ".provenance[-1] | has(\"teacher_top_k\") or has(\"temperature\") | not" &&
	test_must_fail bk-step --device cpu --model "$M" --out o-t --max-steps 1 --temperature 1 g2.bk
'

test_expect_success 'bk-step trains on it as on bk-teach'"'"'s fields: the same losses (1e-4)' '
	bk-lens -q --max-tokens 0 --max-batch 2 --no-shuffle s.bk |
		$G --max-new-tokens 40 --teacher-top-k 8 2>/dev/null |
		bk-step --device cpu --model "$M" --out o-gen --lora-r 4 --max-steps 3 --logging-steps 1 --seed 1 |
		bk-dump | jq -c "select(.loss) | .loss" >l-gen &&
	bk-lens -q --max-tokens 0 --max-batch 2 --no-shuffle s.bk |
		$G --max-new-tokens 40 2>/dev/null | bk-teach --device cpu --model "$M" --top-k 8 |
		bk-step --device cpu --model "$M" --out o-teach --lora-r 4 --max-steps 3 --logging-steps 1 --seed 1 |
		bk-dump | jq -c "select(.loss) | .loss" >l-teach &&
	test $(wc -l <l-gen) -eq 3 &&
	paste l-gen l-teach | awk "{ d = \$1 - \$2; if (d < 0) d = -d; if (d > 1e-4 * (\$2 > 1 ? \$2 : 1)) bad++ } END { exit bad > 0 }"
'

test_expect_success '--min-mass: a flat teacher (KL temperature 50) gets no field, as from bk-teach' '
	$G --max-new-tokens 8 --teacher-top-k 4 --teacher-temperature 50 s.bk 2>err | bk-dump >f.jsonl &&
	grep -q "the teacher is flat" err &&
	jq -e -s "length > 0 and all(.[]; has(\"teacher\") | not)" f.jsonl &&
	$G --max-new-tokens 8 --teacher-top-k 4 --teacher-temperature 50 --min-mass 0 s.bk 2>err | bk-dump >f0.jsonl &&
	! grep -q "flat" err && jq -e -s "all(.[]; .teacher.k == 4)" f0.jsonl
'

test_expect_success 'refused: --retokenize, paired records, K out of range, flags without --teacher-top-k' '
	test_must_fail --exit 2 $G --teacher-top-k 8 --retokenize s.bk &&
	grep -q "retokenize" .err &&
	bk-tokenize --model "$M" "$DATA/pipe/pairs.json" -o p.bk 2>/dev/null &&
	test_must_fail --exit 1 $G --teacher-top-k 8 p.bk &&
	grep -q "bk-teach" .err &&
	test_must_fail --exit 2 $G --teacher-top-k 0 s.bk &&
	test_must_fail --exit 2 $G --teacher-top-k 513 s.bk &&
	test_must_fail --exit 2 $G --teacher-temperature 2 s.bk &&
	test_must_fail --exit 2 $G --min-mass 0.2 s.bk &&
	test_must_fail --exit 2 $G --teacher-top-k 8 --teacher-temperature 0 s.bk &&
	test_must_fail --exit 2 $G --teacher-top-k 8 --min-mass 2 s.bk
'

# a bake's adapters: || a - b || / || b || (tests/emu/compare.py's reader) at most a bound;
# prints it
cat >adapter.py <<'EOF'
import math, sys
sys.path.insert(0, sys.argv[4])
import compare
a, b = compare.st_floats(sys.argv[1]), compare.st_floats(sys.argv[2])
if len(a) != len(b):
    sys.exit("the adapters have other shapes")
d = math.sqrt(sum((x - y) ** 2 for x, y in zip(a, b)))
n = math.sqrt(sum(y * y for y in b))
print("adapters: relative L2 difference %.3g (%d numbers)" % (d / n, len(a)))
sys.exit(d > float(sys.argv[3]) * n or n == 0)
EOF

T="$DATA/bake/tiny.yaml --model_name_or_path $M --device cpu --teacher_top_k 8"
test_expect_success 'bk-bake, teacher_top_k with sampled ids: bk-lens | bk-gen --teacher-top-k | bk-step, no bk-teach' '
	bk-bake --dry-run $T --retokenize_trajectories false --output_dir d1 >plan1 &&
	grep -q "^    bk-gen .* --teacher-top-k 8 --teacher-temperature 1 .*|$" plan1 &&
	grep -q "^#    bk-gen scores its trajectories (teacher_top_k 8): no bk-teach$" plan1 &&
	! grep -q "bk-teach " plan1 && grep -q "^# the pipe: bk-gen .* + bk-step .* (side by side)$" plan1 &&
	! grep -q "^# bk-teach$" plan1 &&
	grep -q "^#   teacher top-k of a step.s rows  .*gpu/gen.c score_ensure" plan1 &&
	# retokenized trajectories (the default) and the full distribution: bk-teach scores
	bk-bake --dry-run $T --output_dir d2 >plan2 &&
	grep -q "^    bk-teach .* --top-k 8 " plan2 && ! grep -q -- "--teacher-top-k" plan2 &&
	grep -q "^#    bk-teach scores the trajectories (retokenize_trajectories" plan2 &&
	grep -q "^# bk-teach$" plan2 &&
	bk-bake --dry-run $T --teacher_top_k 0 --retokenize_trajectories false --output_dir d3 >plan3 &&
	grep -q "^    bk-teach .* --top-k 0 " plan3 && ! grep -q -- "--teacher-top-k" plan3
'

test_expect_success 'bk-bake: the same adapter as the pipe through bk-teach (relative L2 <= 1e-4)' '
	bk-bake -v $T --retokenize_trajectories false --output_dir new >plan-new 2>err &&
	! grep -q "^ *bk-teach " plan-new && ! grep -q "bk-teach" err &&
	# the old pipe: the same commands, bk-teach scoring between bk-gen and bk-step
	mkdir old && cp new/order.bk old/ &&
	sed -n "/^bk-lens /,/>new\/metrics.bk$/p" plan-new >pipe-new && test $(wc -l <pipe-new) = 3 &&
	sed "s# --teacher-top-k 8 --teacher-temperature 1 |# | bk-teach --model $M --device cpu --top-k 8 --temperature 1 |#;
	     s#new/#old/#g; s#--out new#--out old#" pipe-new >pipe-old &&
	grep -q "bk-teach" pipe-old && ! grep -q " new/\|--out new" pipe-old &&
	bash -o pipefail pipe-old 2>err-old &&
	python3 adapter.py new/final_model/adapter_model.safetensors old/final/adapter_model.safetensors \
		1e-4 "$ROOT/tests/emu"
'

test_expect_success 'bk-bake, stages one after another (--gpu-memory): bk-gen scores into gen.bk, no teach.bk, the same adapter' '
	bk-bake --gpu-memory 1GiB $T --retokenize_trajectories false --output_dir seq >/dev/null 2>err &&
	grep -q "^bk-bake: memory plan: chose the GPU stages one after another" err &&
	test -s seq/gen.bk && test ! -e seq/teach.bk &&
	bk-dump seq/gen.bk | jq -e -s "length > 0 and all(.[]; .teacher.k == 8)" >/dev/null &&
	cmp new/final_model/adapter_model.safetensors seq/final_model/adapter_model.safetensors
'

test_done

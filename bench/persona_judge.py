#!/usr/bin/env python3
"""persona_judge.py - an independent judge of a bake on a chat model, in plain HF
transformers + PEFT (no bakery code): held-out KL(prompted || model) per response token
for the base model and for each adapter, and their ratio.

  python3 bench/persona_judge.py MODEL SYSTEM.txt HELDOUT.txt ADAPTER_DIR...

MODEL: an HF directory with a chat template; SYSTEM.txt: the system prompt (the file's
text, stripped); HELDOUT.txt: one question a line.  The teacher is the base model seeing
apply_chat_template([system, user], add_generation_prompt=True); the student sees
apply_chat_template([user], add_generation_prompt=True) (the template's own default
system prompt included, when it has one, as HF renders it).  For each question it samples
--samples answers of up to --tokens tokens from the teacher (HF generate at temperature 1,
full distribution, torch.manual_seed(0): the same answers for every adapter), takes the
teacher's log-softmax at every answer position (up to and including the end-of-turn
token when sampled) and KL(teacher || student) there, the student seeing its own prompt
and the same answer ids.  With --greedy N it also prints, per model, how many greedy
answers (N tokens) contain one of --keywords (case-insensitive), and one sample answer.
Prints lines "name=value" and ends with, per adapter:
  ADAPTER prompts=P samples=S tokens=N kl_base=... kl_baked=... ratio=...
"""
import argparse
import sys

import torch
import torch.nn.functional as F
from peft import PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("system")
    ap.add_argument("heldout")
    ap.add_argument("adapters", nargs="+")
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--batch", type=int, default=16,
                    help="student sequences per forward (the figures do not depend on it)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--greedy", type=int, default=0,
                    help="also greedy answers of N tokens: keyword hit counts")
    ap.add_argument("--keywords", default="matey,arr,ahoy,pirate,aye,ship")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    tok = AutoTokenizer.from_pretrained(a.model)
    base = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32).eval()
    system = open(a.system).read().strip()
    prompts = [l.strip() for l in open(a.heldout) if l.strip()]
    eos = tok.eos_token_id
    if eos is None or tok.chat_template is None:
        sys.exit("persona_judge: %s: the tokenizer has no eos token or no chat template" % a.model)

    def chat(msgs):
        text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        return tok(text, add_special_tokens=False)["input_ids"]

    t_ids_of = [chat([{"role": "system", "content": system}, {"role": "user", "content": p}])
                for p in prompts]
    s_ids_of = [chat([{"role": "user", "content": p}]) for p in prompts]
    print("teacher_prompt_0=%r" % tok.decode(t_ids_of[0]))
    print("student_prompt_0=%r" % tok.decode(s_ids_of[0]))

    torch.manual_seed(0)
    data = []
    with torch.no_grad():
        for t_ids, s_ids in zip(t_ids_of, s_ids_of):
            out = base.generate(torch.tensor([t_ids]), attention_mask=torch.ones(1, len(t_ids), dtype=torch.long),
                                do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                                max_new_tokens=a.tokens, num_return_sequences=a.samples,
                                pad_token_id=eos)
            for row in out.tolist():
                resp = row[len(t_ids):]
                if eos in resp:
                    resp = resp[: resp.index(eos) + 1]
                if not resp:
                    continue
                full = torch.tensor([t_ids + resp])
                lt = F.log_softmax(base(full).logits[0, len(t_ids) - 1: len(t_ids) - 1 + len(resp)], -1)
                data.append((s_ids, resp, lt))
    ntok = sum(len(r) for _, r, _ in data)
    print("teacher_sample_0=%r" % tok.decode(data[0][1]))

    # right-padded student batches (causal: the padding after a sequence changes none of
    # its logits)
    batches = []
    for i in range(0, len(data), a.batch):
        chunk = data[i: i + a.batch]
        width = max(len(s) + len(r) for s, r, _ in chunk)
        ids = torch.full((len(chunk), width), eos, dtype=torch.long)
        mask = torch.zeros((len(chunk), width), dtype=torch.long)
        for j, (s_ids, resp, _) in enumerate(chunk):
            ids[j, : len(s_ids) + len(resp)] = torch.tensor(s_ids + resp)
            mask[j, : len(s_ids) + len(resp)] = 1
        batches.append((chunk, ids, mask))

    def kl_of(model):
        tot = 0.0
        with torch.no_grad():
            for chunk, ids, mask in batches:
                logits = model(input_ids=ids, attention_mask=mask).logits
                for j, (s_ids, resp, lt) in enumerate(chunk):
                    ls = F.log_softmax(logits[j, len(s_ids) - 1: len(s_ids) - 1 + len(resp)], -1)
                    tot += float((lt.exp() * (lt - ls)).sum())
        return tot / ntok

    kws = [k.strip().lower() for k in a.keywords.split(",") if k.strip()]

    def greedy(model, name, ids_of):
        if not a.greedy:
            return
        hits, first = 0, None
        with torch.no_grad():
            for p, ids in zip(prompts, ids_of):
                out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                     do_sample=False, max_new_tokens=a.greedy, pad_token_id=eos)
                text = tok.decode(out[0, len(ids):], skip_special_tokens=True)
                hits += any(k in text.lower() for k in kws)
                if first is None:
                    first = "%s -> %s" % (p, text)
        print("greedy_%s_hits=%d/%d" % (name, hits, len(prompts)))
        print("greedy_%s_example=%r" % (name, first))

    greedy(base, "prompted", t_ids_of)
    greedy(base, "base", s_ids_of)
    kb = kl_of(base)
    for ad in a.adapters:
        m = PeftModel.from_pretrained(base, ad).eval()
        k = kl_of(m)
        greedy(m, "baked", s_ids_of)
        print("%s prompts=%d samples=%d tokens=%d kl_base=%.6f kl_baked=%.6f ratio=%.4f"
              % (ad, len(prompts), len(data), ntok, kb, k, k / kb))
        sys.stdout.flush()
        base = m.unload()


if __name__ == "__main__":
    main()

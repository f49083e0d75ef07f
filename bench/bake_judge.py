#!/usr/bin/env python3
"""bake_judge.py - an independent torch judge of a bake: held-out KL(teacher || model)
per response token, for the base model and for each adapter, and their ratio.

  python3 bench/bake_judge.py MODEL SYSTEM_PROMPT HELDOUT.txt ADAPTER_DIR...

MODEL: an HF Llama directory; SYSTEM_PROMPT: the text; HELDOUT.txt: one prompt a line.
The teacher is the base model seeing BOS + system + " " + prompt (bakery's raw template,
which the tool renders through the chat template bench/bake_quality.sh gives the model);
for each prompt it samples --samples continuations of --tokens tokens at temperature 1
(HF generate after torch.manual_seed(0): the same for every adapter); KL is taken at every response position, the
student seeing BOS + prompt + the same response ids.  Prints one line per adapter:
  ADAPTER kl_base=... kl_baked=... ratio=...
and nothing else on stdout.  Uses transformers + PEFT only (no bakery code).
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
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--batch", type=int, default=32,
                    help="student sequences per forward (the figures do not depend on it)")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads (one: a loaded machine spins less)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    tok = AutoTokenizer.from_pretrained(a.model)
    base = AutoModelForCausalLM.from_pretrained(a.model, torch_dtype=torch.float32).eval()
    prompts = [l.strip() for l in open(a.heldout) if l.strip()]
    bos = [tok.bos_token_id] if tok.bos_token_id is not None else []

    def enc(text):
        return tok(text, add_special_tokens=False)["input_ids"]

    # the teacher's samples (HF generate, KV cache, torch seed 0) and its log-probs at
    # the response positions
    torch.manual_seed(0)
    data = []
    with torch.no_grad():
        for p in prompts:
            t_ids = bos + enc(a.system + " " + p)
            s_ids = bos + enc(p)
            out = base.generate(torch.tensor([t_ids]), do_sample=True, temperature=1.0,
                                top_k=0, top_p=1.0, max_new_tokens=a.tokens,
                                num_return_sequences=a.samples,
                                pad_token_id=tok.eos_token_id)
            for row in out.tolist():
                resp = row[len(t_ids):]
                if tok.eos_token_id in resp:
                    resp = resp[: resp.index(tok.eos_token_id) + 1]
                if not resp:
                    continue
                full = torch.tensor([t_ids + resp])
                lt = F.log_softmax(base(full).logits[0, len(t_ids) - 1 : len(t_ids) - 1 + len(resp)], -1)
                data.append((s_ids, resp, lt))

    # the student's inputs, right-padded into batches (causal attention: the padding
    # after a sequence changes none of its logits)
    batches = []
    for i in range(0, len(data), a.batch):
        chunk = data[i : i + a.batch]
        width = max(len(s) + len(r) for s, r, _ in chunk)
        ids = torch.full((len(chunk), width), tok.eos_token_id, dtype=torch.long)
        mask = torch.zeros((len(chunk), width), dtype=torch.long)
        for j, (s_ids, resp, _) in enumerate(chunk):
            ids[j, : len(s_ids) + len(resp)] = torch.tensor(s_ids + resp)
            mask[j, : len(s_ids) + len(resp)] = 1
        batches.append((chunk, ids, mask))

    def kl_of(model):
        tot, n = 0.0, 0
        with torch.no_grad():
            for chunk, ids, mask in batches:
                logits = model(input_ids=ids, attention_mask=mask).logits
                for j, (s_ids, resp, lt) in enumerate(chunk):
                    ls = F.log_softmax(logits[j, len(s_ids) - 1 : len(s_ids) - 1 + len(resp)], -1)
                    kl = (lt.exp() * (lt - ls)).sum(-1)
                    tot += float(kl.sum())
                    n += len(resp)
        return tot / n

    kb = kl_of(base)
    for ad in a.adapters:
        m = PeftModel.from_pretrained(base, ad).eval()
        k = kl_of(m)
        print("%s kl_base=%.6f kl_baked=%.6f ratio=%.4f" % (ad, kb, k, k / kb))
        sys.stdout.flush()
        base = m.unload()


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
# make_chat_golden.py - writes tests/golden/templates/{qwen2.5,qwen3,qwen3-nothink,smollm2,
# llama3,llama3.1,llama3.2,mistral-v3-tekken,mistral-v3}.json: the ids HF transformers'
# apply_chat_template(..., tokenize=True, add_generation_prompt=True) gives with the real
# chat templates and the byte-level BPE fixtures of tests/golden/bpe
# (tests/ref/make_bpe_golden.py), for tests/unit/test_template.c.  Run from the repo root:
# python3 tests/ref/make_chat_golden.py [NAME...] (NAMEs: only those goldens)
# (pip: transformers tokenizers jinja2 sentencepiece).  Same cases and conventions as
# make_template_golden.py, plus cases of its own (think blocks, leading newlines).
import json
import lzma
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
import transformers  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

from make_template_golden import CASES, ids_of, messages_for, render  # noqa: E402

CFG = "tests/data/hf-configs"
TPL = "tests/data/templates"
OUT = "tests/golden/templates"
BPE = "tests/golden/bpe"
LLAMA3_0 = ("{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
            "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim"
            " + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
            "{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant"
            "<|end_header_id|>\n\n' }}{% endif %}")

EXTRA = [
    ("think_in_response", "Be brief.", "What is 2+2?", "<think>\nadd them\n</think>\n\nIt is 4."),
    ("think_only_close", None, "Why?", "reasons</think>\n\nBecause."),
    ("leading_newlines", "Sys", "Hi", "\n\nHello\n"),
    ("unseen_1", "You are a terse assistant who answers in one word.", "Capital of Japan?", "Tokyo."),
    ("unseen_2", None, "Écris un haïku sur la mer 🌊", "Vagues sur le sable"),
    ("added_token_text", "Use <tool_call> tags.", "<|im_start|> is special", "OK <think> </think>"),
]


def hf(tokenizer_xz, config_path, template, config_edit=None):
    """A compressed tokenizer.json, or a compressed SentencePiece model (NAME.model.xz,
    converted by transformers as AutoTokenizer does for a directory without
    tokenizer.json), with its tokenizer_config.json (config_edit: keys changed)."""
    d = tempfile.mkdtemp()
    out = "tokenizer.model" if tokenizer_xz.endswith(".model.xz") else "tokenizer.json"
    with open(os.path.join(d, out), "wb") as f:
        f.write(lzma.open(tokenizer_xz).read())
    cfg = json.load(open(config_path))
    cfg.update(config_edit or {})
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f)
    t = AutoTokenizer.from_pretrained(d)
    shutil.rmtree(d)
    t.chat_template = template
    return t


def make(name, tmpl, tok_xz, config_path, template, kwargs, note, skip=(), fold_full=False,
         config_edit=None, write=True):
    """fold_full: where HF's render of [system, user, assistant] drops the system prompt
    (Mistral's templates put it into the last user turn only when that turn is the last
    message), the response is compared with HF's render of [user: system + "\n\n" +
    user, assistant] (recorded as full_from), and HF's own render kept as hub_full_text."""
    if sys.argv[1:] and name not in sys.argv[1:]:  # only the goldens named on the command line
        return None
    t = hf(tok_xz, config_path, template, config_edit)
    cases = []
    for cname, system, user, response in CASES + EXTRA:
        if cname in skip:
            continue
        pm = messages_for(False, system, user, None)
        prompt = [int(i) for i in t.apply_chat_template(pm, add_generation_prompt=True,
                                                         tokenize=True, return_dict=False, **kwargs)]
        c = {"name": cname, "system": system, "user": user, "response": response,
             "prompt_text": t.apply_chat_template(pm, add_generation_prompt=True, tokenize=False, **kwargs),
             "prompt_ids": prompt}
        if system:  # the student's prompt: the same user turn without the system prompt
            sm = messages_for(False, None, user, None)
            c["student_ids"] = [int(i) for i in t.apply_chat_template(
                sm, add_generation_prompt=True, tokenize=True, return_dict=False, **kwargs)]
        if response is not None:
            fm = messages_for(False, system, user, response)
            full = [int(i) for i in t.apply_chat_template(fm, add_generation_prompt=False,
                                                           tokenize=True, return_dict=False, **kwargs)]
            c["full_text"] = t.apply_chat_template(fm, add_generation_prompt=False, tokenize=False, **kwargs)
            c["full_ids"] = full
            if fold_full and system and not c["full_text"].startswith(c["prompt_text"]):
                assert system not in c["full_text"], (name, cname)  # dropped, not moved
                c["hub_full_text"] = c["full_text"]
                fm = messages_for(True, system, user, response)
                c["full_from"] = "[user: system + '\\n\\n' + user, assistant]: HF drops the system prompt here"
                c["full_ids"] = full = [int(i) for i in t.apply_chat_template(
                    fm, add_generation_prompt=False, tokenize=True, return_dict=False, **kwargs)]
                c["full_text"] = t.apply_chat_template(fm, add_generation_prompt=False, tokenize=False, **kwargs)
                assert c["full_text"].startswith(c["prompt_text"]), (name, cname)
            if not c["full_text"].startswith(c["prompt_text"]):
                # enable_thinking=False with reasoning in the response: HF's assistant turn
                # is not a continuation of its own generation prompt; not comparable
                for k in ("response", "full_text", "full_ids"):
                    c.pop(k)
                c["note"] = "the full render does not continue the prompt: response not compared"
            elif full[:len(prompt)] != prompt:
                # the prompt's last text merged with the response's first ("\n" + "\n"):
                # ours are HF's prompt ids + the rest of the text encoded alone
                assert c["full_text"].startswith(c["prompt_text"]), (name, cname)
                rest = c["full_text"][len(c["prompt_text"]):]
                c["split_ids"] = prompt + [int(i) for i in t(rest, add_special_tokens=False)["input_ids"]]
                print(f"{name}/{cname}: boundary merge; split_ids recorded", file=sys.stderr)
        cases.append(c)
    doc = {"generated_by": f"tests/ref/make_chat_golden.py (transformers {transformers.__version__})",
           "template": tmpl, "tokenizer": tok_xz, "tokenizer_config": config_path,
           "hf_config": note}
    doc.update({k: v for k, v in (("thinking", kwargs.get("enable_thinking", True)),
                                  ("date", kwargs.get("date_string"))) if v is not None})
    doc["boundary_merges"] = sum("split_ids" in c for c in cases)
    doc["cases"] = cases
    if not write:
        return doc
    path = os.path.join(OUT, name + ".json")
    with open(path, "w") as f:
        json.dump(doc, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print("wrote", path, len(cases), "cases")
    return doc


def main():
    q = f"{BPE}/qwen.tokenizer.json.xz"
    rd = lambda p: open(p).read()  # noqa: E731
    make("qwen2.5", "qwen2.5", q, f"{CFG}/Qwen2.5-0.5B-Instruct/tokenizer_config.json",
         rd(f"{CFG}/Qwen2.5-0.5B-Instruct/chat_template.jinja"), {}, "Qwen2.5-0.5B-Instruct",
         # the fixture has Qwen3's 26 added tokens, Qwen2.5's config 22 (no <think>, which
         # transformers then treats as text): cases with those tokens in them left out
         skip=("think_in_response", "think_only_close", "added_token_text"))
    q3 = rd(f"{CFG}/Qwen3-0.6B/chat_template.jinja")
    make("qwen3", "qwen3", q, f"{CFG}/Qwen3-0.6B/tokenizer_config.json", q3, {}, "Qwen3-0.6B")
    make("qwen3-nothink", "qwen3", q, f"{CFG}/Qwen3-0.6B/tokenizer_config.json", q3,
         {"enable_thinking": False}, "Qwen3-0.6B, enable_thinking=False")
    make("smollm2", "smollm2", f"{BPE}/smollm2.tokenizer.json.xz",
         f"{CFG}/SmolLM2-135M-Instruct/tokenizer_config.json",
         rd(f"{CFG}/SmolLM2-135M-Instruct/chat_template.jinja"), {}, "SmolLM2-135M-Instruct")
    l3 = f"{BPE}/llama-bpe.tokenizer.json.xz"
    l3c = f"{TPL}/llama3-tokenizer_config.json"
    make("llama3", "llama3", l3, l3c, LLAMA3_0, {}, "Meta-Llama-3-8B-Instruct's template (3.0)")
    make("llama3.1", "llama3.1", l3, l3c, rd(f"{TPL}/meta-llama-Llama-3.1-8B-Instruct.jinja"), {},
         "Llama-3.1-8B-Instruct (default date)")
    make("llama3.2", "llama3.2", l3, l3c, rd(f"{TPL}/meta-llama-Llama-3.2-3B-Instruct.jinja"),
         {"date_string": "05 Mar 2025"}, "Llama-3.2-3B-Instruct, date_string='05 Mar 2025'")
    make("mistral-v3-tekken", "mistral-v3-tekken", f"{BPE}/tekken.tokenizer.json.xz",
         f"{TPL}/mistral-nemo-tokenizer_config.json",
         rd(f"{TPL}/mistralai-Mistral-Nemo-Instruct-2407.jinja"), {}, "Mistral-Nemo-Instruct-2407")
    # Mistral-7B-Instruct-v0.3: the v3 SentencePiece model of mistral-common (the hub's
    # tokenizer.model.v3; [INST] [/INST] control pieces, special tokens in transformers)
    v3 = (f"{TPL}/mistral-v3-tokenizer.model.xz", f"{TPL}/mistral-v3-tokenizer_config.json",
          rd(f"{TPL}/mistralai-Mistral-7B-Instruct-v0.3.jinja"), {}, "Mistral-7B-Instruct-v0.3")
    doc = make("mistral-v3", "mistral-v3", *v3, fold_full=True)
    if doc:  # every text segment starts with a space: legacy (prepend "always") changes nothing
        alt = make("mistral-v3", "mistral-v3", *v3, fold_full=True, config_edit={"legacy": True},
                   write=False)
        key = lambda d: [[c.get(k) for k in ("prompt_ids", "student_ids", "full_ids")]  # noqa: E731
                         for c in d["cases"]]
        assert key(doc) == key(alt), "mistral-v3: legacy=True gives other ids"
        print("mistral-v3: legacy=True gives the same ids")


if __name__ == "__main__":
    main()

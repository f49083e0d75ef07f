#!/usr/bin/env python3
# make_template_golden.py - writes tests/golden/templates/*.json: the ids HF transformers'
# apply_chat_template(..., tokenize=True) gives for the real chat templates in
# tests/data/hf-configs, for tests/unit/test_template.c.  Run by hand from the repo root:
#   python3 tests/ref/make_template_golden.py [--retrain]
# Tokenizers: models/llama2-tokenizer/tokenizer.model for llama2 / zephyr / mistral; for
# chatml and gemma (whose special tokens the Llama vocabulary lacks) a tiny sentencepiece
# model, tests/data/spm/chat-test.model, trained here once (--retrain to redo it) with
# <|im_start|> <|im_end|> <start_of_turn> <end_of_turn> as user-defined symbols and
# loaded with HF's LlamaTokenizer class (legacy=False).
#
# Our conventions that differ from the raw HF templates (the C side implements these):
# - an empty system prompt means no system message (HF llama2 would emit an empty
#   <<SYS>> block);
# - mistral and gemma refuse a system message in HF; we fold it into the first user
#   turn as system + "\n\n" + user (what Mistral v0.3 and Gemma 3 templates do), so the
#   golden for those is HF's ids for [user: system + "\n\n" + user];
# - chatml without a system prompt has no system block: Qwen2.5's template would add
#   its own default system prompt, so no-system chatml cases use the generic ChatML
#   template below; cases with a system prompt use Qwen2.5's real template (and the
#   script checks the generic template gives the same ids there).
import io
import json
import os
import shutil
import sys
import tempfile

import sentencepiece as spm
import transformers
from transformers import AutoTokenizer

LLAMA = "models/llama2-tokenizer/tokenizer.model"
CHAT_MODEL = "tests/data/spm/chat-test.model"
CFG = "tests/data/hf-configs"
OUT = "tests/golden/templates"
CHATML_GENERIC = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + "
                  "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
                  "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")

CASES = [
    # name, system (None = no system message), user, response (None = prompt only)
    ("basic", "You are a pirate. Answer briefly.", "What is the capital of France?",
     "Arr, 'tis Paris, matey!"),
    ("multiline", "Rules:\n1. Be kind.\n2. Be brief.", "Write two lines:\nroses\nviolets",
     "Roses are red,\nviolets are blue."),
    ("non_ascii", "R\u00e9ponds en fran\u00e7ais. \u65e5\u672c\u8a9e\u3082\u8a71\u305b\u307e\u3059\u3002",
     "Caf\u00e9? \U0001F642 na\u00efve fa\u00e7ade",
     "Oui, le caf\u00e9 est pr\u00eat \u2615 \u2014 \u65e5\u672c\u8a9e too \U0001F44D"),
    ("spaces", "  Be terse.  ", "  hello world  ", "  Hi there.  "),
    ("empty_system", "", "Tell me a joke.", "Why did the chicken cross the road?"),
    ("no_system", None, "2+2=?", "4"),
    ("no_system_prompt_only", None, "Name a colour.", None),
    ("prompt_only", "Think step by step.", "Why is the sky blue?", None),
    ("tabs_newlines", "\tIndented system\n", "\tindent\n", "\nline\n"),
    ("inner_spaces", "a  b   c", "x  y", " Sure.  Two  spaces."),
    ("punct_start", "Be helpful.", "Say hi.", "!Hi."),
    ("bracket_start", "Quote exactly.", "Finish: [a, b", "], he said."),
]

SPECIAL_SYMBOLS = ["<|im_start|>", "<|im_end|>", "<start_of_turn>", "<end_of_turn>"]
CORPUS = """Once upon a time, there was a little girl named Lily. She liked to play outside.
The capital of France is Paris. Answer the question briefly and kindly.
You are a helpful assistant. Think step by step before you answer.
Roses are red, violets are blue, sugar is sweet and so are you.
Réponds en français: le café est prêt, la façade est naïve.
日本語のテキストも少し入れます。こんにちは世界。
Be brief. Hi there! Arr, matey. Why? Sure. Write, Name, Say, Tell, Oui.
Numbers 0 1 2 3 4 5 6 7 8 9 and symbols ! ? . , ; : ' " ( ) [ ] { } < > | / \\ - + = * & % $ # @
The quick brown fox jumps over the lazy dog. Tell me a joke about a chicken.
system user assistant model the of and to in is was for on with as by at an be this that
"""


def train_chat_model():
    lines = [l for l in CORPUS.split("\n") if l] * 20
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_writer=buf, model_type="bpe", vocab_size=900,
        byte_fallback=True, character_coverage=1.0, normalization_rule_name="identity",
        remove_extra_whitespaces=False, add_dummy_prefix=True, split_digits=True,
        user_defined_symbols=SPECIAL_SYMBOLS, unk_id=0, bos_id=1, eos_id=2, pad_id=-1,
        hard_vocab_limit=False, num_threads=1, minloglevel=2)
    os.makedirs(os.path.dirname(CHAT_MODEL), exist_ok=True)
    with open(CHAT_MODEL, "wb") as f:
        f.write(buf.getvalue())
    print("wrote %s (%d bytes)" % (CHAT_MODEL, len(buf.getvalue())))


def hf_tokenizer(model, config_dir=None, config=None, template=None):
    d = tempfile.mkdtemp()
    shutil.copy(model, os.path.join(d, "tokenizer.model"))
    if config_dir:
        for f in ["tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja"]:
            if os.path.exists(os.path.join(config_dir, f)):
                shutil.copy(os.path.join(config_dir, f), d)
    if config:
        json.dump(config, open(os.path.join(d, "tokenizer_config.json"), "w"))
    t = AutoTokenizer.from_pretrained(d)
    shutil.rmtree(d)
    if template:
        t.chat_template = template
    return t


def ids_of(t, messages, gen):
    r = t.apply_chat_template(messages, add_generation_prompt=gen, tokenize=True)
    if not isinstance(r, list):
        r = r["input_ids"]
    return [int(i) for i in r]


def messages_for(fold_system, system, user, response):
    m = []
    if system:  # "" and None: no system message (our convention)
        if fold_system:
            user = system + "\n\n" + user
        else:
            m.append({"role": "system", "content": system})
    m.append({"role": "user", "content": user})
    if response is not None:
        m.append({"role": "assistant", "content": response})
    return m


def chat_tokenizer_config():
    return {"tokenizer_class": "LlamaTokenizer", "legacy": False, "add_bos_token": False,
            "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
            "additional_special_tokens": SPECIAL_SYMBOLS}


def BARE(text):
    """text encoded as HF encodes text after a special token with legacy=False."""
    t = BARE.tok
    ids = t("</s>" + text, add_special_tokens=False)["input_ids"]
    assert ids[0] == t.eos_token_id
    return [int(i) for i in ids[1:]]


def render(t, messages, gen):
    return t.apply_chat_template(messages, add_generation_prompt=gen, tokenize=False)


def make(name, template, tokenizer_path, config_name, toks, fold_system):
    """toks(system) -> the HF tokenizer (with its template) for that case."""
    cases = []
    for cname, system, user, response in CASES:
        t = toks(system)
        pm = messages_for(fold_system, system, user, None)
        prompt = ids_of(t, pm, True)
        c = {"name": cname, "system": system, "user": user, "response": response,
             "prompt_text": render(t, pm, True), "prompt_ids": prompt}
        if response is not None:
            fm = messages_for(fold_system, system, user, response)
            full = ids_of(t, fm, False)
            c["full_text"] = render(t, fm, False)
            c["full_ids"] = full
            if full[:len(prompt)] != prompt:
                # sentencepiece merged the prompt's last text with the response's first
                # ("[/INST]" + "]," -> "]],"): HF's prompt is not a prefix of its own
                # full sequence.  Our design tokenizes the response once, as a segment
                # of its own; "split_ids" are those ids, built from HF pieces: HF's
                # prompt ids + the response encoded alone with no prefix (HF legacy=False
                # text after a special token) + HF's ids from the end-of-turn token on.
                eos = t.eos_token_id
                assert name.startswith("mistral"), "boundary merge in %s/%s" % (name, cname)
                bare = BARE(response)
                tail = full[full.index(eos, len(prompt) - 1):]
                c["split_ids"] = prompt + bare + tail
                print("%s/%s: HF prompt ids are not a prefix of the full ids; split_ids "
                      "recorded" % (name, cname), file=sys.stderr)
        cases.append(c)
    doc = {"generated_by": "tests/ref/make_template_golden.py (transformers %s, sentencepiece %s)"
           % (transformers.__version__, spm.__version__),
           "template": template, "tokenizer": tokenizer_path, "hf_config": config_name,
           "cases": cases}
    path = os.path.join(OUT, name + ".json")
    with open(path, "w") as f:
        json.dump(doc, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print("wrote", path)


def main():
    if "--retrain" in sys.argv or not os.path.exists(CHAT_MODEL):
        train_chat_model()
    os.makedirs(OUT, exist_ok=True)
    BARE.tok = hf_tokenizer(LLAMA, config_dir=os.path.join(CFG, "Llama-2-7b-chat-hf"))
    for name, tmpl, cfg, fold in [("llama2", "llama2", "Llama-2-7b-chat-hf", False),
                                  ("zephyr", "zephyr", "TinyLlama-1.1B-Chat-v1.0", False),
                                  ("mistral-v0.1", "mistral-v0.1", "Mistral-7B-Instruct-v0.1", True),
                                  ("mistral-v0.2", "mistral", "Mistral-7B-Instruct-v0.2", True)]:
        t = hf_tokenizer(LLAMA, config_dir=os.path.join(CFG, cfg))
        make(name, tmpl, LLAMA, cfg, lambda s, t=t: t, fold)

    qwen = open(os.path.join(CFG, "Qwen2.5-0.5B-Instruct", "chat_template.jinja")).read()
    tq = hf_tokenizer(CHAT_MODEL, config=chat_tokenizer_config(), template=qwen)
    tg = hf_tokenizer(CHAT_MODEL, config=chat_tokenizer_config(), template=CHATML_GENERIC)
    for cname, system, user, response in CASES:  # the generic template agrees with Qwen2.5
        if system:
            m = messages_for(False, system, user, response)
            assert ids_of(tq, m, response is None) == ids_of(tg, m, response is None), cname
    make("chatml", "chatml", CHAT_MODEL, "Qwen2.5-0.5B-Instruct (system) / generic ChatML (none)",
         lambda s: tq if s else tg, False)

    gemma = open(os.path.join(CFG, "gemma-2b-it", "chat_template.jinja")).read()
    tgm = hf_tokenizer(CHAT_MODEL, config=chat_tokenizer_config(), template=gemma)
    make("gemma", "gemma", CHAT_MODEL, "gemma-2b-it", lambda s: tgm, True)


if __name__ == "__main__":
    main()

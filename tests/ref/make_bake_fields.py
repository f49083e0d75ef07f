#!/usr/bin/env python3
"""make_bake_fields.py - writes tests/data/bake/tool-fields.txt: every field of the Python
tool's config classes (BakeryConfig, DataConfig, LoraConfig in bakery-py's
src/bakery/config.py, read with ast: no import of the tool) and of the installed HF
transformers' TrainingArguments, one "CLASS FIELD" a line.  t0700-bake.sh holds
bk-bake --fields against it.

  VENV/bin/python tests/ref/make_bake_fields.py ../shared/reference/bakery-py [OUT]
  python3 tests/ref/make_bake_fields.py ../shared/reference/bakery-py OUT TRAINING_ARGS_PY

Needs transformers (any 5.x), or, as the third argument, the training_args.py of a
transformers wheel, read with ast (no import).  The fixture is transformers 5.3.0's, the
version the tool's lock file pins:
  pip download transformers==5.3.0 --no-deps -d W && unzip W/*.whl transformers/training_args.py  The field names are
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


def training_args_ast(path):
    """(fields, version) of class TrainingArguments in a training_args.py, by ast; the
    version from the dist-info next to the transformers package when there is one."""
    tree = ast.parse(open(path).read())
    names = []
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "TrainingArguments":
            for st in node.body:
                if isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name):
                    init = True
                    if isinstance(st.value, ast.Call):
                        for kw in st.value.keywords:
                            if kw.arg == "init" and isinstance(kw.value, ast.Constant):
                                init = bool(kw.value.value)
                    if init:
                        names.append(st.target.id)
    root = os.path.dirname(os.path.dirname(os.path.abspath(path)))
    version = "?"
    for d in os.listdir(root):
        if d.startswith("transformers-") and d.endswith(".dist-info"):
            version = d[len("transformers-"):-len(".dist-info")]
    return names, version


def main():
    src = sys.argv[1]
    path = sys.argv[2] if len(sys.argv) > 2 else os.path.join(
        os.path.dirname(__file__), "..", "data", "bake", "tool-fields.txt")
    rows = tool_fields(src)
    if len(sys.argv) > 3:
        names, version = training_args_ast(sys.argv[3])
    else:
        import transformers
        from transformers import TrainingArguments
        names = [f.name for f in dataclasses.fields(TrainingArguments) if f.init]
        version = transformers.__version__
    rows += [("TrainingArguments", n) for n in names]
    with open(path, "w") as f:
        f.write("# The fields of the Python tool's config (bakery-py 8da2ae5, MIT: see LICENSE-bakery-py)\n")
        f.write("# and of HF TrainingArguments (transformers %s, Apache-2.0), by\n" % version)
        f.write("# tests/ref/make_bake_fields.py.  CLASS FIELD\n")
        for c, n in rows:
            f.write("%s %s\n" % (c, n))
    print("%s: %d fields" % (path, len(rows)))


if __name__ == "__main__":
    main()

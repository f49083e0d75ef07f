#!/usr/bin/env python3
# make_split_files_golden.py - which files the `datasets` library reads for each split
# of a repo, for tests/unit/test_hubdata.c:
#   tests/golden/hubdata/split_files.json   {"versions", "cases": [{"paths": [...],
#       "splits": {"train": [file, ...], ...}}]}  (files in datasets' order, repeats kept;
#       "splits" empty when datasets finds no data files)
#   and, for repos whose README.md has YAML front matter (a `configs:` section),
#       {"paths", "readme": TEXT, "config": NAME or null, "splits": {...}} or, when
#       datasets refuses the repo (or the config), {"paths", "readme", "config",
#       "error": "ExceptionType: first line of its message"}
# Each layout is made as empty files in a temporary directory.  Without a README it is
# resolved with datasets.data_files.get_data_patterns + DataFilesDict.from_patterns (the
# allowed extensions of load_dataset), as load_dataset(DIR) resolves a directory or a
# hub repo.  With one, datasets.load_dataset_builder(DIR, NAME) (offline: a local
# directory needs no network) gives the config load_dataset(DIR) / load_dataset(DIR,
# NAME) picks and its resolved data_files; the hub's loader (HubDatasetModuleFactory)
# reads the README's YAML and picks configs with the same code as the local one.
# Run from the repo root:
#   python3 -m venv /tmp/pqv && /tmp/pqv/bin/pip install datasets
#   HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 /tmp/pqv/bin/python tests/ref/make_split_files_golden.py
import json
import os
import tempfile

import datasets
from datasets.data_files import DataFilesDict, EmptyDatasetError, get_data_patterns
from datasets.load import _ALL_ALLOWED_EXTENSIONS

LAYOUTS = [
    # split directories win over split names in file names
    ["train/a.jsonl", "test/b.jsonl", "train_extra.jsonl"],
    # hidden and __ paths are left out
    ["train.jsonl", ".old/train.jsonl", "__pycache__/train.jsonl", "a/.train.jsonl"],
    # no split keyword: every file is train
    ["conversations.jsonl", "more/other.parquet", "LICENSE", "README.md", ".gitattributes"],
    # keyword synonyms
    ["train.jsonl", "dev.jsonl"],
    ["training.jsonl", "valid.jsonl", "testing.jsonl"],
    ["train.jsonl", "val.jsonl", "eval.jsonl"],
    ["data/train.jsonl", "data/evaluation.jsonl", "data/validation.parquet"],
    # file-name patterns in their order, repeats kept, separators
    ["b_train.jsonl", "train-train.jsonl", "train.jsonl", "training.jsonl", "a/train_1.jsonl",
     "trainer.jsonl", "retrain.jsonl", "my train 2.json", "x.csv"],
    # directory patterns: prefix, suffix, inside
    ["default/train/0000.parquet", "default/train/0001.parquet", "default/test/0000.parquet",
     "train-v2/a.jsonl", "my_train/b.jsonl", "x-train-y/c.jsonl", "trainer/d.jsonl",
     "train.jsonl"],
    ["default/train/0000.parquet", "default/test/0000.parquet", "train.jsonl",
     "my_train-extra.json", "trainer.jsonl", "data/validation.parquet", "train/notes.txt",
     "retrain.jsonl"],
    # sharded by split
    ["README.md", "data/train_sft-00001-of-00003-deadbeef.parquet",
     "data/train_sft-00000-of-00003-a1b2.parquet", "data/test_sft-00000-of-00001.parquet",
     "data/train_gen-00000-of-00003.parquet", ".gitattributes",
     "data/train_sft-00002-of-00003.parquet"],
    ["data/train-00000-of-00001.parquet", "data/validation-00000-of-00001.parquet",
     "data/b-00000-of-00001.jsonl", "data/a-00000-of-00002.json", "data/a-00001-of-00002.json",
     "train.jsonl"],
    # formats bakery does not read are still datasets' data files
    ["data/train.csv", "data/test.csv"],
    ["train.jsonl.gz", "train.jsonl", "train.TXT", "TRAIN.JSON"],
    # logs and harbor layouts come first
    ["train.jsonl", "run.eval"],
    ["train.jsonl", "x/task.toml"],
    # nothing datasets reads
    ["LICENSE", "README.md"],
]


# (readme, paths, config): README.md front matter with `configs:`
def card(yaml_text):
    return "---\n" + yaml_text + "---\n# a dataset\n"


CONFIG_FILES = ["data/a.jsonl", "data/b.jsonl", "data/c.csv", "data/sub/d.jsonl", "train.jsonl",
                "test.jsonl", "other/x.parquet", "other/y.parquet", ".hidden/h.jsonl",
                "__special/s.jsonl", "data/.dot.jsonl", "notes.md", "en/train.jsonl",
                "en/test.jsonl", "fr/train-0.jsonl", "fr/dev-0.jsonl"]
CONFIG_LAYOUTS = [
    # data_files: one string
    (card("configs:\n- config_name: default\n  data_files: data/*.jsonl\n"), CONFIG_FILES, None),
    # a list of strings (one split, train), repeats kept, '**' across directories
    (card("configs:\n- config_name: default\n  data_files:\n  - other/*.parquet\n"
          "  - data/**\n  - other/x.parquet\n"), CONFIG_FILES, None),
    # split/path entries: a string and a list of globs, in the README's split order
    # (the first config's files pick datasets' builder for all, and its splits must agree
    # on it: that is not modelled, so these put their split entries in a later config)
    (card("configs:\n- config_name: first\n  data_files: train.jsonl\n"
          "- config_name: default\n  data_files:\n  - split: test\n    path: test.jsonl\n"
          "  - split: train\n    path:\n    - \"data/[ab].jsonl\"\n    - \"other/?.parquet\"\n"
          "    - \"data/**/*.jsonl\"\n  - split: validation\n    path: nothing/*.jsonl\n"),
     CONFIG_FILES, None),
    # hidden and __ paths only when the pattern names them; README.md only by its name
    (card("configs:\n- config_name: first\n  data_files: train.jsonl\n"
          "- config_name: default\n  data_files:\n  - split: train\n    path: '**'\n"
          "  - split: hidden\n    path: [\".hidden/*\", \"data/.*\", \"__special/*\"]\n"
          "  - split: card\n    path: [README.md, \"*.md\"]\n"), CONFIG_FILES + ["README.md"], None),
    # several configs: the one named default wins when none says default: true
    (card("configs:\n- config_name: en\n  data_dir: en\n- config_name: default\n"
          "  data_files: train.jsonl\n- config_name: fr\n  data_dir: fr\n"), CONFIG_FILES, None),
    # ... and a named one (data_dir: default patterns inside it)
    (card("configs:\n- config_name: en\n  data_dir: en\n- config_name: default\n"
          "  data_files: train.jsonl\n- config_name: fr\n  data_dir: fr\n"), CONFIG_FILES, "fr"),
    (card("configs:\n- config_name: en\n  data_dir: en\n  data_files:\n  - split: train\n"
          "    path: \"*.jsonl\"\n- config_name: other\n  data_files: other/*\n"), CONFIG_FILES, "en"),
    # default: true (YAML 1.1 booleans: yes, True, on), one config alone
    (card("configs:\n- config_name: en\n  data_dir: en\n- config_name: fr\n  default: yes\n"
          "  data_dir: fr\n"), CONFIG_FILES, None),
    (card("configs:\n- config_name: en\n  default: false\n  data_dir: en\n- config_name: fr\n"
          "  default: 0\n  data_dir: fr\n- config_name: other\n  default: \"no\"\n"
          "  data_files: other/y.parquet\n"), CONFIG_FILES, None),
    (card("configs:\n- config_name: only\n  data_files:\n  - split: train\n    path: test.jsonl\n"),
     CONFIG_FILES, None),
    # a config with no data_files: datasets' default patterns
    (card("configs:\n- config_name: default\n"), CONFIG_FILES, None),
    (card("configs:\n- config_name: default\n  data_files: null\n"), CONFIG_FILES, None),
    # an empty configs list, and no front matter: the default patterns
    (card("configs: []\npretty_name: x\n"), CONFIG_FILES, None),
    ("# no front matter\nconfigs:\n- config_name: x\n  data_files: test.jsonl\n", CONFIG_FILES, None),
    ("---\n---\n", CONFIG_FILES, None),
    # CRLF line ends, a flow mapping, anchors and leading blank lines
    ("\r\n---\r\nconfigs:\r\n- {config_name: default, data_files: &t [test.jsonl]}\r\n---\r\nx\r\n",
     CONFIG_FILES, None),
    (card("x: &f other/x.parquet\nconfigs:\n- config_name: default\n  data_files:\n"
          "  - split: train\n    path: *f\n"), CONFIG_FILES, None),
    # the one dataset_info config names the default when no config does
    (card("dataset_info:\n  config_name: fr\n  features: []\nconfigs:\n- config_name: en\n"
          "  data_dir: en\n- config_name: fr\n  data_dir: fr\n"), CONFIG_FILES, None),
    # refused: several defaults, no default among several configs, an unknown config
    (card("configs:\n- config_name: default\n  data_dir: en\n- config_name: fr\n  default: true\n"
          "  data_dir: fr\n"), CONFIG_FILES, None),
    (card("configs:\n- config_name: en\n  data_dir: en\n- config_name: fr\n  data_dir: fr\n"),
     CONFIG_FILES, None),
    (card("configs:\n- config_name: en\n  data_dir: en\n"), CONFIG_FILES, "de"),
    # refused: malformed YAML, front matter that is no mapping, configs no list, a config
    # with no config_name, data_files a mapping, a number, a bad split name, a split twice,
    # a path that is not there, '**' inside a name, a mix of strings and split entries
    (card("configs:\n- config_name: default\n  data_files: [a.jsonl\n"), CONFIG_FILES, None),
    (card("- configs\n"), CONFIG_FILES, None),
    (card("configs:\n  config_name: default\n"), CONFIG_FILES, None),
    (card("configs:\n- data_files: train.jsonl\n"), CONFIG_FILES, None),
    (card("configs:\n- config_name: default\n  data_files:\n    train: train.jsonl\n"), CONFIG_FILES, None),
    (card("configs:\n- config_name: default\n  data_files: 12\n"), CONFIG_FILES, None),
    (card("configs:\n- config_name: default\n  data_files:\n  - split: my-split\n    path: train.jsonl\n"),
     CONFIG_FILES, None),
    (card("configs:\n- config_name: default\n  data_files:\n  - split: train\n    path: train.jsonl\n"
          "  - split: train\n    path: test.jsonl\n"), CONFIG_FILES, None),
    (card("configs:\n- config_name: default\n  data_files:\n  - split: train\n    path: train.jsonl\n"
          "  - split: test\n    path: missing.jsonl\n"), CONFIG_FILES, None),
    (card("configs:\n- config_name: default\n  data_files: \"data/a**.jsonl\"\n"), CONFIG_FILES, None),
    (card("configs:\n- config_name: default\n  data_files:\n  - train.jsonl\n  - split: test\n"
          "    path: test.jsonl\n"), CONFIG_FILES, None),
]


def resolve_card(readme, paths, name):
    with tempfile.TemporaryDirectory() as d:
        for p in paths:
            f = os.path.join(d, p)
            os.makedirs(os.path.dirname(f), exist_ok=True)
            open(f, "w").close()
        with open(os.path.join(d, "README.md"), "w", newline="") as f:
            f.write(readme)
        try:
            b = datasets.load_dataset_builder(d, name)
        except Exception as e:  # datasets refuses the repo or the config
            msg = str(e).strip().split("\n")[0].replace(d, "REPO")
            return {"error": "%s: %s" % (type(e).__name__, msg[:160])}
        return {"splits": {str(k): [os.path.relpath(f, d) for f in v]
                           for k, v in b.config.data_files.items()}}


def resolve(paths):
    with tempfile.TemporaryDirectory() as d:
        for p in paths:
            f = os.path.join(d, p)
            os.makedirs(os.path.dirname(f), exist_ok=True)
            open(f, "w").close()
        try:
            patterns = get_data_patterns(d)
        except EmptyDatasetError:
            return {}
        files = DataFilesDict.from_patterns(patterns, d, allowed_extensions=_ALL_ALLOWED_EXTENSIONS)
        return {str(k): [os.path.relpath(f, d) for f in v] for k, v in files.items()}


def main():
    cases = [{"paths": p, "splits": resolve(p)} for p in LAYOUTS]
    for readme, paths, name in CONFIG_LAYOUTS:
        c = {"paths": paths, "readme": readme, "config": name}
        c.update(resolve_card(readme, paths, name))
        cases.append(c)
    out = {"versions": {"datasets": datasets.__version__}, "cases": cases}
    with open("tests/golden/hubdata/split_files.json", "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
# make_split_files_golden.py - which files the `datasets` library reads for each split
# of a repo laid out without a README `configs:` section, for tests/unit/test_hubdata.c:
#   tests/golden/hubdata/split_files.json   {"versions", "cases": [{"paths": [...],
#       "splits": {"train": [file, ...], ...}}]}  (files in datasets' order, repeats kept;
#       "splits" empty when datasets finds no data files)
# Each layout is made as empty files in a temporary directory and resolved with
# datasets.data_files.get_data_patterns + DataFilesDict.from_patterns (the allowed
# extensions of load_dataset), as load_dataset(DIR) resolves a directory or a hub repo.
# Run from the repo root:
#   python3 -m venv /tmp/pqv && /tmp/pqv/bin/pip install datasets
#   /tmp/pqv/bin/python tests/ref/make_split_files_golden.py
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
    out = {"versions": {"datasets": datasets.__version__}, "cases": cases}
    with open("tests/golden/hubdata/split_files.json", "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()

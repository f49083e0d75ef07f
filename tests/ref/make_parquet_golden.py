#!/usr/bin/env python3
# make_parquet_golden.py - small parquet files written by pyarrow, as the HF hub stores
# datasets, and the rows pyarrow reads back from them as JSON Lines, for
# tests/unit/test_parquet.c (formats/parquet.c is judged against these):
#   tests/golden/parquet/NAME.parquet   the file
#   tests/golden/parquet/NAME.jsonl     one row per line: pyarrow's to_pylist(), json.dumps
#   tests/golden/parquet/versions.json  the pyarrow version that wrote them
# Cases: clean chat rows (the hub tests' stand-in dataset), an ultrachat-like messages list<struct<content, role>> column (snappy,
# dictionary, v1 pages, several row groups, null and empty lists, null fields), plain
# prompt/response strings (uncompressed, no dictionary, data page v2, many small pages),
# a dictionary that falls back to plain mid-chunk, scalar and nested types with zstd and
# gzip, and one column in an encoding the reader refuses (DELTA_BINARY_PACKED).
# Run from the repo root (deterministic: the same pyarrow writes the same bytes):
#   python3 -m venv /tmp/pqv && /tmp/pqv/bin/pip install pyarrow
#   /tmp/pqv/bin/python tests/ref/make_parquet_golden.py
import json
import os

import pyarrow as pa
import pyarrow.parquet as pq

OUT = "tests/golden/parquet"
MSG = pa.list_(pa.struct([("content", pa.string()), ("role", pa.string())]))


def ultrachat():
    rows = []
    for i in range(11):
        msgs = [
            {"content": f"question {i}: how do I boil an egg? \u00e9\u4f60\U0001F600", "role": "user"},
            {"content": f"answer {i}: put it in boiling water." + " more" * (i % 4), "role": "assistant"},
        ]
        if i % 3 == 1:
            msgs += [{"content": "and then?", "role": "user"}, {"content": "peel it.", "role": "assistant"}]
        if i == 4:
            msgs = []
        if i == 5:
            msgs = None
        if i == 6:
            msgs[1]["content"] = None
        if i == 7:
            msgs.insert(0, None)
        rows.append({"prompt": None if i == 8 else f"question {i}", "prompt_id": "%064x" % (i * 7919),
                     "messages": msgs})
    t = pa.Table.from_pylist(rows, schema=pa.schema([("prompt", pa.string()), ("prompt_id", pa.string()),
                                                     ("messages", MSG)]))
    return t, dict(compression="snappy", row_group_size=4)


def chat():
    """clean chat rows (every row gives pairs) for the hub tests' stand-in
    HuggingFaceH4/ultrachat_200k: tests/t0055-hub-dataset.sh serves it as its splits"""
    topics = ["eggs", "tea", "bread", "rain", "trees", "boats", "stars", "cats", "maps", "glass"]
    rows = []
    for i in range(30):
        t = topics[i % len(topics)]
        msgs = [{"content": f"Tell me one thing about {t} (question {i}).", "role": "user"},
                {"content": f"Here is one thing about {t}: it is number {i}.", "role": "assistant"}]
        if i % 4 == 0:
            msgs += [{"content": f"And another about {t}?", "role": "user"},
                     {"content": f"Another: {t} matter {i % 7} times.", "role": "assistant"}]
        rows.append({"prompt": msgs[0]["content"], "prompt_id": "%064x" % (i * 104729),
                     "messages": msgs})
    t = pa.Table.from_pylist(rows, schema=pa.schema([("prompt", pa.string()), ("prompt_id", pa.string()),
                                                     ("messages", MSG)]))
    return t, dict(compression="snappy", row_group_size=8)


def pairs():
    rows = []
    for i in range(40):
        rows.append({"prompt": f"prompt number {i} " + "x" * (i % 7),
                     "response": None if i % 9 == 3 else ("" if i % 11 == 5 else f"response {i}\nline two")})
    t = pa.Table.from_pylist(rows, schema=pa.schema([("prompt", pa.string()), ("response", pa.string())]))
    return t, dict(compression="none", use_dictionary=False, data_page_version="2.0",
                   write_batch_size=4, data_page_size=64, row_group_size=25)


def fallback():
    rows = [{"text": f"distinct string {i:04d} " + "y" * (i % 13), "label": ["a", "b", "c"][i % 3]}
            for i in range(300)]
    t = pa.Table.from_pylist(rows)
    return t, dict(compression="snappy", dictionary_pagesize_limit=512, write_batch_size=16,
                   data_page_size=256)


def types(codec, version):
    rows = []
    for i in range(9):
        rows.append({
            "i64": None if i == 2 else i * 1000000007 - 5,
            "i32": -i,
            "u32": 4000000000 + i,
            "f64": i / 3.0,
            "f32": i * 0.25,
            "flag": None if i == 4 else (i % 2 == 0),
            "ints": None if i == 1 else [j * i for j in range(i % 4)],
            "tags": [None, f"t{i}"] if i % 2 else [],
            "meta": None if i == 3 else {"source": f"s{i}", "score": i * 1.5, "inner": {"k": [i, i + 1]}},
            "nested": [[f"{i}.{j}.{k}" for k in range(j)] for j in range(i % 3)],
        })
    schema = pa.schema([("i64", pa.int64()), ("i32", pa.int32()), ("u32", pa.uint32()),
                        ("f64", pa.float64()), ("f32", pa.float32()), ("flag", pa.bool_()),
                        ("ints", pa.list_(pa.int64())), ("tags", pa.list_(pa.string())),
                        ("meta", pa.struct([("source", pa.string()), ("score", pa.float64()),
                                            ("inner", pa.struct([("k", pa.list_(pa.int32()))]))])),
                        ("nested", pa.list_(pa.list_(pa.string())))])
    t = pa.Table.from_pylist(rows, schema=schema)
    return t, dict(compression=codec, data_page_version=version, row_group_size=5)


def refused():
    t = pa.table({"prompt": [f"p{i}" for i in range(5)], "n": pa.array(range(5), pa.int64())})
    return t, dict(use_dictionary=False, column_encoding={"n": "DELTA_BINARY_PACKED", "prompt": "PLAIN"},
                   compression="none")


CASES = {
    "ultrachat": ultrachat,
    "chat": chat,
    "pairs": pairs,
    "fallback": fallback,
    "types-zstd": lambda: types("zstd", "2.0"),
    "types-gzip": lambda: types("gzip", "1.0"),
    "refused": refused,
}


def main():
    os.makedirs(OUT, exist_ok=True)
    for name, make in CASES.items():
        table, opts = make()
        path = f"{OUT}/{name}.parquet"
        pq.write_table(table, path, **opts)
        back = pq.read_table(path).to_pylist()
        with open(f"{OUT}/{name}.jsonl", "w", encoding="utf-8") as f:
            for row in back:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
        md = pq.ParquetFile(path).metadata
        print(f"{path}: {md.num_rows} rows, {md.num_row_groups} row groups, {os.path.getsize(path)} bytes")
    with open(f"{OUT}/versions.json", "w") as f:
        json.dump({"pyarrow": pa.__version__}, f)
        f.write("\n")


if __name__ == "__main__":
    main()

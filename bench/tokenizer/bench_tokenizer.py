#!/usr/bin/env python3
"""Single-threaded encode speed: deepinfer's tokenizer vs HF `tokenizers`, same corpus.

The corpus is tools/tokenizer/corpus.py's (seeded; the strings of the agreement fixture),
repeated --repeat times. Ours runs as build/.../bench/tokenizer/bench_tokenizer; HF is called
per string from Python (its per-call overhead is included; encode_batch with one thread is
reported too). Each side does a cold pass (empty word cache) and a warm pass.
Prints a table and appends JSON records to --out (JSONL).

Usage: bench_tokenizer.py --bench-bin BUILD/bench/tokenizer/bench_tokenizer [--tokenizer DIR]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"
root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(root, "tools", "tokenizer"))
from corpus import make_corpus  # noqa: E402

import tokenizers  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bench-bin", required=True)
    ap.add_argument("--tokenizer", default="/work/shared/data/tokenizers/deepseek-v3")
    ap.add_argument("--num-strings", type=int, default=10000)
    ap.add_argument("--out", default=None, help="append JSON records here")
    args = ap.parse_args()

    tok = tokenizers.Tokenizer.from_file(os.path.join(args.tokenizer, "tokenizer.json"))
    added = [t.content for t in tok.get_added_tokens_decoder().values()]
    named = [t for t in added if "place" not in t]
    texts = make_corpus(20240501, args.num_strings, named * 4 + added[:50])
    num_bytes = sum(len(t.encode("utf-8")) for t in texts)

    records = []
    hf = {"impl": "hf-tokenizers " + tokenizers.__version__, "num_strings": len(texts), "num_bytes": num_bytes}
    for name in ("cold", "warm"):
        start = time.perf_counter()
        num_tokens = sum(len(tok.encode(t, add_special_tokens=False).ids) for t in texts)
        s = time.perf_counter() - start
        hf[name] = {"seconds": s, "num_tokens": num_tokens, "mb_per_s": num_bytes / s / 1e6,
                    "tokens_per_s": num_tokens / s}
    start = time.perf_counter()
    num_tokens = sum(len(e.ids) for e in tok.encode_batch(texts, add_special_tokens=False))
    s = time.perf_counter() - start
    hf["batch_1_thread"] = {"seconds": s, "num_tokens": num_tokens, "mb_per_s": num_bytes / s / 1e6,
                            "tokens_per_s": num_tokens / s}
    records.append(hf)

    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False, encoding="utf-8") as f:
        for t in texts:
            f.write(json.dumps(t, ensure_ascii=False) + "\n")
        path = f.name
    try:
        out = subprocess.run([args.bench_bin, args.tokenizer, path], check=True, capture_output=True, text=True)
        records.append(json.loads(out.stdout))
    finally:
        os.unlink(path)

    print(f"corpus: {len(texts)} strings, {num_bytes / 1e6:.2f} MB, tokenizer {args.tokenizer}")
    for r in records:
        for name in ("cold", "warm", "batch_1_thread"):
            if name in r:
                x = r[name]
                print(f"{r['impl']:<28} {name:<15} {x['mb_per_s']:7.2f} MB/s {x['tokens_per_s'] / 1e6:7.3f} Mtok/s")
    if args.out:
        with open(args.out, "a", encoding="utf-8") as f:
            for r in records:
                f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()

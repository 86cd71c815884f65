#!/usr/bin/env python3
"""Peer benchmark on MaskBench: xgrammar and llguidance (PyPI) on the same schemas, the same
instances (serialized like bench/grammar/maskbench.cpp: compact JSON, key order kept) and the
same tokenizer as our grammar_maskbench. Prints one summary JSON object per engine:
schemas compiled, instances judged right, schemas passed (compiled and every instance right),
mask time avg/p50/p99 (one fill per token plus one at the end), compile time p50.

  python3 tools/grammar/peer_bench.py --engine xgrammar --stride 10
"""
import argparse
import json
import os
import statistics
import time

import numpy as np
from tokenizers import Tokenizer


def pct(v, q):
    if not v:
        return 0.0
    v = sorted(v)
    return v[min(len(v) - 1, int(q * len(v)))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--engine", choices=["xgrammar", "llguidance"], required=True)
    ap.add_argument("--maskbench", default="/work/shared/data/maskbench")
    ap.add_argument("--tokenizer", default="/work/shared/data/tokenizers/deepseek-v3")
    ap.add_argument("--stride", type=int, default=1)
    ap.add_argument("--limit", type=int, default=0)
    ap.add_argument("--jsonl", default="")
    args = ap.parse_args()

    tok_json = os.path.join(args.tokenizer, "tokenizer.json")
    hf = Tokenizer.from_file(tok_json)
    cfg = json.load(open(os.path.join(args.tokenizer, "tokenizer_config.json")))
    eos_text = cfg.get("eos_token")
    eos_text = eos_text["content"] if isinstance(eos_text, dict) else eos_text
    eos_id = hf.token_to_id(eos_text)
    vocab = hf.get_vocab(with_added_tokens=True)
    n_vocab = max(vocab.values()) + 1

    if args.engine == "xgrammar":
        import xgrammar as xgr
        import torch
        encoded = [""] * n_vocab
        for s, i in vocab.items():
            encoded[i] = s
        info = xgr.TokenizerInfo(encoded, xgr.VocabType.BYTE_LEVEL, vocab_size=n_vocab, stop_token_ids=[eos_id])
        compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
        bitmask = xgr.allocate_token_bitmask(1, n_vocab)

        def compile_schema(schema):
            return compiler.compile_json_schema(json.dumps(schema), any_whitespace=True, strict_mode=False)

        def run(compiled, ids, times):
            m = xgr.GrammarMatcher(compiled)
            for i in ids:
                t = time.perf_counter()
                m.fill_next_token_bitmask(bitmask)
                times.append((time.perf_counter() - t) * 1e6)
                if not m.accept_token(i):
                    return False
            t = time.perf_counter()
            m.fill_next_token_bitmask(bitmask)
            times.append((time.perf_counter() - t) * 1e6)
            return m.accept_token(eos_id)
    else:
        import llguidance
        import llguidance.numpy as lln
        from llguidance import LLMatcher
        lltok = llguidance.LLTokenizer(tok_json)
        bitmask = lln.allocate_token_bitmask(1, lltok.vocab_size)

        def compile_schema(schema):
            g = LLMatcher.grammar_from_json_schema(schema, defaults={"whitespace_flexible": True})
            m = LLMatcher(lltok, g)
            if m.is_error():
                raise RuntimeError(m.get_error())
            return g

        def run(compiled, ids, times):
            m = LLMatcher(lltok, compiled)
            for i in ids:
                t = time.perf_counter()
                lln.fill_next_token_bitmask(m, bitmask, 0)
                times.append((time.perf_counter() - t) * 1e6)
                if not m.consume_token(i) or m.is_error():
                    return False
            t = time.perf_counter()
            lln.fill_next_token_bitmask(m, bitmask, 0)
            times.append((time.perf_counter() - t) * 1e6)
            return m.is_accepting()

    files = sorted(f for f in os.listdir(args.maskbench) if f.endswith(".json"))[:: args.stride]
    if args.limit:
        files = files[: args.limit]
    out = open(args.jsonl, "w") if args.jsonl else None
    mask_us, compile_us = [], []
    n_compiled = n_passed = n_inst = n_right = 0
    for f in files:
        doc = json.load(open(os.path.join(args.maskbench, f)))
        rec = {"file": f}
        t = time.perf_counter()
        try:
            compiled = compile_schema(doc["schema"])
        except Exception as e:  # noqa: BLE001 - any refusal counts as not handled
            rec["refused"] = str(e)[:300]
            if out:
                out.write(json.dumps(rec) + "\n")
            continue
        compile_us.append((time.perf_counter() - t) * 1e6)
        n_compiled += 1
        all_right = True
        for test in doc["tests"]:
            text = json.dumps(test["data"], ensure_ascii=False, separators=(",", ":"))
            ids = hf.encode(text, add_special_tokens=False).ids
            try:
                verdict = run(compiled, ids, mask_us)
            except Exception:  # noqa: BLE001
                verdict = False
            n_inst += 1
            right = verdict == test["valid"]
            n_right += right
            all_right &= right
        n_passed += all_right
        if out:
            out.write(json.dumps(rec) + "\n")
    summary = {
        "engine": args.engine,
        "schemas": len(files),
        "compiled": n_compiled,
        "passed": n_passed,
        "instances": n_inst,
        "instances_right": n_right,
        "mask_us_avg": statistics.fmean(mask_us) if mask_us else 0,
        "mask_us_p50": pct(mask_us, 0.5),
        "mask_us_p99": pct(mask_us, 0.99),
        "num_masks": len(mask_us),
        "compile_us_p50": pct(compile_us, 0.5),
        "compile_us_p90": pct(compile_us, 0.9),
    }
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Peer benchmark on MaskBench: xgrammar and llguidance (PyPI) on the same schemas, the same
instances (serialized like bench/grammar/maskbench.cpp: compact JSON, key order kept) and the
same tokenizer as our grammar_maskbench. Prints one summary JSON object per engine:
schemas compiled, instances judged right, schemas passed (compiled and every instance right),
mask time avg/p50/p99 (one fill per token plus one at the end), compile time p50.

Each schema runs in a worker process under a wall-clock limit (--schema-timeout-s, compile
plus all its instances): a schema that blows up is killed and counted as not handled, and a
fresh worker takes the next one. Everything runs single-threaded (the engines' thread
options, OMP/MKL/torch threads = 1).

  python3 tools/grammar/peer_bench.py --engine xgrammar --stride 30 --schema-timeout-s 60
"""
import argparse
import json
import multiprocessing as mp
import os
import statistics
import time

for _v in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "RAYON_NUM_THREADS"):
    os.environ[_v] = "1"


def pct(v, q):
    if not v:
        return 0.0
    v = sorted(v)
    return v[min(len(v) - 1, int(q * len(v)))]


def make_engine(name, tokenizer_dir):
    """Returns (compile_schema(schema) -> compiled, run(compiled, ids, times) -> verdict, hf)."""
    from tokenizers import Tokenizer

    tok_json = os.path.join(tokenizer_dir, "tokenizer.json")
    hf = Tokenizer.from_file(tok_json)
    cfg = json.load(open(os.path.join(tokenizer_dir, "tokenizer_config.json")))
    eos_text = cfg.get("eos_token")
    eos_text = eos_text["content"] if isinstance(eos_text, dict) else eos_text
    eos_id = hf.token_to_id(eos_text)
    vocab = hf.get_vocab(with_added_tokens=True)
    n_vocab = max(vocab.values()) + 1

    if name == "xgrammar":
        import torch
        import xgrammar as xgr

        torch.set_num_threads(1)
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

        return compile_schema, run, hf

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

    return compile_schema, run, hf


def worker(engine, tokenizer_dir, conn):
    """Serves one schema file per message: replies {compile_us | refused, mask_us, verdicts}."""
    compile_schema, run, hf = make_engine(engine, tokenizer_dir)
    conn.send({"ready": True})
    while True:
        path = conn.recv()
        if path is None:
            return
        doc = json.load(open(path))
        rec = {}
        t = time.perf_counter()
        try:
            compiled = compile_schema(doc["schema"])
        except Exception as e:  # noqa: BLE001 - any refusal counts as not handled
            rec["refused"] = str(e)[:300]
            conn.send(rec)
            continue
        rec["compile_us"] = (time.perf_counter() - t) * 1e6
        mask_us, verdicts = [], []
        for test in doc["tests"]:
            text = json.dumps(test["data"], ensure_ascii=False, separators=(",", ":"))
            ids = hf.encode(text, add_special_tokens=False).ids
            try:
                verdict = run(compiled, ids, mask_us)
            except Exception:  # noqa: BLE001
                verdict = False
            verdicts.append([bool(verdict), bool(test["valid"])])
        rec["mask_us"] = mask_us
        rec["verdicts"] = verdicts
        conn.send(rec)


class Worker:
    def __init__(self, engine, tokenizer_dir, startup_timeout_s=600):
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=worker, args=(engine, tokenizer_dir, child), daemon=True)
        self.proc.start()
        if not self.conn.poll(startup_timeout_s):
            self.kill()
            raise RuntimeError(f"{engine}: worker did not start within {startup_timeout_s} s")
        self.conn.recv()

    def ask(self, path, timeout_s):
        self.conn.send(path)
        if not self.conn.poll(timeout_s):
            return None
        return self.conn.recv()

    def kill(self):
        self.proc.kill()
        self.proc.join()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--engine", choices=["xgrammar", "llguidance"], required=True)
    ap.add_argument("--maskbench", default="/work/shared/data/maskbench")
    ap.add_argument("--tokenizer", default="/work/shared/data/tokenizers/deepseek-v3")
    ap.add_argument("--stride", type=int, default=1)
    ap.add_argument("--limit", type=int, default=0)
    ap.add_argument("--schema-timeout-s", type=float, default=60.0,
                    help="wall-clock limit per schema (compile + its instances); past it: not handled")
    ap.add_argument("--jsonl", default="", help="per-schema records (file, compile_us or refused/timeout, right)")
    args = ap.parse_args()

    files = sorted(f for f in os.listdir(args.maskbench) if f.endswith(".json"))[:: args.stride]
    if args.limit:
        files = files[: args.limit]
    out = open(args.jsonl, "w") if args.jsonl else None
    mask_us, compile_us = [], []
    n_compiled = n_passed = n_inst = n_right = n_timeout = 0
    t_start = time.time()
    load_start = os.getloadavg()
    w = Worker(args.engine, args.tokenizer)
    for f in files:
        rec = w.ask(os.path.join(args.maskbench, f), args.schema_timeout_s)
        if rec is None:
            w.kill()
            n_timeout += 1
            rec = {"timeout_s": args.schema_timeout_s}
            w = Worker(args.engine, args.tokenizer)
        row = {"file": f}
        if "compile_us" in rec:
            n_compiled += 1
            compile_us.append(rec["compile_us"])
            mask_us.extend(rec["mask_us"])
            right = [v == want for v, want in rec["verdicts"]]
            n_inst += len(right)
            n_right += sum(right)
            n_passed += all(right)
            row.update(compile_us=rec["compile_us"], instances=len(right), right=sum(right))
        else:
            row.update({k: v for k, v in rec.items() if k in ("refused", "timeout_s")})
        if out:
            out.write(json.dumps(row) + "\n")
            out.flush()
    w.conn.send(None)
    w.proc.join(5)
    summary = {
        "engine": args.engine,
        "schemas": len(files),
        "compiled": n_compiled,
        "timeouts": n_timeout,
        "passed": n_passed,
        "instances": n_inst,
        "instances_right": n_right,
        "mask_us_avg": statistics.fmean(mask_us) if mask_us else 0,
        "mask_us_p50": pct(mask_us, 0.5),
        "mask_us_p99": pct(mask_us, 0.99),
        "num_masks": len(mask_us),
        "compile_us_p50": pct(compile_us, 0.5),
        "compile_us_p90": pct(compile_us, 0.9),
        "wall_s": time.time() - t_start,
        "loadavg_start": load_start,
        "loadavg_end": os.getloadavg(),
    }
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""llama-batched-bench records -> Pareto records beside ours, for bench/plot_pareto.py.

  python3 bench/llamacpp_pareto.py llamacpp_sweep.jsonl ours_sweep.jsonl > llamacpp_pareto.jsonl

llamacpp_sweep.jsonl: llama-batched-bench `--output-format jsonl` lines, each with a "kind" field
("prefill" or "decode"; "warmup" records are skipped) that the calling script adds (bench/cuda/vs_llamacpp_cuda.sh does). A
prefill record of `-npp P -npl B` becomes a point at batch B: time per prefill t_pp (the B prompts
of P tokens, no shared prefix), input tokens/s speed_pp. A decode record of `-npp P -ntg G -npl B`
becomes output tokens/s speed_tg (B x G tokens over t_tg) and tokens/s per request speed_tg / B.

The configuration fields plot_pareto.py refuses to mix (model, dtype, backend, draft length,
parallel layout, prompt and generation length) are copied from our record of the same kind and
prompt length, so a llama.cpp point lands on our plot only when it measured the same thing: a
llama.cpp record with no such record of ours, or whose generation length differs from ours, is an
error naming it. Our curve name is reused (engine "llama.cpp" tells the curves apart).
"""
import json
import sys


def main():
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    peer_path, ours_path = sys.argv[1:]
    ours = {}
    with open(ours_path) as f:
        for line in f:
            if not line.startswith("{"):
                continue
            r = json.loads(line)
            if r.get("kind") in ("prefill", "decode") and "curve" in r:
                ours.setdefault((r["kind"], r["prompt_len"]), r)
    n = 0
    with open(peer_path) as f:
        for lineno, line in enumerate(f, 1):
            if not line.startswith("{"):
                continue
            p = json.loads(line)
            kind = p.get("kind")
            if kind == "warmup":  # a configuration run only to pay the process's one-time set-up
                continue
            if kind not in ("prefill", "decode"):
                raise SystemExit(f"{peer_path} line {lineno}: no kind (prefill|decode) on the record")
            ref = ours.get((kind, p["pp"]))
            if ref is None:
                raise SystemExit(f"{peer_path} line {lineno}: no {kind} record of ours at prompt "
                                 f"length {p['pp']} in {ours_path}: nothing to compare with")
            rec = {k: ref[k] for k in ("model", "dtype", "backend", "num_speculative_tokens", "parallel",
                                       "prompt_len", "curve", "kind") if k in ref}
            rec.update(engine="llama.cpp", batch=p["pl"], raw=p)
            if kind == "prefill":
                rec.update(time_per_prefill_s=p["t_pp"], input_tokens_per_s=p["speed_pp"],
                           tokens=p["pl"] * p["pp"], elapsed_s=p["t_pp"], steps=1)
            else:
                if ref.get("gen_len") != p["tg"]:
                    raise SystemExit(f"{peer_path} line {lineno}: llama.cpp generated {p['tg']} tokens, "
                                     f"our records {ref.get('gen_len')}: not the same measurement")
                rec.update(gen_len=p["tg"], tokens_per_s=p["speed_tg"],
                           per_user_tokens_per_s=p["speed_tg"] / p["pl"], tokens=p["pl"] * p["tg"],
                           elapsed_s=p["t_tg"], steps=p["tg"])
            print(json.dumps(rec, sort_keys=True))
            n += 1
    print(f"llamacpp_pareto: {n} records", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

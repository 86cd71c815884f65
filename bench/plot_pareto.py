#!/usr/bin/env python3
"""Pareto plots from `deepinfer bench --sweep` records (and a peer's records in the same format).

  python3 bench/plot_pareto.py ours.jsonl [peer.jsonl ...] --out-dir plots/

Prefill: non-cached input tokens/s (y) against time per prefill (x), one point per batch.
Decode: output tokens/s of the batch (y) against tokens/s per request (x), one point per batch.
A curve is the records with the same (engine, curve) -- `curve` is the name bench gives each
prefill length / decode context, prefixed by --tag. One PNG per configuration: the records of a
plot must agree on the fields in KEY_FIELDS (model, dtype, context, draft length, parallel layout,
backend); a curve whose records disagree, or --curves naming curves of different configurations,
is refused (exit 2) naming the field. Beside each PNG a .json lists the plotted points with the
records' raw quantities, so every figure can be recomputed.

A peer's record needs: engine (e.g. "llama.cpp"), kind, curve, batch, prompt_len, model, dtype,
backend, num_speculative_tokens, parallel, and time_per_prefill_s + input_tokens_per_s (prefill)
or tokens_per_s + per_user_tokens_per_s (decode).
"""
import argparse
import json
import os
import re
import sys

# Fields a plot must not mix (context is prompt_len, plus gen_len for decode).
KEY_FIELDS = ("kind", "model", "dtype", "backend", "num_speculative_tokens", "parallel", "prompt_len")
DECODE_KEY_FIELDS = KEY_FIELDS + ("gen_len",)
AXES = {
    "prefill": ("time_per_prefill_s", "input_tokens_per_s", "time per prefill (s)", "input tokens/s (non-cached)"),
    "decode": ("per_user_tokens_per_s", "tokens_per_s", "tokens/s per request", "output tokens/s"),
}


class Refused(Exception):
    pass


def key_fields(kind):
    return DECODE_KEY_FIELDS if kind == "decode" else KEY_FIELDS


def load(paths):
    recs = []
    for path in paths:
        with open(path) as f:
            for n, line in enumerate(f, 1):
                line = line.strip()
                if not line:
                    continue
                try:
                    r = json.loads(line)
                except json.JSONDecodeError as e:
                    raise Refused(f"{path} line {n}: not JSON ({e})")
                if r.get("kind") not in AXES or "curve" not in r:
                    continue  # throughput records, or records made before --sweep existed
                r.setdefault("engine", "deepinfer")
                r.setdefault("parallel", "single-device")
                missing = [k for k in key_fields(r["kind"]) + AXES[r["kind"]][:2] + ("batch",) if k not in r]
                if missing:
                    raise Refused(f"{path} line {n}: record lacks {', '.join(missing)}")
                recs.append(r)
    return recs


def config_of(r):
    return tuple((k, json.dumps(r[k], sort_keys=True)) for k in key_fields(r["kind"]))


def group(recs, curves=None):
    """{config: {(engine, curve): [records]}}; raises Refused when a curve or a requested set mixes configs."""
    by_curve = {}
    for r in recs:
        by_curve.setdefault((r["engine"], r["curve"], r["kind"]), []).append(r)
    for (engine, curve, _), rs in by_curve.items():
        for k in key_fields(rs[0]["kind"]):
            values = sorted({json.dumps(x[k], sort_keys=True) for x in rs})
            if len(values) > 1:
                raise Refused(f"curve '{curve}' of {engine} mixes records with different {k}: {', '.join(values)}")
    if curves:
        chosen = {c: rs for c, rs in by_curve.items() if c[1] in curves}
        unknown = set(curves) - {c[1] for c in chosen}
        if unknown:
            raise Refused(f"no records for curve(s) {', '.join(sorted(unknown))}")
        configs = {config_of(rs[0]) for rs in chosen.values()}
        if len(configs) > 1:
            a, b = sorted(configs)[:2]
            diff = [k for (k, va), (_, vb) in zip(a, b) if va != vb]
            raise Refused(f"--curves mixes configurations: they differ in {', '.join(diff)}")
        by_curve = chosen
    plots = {}
    for c, rs in by_curve.items():
        plots.setdefault(config_of(rs[0]), {})[c[:2]] = sorted(rs, key=lambda x: x["batch"])
    return plots


def plot_name(config):
    d = dict(config)
    parts = [json.loads(d["kind"]), "ctx" + str(json.loads(d["prompt_len"])), json.loads(d["dtype"]),
             json.loads(d["backend"]), "k" + str(json.loads(d["num_speculative_tokens"]))]
    return re.sub(r"[^A-Za-z0-9_.=-]+", "_", "-".join(parts))


def write_plots(plots, out_dir):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(out_dir, exist_ok=True)
    written = []
    for config, curves in sorted(plots.items()):
        kind = json.loads(dict(config)["kind"])
        xk, yk, xl, yl = AXES[kind]
        fig, ax = plt.subplots(figsize=(6.4, 4.4))
        points = []
        for (engine, curve), rs in sorted(curves.items()):
            xs, ys = [r[xk] for r in rs], [r[yk] for r in rs]
            ax.plot(xs, ys, marker="o" if engine == "deepinfer" else "s", label=f"{engine}: {curve}")
            for r, x, y in zip(rs, xs, ys):
                ax.annotate(str(r["batch"]), (x, y), textcoords="offset points", xytext=(3, 3), fontsize=7)
                points.append({"engine": engine, "curve": curve, "batch": r["batch"], xk: x, yk: y,
                               "steps": r.get("steps"), "tokens": r.get("tokens"), "elapsed_s": r.get("elapsed_s")})
        if kind == "prefill":
            ax.set_xscale("log")
        ax.set_xlabel(xl)
        ax.set_ylabel(yl)
        d = {k: json.loads(v) for k, v in config}
        m = str(d["model"])
        m = os.path.basename(m)[:-len(".config.json")] if m.endswith(".config.json") else (
            os.path.basename(os.path.dirname(m)) if m.endswith(".json") else os.path.basename(m.rstrip("/")))
        ax.set_title(f"{kind}: {m} {d['dtype']}, {d['backend']}, "
                     f"context {d['prompt_len']}, k={d['num_speculative_tokens']}, {d['parallel']}", fontsize=9)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
        name = plot_name(config)
        png = os.path.join(out_dir, name + ".png")
        fig.tight_layout()
        fig.savefig(png, dpi=110)
        plt.close(fig)
        with open(os.path.join(out_dir, name + ".json"), "w") as f:
            json.dump({"config": d, "x": xk, "y": yk, "points": points}, f, indent=1)
        written.append(png)
    return written


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("records", nargs="+", help="JSONL files of bench records (ours and peers')")
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("--curves", help="comma list: plot only these curves (all must share one configuration)")
    args = ap.parse_args()
    try:
        plots = group(load(args.records), args.curves.split(",") if args.curves else None)
        if not plots:
            raise Refused("no prefill/decode records with a curve (run `deepinfer bench --sweep`)")
        for png in write_plots(plots, args.out_dir):
            print(png)
    except Refused as e:
        print(f"plot_pareto: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

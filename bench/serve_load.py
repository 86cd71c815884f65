#!/usr/bin/env python3
"""Load generator for `deepinfer serve` (vLLM benchmark_serving's method) over loopback.

Streams /v1/completions requests with either Poisson arrivals (--rate R req/s) or a fixed number in
flight (--concurrency C), for --duration seconds or --num-requests requests, and reports
TTFT, inter-token latency (ITL), end-to-end latency (p50/p99), output tokens/s and lost requests
(any request not answered with [DONE] and its max_tokens of output) as one JSON line, with the
client's own CPU and the server's engine counters (deepinfer:engine_*) over the timed part.
An untimed round of 1-token requests opens the connections first; --processes splits the load
over several client processes (one asyncio process cannot keep up with a few hundred streams).

  python3 bench/serve_load.py --url http://127.0.0.1:8000 --concurrency 256 --duration 60 \
      --prompt-len 32 --max-tokens 32
"""
import argparse
import asyncio
import json
import multiprocessing
import os
import random
import sys
import time

import httpx


def pct(values, q):
    if not values:
        return None
    v = sorted(values)
    return v[min(len(v) - 1, int(round(q / 100.0 * (len(v) - 1))))]


async def one_request(client, url, model, prompt_ids, max_tokens, stats):
    t0 = time.monotonic()
    first = None
    last = None
    tokens = 0
    done = False
    try:
        async with client.stream("POST", url + "/v1/completions",
                                 json={"model": model, "prompt": prompt_ids, "max_tokens": max_tokens,
                                       "ignore_eos": True, "temperature": 0, "stream": True,
                                       "stream_options": {"include_usage": True}}) as r:
            if r.status_code != 200:
                stats["errors"].append(r.status_code)
                return
            # Raw bytes split into SSE events here: httpx's aiter_lines costs several times more
            # CPU per chunk, and at a few hundred streams the client then lags the server.
            buf = b""
            async for data in r.aiter_raw():
                buf += data
                *events, buf = buf.split(b"\n\n")
                now = time.monotonic()
                for event in events:
                    if not event.startswith(b"data: "):
                        continue
                    payload = event[6:]
                    if payload == b"[DONE]":
                        done = True
                        break
                    try:
                        chunk = json.loads(payload)
                    except json.JSONDecodeError:
                        stats["bad_lines"].append(payload[:200].decode(errors="replace"))  # kept for the report
                        raise
                    if chunk.get("usage"):
                        tokens = chunk["usage"]["completion_tokens"]
                    if chunk["choices"] and chunk["choices"][0]["text"]:
                        if first is None:
                            first = now
                        else:
                            stats["itl"].append(now - last)
                        last = now
                if done:
                    break
    except Exception as e:  # noqa: BLE001 -- counted as lost
        stats["errors"].append(type(e).__name__)
        return
    if not done or tokens != max_tokens:
        stats["lost"] += 1
        return
    stats["ttft"].append(first - t0 if first else time.monotonic() - t0)
    stats["e2e"].append(time.monotonic() - t0)
    stats["tokens"] += tokens


def engine_counters(url):
    """The server's deepinfer:engine_* counters (its engine thread's steps and time) from /metrics."""
    out = {}
    try:
        text = httpx.get(url + "/metrics", timeout=30.0).text
    except httpx.HTTPError:
        return out
    for line in text.splitlines():
        if not line.startswith("deepinfer:engine_"):
            continue
        name, value = line.rsplit(" ", 1)
        out[name] = float(value)
    return out


async def run_worker(args, concurrency, num_requests, seed, warm):
    """One client process's share: `concurrency` in flight (or its share of the Poisson rate).
    `warm()` runs (blocking) after the warm-up round, before the timed part."""
    rng = random.Random(seed)
    limits = httpx.Limits(max_connections=max(concurrency, 1) + 16, max_keepalive_connections=None)
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0), limits=limits) as client:
        model = (await client.get(args.url + "/v1/models")).json()["data"][0]["id"]
        stats = {"ttft": [], "itl": [], "e2e": [], "tokens": 0, "lost": 0, "errors": [], "bad_lines": []}

        def prompt(n):
            return [rng.randrange(10, 8000) for _ in range(n)]

        if args.warmup:  # opens the connections (and warms the server) before the timed part
            scratch = {"ttft": [], "itl": [], "e2e": [], "tokens": 0, "lost": 0, "errors": [], "bad_lines": []}
            await asyncio.gather(*[one_request(client, args.url, model, prompt(4), 1, scratch)
                                   for _ in range(max(concurrency, 1))])
        warm()
        cpu0 = time.process_time()
        start = time.monotonic()
        deadline = start + args.duration
        sent = 0

        def more():
            return time.monotonic() < deadline and (num_requests == 0 or sent < num_requests)

        tasks = set()
        if args.rate > 0:
            while more():
                tasks.add(asyncio.create_task(one_request(client, args.url, model, prompt(args.prompt_len),
                                                          args.max_tokens, stats)))
                sent += 1
                await asyncio.sleep(rng.expovariate(args.rate / args.processes))
        else:
            while more():
                while len(tasks) < concurrency and more():
                    tasks.add(asyncio.create_task(one_request(client, args.url, model, prompt(args.prompt_len),
                                                              args.max_tokens, stats)))
                    sent += 1
                done, tasks = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        if tasks:
            await asyncio.wait(tasks)
        stats.update(sent=sent, start=start, end=time.monotonic(), cpu_s=time.process_time() - cpu0)
        return stats


def worker_main(args, concurrency, num_requests, seed, warmed, go, queue):
    def warm():
        warmed.wait()
        go.wait()
    try:
        queue.put(asyncio.run(run_worker(args, concurrency, num_requests, seed, warm)))
    except BaseException as e:  # the parent must not wait forever
        warmed.abort()
        go.abort()
        queue.put(e)
        raise


def run(args):
    before = {}

    def scrape_before():  # after the warm-up: the counters cover the timed part only
        before.update(engine_counters(args.url))

    if args.processes == 1:
        parts = [asyncio.run(run_worker(args, args.concurrency, args.num_requests, args.seed, scrape_before))]
    else:  # several client processes (one asyncio client saturates a core at a few hundred streams)
        ctx = multiprocessing.get_context("fork")
        warmed, go, queue = ctx.Barrier(args.processes + 1), ctx.Barrier(args.processes + 1), ctx.Queue()
        procs = []
        for i in range(args.processes):
            def share(total):
                return total // args.processes + (1 if i < total % args.processes else 0)
            procs.append(ctx.Process(target=worker_main, args=(args, share(args.concurrency),
                                                               share(args.num_requests) if args.num_requests else 0,
                                                               args.seed + i, warmed, go, queue)))
        for pr in procs:
            pr.start()
        warmed.wait()
        scrape_before()
        go.wait()
        parts = [queue.get() for _ in procs]
        failed = [p for p in parts if isinstance(p, BaseException)]
        if failed:
            raise RuntimeError(f"a client process failed: {failed[0]!r}")
        for pr in procs:
            pr.join()
    after = engine_counters(args.url)
    stats = {k: [x for p in parts for x in p[k]] for k in ("ttft", "itl", "e2e", "errors", "bad_lines")}
    tokens = sum(p["tokens"] for p in parts)
    wall = max(p["end"] for p in parts) - min(p["start"] for p in parts)
    answered = len(stats["e2e"])
    delta = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}

    def counter(name):
        return delta.get(name, 0.0)

    steps = counter('deepinfer:engine_steps_total{kind="prefill"}') + counter('deepinfer:engine_steps_total{kind="decode"}')
    return {
        "mode": f"rate={args.rate}" if args.rate > 0 else f"concurrency={args.concurrency}",
        "processes": args.processes,
        "prompt_len": args.prompt_len, "max_tokens": args.max_tokens, "sent": sum(p["sent"] for p in parts),
        "answered": answered, "lost": sum(p["lost"] for p in parts), "errors": len(stats["errors"]),
        "error_kinds": sorted(set(map(str, stats["errors"]))), "bad_lines": stats["bad_lines"][:3],
        "wall_s": round(wall, 2), "output_tok_per_s": round(tokens / wall, 1),
        # The client's own CPU (seconds, and per client process the share of its wall): near 1 the
        # client, not the server, sets the pace.
        "client_cpu_s": round(sum(p["cpu_s"] for p in parts), 2),
        "client_cpu_frac": round(max(p["cpu_s"] / max(p["end"] - p["start"], 1e-9) for p in parts), 3),
        "ttft_p50_ms": round(1e3 * (pct(stats["ttft"], 50) or 0), 1),
        "ttft_p99_ms": round(1e3 * (pct(stats["ttft"], 99) or 0), 1),
        "itl_p50_ms": round(1e3 * (pct(stats["itl"], 50) or 0), 2),
        "itl_p99_ms": round(1e3 * (pct(stats["itl"], 99) or 0), 2),
        "e2e_p50_s": round(pct(stats["e2e"], 50) or 0, 3), "e2e_p99_s": round(pct(stats["e2e"], 99) or 0, 3),
        # The server's engine thread over the run (deltas of its deepinfer:engine_* counters).
        "engine_steps": int(steps),
        "engine_prefill_steps": int(counter('deepinfer:engine_steps_total{kind="prefill"}')),
        "engine_mean_batch": round(counter("deepinfer:engine_step_seqs_total") / steps, 2) if steps else 0.0,
        "engine_step_s": round(counter('deepinfer:engine_thread_seconds_total{state="step"}'), 3),
        "engine_output_s": round(counter('deepinfer:engine_thread_seconds_total{state="output"}'), 3),
        "engine_task_s": round(counter('deepinfer:engine_thread_seconds_total{state="task"}'), 3),
        "engine_idle_s": round(counter('deepinfer:engine_thread_seconds_total{state="idle"}'), 3),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--rate", type=float, default=0.0, help="Poisson arrivals per second (0: fixed concurrency)")
    ap.add_argument("--duration", type=float, default=30.0, help="seconds of sending")
    ap.add_argument("--num-requests", type=int, default=0, help="stop sending after this many (0: by duration)")
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--processes", type=int, default=0,
                    help="client processes sharing --concurrency, --num-requests and --rate (0: one per 16 "
                         "streams, at most 4 and half the cores; one process held 256 streams 11%% below the "
                         "server's pace on the H200 host, 64 streams 5%%)")
    ap.add_argument("--no-warmup", dest="warmup", action="store_false",
                    help="skip the untimed round of 1-token requests that opens the connections first")
    args = ap.parse_args()
    if args.processes <= 0:
        args.processes = max(1, min(4, (os.cpu_count() or 2) // 2, -(-args.concurrency // 16)))
    result = run(args)
    print(json.dumps(result))
    return 0 if result["lost"] == 0 and result["errors"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())

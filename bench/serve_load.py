#!/usr/bin/env python3
"""Load generator for `deepinfer serve` (vLLM benchmark_serving's method) over loopback.

Streams /v1/completions requests with either Poisson arrivals (--rate R req/s) or a fixed number in
flight (--concurrency C), for --duration seconds or --num-requests requests, and reports
TTFT, inter-token latency (ITL), end-to-end latency (p50/p99), output tokens/s and lost requests
(any request not answered with [DONE] and its max_tokens of output) as one JSON line.

  python3 bench/serve_load.py --url http://127.0.0.1:8000 --concurrency 256 --duration 60 \
      --prompt-len 32 --max-tokens 32
"""
import argparse
import asyncio
import json
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
    t0 = time.perf_counter()
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
            async for line in r.aiter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[6:]
                if data == "[DONE]":
                    done = True
                    break
                try:
                    chunk = json.loads(data)
                except json.JSONDecodeError:
                    stats["bad_lines"].append(data[:200])  # kept for the report
                    raise
                if chunk.get("usage"):
                    tokens = chunk["usage"]["completion_tokens"]
                if chunk["choices"] and chunk["choices"][0]["text"]:
                    now = time.perf_counter()
                    if first is None:
                        first = now
                    else:
                        stats["itl"].append(now - last)
                    last = now
    except Exception as e:  # noqa: BLE001 -- counted as lost
        stats["errors"].append(type(e).__name__)
        return
    if not done or tokens != max_tokens:
        stats["lost"] += 1
        return
    stats["ttft"].append(first - t0 if first else time.perf_counter() - t0)
    stats["e2e"].append(time.perf_counter() - t0)
    stats["tokens"] += tokens


async def run(args):
    rng = random.Random(args.seed)
    limits = httpx.Limits(max_connections=max(args.concurrency, 1) + 16, max_keepalive_connections=None)
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0), limits=limits) as client:
        model = (await client.get(args.url + "/v1/models")).json()["data"][0]["id"]
        stats = {"ttft": [], "itl": [], "e2e": [], "tokens": 0, "lost": 0, "errors": [], "bad_lines": []}
        start = time.perf_counter()
        deadline = start + args.duration
        sent = 0

        def prompt():
            return [rng.randrange(10, 8000) for _ in range(args.prompt_len)]

        def more():
            return time.perf_counter() < deadline and (args.num_requests == 0 or sent < args.num_requests)

        tasks = set()
        if args.rate > 0:
            while more():
                tasks.add(asyncio.create_task(one_request(client, args.url, model, prompt(), args.max_tokens, stats)))
                sent += 1
                await asyncio.sleep(rng.expovariate(args.rate))
        else:
            while more():
                while len(tasks) < args.concurrency and more():
                    tasks.add(asyncio.create_task(one_request(client, args.url, model, prompt(), args.max_tokens,
                                                              stats)))
                    sent += 1
                done, tasks = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        if tasks:
            await asyncio.wait(tasks)
        wall = time.perf_counter() - start
    answered = len(stats["e2e"])
    return {
        "mode": f"rate={args.rate}" if args.rate > 0 else f"concurrency={args.concurrency}",
        "prompt_len": args.prompt_len, "max_tokens": args.max_tokens, "sent": sent, "answered": answered,
        "lost": stats["lost"], "errors": len(stats["errors"]), "error_kinds": sorted(set(map(str, stats["errors"]))),
        "bad_lines": stats["bad_lines"][:3],
        "wall_s": round(wall, 2), "output_tok_per_s": round(stats["tokens"] / wall, 1),
        "ttft_p50_ms": round(1e3 * (pct(stats["ttft"], 50) or 0), 1),
        "ttft_p99_ms": round(1e3 * (pct(stats["ttft"], 99) or 0), 1),
        "itl_p50_ms": round(1e3 * (pct(stats["itl"], 50) or 0), 2),
        "itl_p99_ms": round(1e3 * (pct(stats["itl"], 99) or 0), 2),
        "e2e_p50_s": round(pct(stats["e2e"], 50) or 0, 3), "e2e_p99_s": round(pct(stats["e2e"], 99) or 0, 3),
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
    args = ap.parse_args()
    result = asyncio.run(run(args))
    print(json.dumps(result))
    return 0 if result["lost"] == 0 and result["errors"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())

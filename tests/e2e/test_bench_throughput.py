"""deepinfer bench --throughput end to end on the embedded tiny model (CPU):
requests through the engine's continuous batching, one JSONL record whose raw
quantities give its rates, and a malformed spec refused with a clear error."""
import json
import os
import subprocess
import sys
import tempfile

binary, root = sys.argv[1], sys.argv[2]
requests, prompt_len, gen_len = 12, 24, 5
with tempfile.TemporaryDirectory() as tmp:
    out = os.path.join(tmp, "throughput.jsonl")
    # max_num_seqs 4 < 12 requests and a token budget below one step's prefill
    # demand: the scheduler must queue, chunk and refill as it goes.
    r = subprocess.run([binary, "bench", "--throughput", f"{requests}x{prompt_len}x{gen_len}",
                        "--threads", "2", "--max-num-seqs", "4", "--max-num-batched-tokens", "40",
                        "--peer-tokens-per-s", "100", "--num-speculative-tokens", "0", "--output", out],
                       capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        sys.exit(f"bench --throughput failed: {r.stderr}")
    recs = [json.loads(l) for l in open(out)]
    assert len(recs) == 1, recs
    x = recs[0]
    assert x["kind"] == "throughput", x
    assert (x["requests"], x["prompt_len"], x["gen_len"]) == (requests, prompt_len, gen_len), x
    assert x["prompt_tokens"] == requests * prompt_len, x
    assert x["output_tokens"] == requests * gen_len, x  # EOS ignored: every request runs to gen_len
    assert x["max_num_seqs"] == 4 and x["max_num_batched_tokens"] == 40, x
    assert x["kv_blocks"] > 0 and x["kv_block_size"] > 0, x
    assert x["elapsed_s"] > 0
    rel = lambda a, b: abs(a - b) <= 1e-9 * max(abs(a), abs(b))
    assert rel(x["output_tokens_per_s"], x["output_tokens"] / x["elapsed_s"]), x
    assert rel(x["total_tokens_per_s"], (x["prompt_tokens"] + x["output_tokens"]) / x["elapsed_s"]), x
    assert rel(x["output_ratio_to_peer"], x["output_tokens_per_s"] / 100), x
    # At most 4 requests at a time, each held for >= gen_len steps (its last prefill
    # chunk samples the first token): 12 / 4 = 3 waves of >= 5 steps.
    assert x["steps"] >= (requests // 4) * gen_len, x
    assert x["prompt_tokens_computed"] == requests * prompt_len, x
    assert "output tok/s" in r.stderr and "x the peer" in r.stderr, r.stderr

    bad = subprocess.run([binary, "bench", "--throughput", "12x24", "--threads", "2"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and "--throughput" in bad.stderr and "12x24" in bad.stderr, bad.stderr
print("ok")

"""deepinfer bench end to end on the tiny test config with random weights:
one JSONL record per measurement, with the raw quantities."""
import json
import os
import subprocess
import sys
import tempfile

binary, root = sys.argv[1], sys.argv[2]
cfg = os.path.join(root, "tests/data/tiny_v3/config.json")
with tempfile.TemporaryDirectory() as tmp:
    out = os.path.join(tmp, "bench.jsonl")
    r = subprocess.run([binary, "bench", "--config", cfg, "--random-weights", "--prefill", "32,64",
                        "--batch", "1,4", "--prompt-len", "16", "--gen-len", "8", "--repeats", "2",
                        "--threads", "2", "--output", out, "--roofline-gbps", "10"],
                       capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        sys.exit(f"bench failed: {r.stderr}")
    recs = [json.loads(l) for l in open(out)]
    kinds = [(x["kind"], x["batch"], x["prompt_len"]) for x in recs]
    assert kinds == [("prefill", 1, 32), ("prefill", 1, 64), ("decode", 1, 16), ("decode", 4, 16)], kinds
    for x in recs:
        for key in ("steps", "tokens", "elapsed_s", "tokens_per_s", "bytes_counted", "flops_counted",
                    "weight_bytes_per_step", "runs_s", "fraction_of_roofline"):
            assert key in x, (key, x)
        assert len(x["runs_s"]) == 2 and x["elapsed_s"] > 0
        assert abs(x["tokens_per_s"] - x["tokens"] / x["elapsed_s"]) < 1e-6 * x["tokens_per_s"]
    assert recs[3]["tokens"] == 4 * 7 and recs[3]["steps"] == 7
    assert recs[3]["timed_tokens_per_run"] == [28, 28], recs[3]

    # Chunked prefill (16 prompt tokens per step): the first request decodes while later prompts
    # are still in prefill; the timed part (from the last first token) must not count those
    # tokens, and every request must fit in the KV cache at once (gen 32).
    out2 = os.path.join(tmp, "bench_chunked.jsonl")
    r = subprocess.run([binary, "bench", "--config", cfg, "--random-weights", "--batch", "4",
                        "--prompt-len", "16", "--gen-len", "32", "--repeats", "1", "--warmup", "0",
                        "--max-num-batched-tokens", "16", "--threads", "2", "--output", out2],
                       capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        sys.exit(f"bench (chunked) failed: {r.stderr}")
    (rec,) = [json.loads(l) for l in open(out2)]
    assert 0 < rec["tokens"] < 4 * 31, rec
    assert rec["tokens"] >= 3 * 31 - 6, rec  # at most a few early tokens per request are left out
    assert abs(rec["tokens_per_s"] - rec["tokens"] / rec["elapsed_s"]) < 1e-6 * rec["tokens_per_s"]

    # Speculative decoding on the embedded model (its MTP layer), text prompts: the record counts
    # emitted tokens only (the same as without drafts) and carries the draft counts.
    out3 = os.path.join(tmp, "spec.jsonl")
    for k in ("0", "2"):
        r = subprocess.run([binary, "bench", "--batch", "2", "--gen-len", "12", "--repeats", "1", "--threads", "2",
                            "--prompt-file", os.path.join(root, "bench/prompts/code.jsonl"),
                            "--num-speculative-tokens", k, "--output", out3], capture_output=True, text=True, timeout=600)
        if r.returncode != 0:
            sys.exit(f"bench (speculative) failed: {r.stderr}")
    base, spec = [json.loads(l) for l in open(out3)]
    assert base["num_speculative_tokens"] == 0 and spec["num_speculative_tokens"] == 2, (base, spec)
    assert spec["tokens"] == base["tokens"] == 2 * 11, (base["tokens"], spec["tokens"])
    sd = spec["spec_decode"]
    assert sd["draft_tokens"] > 0 and sd["emitted_tokens"] == sd["verify_steps"] + sd["accepted_tokens"], sd
    assert len(sd["accepted_per_position"]) == 2 and spec["steps"] < base["steps"], (spec["steps"], base["steps"], sd)
    assert base["spec_decode"]["draft_tokens"] == 0
print("ok")

"""deepinfer generate end to end: JSONL batch with good and bad lines, one result
per line and its fields, and batch output equal to the streamed single-prompt output."""
import json
import os
import subprocess
import sys
import tempfile

binary, root = sys.argv[1], sys.argv[2]
env = dict(os.environ, DEEPINFER_NUM_THREADS="2")
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


prompts = ["def add(a, b):", "import numpy as np\n", "class Stack:", "for i in range(10):"]
with tempfile.TemporaryDirectory() as tmp:
    inp, out = os.path.join(tmp, "in.jsonl"), os.path.join(tmp, "out.jsonl")
    lines = [json.dumps({"prompt": p, "max_tokens": 24, "temperature": 0}) for p in prompts]
    lines += [
        json.dumps({"prompt": "", "max_tokens": 4}),                      # 4: empty prompt
        json.dumps({"prompt": "x", "max_tokens": 0}),                     # 5: max_tokens < 1
        json.dumps({"prompt": "x", "temperature": -0.5}),                 # 6: temperature < 0
        json.dumps({"prompt": "x", "top_p": 1.5}),                        # 7: top_p > 1
        json.dumps({"prompt": "x", "max_token": 3}),                      # 8: unknown field
        json.dumps({"prompt": "word " * 5000, "max_tokens": 2}),          # 9: longer than context
        json.dumps({"messages": [{"role": "user", "content": "sum a list"}], "max_tokens": 8,
                    "temperature": 0.8, "seed": 1, "n": 2}),              # 10: chat, n = 2
    ]
    with open(inp, "w") as f:
        f.write("\n".join(lines) + "\n")
    r = subprocess.run([binary, "generate", "--input", inp, "--output", out, "--num-speculative-tokens", "0"],
                       env=env, capture_output=True, text=True, timeout=600)
    check(r.returncode == 1, f"exit code 1 when some requests fail, got {r.returncode}: {r.stderr[-2000:]}")
    rows = [json.loads(l) for l in open(out)]
    check(len(rows) == len(lines), f"{len(rows)} output lines for {len(lines)} input lines")
    # Results are appended in completion order; "index" is the request's number in the input.
    check(sorted(row["index"] for row in rows) == list(range(len(lines))), "one result per input line")
    rows.sort(key=lambda row: row["index"])
    for i in range(4):
        row = rows[i]
        check("error" not in row, f"line {i + 1} succeeded: {row.get('error')}")
        check(len(row.get("token_ids", [])) <= 24 and row.get("finish_reason") in ("stop", "length"),
              f"line {i + 1} has tokens and a finish reason")
        check(row.get("usage", {}).get("completion_tokens") == len(row.get("token_ids", [])), "usage counts")
    expect = {4: "prompt", 5: "max_tokens", 6: "temperature", 7: "top_p", 8: "line 9: unknown field 'max_token'",
              9: "context"}
    for i, needle in expect.items():
        check(needle in rows[i].get("error", ""), f"line {i + 1} error mentions {needle!r}: {rows[i]}")
    check(len(rows[10].get("outputs", [])) == 2, "n = 2 gives two outputs")

    # Streamed single prompt == the same prompt inside the batch (greedy).
    for i in (0, 2):
        s = subprocess.run([binary, "generate", "--prompt", prompts[i], "--max-tokens", "24",
                            "--temperature", "0"], env=env, capture_output=True, text=True, timeout=300)
        check(s.returncode == 0, f"--prompt exit code {s.returncode}: {s.stderr[-1000:]}")
        check(s.stdout == rows[i]["text"] + "\n", f"streamed text equals batch text for prompt {i}")

    # Speculative decoding, the default (the embedded model's MTP layer: k = 3, scheduled
    # length): the same tokens, plus the draft counts.
    spec_out = os.path.join(tmp, "spec.jsonl")
    r = subprocess.run([binary, "generate", "--input", inp, "--output", spec_out],
                       env=env, capture_output=True, text=True, timeout=600)
    check(r.returncode == 1, f"speculative batch exit code 1 (bad lines), got {r.returncode}: {r.stderr[-2000:]}")
    spec_rows = sorted((json.loads(l) for l in open(spec_out)), key=lambda row: row["index"])
    for i in range(len(prompts)):
        check(spec_rows[i]["token_ids"] == rows[i]["token_ids"], f"speculative tokens equal for prompt {i}")
    sd = spec_rows[0].get("spec_decode", {})
    check(sd.get("draft_tokens", 0) > 0 and 0 < sd.get("acceptance_rate", 0) <= 1 and
          sd.get("emitted_tokens") == sd.get("verify_steps", 0) + sd.get("accepted_tokens", -1),
          f"spec_decode counts in the batch output: {sd}")
    check("spec_decode" not in rows[0], "no spec_decode without speculation")

if failures:
    sys.exit(f"{len(failures)} checks failed")
print("ok")

"""deepinfer CLI hardening end to end (issue 12): exit codes (0 / 1 request or input
error / 2 usage), --version, --help on stdout with defaults, contradictory flags refused,
impossible bench values refused, one bad batch line (raw 0xFF, wrapped or huge numbers)
is that line's error, --max-model-len above the model refused, --output checked before the
model loads, results durable under SIGINT and completed by --resume, and
generation_config.json's sampling defaults honoured."""
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

binary, root = sys.argv[1], os.path.abspath(sys.argv[2])
model = os.path.join(root, "models/deepseek-v3-tiny-code")
env = dict(os.environ, DEEPINFER_NUM_THREADS="2")
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


def run(*args, timeout=300, **kw):
    return subprocess.run([binary, *args], env=env, capture_output=True, timeout=timeout, **kw)


def results(path):
    return [json.loads(l) for l in open(path, encoding="utf-8")]


with tempfile.TemporaryDirectory() as tmp:
    def write(name, data):
        path = os.path.join(tmp, name)
        with open(path, "wb") as f:
            f.write(data if isinstance(data, bytes) else data.encode())
        return path

    good = write("good.jsonl", json.dumps({"prompt": "def f():", "max_tokens": 2, "temperature": 0}) + "\n")
    out = os.path.join(tmp, "out.jsonl")

    # --version, --help on stdout with defaults, exit codes of usage errors.
    r = run("--version")
    check(r.returncode == 0 and r.stdout.decode().startswith("deepinfer "), f"--version: {r}")
    r = run("--help")
    check(r.returncode == 0 and b"generate" in r.stdout, f"deepinfer --help on stdout: {r}")
    r = run("generate", "--help")
    help_text = r.stdout.decode()
    check(r.returncode == 0 and "--max-tokens" in help_text, f"generate --help on stdout: {r.returncode}")
    max_tokens_line = next((l for l in help_text.splitlines() if "--max-tokens" in l), "")
    check("16" in max_tokens_line, f"--help shows --max-tokens' default: {max_tokens_line!r}")
    check("n <= 128" in help_text, "--help documents the per-line bounds")
    schema = write("schema.json", '{"type": "string"}')
    usage_cases = [
        ("--regex with --json-schema", ["generate", "--prompt", "x", "--regex", "a+", "--json-schema", schema]),
        ("--chat with --input", ["generate", "--input", good, "--output", out, "--chat"]),
        ("--prompt with --input", ["generate", "--input", good, "--output", out, "--prompt", "x"]),
        ("--input without --output", ["generate", "--input", good]),
        ("--resume without --input", ["generate", "--prompt", "x", "--resume"]),
        ("no prompt", ["generate"]),
        ("unknown flag", ["generate", "--prompt", "x", "--no-such-flag"]),
        ("--max-tokens 0", ["generate", "--prompt", "x", "--max-tokens", "0"]),
        ("--max-num-seqs 0", ["generate", "--prompt", "x", "--max-num-seqs", "0"]),
        ("bench --batch 0", ["bench", "--batch", "0"]),
        ("bench --batch -3", ["bench", "--batch", "-3"]),
        ("bench --prefill 0", ["bench", "--prefill", "0"]),
        ("bench --repeats 0", ["bench", "--batch", "1", "--repeats", "0"]),
        ("bench --throughput 0x1x1", ["bench", "--throughput", "0x1x1"]),
        ("unknown command", ["frobnicate"]),
    ]
    for what, args in usage_cases:
        r = run(*args, timeout=120)
        check(r.returncode == 2, f"{what}: exit 2 (usage), got {r.returncode}: {r.stderr[-300:]!r}")
        check(not os.path.exists(out), f"{what}: no output written")

    # --max-model-len above the model's max_position_embeddings (2048): refused at load.
    r = run("generate", "--prompt", "x", "--max-model-len", "4096")
    check(r.returncode == 1 and b"max_position_embeddings 2048" in r.stderr,
          f"--max-model-len 4096 refused: {r.returncode} {r.stderr[-300:]!r}")

    # An unwritable --output is reported before the model loads (no progress bar, no results).
    r = run("generate", "--input", good, "--output", os.path.join(tmp, "no/such/dir/out.jsonl"))
    check(r.returncode == 1 and b"--output: cannot write" in r.stderr and b"requests" not in r.stderr,
          f"unwritable --output: {r.returncode} {r.stderr[-300:]!r}")

    # One bad line is that line's error: raw 0xFF, wrapped and huge numbers; the others run.
    lines = [
        json.dumps({"prompt": "def add(a, b):", "max_tokens": 3, "temperature": 0}).encode(),
        b'{"prompt": "bad \xff byte", "max_tokens": 2}',
        json.dumps({"prompt": "x", "max_tokens": 4294967298}).encode(),
        json.dumps({"prompt": "x", "n": 1e9}).encode(),
        b'{"prompt": "' + b"a" * 100000,                        # unterminated: not echoed back
        json.dumps({"prompt": "class Stack:"}).encode(),         # --max-tokens 3 is its default
    ]
    inp = write("mixed.jsonl", b"\n".join(lines) + b"\n")
    r = run("generate", "--input", inp, "--output", out, "--max-tokens", "3", "--temperature", "0")
    check(r.returncode == 1, f"mixed batch exits 1: {r.returncode} {r.stderr[-500:]!r}")
    rows = {row["index"]: row for row in results(out)}
    check(sorted(rows) == list(range(len(lines))), f"one result per line: {sorted(rows)}")
    for i in (0, 5):
        check("error" not in rows.get(i, {}) and 1 <= len(rows.get(i, {}).get("token_ids", [])) <= 3,
              f"line {i + 1} ran with at most 3 tokens: {rows.get(i)}")
    expect = {1: "invalid UTF-8", 2: "out of range", 3: "n: must be in [1, 128]", 4: "not valid JSON"}
    for i, needle in expect.items():
        err = rows.get(i, {}).get("error", "")
        check(needle in err and len(err) < 300, f"line {i + 1} error mentions {needle!r}: {err[:300]!r}")
    check(len(r.stderr) < 5000, f"stderr does not echo the 100 kB line ({len(r.stderr)} bytes)")
    os.remove(out)

    # SIGINT: finished lines kept, how many remain printed, exit 130; --resume completes the rest.
    num = 12
    inp = write("long.jsonl", "".join(json.dumps({"prompt": f"def f{i}(x):", "max_tokens": 24, "temperature": 0,
                                                  "ignore_eos": True}) + "\n" for i in range(num)))
    p = subprocess.Popen([binary, "generate", "--input", inp, "--output", out, "--max-num-seqs", "1"], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.time() + 240
    while time.time() < deadline and p.poll() is None:
        if os.path.exists(out) and sum(1 for _ in open(out, "rb")) >= 2:
            break
        time.sleep(0.05)
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=120)
    kept = results(out)
    check(p.returncode == 130, f"SIGINT exits 130, got {p.returncode}: {err[-500:]!r}")
    check(2 <= len(kept) < num, f"SIGINT kept the finished lines: {len(kept)} of {num}")
    check(f"{num - len(kept)} requests remain".encode() in err, f"SIGINT says how many remain: {err[-500:]!r}")
    check(all(len(row["token_ids"]) == 24 for row in kept), "kept lines are complete results")
    r = run("generate", "--input", inp, "--output", out, "--resume")
    rows = results(out)
    check(r.returncode == 0, f"--resume exit 0: {r.stderr[-500:]!r}")
    check(sorted(row["index"] for row in rows) == list(range(num)), "--resume: every index exactly once")
    check(rows[:len(kept)] == kept, "--resume keeps the earlier lines as they were")
    check(f"({len(kept)} were already there)".encode() in r.stderr, f"--resume reports the skipped: {r.stderr[-300:]!r}")

    # generation_config.json: its sampling fields are the defaults where no flag is given.
    gdir = os.path.join(tmp, "model")
    os.mkdir(gdir)
    for name in os.listdir(model):
        if name != "generation_config.json":
            os.symlink(os.path.join(model, name), os.path.join(gdir, name))
    with open(os.path.join(gdir, "generation_config.json"), "w") as f:
        json.dump({"temperature": 0.0, "max_new_tokens": 3, "do_sample": True}, f)
    prompt = "def add(a, b):"
    explicit = run("generate", "--model", model, "--prompt", prompt, "--temperature", "0", "--max-tokens", "3")
    auto = run("generate", "--model", gdir, "--prompt", prompt)
    check(auto.returncode == 0 and b"defaults from" in auto.stderr and b"temperature=0" in auto.stderr,
          f"generation_config.json applied and reported: {auto.stderr[-300:]!r}")
    check(auto.stdout == explicit.stdout, f"its defaults give the flags' output: {auto.stdout!r} vs {explicit.stdout!r}")
    flag = run("generate", "--model", gdir, "--prompt", prompt, "--max-tokens", "1")
    check(b"+ 1 generated tokens" in flag.stderr and b"max_tokens" not in flag.stderr.split(b"\n")[0],
          f"a flag overrides generation_config.json: {flag.stderr[-300:]!r}")
    none = run("generate", "--model", gdir, "--prompt", prompt, "--generation-config", "none", "--seed", "1")
    check(none.returncode == 0 and b"defaults from" not in none.stderr, f"--generation-config none: {none.stderr[-300:]!r}")

if failures:
    sys.exit(f"{len(failures)} checks failed")
print("ok")

"""Hostile JSON through the CLI (issue #12): inputs nested 200,000 deep (built here, never
committed), an EBNF without root and a 100,000-rule chain give a clear error and exit code 1,
never a crash (SIGSEGV), and the messages name the cause."""
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

binary, root = sys.argv[1], sys.argv[2]
model = os.path.join(root, "models", "deepseek-v3-tiny-code")
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


class Result:
    def __init__(self, p):
        self.returncode = p.returncode
        self.stdout = p.stdout.decode("utf-8", "replace")
        self.stderr = p.stderr.decode("utf-8", "replace")


def run(args, stdin=b""):
    if isinstance(stdin, str):
        stdin = stdin.encode()
    return Result(subprocess.run([binary] + args, input=stdin, capture_output=True, timeout=300))


def expect_error(args, needles, what, stdin=b""):
    r = run(args, stdin)
    check(r.returncode == 1, f"{what}: exit code 1 (an error, not a crash), got {r.returncode}: {r.stderr[-500:]}")
    for n in needles:
        check(n in r.stderr, f"{what}: stderr names {n!r}: {r.stderr[-500:]}")
    check(len(r.stderr) < 2000, f"{what}: error message is bounded ({len(r.stderr)} bytes)")


deep = "[" * 200000 + "]" * 200000
with tempfile.TemporaryDirectory() as tmp:
    # config.json nested 200,000 deep.
    cfg_dir = os.path.join(tmp, "deep_config")
    os.makedirs(cfg_dir)
    with open(os.path.join(cfg_dir, "config.json"), "w") as f:
        f.write('{"model_type": "deepseek_v3", "vocab_size": ' + deep + "}")
    expect_error(["info", "--model", cfg_dir], ["config.json", "nested deeper than the limit of 256"],
                 "info on a deep config.json")

    # A safetensors header nested 200,000 deep beside a valid config.json.
    st_dir = os.path.join(tmp, "deep_header")
    os.makedirs(st_dir)
    shutil.copy(os.path.join(model, "config.json"), st_dir)
    header = ('{"w": {"dtype": "U8", "shape": ' + deep + ', "data_offsets": [0, 1]}}').encode()
    with open(os.path.join(st_dir, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header + b"\0" * 8)
    expect_error(["info", "--model", st_dir], ["model.safetensors", "nested deeper than the limit of 256"],
                 "info on a deep safetensors header")

    # A JSON Schema enum nested 30,000 deep.
    schema = os.path.join(tmp, "deep_enum.json")
    with open(schema, "w") as f:
        f.write('{"enum": [' + "[" * 30000 + "1" + "]" * 30000 + "]}")
    expect_error(["grammar", "check", "--json-schema", schema, "--tokenizer", model],
                 ["json schema", "nested deeper"], "grammar check on a deep enum", stdin='"1"\n')

    # EBNF without root; a 100,000-rule chain.
    noroot = os.path.join(tmp, "noroot.ebnf")
    with open(noroot, "w") as f:
        f.write('start ::= "x"\n')
    expect_error(["grammar", "check", "--ebnf", noroot, "--tokenizer", model], ["no rule named 'root'"],
                 "grammar check on an EBNF without root", stdin='"x"\n')
    chain = os.path.join(tmp, "chain.ebnf")
    with open(chain, "w") as f:
        f.write("root ::= a0\n" + "".join(f"a{i} ::= a{i + 1}\n" for i in range(100000)) + 'a100000 ::= "x"\n')
    expect_error(["grammar", "check", "--ebnf", chain, "--tokenizer", model], ["automaton states"],
                 "grammar check on a 100,000-rule chain", stdin='"x"\n')

    # A stdin line of grammar check / tokenize with a raw 0xFF byte or nested deep.
    expect_error(["tokenize", "--tokenizer", model], ["stdin line 2", "invalid UTF-8 at byte offset 1"],
                 "tokenize with invalid UTF-8 on line 2", stdin=b'"ok"\n"\xff"\n')
    r = run(["tokenize", "--tokenizer", model], stdin='"ok"\n' + deep + "\n")
    check(r.returncode == 1 and "stdin line 2" in r.stderr and "nested deeper" in r.stderr,
          f"tokenize with a deep line 2: {r.returncode} {r.stderr[-300:]}")
    check(r.stdout.count("\n") == 1, "tokenize printed the first line's ids before the error")

if failures:
    print(f"{len(failures)} failure(s)")
    sys.exit(1)
print("all hostile-input checks passed")

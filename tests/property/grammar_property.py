#!/usr/bin/env python3
"""Property test of structured outputs (issue #6 item 5): every string our matcher can generate
under a constraint is valid by an independent validator.

grammar_walk (tests/property/grammar_walk.cpp) draws random strings by walking the matcher with
seeded random choices among the tokens its mask allows; this script validates each completed
string: JSON Schema with the `jsonschema` package (plus formats.py, RFC-based format checks that
do not depend on optional packages), regexes with Python's `re.fullmatch`. Cases:
  1. tests/property/cases.json, hand-written, covering every supported keyword, on a small
     random-token vocabulary (all 256 bytes + JSON-shaped multi-byte tokens);
  2. a fixed sample of MaskBench schemas (../shared/data/maskbench; skipped with a message when
     absent) that our compiler accepts, same vocabulary;
  3. the hand-written cases on the DeepSeek-V3 vocabulary (skipped when its tokenizer is absent).
Fails on: an invalid string, a matcher inconsistency reported by grammar_walk (mask/accept
disagreement, dead end), a hand-written case refused or with no finished walk. MaskBench
strings that break only `oneOf` (compiled as anyOf) or `uniqueItems` (ignored) are documented
approximations (grammar/README.md): counted and shown, not failures.

  grammar_property.py --walk BUILD/tests/property/grammar_walk --shared /work/shared
"""
import argparse
import json
import os
import re
import subprocess
import sys
import time

try:
    import jsonschema
except ImportError:
    sys.exit("property_grammar: the jsonschema package is missing (tools/setup.sh installs python3-jsonschema)")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from formats import CHECKS  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
APPROXIMATED = {"oneOf", "uniqueItems"}


def ecma_to_python(pattern):
    """ECMAScript regex (JSON Schema `pattern`) -> Python re. The dialects agree on what we
    compile except \\s (ECMAScript's includes U+FEFF, Python's does not) and named groups
    (`(?<name>` is `(?P<name>` in Python)."""
    out, i, in_class = [], 0, False
    while i < len(pattern):
        c = pattern[i]
        if c == "\\" and i + 1 < len(pattern):
            e = pattern[i + 1]
            if e == "s":
                out.append("\\s\\ufeff" if in_class else "[\\s\\ufeff]")
            elif e == "S" and not in_class:
                out.append("[^\\s\\ufeff]")
            else:
                out.append(pattern[i:i + 2])
            i += 2
            continue
        if pattern.startswith("(?<", i) and not in_class and pattern[i + 3:i + 4] not in ("=", "!"):
            out.append("(?P<")
            i += 3
            continue
        if c == "[" and not in_class:
            in_class = True
        elif c == "]" and in_class:
            in_class = False
        out.append(c)
        i += 1
    return "".join(out)


def openapi_nullable(schema):
    """OpenAPI `nullable: true` (which our compiler honours) as plain JSON Schema."""
    if isinstance(schema, list):
        return [openapi_nullable(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    s = {k: openapi_nullable(v) for k, v in schema.items()}
    if s.pop("nullable", False) is True:
        return {"anyOf": [{"type": "null"}, s]}
    return s


def find_key(schema, pred):
    if isinstance(schema, dict):
        return any(pred(k, v) for k, v in schema.items()) or any(find_key(v, pred) for v in schema.values())
    if isinstance(schema, list):
        return any(find_key(v, pred) for v in schema)
    return False


def make_validator(schema):
    """The validator for the schema's draft; without $schema: draft 4 if it uses boolean
    exclusive bounds, draft 7 if it uses tuple `items`, else 2020-12. `pattern` is checked
    with the ECMAScript->Python translation; formats with jsonschema's checkers and ours."""
    if "$schema" in schema:
        base = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    elif find_key(schema, lambda k, v: k in ("exclusiveMinimum", "exclusiveMaximum") and isinstance(v, bool)):
        base = jsonschema.Draft4Validator
    elif find_key(schema, lambda k, v: k == "items" and isinstance(v, list)):
        base = jsonschema.Draft7Validator
    else:
        base = jsonschema.Draft202012Validator

    def pattern(validator, patrn, instance, _schema):
        if validator.is_type(instance, "string") and not re.search(ecma_to_python(patrn), instance):
            yield jsonschema.ValidationError(f"{instance!r} does not match {patrn!r}")

    cls = jsonschema.validators.extend(base, {"pattern": pattern})
    ours = jsonschema.FormatChecker(formats=())
    for name, check in CHECKS.items():
        ours.checks(name)(check)
    schema = openapi_nullable(schema)
    # FORMAT_CHECKER (the draft's own checkers) is jsonschema >= 4.12; Debian 12 ships 4.10.
    theirs = getattr(base, "FORMAT_CHECKER", None) or jsonschema.FormatChecker()
    return [cls(schema, format_checker=theirs), cls(schema, format_checker=ours)]


def reject_constant(name):
    raise ValueError(f"non-JSON constant {name}")


def dup_keys_hook(pairs):
    keys = [k for k, _ in pairs]
    if len(set(keys)) != len(keys):
        raise KeyError("duplicate key")
    return dict(pairs)


def run_walk(walk, vocab, cases, seed):
    lines = "".join(json.dumps(c) + "\n" for c in cases)
    r = subprocess.run([walk, "--vocab", vocab, "--seed", str(seed)], input=lines.encode(), capture_output=True,
                       timeout=900)
    if r.returncode != 0:
        sys.exit(f"property_grammar: grammar_walk failed ({r.returncode}): {r.stderr.decode(errors='replace')[-2000:]}")
    return [json.loads(l) for l in r.stdout.decode().splitlines()]


class Tally:
    def __init__(self, name):
        self.name = name
        self.cases = self.refused = self.strings = self.unfinished = self.approx = self.dups = 0
        self.failures = []

    def fail(self, case_id, what):
        self.failures.append(f"[{self.name}] {case_id}: {what[:600]}")

    def report(self):
        print(f"{self.name}: {self.cases} cases, {self.refused} refused, {self.strings} strings validated, "
              f"{self.unfinished} walks unfinished, {self.approx} documented approximations, "
              f"{self.dups} with duplicate extra keys, {len(self.failures)} failures")


def check_results(tally, cases, results, strict):
    """strict: hand-written cases (must compile and finish); else MaskBench (refusals fine)."""
    by_id = {c["id"]: c for c in cases}
    for res in results:
        case = by_id[res["id"]]
        tally.cases += 1
        if "refused" in res:
            tally.refused += 1
            if strict:
                tally.fail(res["id"], f"refused: {res['refused']}")
            continue
        for e in res["errors"]:
            tally.fail(res["id"], f"matcher: {e}")
        tally.unfinished += res["unfinished"]
        if strict and not res["samples"]:
            tally.fail(res["id"], f"no walk finished ({res['unfinished']} unfinished)")
        if case["kind"] == "regex":
            rx = re.compile(ecma_to_python(case["source"]))
        else:
            validators = make_validator(json.loads(case["source"]))
        for h in res["samples"]:
            raw = bytes.fromhex(h)
            tally.strings += 1
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                tally.fail(res["id"], f"not UTF-8 ({e}): {raw!r}")
                continue
            if case["kind"] == "regex":
                if not rx.fullmatch(text):
                    tally.fail(res["id"], f"{text!r} does not fully match /{case['source']}/")
                continue
            try:
                value = json.loads(text, parse_constant=reject_constant)
            except (ValueError, RecursionError) as e:
                tally.fail(res["id"], f"not JSON ({e}): {text!r}")
                continue
            try:
                json.loads(text, object_pairs_hook=dup_keys_hook)
            except KeyError:
                tally.dups += 1
            errors = [e for v in validators for e in v.iter_errors(value)]
            if not errors:
                continue
            if not strict and all(e.validator in APPROXIMATED for e in errors):
                tally.approx += 1
                continue
            e = errors[0]
            tally.fail(res["id"], f"{text[:300]!r} invalid: {e.message[:300]} (keyword {e.validator} at "
                                  f"{'/'.join(map(str, e.absolute_schema_path))})")


def hand_cases(samples, max_tokens):
    out = []
    for c in json.load(open(os.path.join(HERE, "cases.json"))):
        kind = "regex" if "regex" in c else "json_schema"
        src = c["regex"] if kind == "regex" else json.dumps(c["schema"])
        out.append({"id": c["name"], "kind": kind, "source": src, "any_whitespace": c.get("any_whitespace", False),
                    "samples": samples, "max_tokens": max_tokens})
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--walk", required=True, help="grammar_walk binary")
    ap.add_argument("--shared", default=os.path.join(HERE, "../../../shared"))
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--samples", type=int, default=30, help="walks per hand-written case (small vocabulary)")
    ap.add_argument("--maskbench-stride", type=int, default=40)
    ap.add_argument("--maskbench-samples", type=int, default=8)
    ap.add_argument("--deepseek-samples", type=int, default=2)
    ap.add_argument("--parts", default="hand,maskbench,deepseek", help="comma-separated subset to run")
    args = ap.parse_args()
    t0 = time.time()
    tallies = []

    parts = set(args.parts.split(","))
    if "hand" in parts:
        t = Tally("hand-written, small vocabulary")
        cases = hand_cases(args.samples, 3000)
        check_results(t, cases, run_walk(args.walk, "small", cases, args.seed), strict=True)
        tallies.append(t)

    mb = os.path.join(args.shared, "data/maskbench")
    if "maskbench" not in parts:
        pass
    elif os.path.isdir(mb):
        t = Tally(f"MaskBench every {args.maskbench_stride}th schema, small vocabulary")
        cases = []
        for f in sorted(x for x in os.listdir(mb) if x.endswith(".json"))[:: args.maskbench_stride]:
            doc = json.load(open(os.path.join(mb, f)))
            cases.append({"id": f, "kind": "json_schema", "source": json.dumps(doc["schema"]),
                          "samples": args.maskbench_samples, "max_tokens": 3000})
        check_results(t, cases, run_walk(args.walk, "small", cases, args.seed), strict=False)
        tallies.append(t)
    else:
        print(f"property_grammar: SKIPPED the MaskBench part: no data at {mb}")

    tok = os.path.join(args.shared, "data/tokenizers/deepseek-v3")
    if "deepseek" not in parts:
        pass
    elif os.path.isfile(os.path.join(tok, "tokenizer.json")):
        t = Tally("hand-written, DeepSeek-V3 vocabulary")
        cases = hand_cases(args.deepseek_samples, 300)
        check_results(t, cases, run_walk(args.walk, tok, cases, args.seed), strict=False)
        tallies.append(t)
    else:
        print(f"property_grammar: SKIPPED the DeepSeek-V3 part: no tokenizer at {tok}")

    for t in tallies:
        t.report()
    failures = [f for t in tallies for f in t.failures]
    shown = {}
    for f in failures:  # at most 3 per case, so every failing case is listed
        key = f.split(": ", 1)[0]
        shown[key] = shown.get(key, 0) + 1
        if shown[key] <= 3:
            print("FAIL", f)
    for key, n in shown.items():
        if n > 3:
            print(f"FAIL {key}: {n - 3} more")
    print(f"property_grammar: {len(failures)} failures in {time.time() - t0:.1f} s")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

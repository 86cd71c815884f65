"""Converts public benchmark files (which you download yourself; deepinfer never downloads data)
into `deepinfer eval generate --dataset` JSONL (app/eval.h).

  python3 tools/eval/convert.py aime IN.jsonl OUT.jsonl   # {"problem"|"question", "answer", "id"?}
  python3 tools/eval/convert.py gpqa IN.csv OUT.jsonl     # GPQA's CSV: Question, Correct Answer,
                                                          # Incorrect Answer 1..3 (choices shuffled
                                                          # by a fixed per-question seed)
  python3 tools/eval/convert.py hle IN.jsonl OUT.jsonl    # {"id", "question", "answer",
                                                          # "answer_type"}; multipleChoice -> exact_match
                                                          # of the letter, image questions skipped
Options: --max-tokens N (default 4096), --chat (messages instead of a raw prompt).
"""
import argparse
import csv
import hashlib
import json
import random
import sys

AIME_INSTRUCTION = "Solve the problem. Put the final answer, an integer from 0 to 999, in \\boxed{}."
GPQA_INSTRUCTION = "Answer with the letter of the correct choice, as 'Answer: X'."
HLE_INSTRUCTION = "Give your final answer on a last line as 'Answer: ...'."


def read_jsonl(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(l) for l in f if l.strip()]


def prompt_fields(text, chat):
    return {"messages": [{"role": "user", "content": text}]} if chat else {"prompt": text}


def aime(rows, a):
    for i, r in enumerate(rows):
        q = r.get("problem", r.get("question"))
        if q is None or "answer" not in r:
            raise SystemExit("aime: row %d needs problem (or question) and answer" % (i + 1))
        yield {"id": str(r.get("id", "aime-%d" % (i + 1))), "kind": "exact_answer", "answer": str(r["answer"]),
               "max_tokens": a.max_tokens, **prompt_fields("%s\n\n%s" % (q, AIME_INSTRUCTION), a.chat)}


def gpqa(rows, a):
    for i, r in enumerate(rows):
        try:
            q, right = r["Question"].strip(), r["Correct Answer"].strip()
            wrong = [r["Incorrect Answer %d" % k].strip() for k in (1, 2, 3)]
        except KeyError as e:
            raise SystemExit("gpqa: row %d has no column %s" % (i + 1, e))
        choices = [right] + wrong
        seed = int(hashlib.sha256(q.encode()).hexdigest()[:16], 16)
        random.Random(seed).shuffle(choices)
        letters = "ABCD"
        body = q + "\n\n" + "\n".join("%s) %s" % (letters[k], c) for k, c in enumerate(choices))
        yield {"id": str(r.get("Record ID", "gpqa-%d" % (i + 1))), "kind": "multiple_choice",
               "answer": letters[choices.index(right)], "choices": choices, "max_tokens": a.max_tokens,
               **prompt_fields(body + "\n\n" + GPQA_INSTRUCTION, a.chat)}


def hle(rows, a):
    for i, r in enumerate(rows):
        if r.get("image"):
            continue  # text-only models
        yield {"id": str(r.get("id", "hle-%d" % (i + 1))), "kind": "exact_match", "answer": str(r["answer"]),
               "max_tokens": a.max_tokens, "meta": {"answer_type": r.get("answer_type", "")},
               **prompt_fields("%s\n\n%s" % (r["question"], HLE_INSTRUCTION), a.chat)}


def main(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("format", choices=["aime", "gpqa", "hle"])
    p.add_argument("input")
    p.add_argument("output")
    p.add_argument("--max-tokens", type=int, default=4096)
    p.add_argument("--chat", action="store_true")
    a = p.parse_args(argv)
    if a.format == "gpqa":
        with open(a.input, encoding="utf-8", newline="") as f:
            rows = list(csv.DictReader(f))
    else:
        rows = read_jsonl(a.input)
    items = list({"aime": aime, "gpqa": gpqa, "hle": hle}[a.format](rows, a))
    ids = [it["id"] for it in items]
    if len(set(ids)) != len(ids):
        raise SystemExit("%s: duplicate ids in %s" % (a.format, a.input))
    with open(a.output, "w", encoding="utf-8") as f:
        for it in items:
            f.write(json.dumps(it, ensure_ascii=False) + "\n")
    print("%s: %d items -> %s" % (a.format, len(items), a.output), file=sys.stderr)


if __name__ == "__main__":
    main(sys.argv[1:])

#!/usr/bin/env python3
"""Writes the chat-encoding fixture (JSONL): seeded conversations rendered by transformers'
apply_chat_template with DeepSeek-V3's tokenizer_config chat_template (the oracle), plus the ids
of the rendered text from HF `tokenizers`.

Each line: {"messages": [{"role", "content"}], "add_generation_prompt": bool, "text": str,
            "ids": [...]}
Run with the oracle venv (transformers):
  /work/oracle-venv/bin/python make_chat_fixture.py TOKENIZER_DIR OUT.jsonl.gz
"""
import argparse
import gzip
import json
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from corpus import make_corpus  # noqa: E402

import tokenizers  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("tokenizer_dir")
    ap.add_argument("out")
    ap.add_argument("--num-conversations", type=int, default=200)
    args = ap.parse_args()

    hf = AutoTokenizer.from_pretrained(args.tokenizer_dir)
    raw = tokenizers.Tokenizer.from_file(os.path.join(args.tokenizer_dir, "tokenizer.json"))
    texts = [t for t in make_corpus(seed=5, num_strings=2000) if len(t) < 200]
    rng = random.Random(11)
    with gzip.open(args.out, "wt", encoding="utf-8", compresslevel=9) as f:
        for i in range(args.num_conversations):
            messages = []
            for _ in range(rng.randint(0, 2)):  # system prompts, anywhere in the list
                messages.insert(rng.randint(0, len(messages)), {"role": "system", "content": rng.choice(texts)})
            for _ in range(rng.randint(0 if i < 5 else 1, 4)):
                messages.append({"role": "user", "content": rng.choice(texts)})
                r = rng.random()
                if r < 0.2:  # tool outputs, then the assistant (or the end)
                    for _ in range(rng.randint(1, 3)):
                        messages.append({"role": "tool", "content": rng.choice(texts)})
                    if rng.random() < 0.7:
                        messages.append({"role": "assistant", "content": rng.choice(texts)})
                elif r < 0.8:
                    messages.append({"role": "assistant", "content": rng.choice(texts)})
            if rng.random() < 0.3:
                messages.insert(rng.randint(0, len(messages)), {"role": "system", "content": rng.choice(texts)})
            add_generation_prompt = rng.random() < 0.6
            text = hf.apply_chat_template(messages, tokenize=False,
                                          add_generation_prompt=add_generation_prompt)
            ids = raw.encode(text, add_special_tokens=False).ids
            f.write(json.dumps({"messages": messages, "add_generation_prompt": add_generation_prompt,
                                "text": text, "ids": ids}, ensure_ascii=False) + "\n")
    print(f"{args.out}: {args.num_conversations} conversations, {os.path.getsize(args.out)} bytes")


if __name__ == "__main__":
    main()

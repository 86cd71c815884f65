#!/usr/bin/env python3
"""Checks `deepinfer serve`'s chat rendering (tool calls, tool results) against transformers.

Needs a venv with `transformers` (not part of CI): for each conversation below it renders the
checkpoint's own chat template with transformers (`apply_chat_template(..., add_generation_prompt=True)`,
then its ids) and compares the token ids with the server's POST /tokenize of the
same messages. The HF template has no tools section, so requests here carry no `tools` (the
server adds its `## Tools` system section only for tool_choice other than none).

  python3 tools/server/check_chat_rendering.py --url http://127.0.0.1:8000 \
      --tokenizer ../shared/data/tokenizers/deepseek-v3   # or the served checkpoint's directory
Exit status 0 when every conversation matches; prints the first differing token otherwise.
"""
import argparse
import json
import sys

import httpx

CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
CALL2 = {"id": "call_2", "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}
CONVERSATIONS = [
    [{"role": "user", "content": "Hello"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
     {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Weather?"}],
    [{"role": "user", "content": "Weather in Paris?"},
     {"role": "assistant", "content": None, "tool_calls": [CALL]},
     {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 21}'}],
    [{"role": "user", "content": "Two things"},
     {"role": "assistant", "content": None, "tool_calls": [CALL, CALL2]},
     {"role": "tool", "tool_call_id": "call_1", "content": "21"},
     {"role": "tool", "tool_call_id": "call_2", "content": "3"},
     {"role": "assistant", "content": "It is 21 and 3."},
     {"role": "user", "content": "Thanks"}],
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--tokenizer", required=True, help="directory with tokenizer.json + tokenizer_config.json")
    args = ap.parse_args()
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(args.tokenizer)
    failures = 0
    for i, messages in enumerate(CONVERSATIONS):
        # (transformers 5 returns an Encoding for tokenize=True: render, then encode the text.)
        text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        want = tok.encode(text, add_special_tokens=False)
        got = httpx.post(args.url + "/tokenize", json={"messages": messages}, timeout=60).json()
        got = got.get("tokens", got)
        if got == want:
            print(f"conversation {i}: ok ({len(want)} tokens)")
            continue
        failures += 1
        k = next((j for j, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
        print(f"conversation {i}: differs at token {k}: server {tok.decode(got[k:k + 12])!r} "
              f"transformers {tok.decode(want[k:k + 12])!r}")
        print("  transformers:", json.dumps(tok.decode(want)))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

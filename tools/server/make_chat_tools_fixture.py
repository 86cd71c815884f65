#!/usr/bin/env python3
"""Writes the fixtures that check `deepinfer serve`'s DeepSeek chat formats against the oracles.

1. Rendering (tests/unit/tokenizer/data/deepseek_chat_tools.jsonl.gz): conversations with tool
   calls, tool results, several turns and thinking on/off, rendered by transformers'
   apply_chat_template with
     - DeepSeek-V3's own template (the tokenizer_config.json of TOKENIZER_DIR), and
     - DeepSeek-V3.1's template (tests/unit/tokenizer/data/deepseek_v31_chat_template.jinja,
       the official text; V3.1's tokenizer.json is not here, so V3.1 rows are checked as text).
   Each line: {"format": "deepseek_v3"|"deepseek_v31", "messages", "add_generation_prompt",
               "thinking", "text", "ids" (V3 only: HF tokenizers' ids of the text)}
2. Parsing (tests/unit/server/data/deepseek_tool_parse.json): model outputs and what vLLM's
   deepseek_v3 / deepseek_v31 tool parsers' extract_tool_calls returns for them. vLLM is not
   installed here (no GPU wheel on this box), so `vllm_extract` below restates their logic
   (vllm/entrypoints/openai/tool_parsers/deepseekv3_tool_parser.py and deepseekv31_tool_parser.py:
   the same regexes, "content is the text before <｜tool▁calls▁begin｜>, None when empty").
   Cases where our parser deliberately differs carry "ours" with the reason.

Run with the oracle venv:
  /work/venv/bin/python tools/server/make_chat_tools_fixture.py /work/shared/data/tokenizers/deepseek-v3
"""
import argparse
import gzip
import json
import os
import random
import re

import tokenizers
from transformers import AutoTokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
V31_TEMPLATE = os.path.join(ROOT, "tests/unit/tokenizer/data/deepseek_v31_chat_template.jinja")
RENDER_OUT = os.path.join(ROOT, "tests/unit/tokenizer/data/deepseek_chat_tools.jsonl.gz")
PARSE_OUT = os.path.join(ROOT, "tests/unit/server/data/deepseek_tool_parse.json")


def call(name, args, i=0):
    return {"id": f"call_{i}", "type": "function", "function": {"name": name, "arguments": args}}


W = call("get_weather", '{"city": "Paris"}', 1)
A = call("add", '{"a": 1, "b": 2}', 2)
U = call("translate", '{"text": "日本語 ✓", "to": "en"}', 3)
PRETTY = call("search", '{\n  "query": "deepseek",\n  "limit": 3\n}', 4)

HAND = [
    [{"role": "user", "content": "Hello"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
     {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Weather?"}],
    [{"role": "user", "content": "Weather in Paris?"},
     {"role": "assistant", "content": None, "tool_calls": [W]},
     {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 21}'}],
    [{"role": "user", "content": "Weather in Paris?"},
     {"role": "assistant", "content": None, "tool_calls": [W]},
     {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 21}'},
     {"role": "assistant", "content": "It is 21 degrees."}],
    [{"role": "user", "content": "Two things"},
     {"role": "assistant", "content": None, "tool_calls": [W, A]},
     {"role": "tool", "tool_call_id": "call_1", "content": "21"},
     {"role": "tool", "tool_call_id": "call_2", "content": "3"},
     {"role": "assistant", "content": "It is 21 and 3."},
     {"role": "user", "content": "Thanks"}],
    # Two tool-call turns (V3's is_first and is_output_first are never reset).
    [{"role": "system", "content": "You are a helpful assistant."},
     {"role": "user", "content": "Paris?"},
     {"role": "assistant", "content": None, "tool_calls": [W]},
     {"role": "tool", "content": "21"},
     {"role": "assistant", "content": "21 degrees."},
     {"role": "user", "content": "And 1+2, and translate"},
     {"role": "assistant", "content": None, "tool_calls": [A, U]},
     {"role": "tool", "content": "3"},
     {"role": "tool", "content": "Japanese"}],
    # Content next to the calls (V3 writes only the content; V3.1 both).
    [{"role": "user", "content": "Paris?"},
     {"role": "assistant", "content": "Let me look.", "tool_calls": [W]},
     {"role": "tool", "content": "21"}],
    # Pretty-printed arguments, unicode, a tool result followed by the user.
    [{"role": "user", "content": "Find it"},
     {"role": "assistant", "content": None, "tool_calls": [PRETTY]},
     {"role": "tool", "content": "[\"a\", \"b\"]"},
     {"role": "user", "content": "ok, now ✓ 日本"}],
    # An assistant turn with reasoning in its history text (V3.1 drops what precedes </think>).
    [{"role": "user", "content": "1+1?"},
     {"role": "assistant", "content": "<think>easy</think>2"},
     {"role": "user", "content": "2+2?"}],
    # Empty call list.
    [{"role": "user", "content": "x"}, {"role": "assistant", "content": None, "tool_calls": []},
     {"role": "user", "content": "y"}],
    # Only a system prompt / only tool outputs.
    [{"role": "system", "content": "S1"}, {"role": "system", "content": "S2"}],
    [{"role": "tool", "content": "out"}],
]


def random_conversations(rng, n):
    words = ["alpha", "beta", "gamma", "ünïcode", "日本語", "emoji 🚀", "tabs\tand\nnewlines", "{\"j\": 1}",
             "<think>", "</think>", "  spaces  ", ""]
    names = ["get_weather", "add", "search_web", "run_code"]

    def text():
        return " ".join(rng.choice(words) for _ in range(rng.randint(1, 4)))

    out = []
    for _ in range(n):
        msgs = []
        if rng.random() < 0.5:
            msgs.append({"role": "system", "content": text()})
        for _ in range(rng.randint(1, 4)):
            msgs.append({"role": "user", "content": text()})
            r = rng.random()
            if r < 0.5:
                calls = [call(rng.choice(names), json.dumps({"q": text(), "n": rng.randint(0, 9)}, ensure_ascii=rng.random() < 0.5), k)
                         for k in range(rng.randint(1, 3))]
                msgs.append({"role": "assistant", "content": None if rng.random() < 0.8 else text(), "tool_calls": calls})
                for _ in calls:
                    msgs.append({"role": "tool", "content": text()})
                if rng.random() < 0.7:
                    msgs.append({"role": "assistant", "content": text()})
            elif r < 0.9:
                msgs.append({"role": "assistant", "content": text()})
        out.append(msgs)
    return out


def vllm_extract(output, fmt):
    """vLLM's extract_tool_calls for deepseek_v3 (fmt "deepseek_v3") / deepseek_v31 (restated)."""
    if "<｜tool▁calls▁begin｜>" not in output:
        return {"tools_called": False, "tool_calls": [], "content": output}
    if fmt == "deepseek_v3":
        regex = re.compile(r"<｜tool▁call▁begin｜>(?P<type>.*)<｜tool▁sep｜>(?P<function_name>.*)\n```json\n"
                           r"(?P<function_arguments>.*)\n```<｜tool▁call▁end｜>")
        calls = [{"name": m[1], "arguments": m[2]} for m in regex.findall(output)]
    else:
        regex = re.compile(r"<｜tool▁call▁begin｜>(?P<function_name>.*?)<｜tool▁sep｜>(?P<function_arguments>.*?)"
                           r"<｜tool▁call▁end｜>")
        calls = [{"name": m[0], "arguments": m[1]} for m in regex.findall(output)]
    content = output[: output.find("<｜tool▁calls▁begin｜>")]
    return {"tools_called": True, "tool_calls": calls, "content": content if content else None}


def parse_cases():
    B, E = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
    cb, ce, sep = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"

    def v3(name, args):
        return f"{cb}function{sep}{name}\n```json\n{args}\n```{ce}"

    def v31(name, args):
        return f"{cb}{name}{sep}{args}{ce}"

    cases = []
    for fmt, one, join in (("deepseek_v3", v3, "\n"), ("deepseek_v31", v31, "")):
        outputs = [
            "plain text, no calls",
            B + one("get_weather", '{"city": "Paris"}') + E,
            "Let me check." + B + one("get_weather", '{"city": "Paris"}') + join + one("add", '{"a": 1, "b": 2}') + E,
            B + one("translate", '{"text": "日本語 ✓"}') + E,
            "prefix" + B + one("f", "{}") + E + " trailing text",
            B + one("f", '{"x": [1, {"y": null}]}') + join + one("g", '{"s": "a}b"}') + join + one("h", "{}") + E,
        ]
        for o in outputs:
            cases.append({"format": fmt, "output": o, "vllm": vllm_extract(o, fmt)})
        # Arguments over several lines: vLLM's regexes (no DOTALL) drop the call; ours keeps it.
        o = B + one("search", '{\n  "q": "x"\n}') + E
        cases.append({"format": fmt, "output": o, "vllm": vllm_extract(o, fmt),
                      "ours": {"tool_calls": [{"name": "search", "arguments": '{\n  "q": "x"\n}'}], "content": None},
                      "why": "arguments may span lines (vLLM's '.' does not match a newline and drops the call)"})
    return cases


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("tokenizer_dir")
    args = ap.parse_args()
    hf = AutoTokenizer.from_pretrained(args.tokenizer_dir)
    raw = tokenizers.Tokenizer.from_file(os.path.join(args.tokenizer_dir, "tokenizer.json"))
    v31 = open(V31_TEMPLATE, encoding="utf-8").read()
    rng = random.Random(15)
    conversations = HAND + random_conversations(rng, 80)
    rows = []
    for fmt, template in (("deepseek_v3", None), ("deepseek_v31", v31)):
        for messages in conversations:
            for add_generation_prompt in (True, False):
                for thinking in ((False, True) if fmt == "deepseek_v31" else (False,)):
                    try:
                        text = hf.apply_chat_template(messages, tokenize=False, chat_template=template,
                                                      add_generation_prompt=add_generation_prompt, thinking=thinking)
                    except Exception as e:  # noqa: BLE001 (a template that cannot render this; skipped)
                        print(f"{fmt}: skipped a conversation: {type(e).__name__}: {e}")
                        continue
                    row = {"format": fmt, "messages": messages, "add_generation_prompt": add_generation_prompt,
                           "thinking": thinking, "text": text}
                    if fmt == "deepseek_v3":
                        row["ids"] = raw.encode(text, add_special_tokens=False).ids
                    rows.append(row)
    with gzip.open(RENDER_OUT, "wt", encoding="utf-8", compresslevel=9) as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    print(f"{RENDER_OUT}: {len(rows)} renderings, {os.path.getsize(RENDER_OUT)} bytes")
    os.makedirs(os.path.dirname(PARSE_OUT), exist_ok=True)
    with open(PARSE_OUT, "w", encoding="utf-8") as f:
        json.dump(parse_cases(), f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"{PARSE_OUT}: written")


if __name__ == "__main__":
    main()

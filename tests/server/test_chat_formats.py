"""DeepSeek-V3 and V3.1 chat formats end to end: the prompt the server renders (POST /tokenize, then
/detokenize) equals transformers' rendering of the checkpoint's template (the rows of
tests/unit/tokenizer/data/deepseek_chat_tools.jsonl.gz, tools/server/make_chat_tools_fixture.py),
the format follows the checkpoint (a tokenizer whose chat_template is V3.1's), and forced tool
calls follow the function's JSON Schema through the grammar engine."""
import gzip
import json
import os
import shutil

import httpx
import jsonschema
import openai
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = os.path.join(ROOT, "models", "deepseek-v3-tiny-code")
ROWS = os.path.join(ROOT, "tests", "unit", "tokenizer", "data", "deepseek_chat_tools.jsonl.gz")
V31_TEMPLATE = os.path.join(ROOT, "tests", "unit", "tokenizer", "data", "deepseek_v31_chat_template.jinja")
CALLS_BEGIN, CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
CALL_BEGIN, CALL_END, SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"

STRICT_WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                                    "unit": {"enum": ["C", "F"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}
STRICT_ADD = {"type": "function", "function": {
    "name": "add", "parameters": {"type": "object", "properties": {"a": {"type": "integer", "minimum": -99, "maximum": 99},
                                                 "b": {"type": "integer", "minimum": -99, "maximum": 99}},
                                  "required": ["a", "b"], "additionalProperties": False}}}


def rows(fmt, limit):
    with gzip.open(ROWS, "rt", encoding="utf-8") as f:
        out = [r for r in map(json.loads, f) if r["format"] == fmt and r["add_generation_prompt"]]
    # The hand-written conversations first (tool calls, results, several turns), then random ones.
    return out[:limit]


def rendered(url, messages, thinking=False):
    r = httpx.post(url + "/tokenize", json={"messages": messages, "chat_template_kwargs": {"thinking": thinking}},
                   timeout=60)
    assert r.status_code == 200, r.text
    d = httpx.post(url + "/detokenize", json={"tokens": r.json()["tokens"]}, timeout=60)
    assert d.status_code == 200, d.text
    return d.json()["prompt"]


@pytest.fixture(scope="module")
def v31_server(tmp_path_factory, start_module_server):
    """The embedded model with a tokenizer whose chat_template is DeepSeek-V3.1's."""
    d = tmp_path_factory.mktemp("v31_tokenizer")
    shutil.copy(os.path.join(TINY, "tokenizer.json"), d / "tokenizer.json")
    with open(os.path.join(TINY, "tokenizer_config.json"), encoding="utf-8") as f:
        config = json.load(f)
    with open(V31_TEMPLATE, encoding="utf-8") as f:
        config["chat_template"] = f.read()
    (d / "tokenizer_config.json").write_text(json.dumps(config, ensure_ascii=False), encoding="utf-8")
    return start_module_server("--tokenizer", str(d), "--reasoning-parser", "deepseek_v3")


def test_v3_rendering_equals_transformers(server):
    checked = 0
    for row in rows("deepseek_v3", 40):
        assert rendered(server.url, row["messages"]) == row["text"], row["messages"]
        checked += 1
    assert checked >= 30


def test_v31_rendering_equals_transformers(v31_server):
    checked = 0
    for row in [r for r in rows("deepseek_v31", 80)]:
        assert rendered(v31_server.url, row["messages"], row["thinking"]) == row["text"], row
        checked += 1
    assert checked >= 40


def test_v31_tool_calls_parsed_and_thinking(v31_server, model_name):
    c = openai.OpenAI(base_url=v31_server.url + "/v1", api_key="x", max_retries=0)
    out = ("Checking\\." + CALLS_BEGIN + CALL_BEGIN + "get_weather" + SEP + '\\{"city": "Oslo"\\}' + CALL_END
           + CALL_BEGIN + "add" + SEP + '\\{"a": 1\\}' + CALL_END + CALLS_END)
    r = c.chat.completions.create(model=model_name, messages=[{"role": "user", "content": "Oslo?"}],
                                  tools=[STRICT_WEATHER, STRICT_ADD], max_tokens=300, temperature=0,
                                  extra_body={"guided_regex": out})
    m = r.choices[0].message
    assert m.content == "Checking."
    assert [(t.function.name, json.loads(t.function.arguments)) for t in m.tool_calls] == [
        ("get_weather", {"city": "Oslo"}), ("add", {"a": 1})]
    assert r.choices[0].finish_reason == "tool_calls"
    # Thinking mode: the prompt opens the reply with <think>, the reply's reasoning is split off.
    r = c.chat.completions.create(model=model_name, messages=[{"role": "user", "content": "Hi"}], max_tokens=60,
                                  temperature=0, extra_body={"guided_regex": "plan</think>done",
                                                             "chat_template_kwargs": {"thinking": True}})
    assert (r.choices[0].message.reasoning_content, r.choices[0].message.content) == ("plan", "done")
    assert rendered(v31_server.url, [{"role": "user", "content": "Hi"}], True).endswith("<｜Assistant｜><think>")
    assert rendered(v31_server.url, [{"role": "user", "content": "Hi"}], False).endswith("<｜Assistant｜></think>")


@pytest.mark.parametrize("fmt", ["v3", "v31"])
def test_forced_tool_calls_follow_the_schema(fmt, server, v31_server, model_name):
    url = server.url if fmt == "v3" else v31_server.url
    c = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in (STRICT_WEATHER, STRICT_ADD)}
    r = c.chat.completions.create(model=model_name, messages=[{"role": "user", "content": "Weather in Paris?"}],
                                  tools=[STRICT_WEATHER, STRICT_ADD], max_tokens=300, temperature=0.8, seed=3,
                                  tool_choice={"type": "function", "function": {"name": "get_weather"}})
    ch = r.choices[0]
    assert ch.finish_reason == "tool_calls", ch
    (call,) = ch.message.tool_calls
    assert call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), schemas["get_weather"])
    r = c.chat.completions.create(model=model_name, messages=[{"role": "user", "content": "Add 1 and 2."}],
                                  tools=[STRICT_WEATHER, STRICT_ADD], tool_choice="required", max_tokens=300,
                                  temperature=0.8, seed=5, parallel_tool_calls=False)
    ch = r.choices[0]
    assert ch.finish_reason == "tool_calls", ch
    (call,) = ch.message.tool_calls
    jsonschema.validate(json.loads(call.function.arguments), schemas[call.function.name])


def test_forced_tool_call_with_a_bad_schema_is_400(client, model_name):
    bad = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "not": {}}}}
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=model_name, messages=[{"role": "user", "content": "x"}], tools=[bad],
                                       tool_choice="required", max_tokens=5)

"""`deepinfer serve` as users use it: the official `openai` client and httpx against the real binary."""
import json
import re
import threading
import time

import httpx
import jsonschema
import openai
import pytest

CHAT = [{"role": "user", "content": "Write a function that adds two numbers."}]


def metric(server, name):
    text = httpx.get(server.url + "/metrics").text
    total = 0.0
    found = False
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            total += float(line.rsplit(" ", 1)[1])
            found = True
    assert found, f"{name} not in /metrics"
    return total


def sse_events(response):
    """The data: payloads of an SSE response, in order."""
    out = []
    for line in response.iter_lines():
        if line.startswith("data: "):
            out.append(line[len("data: "):])
    return out


# --- endpoints ---

def test_health_version_models(server, model_name):
    assert httpx.get(server.url + "/health").status_code == 200
    assert httpx.get(server.url + "/version").json()["version"]
    models = httpx.get(server.url + "/v1/models").json()
    assert models["object"] == "list" and models["data"][0]["object"] == "model"
    assert model_name == "deepseek-v3-tiny-code"


def test_openai_models_list(client, model_name):
    assert [m.id for m in client.models.list()] == [model_name]


def test_completion(client, server, model_name):
    r = client.completions.create(model=model_name, prompt="def add(a, b):", max_tokens=5, temperature=0,
                                  extra_body={"ignore_eos": True})
    assert r.id.startswith("cmpl-") and r.object == "text_completion"
    assert len(r.choices) == 1 and r.choices[0].finish_reason == "length"
    n_prompt = httpx.post(server.url + "/tokenize", json={"prompt": "def add(a, b):"}).json()["count"]
    assert r.usage.prompt_tokens == n_prompt
    assert r.usage.completion_tokens == 5 and r.usage.total_tokens == n_prompt + 5
    # The same prompt as token ids gives the same greedy text.
    ids = httpx.post(server.url + "/tokenize", json={"prompt": "def add(a, b):"}).json()["tokens"]
    r2 = client.completions.create(model=model_name, prompt=ids, max_tokens=5, temperature=0,
                                   extra_body={"ignore_eos": True})
    assert r2.choices[0].text == r.choices[0].text


def test_completion_list_of_prompts_and_echo(client, model_name):
    r = client.completions.create(model=model_name, prompt=["def f(x):", "import os"], max_tokens=3,
                                  temperature=0, n=2, echo=True)
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    assert r.choices[0].text.startswith("def f(x):") and r.choices[2].text.startswith("import os")
    assert r.choices[0].text == r.choices[1].text  # greedy: both samples agree


def test_chat(client, model_name):
    r = client.chat.completions.create(model=model_name, messages=CHAT, max_tokens=8, temperature=0)
    assert r.id.startswith("chatcmpl-") and r.object == "chat.completion"
    c = r.choices[0]
    assert c.message.role == "assistant" and isinstance(c.message.content, str)
    assert c.finish_reason in ("stop", "length")
    assert r.usage.completion_tokens <= 8
    r2 = client.chat.completions.create(model=model_name, messages=CHAT, max_completion_tokens=8, temperature=0)
    assert r2.choices[0].message.content == c.message.content


def test_chat_stream_matches_non_stream(client, model_name):
    full = client.chat.completions.create(model=model_name, messages=CHAT, max_tokens=12, temperature=0)
    chunks = list(client.chat.completions.create(model=model_name, messages=CHAT, max_tokens=12, temperature=0,
                                                 stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(ch.object == "chat.completion.chunk" and ch.id == chunks[0].id for ch in chunks)
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == full.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == full.choices[0].finish_reason
    assert all(ch.usage is None for ch in chunks)


def test_stream_raw_sse_and_done(server, model_name):
    with httpx.stream("POST", server.url + "/v1/completions",
                      json={"model": model_name, "prompt": "x = ", "max_tokens": 4, "stream": True}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = sse_events(r)
    assert events[-1] == "[DONE]"
    body = [json.loads(e) for e in events[:-1]]
    assert body[-1]["choices"][0]["finish_reason"] in ("stop", "length")


def test_stream_include_usage(client, model_name):
    chunks = list(client.completions.create(model=model_name, prompt="for i in", max_tokens=6, temperature=0,
                                            stream=True, stream_options={"include_usage": True},
                                            extra_body={"ignore_eos": True}))
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 6
    assert all(ch.usage is None for ch in chunks[:-1])


def test_n_streaming_interleaved(client, model_name):
    chunks = list(client.chat.completions.create(model=model_name, messages=CHAT, max_tokens=6, n=3,
                                                 temperature=1.0, seed=3, stream=True))
    texts = {0: "", 1: "", 2: ""}
    finished = set()
    for ch in chunks:
        for c in ch.choices:
            texts[c.index] += c.delta.content or ""
            if c.finish_reason:
                finished.add(c.index)
    assert finished == {0, 1, 2}
    full = client.chat.completions.create(model=model_name, messages=CHAT, max_tokens=6, n=3, temperature=1.0,
                                          seed=3)
    assert [c.index for c in full.choices] == [0, 1, 2]
    assert [c.message.content for c in full.choices] == [texts[0], texts[1], texts[2]]


def test_seed_gives_identical_text(client, model_name):
    kw = dict(model=model_name, prompt="class Stack:", max_tokens=16, temperature=1.0, top_p=0.95, seed=1234,
              extra_body={"ignore_eos": True})
    a = client.completions.create(**kw).choices[0].text
    b = client.completions.create(**kw).choices[0].text
    assert a == b
    others = {client.completions.create(**{**kw, "seed": s}).choices[0].text for s in (1, 2, 3)}
    assert len(others | {a}) > 1, "different seeds all gave the same text"


def test_sampling_fields_accepted(client, model_name):
    r = client.completions.create(model=model_name, prompt="def", max_tokens=4, temperature=0.7, top_p=0.9,
                                  presence_penalty=0.5, frequency_penalty=0.5, seed=1, user="someone",
                                  extra_body={"top_k": 20, "min_p": 0.05, "repetition_penalty": 1.1,
                                              "min_tokens": 2})
    assert r.usage.completion_tokens >= 2


def test_stop_string(client, model_name):
    base = client.completions.create(model=model_name, prompt="def add(a, b):", max_tokens=24, temperature=0,
                                     extra_body={"ignore_eos": True}).choices[0].text
    assert len(base) > 6
    stop = base[3:6]
    cut = base[:base.index(stop)]
    r = client.completions.create(model=model_name, prompt="def add(a, b):", max_tokens=24, temperature=0,
                                  stop=[stop], extra_body={"ignore_eos": True})
    assert r.choices[0].text == cut and r.choices[0].finish_reason == "stop"
    assert r.choices[0].model_extra["stop_reason"] == stop  # vLLM's field: which stop string
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model=model_name, prompt="def add(a, b):", max_tokens=24, temperature=0, stop=stop, stream=True,
        extra_body={"ignore_eos": True}) if c.choices)
    assert streamed == cut


def test_chat_logprobs(client, model_name):
    r = client.chat.completions.create(model=model_name, messages=CHAT, max_tokens=4, temperature=0,
                                       logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    for entry in content:
        assert entry.logprob <= 0 and len(entry.top_logprobs) == 3
        assert entry.top_logprobs[0].logprob >= entry.top_logprobs[-1].logprob
        assert abs(entry.top_logprobs[0].logprob - entry.logprob) < 1e-4  # greedy picks the top one


def test_completion_logprobs(client, model_name):
    r = client.completions.create(model=model_name, prompt="import", max_tokens=3, temperature=0, logprobs=2,
                                  extra_body={"ignore_eos": True})
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 3
    assert "".join(lp.tokens) == r.choices[0].text
    assert all(len(t) <= 2 for t in lp.top_logprobs)


def test_top_logprobs_include_the_chosen_token(client, model_name):
    """vLLM's lists: the chosen token first, then the most likely ones without it. Chat's
    top_logprobs has k entries (the chosen one in place of the k-th when it is not in the top k);
    completions' dict k + 1 (the chosen one besides the top k). Sampled hot, so many chosen tokens
    are not the most likely ones."""
    k = 2
    r = client.chat.completions.create(model=model_name, messages=CHAT, max_tokens=48, temperature=2.0, seed=5,
                                       logprobs=True, top_logprobs=k, extra_body={"ignore_eos": True})
    outside = 0
    for entry in r.choices[0].logprobs.content:
        top = entry.top_logprobs
        assert len(top) == k
        assert top[0].token == entry.token and top[0].logprob == entry.logprob
        rest = [t.logprob for t in top[1:]]
        assert rest == sorted(rest, reverse=True)
        if all(v > entry.logprob for v in rest):
            outside += 1  # below every other listed one: not the most likely
    assert outside > 0, "no sampled token outside the top k: the case is not exercised"
    # top_logprobs 0: logprobs of the chosen tokens, no alternatives (vLLM).
    r0 = client.chat.completions.create(model=model_name, messages=CHAT, max_tokens=3, temperature=0,
                                        logprobs=True, top_logprobs=0)
    assert all(e.top_logprobs == [] for e in r0.choices[0].logprobs.content)

    c = client.completions.create(model=model_name, prompt="def add(a, b):", max_tokens=48, temperature=2.0, seed=5,
                                  logprobs=k, extra_body={"ignore_eos": True})
    lp = c.choices[0].logprobs
    extra = 0
    for tok, value, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert len(top) <= k + 1
        if any("\ufffd" in t for t in top):
            continue  # partial UTF-8 tokens share the key "\ufffd" (as in vLLM's dict)
        assert top[tok] == value, (tok, top)
        assert len(top) >= k
        extra += len(top) == k + 1
    assert extra > 0, "no sampled token outside the top k: the case is not exercised"
    # logprobs 0: the chosen token alone.
    c0 = client.completions.create(model=model_name, prompt="import", max_tokens=3, temperature=0, logprobs=0)
    lp0 = c0.choices[0].logprobs
    assert [list(t) for t in lp0.top_logprobs] == [[t] for t in lp0.tokens]


def test_completion_echo_logprobs(server, client, model_name):
    """echo + logprobs: the prompt's tokens first (null first logprob), then the completion's; the
    prompt entries equal the logprobs a decode computed for the same tokens (an independent path)."""
    ids = httpx.post(server.url + "/tokenize", json={"prompt": "def add(a, b):"}).json()["tokens"]
    gen = client.completions.create(model=model_name, prompt=ids, max_tokens=4, temperature=0, logprobs=1,
                                    extra_body={"ignore_eos": True})
    more = httpx.post(server.url + "/tokenize", json={"prompt": gen.choices[0].text}).json()["tokens"]
    bos = ids[0]
    prompt = ids + [t for t in more if t != bos]
    r = client.completions.create(model=model_name, prompt=prompt, max_tokens=2, temperature=0, logprobs=2,
                                  echo=True, extra_body={"ignore_eos": True})
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == len(prompt) + 2
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert all(v <= 0 for v in lp.token_logprobs[1:])
    assert all(1 <= len(t) <= 3 for t in lp.top_logprobs[1:])  # the prompt token besides the top 2
    assert all(t[tok] == v for tok, v, t in zip(lp.tokens[1:], lp.token_logprobs[1:], lp.top_logprobs[1:])
               if not any("\ufffd" in key for key in t))
    assert lp.text_offset == sorted(lp.text_offset) and lp.text_offset[0] == 0
    assert r.usage.prompt_tokens == len(prompt)
    if lp.tokens[len(ids):len(prompt)] != gen.choices[0].logprobs.tokens[:len(prompt) - len(ids)]:
        pytest.skip("the completion text tokenizes differently")
    for j in range(len(prompt) - len(ids)):
        assert abs(lp.token_logprobs[len(ids) + j] - gen.choices[0].logprobs.token_logprobs[j]) < 2e-3, j
    # Streaming: the echo chunk carries the prompt's entries; the rest follow token by token.
    chunks = list(client.completions.create(model=model_name, prompt=prompt, max_tokens=2, temperature=0,
                                            logprobs=2, echo=True, stream=True, extra_body={"ignore_eos": True}))
    first = chunks[0].choices[0]
    assert first.logprobs.tokens == lp.tokens[:len(prompt)]
    assert first.logprobs.token_logprobs == lp.token_logprobs[:len(prompt)]


def test_prompt_logprobs_extra_field(server, model_name):
    """vLLM's prompt_logprobs on completions (per choice) and chat (top level): None first, then the
    prompt token and the top k of each position by token id; not with stream."""
    url = server.url
    r = httpx.post(url + "/v1/completions", json={"model": model_name, "prompt": "x = [1, 2, 3]", "max_tokens": 1,
                                                  "prompt_logprobs": 2, "n": 2}).json()
    plp = r["choices"][0]["prompt_logprobs"]
    assert r["choices"][1]["prompt_logprobs"] == plp
    assert len(plp) == r["usage"]["prompt_tokens"] and plp[0] is None
    for entry in plp[1:]:
        assert 1 <= len(entry) <= 3
        for tid, e in entry.items():
            assert int(tid) >= 0 and e["logprob"] <= 0 and e["rank"] >= 1 and isinstance(e["decoded_token"], str)
        assert any(e["rank"] == 1 for e in entry.values())
    c = httpx.post(url + "/v1/chat/completions", json={"model": model_name, "messages": CHAT, "max_tokens": 1,
                                                       "prompt_logprobs": 0}).json()
    assert len(c["prompt_logprobs"]) == c["usage"]["prompt_tokens"] and c["prompt_logprobs"][0] is None
    assert all(len(e) == 1 for e in c["prompt_logprobs"][1:])
    e = error_of(httpx.post(url + "/v1/completions", json={"model": model_name, "prompt": "x", "stream": True,
                                                           "prompt_logprobs": 1}), 400)
    assert e["param"] == "prompt_logprobs"
    error_of(httpx.post(url + "/v1/completions", json={"model": model_name, "prompt": "x", "prompt_logprobs": 21}), 400)


def test_logprobs_limits(client, model_name):
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=model_name, messages=CHAT, max_tokens=2, logprobs=True,
                                       top_logprobs=21)
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=model_name, prompt="a", max_tokens=2, logprobs=21)


def test_json_schema_output(client, model_name):
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                                               "age": {"type": "integer", "minimum": 0, "maximum": 99}},
              "required": ["name", "age"], "additionalProperties": False}
    r = client.chat.completions.create(
        model=model_name, messages=[{"role": "user", "content": "A person as JSON."}], max_tokens=64,
        temperature=0.8, seed=5,
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": schema}})
    assert r.choices[0].finish_reason == "stop", r.choices[0].message.content
    jsonschema.validate(json.loads(r.choices[0].message.content), schema)


def test_json_object_output(client, model_name):
    r = client.chat.completions.create(model=model_name, messages=CHAT, max_tokens=48, temperature=0,
                                       response_format={"type": "json_object"})
    c = r.choices[0]
    if c.finish_reason == "stop":
        assert isinstance(json.loads(c.message.content), dict)
    else:  # cut by max_tokens: still a JSON object's prefix
        assert c.message.content.startswith("{")


def test_tokenize_detokenize_roundtrip(server):
    text = "def add(a, b):\n    return a + b\n"
    t = httpx.post(server.url + "/tokenize", json={"prompt": text}).json()
    assert t["count"] == len(t["tokens"]) and t["max_model_len"] > 0
    d = httpx.post(server.url + "/detokenize", json={"tokens": t["tokens"]}).json()
    assert d["prompt"].endswith(text)
    chat = httpx.post(server.url + "/tokenize", json={"messages": CHAT}).json()
    assert chat["count"] > t["count"] - 10
    assert httpx.post(server.url + "/detokenize", json={"tokens": [10 ** 9]}).status_code == 400


def test_metrics_names(server, client, model_name):
    client.completions.create(model=model_name, prompt="x", max_tokens=2)
    text = httpx.get(server.url + "/metrics").text
    for name in ["num_requests_running", "num_requests_waiting", "kv_cache_usage_perc", "prompt_tokens_total",
                 "generation_tokens_total", "request_success_total", "time_to_first_token_seconds",
                 "inter_token_latency_seconds", "e2e_request_latency_seconds", "request_queue_time_seconds",
                 "prefix_cache_queries", "prefix_cache_hits"]:
        assert "deepinfer:" + name in text, name
    assert metric(server, "deepinfer:generation_tokens_total") >= 2
    assert 'deepinfer:request_success_total{finished_reason="length"}' in text
    for name in ["spec_decode_num_drafts_total", "spec_decode_num_draft_tokens_total",
                 "spec_decode_num_accepted_tokens_total"]:
        assert metric(server, "deepinfer:" + name) == 0, name  # speculative decoding is off


def test_engine_thread_metrics(start_server, model_name):
    """deepinfer:engine_* (the step loop's counters, bench/serve_vs_bench.sh compares them with
    `deepinfer bench --throughput`): a fresh server's first request of P prompt tokens and G output
    tokens is one prefill step and G - 1 decode steps of one sequence; the idle clock starts with it.
    Speculation off: drafts would make fewer, longer steps (on by default for an MTP checkpoint)."""
    s = start_server("--num-speculative-tokens", "0")
    url = s.url

    def engine():
        out = {}
        for line in httpx.get(url + "/metrics").text.splitlines():
            if line.startswith("deepinfer:engine_"):
                name, value = line.rsplit(" ", 1)
                out[name] = float(value)
        return out

    before = engine()
    assert before['deepinfer:engine_steps_total{kind="prefill"}'] == 0
    assert before['deepinfer:engine_thread_seconds_total{state="idle"}'] == 0
    r = httpx.post(url + "/v1/completions", json={"model": model_name, "prompt": list(range(10, 30)), "max_tokens": 6,
                                                  "ignore_eos": True, "temperature": 0}).json()
    assert r["usage"]["completion_tokens"] == 6
    time.sleep(0.3)  # idle now
    after = engine()
    assert after['deepinfer:engine_steps_total{kind="prefill"}'] == 1
    assert after['deepinfer:engine_steps_total{kind="decode"}'] == 5
    assert after["deepinfer:engine_step_seqs_total"] == 6
    assert after['deepinfer:engine_thread_seconds_total{state="step"}'] > 0
    assert after['deepinfer:engine_thread_seconds_total{state="task"}'] > 0
    assert after['deepinfer:engine_thread_seconds_total{state="idle"}'] >= 0.2


def test_generation_config_defaults(start_server, model_name, tmp_path):
    """--generation-config DIR (auto: the model's generation_config.json, as vLLM): its sampling
    fields are the defaults of requests that give none, max_new_tokens caps max_tokens."""
    (tmp_path / "generation_config.json").write_text(json.dumps({"temperature": 0.0, "max_new_tokens": 5}))
    s = start_server("--generation-config", str(tmp_path))
    c = openai.OpenAI(base_url=s.url + "/v1", api_key="x", max_retries=0)
    texts = {c.completions.create(model=model_name, prompt="def add(a, b):", max_tokens=30,
                                  extra_body={"ignore_eos": True}).choices[0].text for _ in range(3)}
    assert len(texts) == 1  # greedy by default: no seed, same text
    r = c.chat.completions.create(model=model_name, messages=CHAT, max_tokens=30, extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 5 and r.choices[0].finish_reason == "length"
    # A request's own temperature wins (seeded: the same sampled text again, not greedy's).
    hot = {c.completions.create(model=model_name, prompt="def add(a, b):", max_tokens=5, temperature=2.0, seed=s_,
                                extra_body={"ignore_eos": True}).choices[0].text for s_ in range(4)}
    assert len(hot) > 1


def test_spec_decode_metrics(start_server, model_name):
    s = start_server("--num-speculative-tokens", "2", "--speculator", "ngram")
    c = openai.OpenAI(base_url=s.url + "/v1", api_key="x", max_retries=0)
    c.completions.create(model=model_name, prompt="def f(x):\n    return x\n" * 6, max_tokens=24, temperature=0)
    drafts = metric(s, "deepinfer:spec_decode_num_drafts_total")
    proposed = metric(s, "deepinfer:spec_decode_num_draft_tokens_total")
    accepted = metric(s, "deepinfer:spec_decode_num_accepted_tokens_total")
    per_pos = metric(s, "deepinfer:spec_decode_num_accepted_tokens_per_pos_total")
    assert drafts > 0 and drafts <= proposed <= 2 * drafts
    assert 0 <= accepted <= proposed and per_pos == accepted
    assert 'deepinfer:spec_decode_num_accepted_tokens_per_pos_total{position="0"}' in httpx.get(s.url + "/metrics").text
    # The default (no flag) drafts with the embedded model's MTP layer, and answers as k = 0 does.
    d = start_server()
    prompt, want = "def fibonacci(n):", c.completions.create(model=model_name, prompt="def fibonacci(n):",
                                                             max_tokens=16, temperature=0).choices[0].text
    got = openai.OpenAI(base_url=d.url + "/v1", api_key="x", max_retries=0).completions.create(
        model=model_name, prompt=prompt, max_tokens=16, temperature=0).choices[0].text
    assert got == want
    assert metric(d, "deepinfer:spec_decode_num_draft_tokens_total") > 0


# --- errors ---

def error_of(r, status):
    assert r.status_code == status, r.text
    e = r.json()["error"]
    assert set(e) >= {"message", "type", "param", "code"} and e["code"] == status
    return e


def test_error_wrong_model_and_route(server, client):
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="nope", prompt="x", max_tokens=2)
    error_of(httpx.get(server.url + "/v1/nothing"), 404)


def test_error_bad_fields(server, model_name):
    url = server.url + "/v1/chat/completions"
    for bad, param in [({"temperature": "hot"}, "temperature"), ({"n": 0}, "n"), ({"max_tokens": -1}, "max_tokens"),
                       ({"top_p": 2}, "top_p"), ({"stop": [1]}, "stop"),
                       ({"response_format": {"type": "xml"}}, "response_format")]:
        e = error_of(httpx.post(url, json={"model": model_name, "messages": CHAT, **bad}), 400)
        assert e["param"] == param, e
    error_of(httpx.post(url, json={"model": model_name, "messages": []}), 400)
    error_of(httpx.post(url, json={"model": model_name, "messages": [{"role": "robot", "content": "x"}]}), 400)
    error_of(httpx.post(url, content=b"{not json", headers={"content-type": "application/json"}), 400)
    deep = "[" * 100 + "]" * 100
    e = error_of(httpx.post(url, content=('{"model": "m", "messages": ' + deep + "}").encode()), 400)
    assert "deeper" in e["message"]
    error_of(httpx.post(url, json={"model": model_name, "messages": CHAT,
                                   "response_format": {"type": "json_schema",
                                                       "json_schema": {"name": "x",
                                                                       "schema": {"type": "nonsense"}}}}), 400)


def test_unknown_fields_ignored_with_warning(server, model_name):
    r = httpx.post(server.url + "/v1/completions",
                   json={"model": model_name, "prompt": "x", "max_tokens": 2, "no_such_field": 1})
    assert r.status_code == 200
    time.sleep(0.1)
    assert any("no_such_field" in line for line in server.log)


def test_engine_failure_mid_stream(start_server, model_name, monkeypatch):
    """An engine step that fails after a stream started: a data: error chunk, then [DONE]; a
    non-streaming request gets a 500 error body; the server goes on serving."""
    monkeypatch.setenv("DEEPINFER_SERVE_FAIL_STEP", "4")  # the server's 4th step throws
    s = start_server()
    body = {"model": model_name, "prompt": "def add(a, b):", "max_tokens": 20, "ignore_eos": True,
            "temperature": 0, "stream": True}
    with httpx.stream("POST", s.url + "/v1/completions", json=body, timeout=60) as r:
        assert r.status_code == 200
        events = sse_events(r)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert len(chunks) >= 2 and all("choices" in c for c in chunks[:-1])  # tokens came first
    err = chunks[-1]["error"]
    assert "injected failure" in err["message"] and err["code"] == 500
    ok = httpx.post(s.url + "/v1/completions", json={**body, "stream": False, "max_tokens": 3}, timeout=60)
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 3
    assert metric(s, 'deepinfer:request_success_total{finished_reason="error"}') == 1
    assert metric(s, "deepinfer:num_requests_running") == 0


def test_cors(start_server, model_name):
    """--allowed-origins: the preflight and every reply carry Access-Control-Allow-Origin, the
    generation routes' (whole and streamed) and errors included."""
    s = start_server("--allowed-origins", "*")
    o = {"Origin": "http://example.test"}
    pre = httpx.options(s.url + "/v1/chat/completions", headers={**o, "Access-Control-Request-Method": "POST"})
    assert pre.status_code == 204 and pre.headers["access-control-allow-origin"] == "*"
    assert "POST" in pre.headers["access-control-allow-methods"]
    body = {"model": model_name, "prompt": "x", "max_tokens": 1}
    for r in (httpx.get(s.url + "/v1/models", headers=o), httpx.post(s.url + "/v1/completions", json=body, headers=o),
              httpx.post(s.url + "/v1/completions", json={**body, "model": "nope"}, headers=o)):
        assert r.headers.get("access-control-allow-origin") == "*", r.request.url
    with httpx.stream("POST", s.url + "/v1/completions", json={**body, "stream": True}, headers=o) as r:
        assert r.headers.get("access-control-allow-origin") == "*"
        assert sse_events(r)[-1] == "[DONE]"


def test_error_prompt_past_context(server, client, model_name):
    max_len = httpx.post(server.url + "/tokenize", json={"prompt": "x"}).json()["max_model_len"]
    with pytest.raises(openai.BadRequestError, match="maximum context length"):
        client.completions.create(model=model_name, prompt=[5] * (max_len + 1), max_tokens=2)
    with pytest.raises(openai.BadRequestError, match="maximum context length"):
        client.completions.create(model=model_name, prompt="x", max_tokens=max_len + 10)


def test_error_bad_tool_choice(client, model_name):
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    with pytest.raises(openai.BadRequestError, match="not in tools"):
        client.chat.completions.create(model=model_name, messages=CHAT, tools=tools,
                                       tool_choice={"type": "function", "function": {"name": "g"}})
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=model_name, messages=CHAT, tools=tools, tool_choice="sometimes")
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=model_name, messages=CHAT, tools=[{"type": "function"}])
    r = client.chat.completions.create(model=model_name, messages=CHAT, tools=tools, tool_choice="none",
                                       max_tokens=2)
    assert r.choices[0].message.tool_calls in (None, [])


def test_api_key(start_server, model_name):
    s = start_server("--api-key", "sekret")
    assert httpx.get(s.url + "/health").status_code == 200
    assert httpx.get(s.url + "/metrics").status_code == 200
    error_of(httpx.get(s.url + "/v1/models"), 401)
    error_of(httpx.get(s.url + "/v1/models", headers={"Authorization": "Bearer wrong"}), 401)
    ok = openai.OpenAI(base_url=s.url + "/v1", api_key="sekret", max_retries=0)
    assert ok.completions.create(model=model_name, prompt="x", max_tokens=2).usage.completion_tokens >= 1
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=s.url + "/v1", api_key="bad", max_retries=0).models.list()


def test_body_too_large(start_server):
    s = start_server("--max-request-bytes", "1000")
    r = httpx.post(s.url + "/v1/completions", content=b'{"prompt": "' + b"a" * 5000 + b'"}')
    error_of(r, 413)
    assert httpx.get(s.url + "/health").status_code == 200


def test_queue_full_gets_503(start_server, model_name):
    s = start_server("--max-queued-requests", "1", "--max-num-seqs", "1")
    results = []

    def one():
        r = httpx.post(s.url + "/v1/completions", timeout=60,
                       json={"model": model_name, "prompt": "x", "max_tokens": 32, "ignore_eos": True})
        results.append(r)

    threads = [threading.Thread(target=one) for _ in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    codes = sorted(r.status_code for r in results)
    assert 200 in codes and 503 in codes, codes
    busy = next(r for r in results if r.status_code == 503)
    assert busy.headers["retry-after"] and busy.json()["error"]["code"] == 503


def test_disconnect_aborts(server, model_name):
    before = metric(server, 'deepinfer:request_success_total{finished_reason="abort"}')
    for stream in (True, False):
        with httpx.Client(timeout=60) as c:
            req = c.build_request("POST", server.url + "/v1/completions",
                                  json={"model": model_name, "prompt": "def", "max_tokens": 1500,
                                        "ignore_eos": True, "stream": stream},
                                  timeout=httpx.Timeout(60, read=None if stream else 0.5))
            if stream:
                r = c.send(req, stream=True)
                it = r.iter_lines()
                next(it)
                r.close()
            else:
                with pytest.raises(httpx.ReadTimeout):
                    c.send(req)
    deadline = time.time() + 10
    while time.time() < deadline and (metric(server, "deepinfer:num_requests_running") != 0 or
                                      metric(server, 'deepinfer:request_success_total{finished_reason="abort"}')
                                      < before + 2):
        time.sleep(0.05)
    assert metric(server, "deepinfer:num_requests_running") == 0
    assert metric(server, 'deepinfer:request_success_total{finished_reason="abort"}') >= before + 2
    assert metric(server, "deepinfer:kv_cache_usage_perc") == 0


def test_no_head_of_line_blocking(server, model_name):
    """A short request finishes while a long stream is still running."""
    long_done = threading.Event()

    def long_stream():
        with httpx.stream("POST", server.url + "/v1/completions", timeout=120,
                          json={"model": model_name, "prompt": "def", "max_tokens": 400, "ignore_eos": True,
                                "stream": True}) as r:
            for _ in r.iter_lines():
                pass
        long_done.set()

    t = threading.Thread(target=long_stream)
    t.start()
    time.sleep(0.2)
    r = httpx.post(server.url + "/v1/completions", timeout=60,
                   json={"model": model_name, "prompt": "x", "max_tokens": 2})
    assert r.status_code == 200
    assert not long_done.is_set()
    t.join()


def test_keep_alive_connection_reused(server, model_name):
    with httpx.Client(timeout=30) as c:
        ports = set()
        for _ in range(3):
            r = c.post(server.url + "/v1/completions", json={"model": model_name, "prompt": "x", "max_tokens": 1},
                       extensions={})
            assert r.status_code == 200
            ports.add(r.extensions["network_stream"].get_extra_info("client_addr")[1])
        assert len(ports) == 1


def test_graceful_shutdown_drains(start_server, model_name):
    s = start_server()
    out = {"events": []}
    started = threading.Event()

    def stream():
        with httpx.stream("POST", s.url + "/v1/completions", timeout=120,
                          json={"model": model_name, "prompt": "def", "max_tokens": 120, "ignore_eos": True,
                                "stream": True}) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    out["events"].append(line[6:])
                    started.set()

    t = threading.Thread(target=stream)
    t.start()
    assert started.wait(60)
    assert s.stop() == 0
    t.join()
    assert out["events"][-1] == "[DONE]"
    texts = [json.loads(e) for e in out["events"][:-1]]
    assert texts[-1]["choices"][0]["finish_reason"] == "length"
    assert sum(1 for e in texts if e["choices"][0]["text"]) > 1


# --- DeepSeek formats: tool calls and reasoning ---

# Bounded schemas: forced calls follow them (grammar engine), and the tiny model at temperature 0
# would otherwise write one unbounded string until max_tokens.
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                            "parameters": {"type": "object",
                                                           "properties": {"city": {"type": "string", "maxLength": 16}},
                                                           "additionalProperties": False}}}
ADD = {"type": "function", "function": {"name": "add", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9}},
    "additionalProperties": False}}}
CALLS_BEGIN, CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
CALL_BEGIN, CALL_END, SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"


def test_tool_choice_named_function(client, model_name):
    r = client.chat.completions.create(model=model_name, messages=[{"role": "user", "content": "Weather in Paris?"}],
                                       tools=[WEATHER, ADD], max_tokens=400, temperature=0,
                                       tool_choice={"type": "function", "function": {"name": "get_weather"}})
    c = r.choices[0]
    assert c.finish_reason == "tool_calls", c
    assert c.message.content is None
    (call,) = c.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather" and call.id
    assert call.function.arguments.startswith("{") and call.function.arguments.endswith("}")


def test_tool_choice_required_streamed(client, model_name):
    chunks = list(client.chat.completions.create(
        model=model_name, messages=[{"role": "user", "content": "Add 1 and 2."}], tools=[WEATHER, ADD],
        tool_choice="required", max_tokens=400, temperature=0, stream=True))
    deltas = [tc for ch in chunks if ch.choices for tc in (ch.choices[0].delta.tool_calls or [])]
    assert len(deltas) == 2
    assert deltas[0].id and deltas[0].function.name in ("get_weather", "add") and deltas[0].function.arguments == ""
    assert deltas[1].index == 0 and deltas[1].function.arguments.startswith("{")
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_tool_calls_parsed_under_auto(client, model_name):
    forced = ("Checking\\." + CALLS_BEGIN + CALL_BEGIN + "function" + SEP + "get_weather\\n```json\\n"
              + '\\{"city": "Oslo"\\}' + "\\n```" + CALL_END + "\\n" + CALL_BEGIN + "function" + SEP
              + "add\\n```json\\n" + '\\{"a": 1\\}' + "\\n```" + CALL_END + CALLS_END)
    r = client.chat.completions.create(model=model_name, messages=[{"role": "user", "content": "Oslo?"}],
                                       tools=[WEATHER, ADD], max_tokens=400, temperature=0,
                                       extra_body={"guided_regex": forced})
    c = r.choices[0]
    assert c.message.content == "Checking."
    assert [(t.function.name, json.loads(t.function.arguments)) for t in c.message.tool_calls] == [
        ("get_weather", {"city": "Oslo"}), ("add", {"a": 1})]
    assert len({t.id for t in c.message.tool_calls}) == 2
    assert c.finish_reason == "tool_calls"


def test_tool_results_rendered_back(client, model_name):
    messages = [{"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "call_1", "type": "function",
                     "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 21}'}]
    r = client.chat.completions.create(model=model_name, messages=messages, tools=[WEATHER], max_tokens=4,
                                       temperature=0)
    assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")
    with_tools = httpx.post(client.base_url.join("/tokenize").__str__(), json={"messages": messages}).json()
    assert with_tools["count"] > 20


def test_reasoning_content(start_server, model_name):
    s = start_server("--reasoning-parser", "deepseek_v3")
    c = openai.OpenAI(base_url=s.url + "/v1", api_key="x", max_retries=0)
    kw = dict(model=model_name, messages=CHAT, max_tokens=60, temperature=0,
              extra_body={"guided_regex": "<think>plan it</think>done", "chat_template_kwargs": {"thinking": True}})
    r = c.chat.completions.create(**kw)
    m = r.choices[0].message
    assert m.reasoning_content == "plan it" and m.content == "done"
    chunks = list(c.chat.completions.create(**kw, stream=True))
    reasoning = "".join(getattr(ch.choices[0].delta, "reasoning_content", None) or "" for ch in chunks if ch.choices)
    content = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert (reasoning, content) == ("plan it", "done")
    # Without thinking, the deepseek_v3 parser leaves the text alone.
    kw["extra_body"] = {"guided_regex": "<think>plan it</think>done", "chat_template_kwargs": {"thinking": False}}
    assert c.chat.completions.create(**kw).choices[0].message.content == "<think>plan it</think>done"

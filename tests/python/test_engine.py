"""The Python package against the CLI and against its own contract (issue 18 items 1-2).

Run with the package importable (a wheel installed by tools/test.sh, or PYTHONPATH at a
DEEPINFER_PYTHON=ON build's python/ directory) and DEEPINFER_CLI naming the `deepinfer` binary.
"""
import json
import os
import subprocess
import sys
import threading

import pytest

import deepinfer
from deepinfer import OfflineEngine, SamplingParams

CLI = os.environ.get("DEEPINFER_CLI", "")


@pytest.fixture(scope="module")
def engine():
    return OfflineEngine(num_threads=2)


# Requests both sides run: greedy, seeded sampled (two seeds, top-p/top-k), a stop string, chat.
REQUESTS = [
    {"prompt": "def fibonacci(n):", "temperature": 0.0, "max_tokens": 24},
    {"prompt": "def add(a, b):", "temperature": 0.8, "top_p": 0.9, "seed": 7, "max_tokens": 20},
    {"prompt": "def add(a, b):", "temperature": 0.8, "top_k": 20, "seed": 8, "max_tokens": 20},
    {"prompt": "import os\n", "temperature": 0.0, "max_tokens": 30, "stop": ["\n\n"]},
    {"messages": [{"role": "user", "content": "Write a function that reverses a list."}],
     "temperature": 0.0, "max_tokens": 16},
]


def _params(req):
    kw = {k: v for k, v in req.items() if k not in ("prompt", "messages")}
    return SamplingParams(**kw)


def _prompt(req):
    return req["prompt"] if "prompt" in req else req["messages"]


@pytest.mark.skipif(not CLI, reason="DEEPINFER_CLI not set")
def test_outputs_equal_the_cli(engine, tmp_path):
    inp = tmp_path / "in.jsonl"
    out = tmp_path / "out.jsonl"
    inp.write_text("".join(json.dumps(r) + "\n" for r in REQUESTS))
    subprocess.run([CLI, "generate", "--input", str(inp), "--output", str(out), "--generation-config", "none",
                    "--threads", "2"], check=True, capture_output=True, timeout=600)
    cli = {}
    for line in out.read_text().splitlines():
        rec = json.loads(line)
        cli[rec["index"]] = rec
    outs = engine.generate([_prompt(r) for r in REQUESTS], [_params(r) for r in REQUESTS])
    assert len(outs) == len(REQUESTS)
    for i, o in enumerate(outs):
        assert o.token_ids == cli[i]["token_ids"], f"request {i}"
        assert o.text == cli[i]["text"], f"request {i}"
        assert o.finish_reason == cli[i]["finish_reason"], f"request {i}"
    # the seeded requests really sampled: different seeds, different continuations
    assert outs[1].token_ids != outs[2].token_ids


def test_batch_order_is_input_order(engine):
    prompts = ["def a():", "class B:", "import sys", "x = [", "# comment"]
    params = [SamplingParams(temperature=0, max_tokens=4 + 5 * i) for i in range(len(prompts))]
    together = engine.generate(prompts, params)
    for i, (p, sp) in enumerate(zip(prompts, params)):
        alone = engine.generate(p, sp)[0]
        assert together[i].token_ids == alone.token_ids
        assert together[i].prompt_token_ids == engine.tokenize(p)
    assert [len(o.token_ids) for o in together] == [4 + 5 * i for i in range(len(prompts))]


def test_token_id_prompts_and_usage(engine):
    ids = engine.tokenize("def square(x):")
    by_text, by_ids = engine.generate(["def square(x):", ids], SamplingParams(temperature=0, max_tokens=8))
    assert by_ids.token_ids == by_text.token_ids
    assert by_ids.usage["prompt_tokens"] == len(ids)
    assert by_ids.usage["completion_tokens"] == 8
    assert by_ids.finish_reason == "length"


def test_n_samples_and_seeds(engine):
    sp = SamplingParams(temperature=1.0, n=3, seed=11, max_tokens=12)
    a = engine.generate("def f(x):", sp)[0]
    b = engine.generate("def f(x):", sp)[0]
    assert [c.index for c in a.outputs] == [0, 1, 2]
    assert [c.token_ids for c in a.outputs] == [c.token_ids for c in b.outputs]  # seeded: reproducible
    assert len({tuple(c.token_ids) for c in a.outputs}) > 1  # the samples differ from each other


def test_logprobs(engine):
    out = engine.generate("def f(x):", SamplingParams(temperature=0, max_tokens=5, logprobs=3))[0]
    assert len(out.logprobs) == 5
    for tok, lp in zip(out.token_ids, out.logprobs):
        assert lp.token_id == tok
        assert len(lp.top) == 3
        assert lp.logprob <= 0.0
        assert lp.top[0][0] == tok  # greedy: the sampled token is the most likely one


def test_structured_output_regex_and_schema(engine):
    out = engine.generate("x = ", SamplingParams(temperature=0.7, seed=3, max_tokens=12,
                                                 so_args={"regex": r"[0-9]{3}-[a-z]{2}"}))[0]
    import re
    assert re.fullmatch(r"[0-9]{3}-[a-z]{2}", out.text), out.text
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"],
              "additionalProperties": False}
    out = engine.generate("data = ", SamplingParams(temperature=0.7, seed=5, max_tokens=40,
                                                    so_args={"json_schema": schema}))[0]
    assert out.finish_reason == "stop", out.text
    value = json.loads(out.text)
    assert set(value) == {"a"} and isinstance(value["a"], int)


def test_stream_deltas_add_up_to_generate(engine):
    sp = SamplingParams(temperature=0, max_tokens=20)
    full = engine.generate("def fibonacci(n):", sp)[0]
    text, ids, updates = "", [], 0
    for upd in engine.stream("def fibonacci(n):", sp):
        updates += 1
        text += upd.outputs[0].delta_text
        ids += upd.outputs[0].delta_token_ids
        last = upd
    assert last.finished and updates > 1
    assert ids == full.token_ids and text == full.text


def test_delta_output_kind_streams_only_the_new_part(engine):
    # output_kind="delta" (vLLM's RequestOutputKind.DELTA): every update's text / token_ids /
    # logprobs hold only what it adds; joined, they are generate()'s whole output, and generate()
    # with the same parameters still returns whole outputs.
    sp = SamplingParams(temperature=0.7, seed=3, max_tokens=20, logprobs=1, output_kind="delta")
    full = engine.generate("def fibonacci(n):", sp)[0]
    assert len(full.outputs[0].token_ids) == 20 and len(full.outputs[0].logprobs) == 20
    text, ids, lps, updates = "", [], [], 0
    for upd in engine.stream("def fibonacci(n):", sp):
        o = upd.outputs[0]
        updates += 1
        assert o.token_ids == o.delta_token_ids and o.text == o.delta_text
        text += o.text
        ids += o.token_ids
        lps += [(lp.token_id, lp.logprob) for lp in o.logprobs]
        last = upd
    assert last.finished and updates > 1
    assert ids == full.outputs[0].token_ids and text == full.outputs[0].text
    assert lps == [(lp.token_id, lp.logprob) for lp in full.outputs[0].logprobs]
    with pytest.raises(ValueError, match="output_kind"):
        SamplingParams(output_kind="final")


def test_engine_stats_count_the_run():
    eng = OfflineEngine(num_threads=2, num_speculative_tokens=0, max_num_seqs=4)
    outs = eng.generate(["def a():", "def b():", "x = 1"], SamplingParams(temperature=0, max_tokens=8,
                                                                          ignore_eos=True))
    st = eng.stats
    assert sum(len(o.outputs[0].token_ids) for o in outs) == st.num_generated_tokens == 24
    assert 1 <= st.num_prefill_steps <= st.num_steps <= st.num_step_seqs
    assert st.num_running_seqs == 0 and st.num_waiting_seqs == 0
    assert st.num_free_kv_blocks == st.num_kv_blocks  # nothing held after the run (no prefix reuse held)
    assert st.spec_varlen == 0 and st.num_speculative_tokens == 0 and st.num_kv_block_copies == 0


def test_abort_a_stream(engine):
    sp = SamplingParams(temperature=0, max_tokens=200, ignore_eos=True)
    seen = 0
    for upd in engine.stream("def long():", sp):
        seen += len(upd.outputs[0].delta_token_ids)
        if seen >= 5:
            assert engine.abort(upd.request_id)
            rid = upd.request_id
            break
    assert not engine.abort(rid)  # gone
    # closing a stream early aborts its request: the engine is idle again afterwards
    gen = engine.stream("def other():", sp)
    next(gen)
    gen.close()
    assert engine.generate("def f():", SamplingParams(temperature=0, max_tokens=3))[0].finish_reason == "length"
    assert not engine._engine.has_unfinished()


def test_generate_while_another_thread_streams(engine):
    sp = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    alone = engine.generate("def stream_me():", sp)[0].token_ids
    result, errors = {}, []

    def streamer():
        try:
            ids = []
            for upd in engine.stream("def stream_me():", sp):
                ids += upd.outputs[0].delta_token_ids
            result["stream"] = ids
        except Exception as e:  # surfaced by the assert below
            errors.append(e)

    t = threading.Thread(target=streamer)
    t.start()
    outs = engine.generate(["def g():", "def h():"], SamplingParams(temperature=0, max_tokens=30))
    t.join(timeout=300)
    assert not t.is_alive() and not errors
    assert result["stream"] == alone
    assert all(o.finish_reason in ("length", "stop") for o in outs)


@pytest.mark.parametrize("kwargs, field", [
    ({"temperature": -1.0}, "temperature"),
    ({"top_p": 0.0}, "top_p"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"n": 0}, "n"),
    ({"max_tokens": "ten"}, "max_tokens"),
    ({"seed": -3}, "seed"),
    ({"stop": [1, 2]}, "stop"),
    ({"logprobs": 1000}, "logprobs"),
    ({"so_args": {"regex": "a", "ebnf": "b"}}, "so_args"),
    ({"so_args": {"grammar": "x"}}, "so_args"),
])
def test_bad_sampling_params_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**kwargs)


def test_bad_requests_raise_and_leave_the_engine_usable(engine):
    with pytest.raises(ValueError, match="prompts"):
        engine.generate([])
    with pytest.raises(ValueError, match=r"prompts\[1\]"):
        engine.generate(["ok", 3.5])
    with pytest.raises(ValueError, match="sampling_params"):
        engine.generate(["a", "b"], [SamplingParams(), SamplingParams(), SamplingParams()])
    too_long = list(range(1, 10)) * (engine.max_model_len // 9 + 2)
    with pytest.raises(ValueError, match=r"prompts\[1\]"):
        engine.generate(["fine", too_long], SamplingParams(max_tokens=2))
    with pytest.raises(ValueError, match="grammar|regex"):
        engine.generate("x", SamplingParams(so_args={"regex": "(unclosed"}))
    assert not engine._engine.has_unfinished()
    assert engine.generate("def f():", SamplingParams(temperature=0, max_tokens=2))[0].finish_reason == "length"


def test_bad_engine_options():
    with pytest.raises(TypeError, match="max_num_seq"):
        OfflineEngine(max_num_seq=4)
    with pytest.raises(ValueError, match="no_such_dir"):
        OfflineEngine(model_path="/no_such_dir")
    with pytest.raises(ValueError, match="backend"):
        OfflineEngine(backend="tpu")


def test_prompt_logprobs_is_teacher_forcing(engine):
    ids = engine.tokenize("def fibonacci(n):\n    if n < 2:\n        return n")
    lps = engine.prompt_logprobs(ids)
    assert len(lps) == len(ids) - 1 and all(x <= 0 for x in lps)
    # Independent path: generate one token after each prefix and read the next prompt token's
    # logprob among the top 20 the sampler reports (a decode-side log-softmax in float).
    compared = 0
    for k in range(1, len(ids) - 1):
        out = engine.generate(ids[:k + 1], SamplingParams(temperature=0, max_tokens=1, logprobs=20))[0]
        top = dict(out.logprobs[0].top)
        if ids[k + 1] in top:
            assert abs(top[ids[k + 1]] - lps[k]) < 1e-4, (k, top[ids[k + 1]], lps[k])
            compared += 1
    assert compared >= (len(ids) - 2) // 2


def test_env_settings_apply(tmp_path):
    # DEEPINFER_* settings are read by the engine as in the CLI: a bad value is refused by name.
    code = ("import deepinfer\n"
            "try:\n    deepinfer.OfflineEngine(num_threads=1)\nexcept ValueError as e:\n    print('ERR', e)\n")
    env = dict(os.environ, DEEPINFER_BATCH_INVARIANT="maybe")
    r = subprocess.run([sys.executable, "-c", code],
                       env=env, capture_output=True, text=True, timeout=300)
    assert "DEEPINFER_BATCH_INVARIANT" in (r.stdout + r.stderr), r.stdout + r.stderr


def test_version_and_embedded_model():
    assert deepinfer.__version__
    assert os.path.isfile(os.path.join(deepinfer.embedded_model_path(), "config.json"))


def test_ctrl_c_stops_a_long_generate_cleanly():
    code = (
        "import signal, sys, deepinfer\n"
        # a process started in the background by a non-interactive shell inherits SIGINT ignored,
        # and Python then installs no KeyboardInterrupt handler: install it, as a terminal has it
        "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
        "e = deepinfer.OfflineEngine(num_threads=1)\n"
        "sp = deepinfer.SamplingParams(temperature=0, max_tokens=100000, ignore_eos=True)\n"
        "print('ready', flush=True)\n"
        "try:\n"
        "    e.generate(['def f():'] * 4, sp)\n"
        "    print('finished?!')\n"
        "except KeyboardInterrupt:\n"
        "    assert not e._engine.has_unfinished()\n"
        "    out = e.generate('def g():', deepinfer.SamplingParams(temperature=0, max_tokens=3))[0]\n"
        "    print('interrupted', out.finish_reason, flush=True)\n")
    import signal
    import time
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "ready"
    time.sleep(1.0)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err
    assert out.strip() == "interrupted length", out + err

"""deepinfer.eval against the CLI's `deepinfer eval` (issue 18 item 3, Python half).

The two stages are one C++ implementation (include/deepinfer/eval.h) reached two ways, so a raw
file written from Python must equal the CLI's record for record (but for where the engine's model
directory lives), and either stage-2 entry point must give the same scores for either file.
"""
import json
import os
import re
import subprocess
import sys

import pytest

import deepinfer
from deepinfer import OfflineEngine, SamplingParams
from deepinfer import eval as di_eval

CLI = os.environ.get("DEEPINFER_CLI", "")
ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
TASKS = os.path.join(ROOT, "tests", "data", "eval", "tasks.jsonl")
needs_cli = pytest.mark.skipif(not CLI, reason="DEEPINFER_CLI names no deepinfer binary")


@pytest.fixture(scope="module")
def engine():
    return OfflineEngine(num_threads=2)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """A slice of the in-tree eval set with every kind in it (arithmetic, code, choice, structured)."""
    items = [json.loads(l) for l in open(TASKS, encoding="utf-8") if l.strip()]
    chosen, seen = [], {}
    for it in items:
        if seen.get(it["kind"], 0) < 2:
            seen[it["kind"]] = seen.get(it["kind"], 0) + 1
            chosen.append(it)
    path = tmp_path_factory.mktemp("eval") / "items.jsonl"
    path.write_text("".join(json.dumps(it) + "\n" for it in chosen), encoding="utf-8")
    return str(path), chosen


def _cli(*args):
    return subprocess.run([CLI, "eval", *args], capture_output=True, text=True, timeout=600)


def _without_engine_dir(rec):
    r = dict(rec)
    r["engine"] = {k: v for k, v in rec["engine"].items() if k != "model_dir"}
    return r


@needs_cli
def test_generate_writes_the_cli_records(engine, dataset, tmp_path):
    path, items = dataset
    params = SamplingParams(temperature=0.7, top_p=0.95, seed=11, max_tokens=24)
    py_out = tmp_path / "py.jsonl"
    recs = di_eval.generate(path, str(py_out), engine=engine, samples=2, sampling_params=params)
    assert len(recs) == 2 * len(items)
    assert [r["task_id"] for r in recs] == [it["id"] for it in items for _ in range(2)]
    assert [r["sample"] for r in recs] == [0, 1] * len(items)
    cli_out = tmp_path / "cli.jsonl"
    r = _cli("generate", "--dataset", path, "--output", str(cli_out), "--samples", "2", "--temperature", "0.7",
             "--top-p", "0.95", "--seed", "11", "--max-tokens", "24", "--threads", "2")
    assert r.returncode == 0, r.stderr[-2000:]
    cli = [json.loads(l) for l in open(cli_out, encoding="utf-8")]
    py = [json.loads(l) for l in open(py_out, encoding="utf-8")]
    assert py == recs
    assert len(cli) == len(py)
    for a, b in zip(py, cli):
        assert _without_engine_dir(a) == _without_engine_dir(b), a["task_id"]
    # Two samples of one seeded item differ (seq_seed + sample) but are each reproducible.
    assert any(py[2 * i]["text"] != py[2 * i + 1]["text"] for i in range(len(items)))


def _sandbox_free(scores):
    """Scores with each code sample's sandbox directory (a fresh temporary name per run) elided."""
    return json.loads(re.sub(r"deepinfer-eval-[A-Za-z0-9]+", "deepinfer-eval-X", json.dumps(scores)))


@needs_cli
def test_score_equals_the_cli_score(engine, dataset, tmp_path):
    path, _ = dataset
    raw = tmp_path / "raw.jsonl"
    di_eval.generate(path, str(raw), engine=engine, samples=1,
                     sampling_params=SamplingParams(temperature=0.0, max_tokens=24))
    ours = di_eval.score(str(raw), output=str(tmp_path / "py_scores.json"), check_structured_output=True)
    r = _cli("score", "--input", str(raw), "--output", str(tmp_path / "cli_scores.json"),
             "--check-structured-output", "--python", sys.executable)
    assert r.returncode in (0, 1), r.stderr[-2000:]
    theirs = json.load(open(tmp_path / "cli_scores.json", encoding="utf-8"))
    assert _sandbox_free(ours) == _sandbox_free(theirs)
    assert json.load(open(tmp_path / "py_scores.json", encoding="utf-8")) == ours
    s = ours["summary"]
    assert s["tasks"] == len(ours["tasks"]) and s["samples"] == len(ours["samples"])
    assert set(s["by_kind"]) >= {"exact_answer", "code", "structured"}
    assert s["structured_output"]["checked"] >= 1


def test_graders_read_edited_outputs(engine, dataset, tmp_path):
    """Stage 2 alone: the right answer written into a record is graded correct, a wrong one not,
    and a code sample passes only when its tests do (a grader can change without inference)."""
    path, items = dataset
    raw = tmp_path / "raw.jsonl"
    recs = di_eval.generate(path, str(raw), engine=engine, samples=1,
                            sampling_params=SamplingParams(temperature=0.0, max_tokens=4))
    arith = next(r for r in recs if r["kind"] == "exact_answer")
    code = next(r for r in recs if r["kind"] == "code")
    right = dict(arith, text=str(arith["item"]["answer"]) + "\n")
    wrong = dict(arith, text="-12345\n", task_id=arith["task_id"] + "-wrong",
                 item=dict(arith["item"], id=arith["task_id"] + "-wrong"))
    broken = dict(code, text=" __import__('sys').exit(3)\n")  # the prompt ends in "return"
    scores = di_eval.score([right, wrong, broken])
    by_id = {t["task_id"]: t for t in scores["tasks"]}
    assert by_id[arith["task_id"]]["pass@1"] == 1.0
    assert by_id[arith["task_id"] + "-wrong"]["pass@1"] == 0.0
    assert by_id[code["task_id"]]["pass@1"] == 0.0
    assert "exit 3" in next(s for s in scores["samples"] if s["task_id"] == code["task_id"])["detail"]


def test_bad_dataset_is_refused_before_inference(tmp_path):
    for body, want in [
        ('{"id": "a", "kind": "exact_match", "prompt": "p", "answer": "x"}\n' * 2, "appears twice"),
        ('{"id": "a", "kind": "essay", "prompt": "p"}\n', "line 1: kind: 'essay'"),
        ('{"id": "a", "kind": "exact_match", "prompt": "p", "answer": "x", "tempreature": 1}\n',
         "unknown field 'tempreature'"),
        ('{"id": "a", "kind": "exact_match", "prompt": "p", "answer": "x", "max_tokens": -3}\n', "max_tokens"),
    ]:
        path = tmp_path / "bad.jsonl"
        path.write_text(body, encoding="utf-8")

        class NoEngine:  # would fail loudly if stage 1 reached the engine
            def __getattr__(self, name):
                raise AssertionError("the engine ran for a bad dataset")

        with pytest.raises(ValueError, match=want):
            di_eval.generate(str(path), str(tmp_path / "out.jsonl"), engine=NoEngine())
        assert not (tmp_path / "out.jsonl").exists()
    with pytest.raises(ValueError, match="samples"):
        di_eval.generate(TASKS, str(tmp_path / "out.jsonl"), samples=0)
    with pytest.raises(ValueError, match="not a raw eval record"):
        di_eval.score([{"id": "x"}])


def test_perplexity_has_the_baseline_bits(engine, tmp_path):
    """The CLI's `eval ppl` and deepinfer.eval.perplexity give the same doubles, bit for bit."""
    texts = [json.loads(l) for l in open(os.path.join(ROOT, "tests/models/ppl_texts.jsonl"), encoding="utf-8")]
    ours = di_eval.perplexity([t["text"] for t in texts], engine=engine)
    assert all(o["ppl"] > 1.0 for o in ours)
    if not CLI:
        pytest.skip("DEEPINFER_CLI names no deepinfer binary")
    out = tmp_path / "ppl.jsonl"
    r = _cli("ppl", "--threads", "2", "--texts", os.path.join(ROOT, "tests/models/ppl_texts.jsonl"),
             "--output", str(out))
    assert r.returncode == 0, r.stderr[-2000:]
    cli = [json.loads(l) for l in open(out, encoding="utf-8")]
    assert [c["ppl_hex"] for c in cli] == [o["ppl_hex"] for o in ours]
    assert [c["nll_hex"] for c in cli] == [o["nll_hex"] for o in ours]

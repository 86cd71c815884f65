"""Two-stage evaluation from Python, the same as `deepinfer eval generate | score | ppl`.

    from deepinfer import OfflineEngine, SamplingParams, eval as di_eval
    engine = OfflineEngine(num_threads=2)
    di_eval.generate("items.jsonl", "raw.jsonl", engine=engine, samples=4,
                     sampling_params=SamplingParams(temperature=0.7, max_tokens=64, seed=11))
    scores = di_eval.score("raw.jsonl")          # never loads a model
    print(scores["summary"]["pass@1"])

Stage 1 writes one raw record per sample (the item, the request, the sampling parameters and
seed, the output text and token ids, the engine's version and config); stage 2 grades that file
alone, so a grader can change without running the model again. Both stages are the C++ code the
CLI runs (include/deepinfer/eval.h): a file written here is scored by `deepinfer eval score` with
the same numbers, and the other way round. Dataset lines: app/eval.h (id, kind, answer / choices /
tests, and request fields: prompt | messages | prompt_token_ids plus sampling fields).
"""
from __future__ import annotations

import json
import math
import os
import struct
import sys
from typing import Any, Optional, Sequence

from . import _core
from . import OfflineEngine, SamplingParams

__all__ = ["generate", "score", "read_records", "perplexity"]


def _checker() -> str:
    return os.path.join(os.path.dirname(__file__), "check_structured.py")


def generate(dataset: str, output: str, engine: Optional[OfflineEngine] = None, samples: int = 1,
             sampling_params: Optional[SamplingParams] = None) -> list:
    """Runs every item of `dataset` (JSONL) `samples` times and writes the raw records to `output`
    (JSONL, dataset order, one line per sample). `sampling_params` fills the fields an item leaves
    out (a missing seed is 0: an eval is reproducible). Every item is checked before the engine
    runs (deepinfer.Error naming the line and field). Returns the records as dicts."""
    if isinstance(samples, bool) or not isinstance(samples, int):
        raise ValueError(f"samples: expected an integer, got {samples!r}")
    defaults = (sampling_params or SamplingParams())._core
    tasks = _core.eval_read_dataset(os.fspath(dataset), samples, defaults)
    engine = engine or OfflineEngine()
    ids = engine._add_core([t.prompt for t in tasks], [t.params for t in tasks])
    final = {}
    for out in engine._updates(ids):
        if out.finished:
            final[out.request_id] = out
    lines = []
    for task, rid in zip(tasks, ids):
        for j in range(samples):
            sample = _core.eval_sample_output(final[rid], j)
            lines.append(_core.eval_raw_record(task, j, sample, engine._config))
    tmp = os.fspath(output) + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write("".join(line + "\n" for line in lines))
    os.replace(tmp, output)  # a finished file or none
    return [json.loads(line) for line in lines]


def read_records(path: str) -> list:
    """The raw records of a file `generate` (or `deepinfer eval generate`) wrote, as JSON texts."""
    with open(path, encoding="utf-8") as f:
        return [line for line in (l.strip() for l in f) if line]


def score(records: Any, output: Optional[str] = None, check_structured_output: bool = False,
          python: Optional[str] = None, code_timeout: float = 10.0) -> dict:
    """Grades raw records: a path, or a list of records (dicts or JSON texts). Returns
    {"summary": {...pass@1, by_kind, structured_output...}, "tasks": [...], "samples": [...]}
    and writes it to `output` when given. Code items run their tests in a sandboxed `python`
    (default: this interpreter); check_structured_output validates every constrained output."""
    if isinstance(records, (str, os.PathLike)):
        texts = read_records(os.fspath(records))
    else:
        texts = [r if isinstance(r, str) else json.dumps(r) for r in records]
    options = _core.EvalScoreOptions()
    options.python = python or sys.executable
    options.code_timeout_s = float(code_timeout)
    options.check_structured_output = bool(check_structured_output)
    options.structured_checker = _checker()
    result = json.loads(_core.eval_score(texts, options))
    if output is not None:
        with open(output, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=2)
            f.write("\n")
    return result


def perplexity(texts: Sequence[Any], engine: Optional[OfflineEngine] = None) -> list:
    """Per-text perplexity by teacher forcing, as `deepinfer eval ppl` computes it (bit for bit:
    log-probabilities summed in token order in doubles, nll = -sum / n, ppl = exp(nll)).
    `texts`: strings or token-id lists. Returns [{"num_tokens", "scored_tokens", "nll", "ppl",
    "nll_hex", "ppl_hex"}] (the *_hex fields are the doubles' IEEE-754 bits, as in the baselines)."""
    engine = engine or OfflineEngine()
    out = []
    for i, t in enumerate(texts):
        lp = engine.prompt_logprobs(t)
        if not lp:
            raise ValueError(f"texts[{i}]: a text needs at least 2 tokens")
        total = 0.0
        for v in lp:  # in token order, as the CLI sums
            total += v
        nll = -total / len(lp)
        ppl = math.exp(nll)
        out.append({"num_tokens": len(lp) + 1, "scored_tokens": len(lp), "nll": nll, "ppl": ppl,
                    "nll_hex": _hex(nll), "ppl_hex": _hex(ppl)})
    return out


def _hex(d: float) -> str:
    return struct.pack(">d", d).hex()

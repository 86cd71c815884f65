"""deepinfer: a C++ inference engine for the DeepSeek model family, from Python.

    from deepinfer import OfflineEngine, SamplingParams
    engine = OfflineEngine()                      # the embedded tiny model, CPU backend
    outs = engine.generate(["def fibonacci(n):"], SamplingParams(temperature=0, max_tokens=32))
    print(outs[0].text)

Names follow DeepInfer's and vLLM's offline APIs. The engine runs in C++ with the GIL
released; several Python threads may call generate() / stream() on one engine at once (their
requests share the engine's batches). DEEPINFER_* environment variables apply as in the CLI.
"""
from __future__ import annotations

import collections
import json
import os
import threading
from typing import Any, Iterable, Iterator, Optional, Sequence, Union

from . import _core
from ._core import (CompletionOutput, EngineStats, Error, RequestOutput, SpecDecodeStats,
                    TokenLogprob)

__version__ = _core.__version__
__all__ = ["OfflineEngine", "SamplingParams", "RequestOutput", "CompletionOutput", "TokenLogprob",
           "SpecDecodeStats", "EngineStats", "Error", "embedded_model_path"]


def embedded_model_path() -> str:
    """The tiny model shipped with the package (the CLI's default model)."""
    packaged = os.path.join(os.path.dirname(__file__), "models", "deepseek-v3-tiny-code")
    return packaged if os.path.isdir(packaged) else _core.embedded_model_dir


_SO_KINDS = ("regex", "json_schema", "ebnf", "json_object")


class SamplingParams:
    """How one request is sampled and when it stops (see include/deepinfer/sampling_params.h).

    so_args: structured output, a dict with one of "regex" (pattern), "json_schema" (a schema
    dict or its text), "ebnf" (grammar text) or "json_object" (True), and optionally
    "any_whitespace" (bool). Values are checked when the object is made: a bad one raises
    ValueError naming the field.

    output_kind: what each update of OfflineEngine.stream() carries, as vLLM's RequestOutputKind:
    "cumulative" (default: every update has the whole text, token_ids and logprobs so far, and
    the new part in delta_text / delta_token_ids) or "delta" (text, token_ids and logprobs hold
    only the new part, so a long stream copies nothing per update that grows with the output).
    generate() always returns whole outputs.
    """

    _OUTPUT_KINDS = ("cumulative", "delta")

    _FIELDS = {
        "n": int, "temperature": float, "top_p": float, "top_k": int, "min_p": float,
        "repetition_penalty": float, "frequency_penalty": float, "presence_penalty": float,
        "max_tokens": int, "min_tokens": int, "ignore_eos": bool,
        "include_stop_str_in_output": bool, "seq_seed": int, "skip_special_tokens": bool,
    }

    def __init__(self, temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0,
                 min_p: float = 0.0, max_tokens: int = 16, stop: Union[None, str, Sequence[str]] = None,
                 seed: Optional[int] = None, seq_seed: int = 0, n: int = 1,
                 logprobs: Optional[int] = None, so_args: Optional[dict] = None,
                 min_tokens: int = 0, repetition_penalty: float = 1.0,
                 frequency_penalty: float = 0.0, presence_penalty: float = 0.0,
                 stop_token_ids: Optional[Sequence[int]] = None, ignore_eos: bool = False,
                 include_stop_str_in_output: bool = False, skip_special_tokens: bool = True,
                 output_kind: str = "cumulative"):
        values = dict(temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p,
                      max_tokens=max_tokens, seq_seed=seq_seed, n=n, min_tokens=min_tokens,
                      repetition_penalty=repetition_penalty, frequency_penalty=frequency_penalty,
                      presence_penalty=presence_penalty, ignore_eos=ignore_eos,
                      include_stop_str_in_output=include_stop_str_in_output,
                      skip_special_tokens=skip_special_tokens)
        core = _core.SamplingParams()
        for name, value in values.items():
            setattr(core, name, _typed(name, value, self._FIELDS[name]))
        if stop is not None:
            stops = [stop] if isinstance(stop, str) else list(stop)
            if not all(isinstance(s, str) for s in stops):
                raise ValueError(f"stop: expected a string or a list of strings, got {stop!r}")
            core.stop = stops
        if stop_token_ids is not None:
            core.stop_token_ids = [_typed("stop_token_ids", t, int) for t in stop_token_ids]
        if seed is not None:
            seed = _typed("seed", seed, int)
            if seed < 0 or seed >= 2**64:
                raise ValueError(f"seed: expected 0 <= seed < 2**64, got {seed}")
            core.seed = seed
        if seq_seed < 0:
            raise ValueError(f"seq_seed: expected >= 0, got {seq_seed}")
        core.logprobs = -1 if logprobs is None else _typed("logprobs", logprobs, int)
        if so_args is not None:
            core.so_args = _so_args(so_args)
        if output_kind not in self._OUTPUT_KINDS:
            raise ValueError(f"output_kind: expected one of {', '.join(self._OUTPUT_KINDS)}, got {output_kind!r}")
        self.output_kind = output_kind
        core.validate()  # deepinfer.Error (a ValueError) naming the field
        self._core = core

    def __getattr__(self, name: str) -> Any:
        if name in ("_core", "output_kind"):
            raise AttributeError(name)
        return getattr(self._core, name)

    def __repr__(self) -> str:
        c = self._core
        return (f"SamplingParams(temperature={c.temperature}, top_p={c.top_p}, top_k={c.top_k}, "
                f"max_tokens={c.max_tokens}, n={c.n}, seed={c.seed}, seq_seed={c.seq_seed})")


def _typed(name: str, value: Any, kind: type) -> Any:
    if kind is bool:
        if not isinstance(value, bool):
            raise ValueError(f"{name}: expected a bool, got {value!r}")
        return value
    if kind is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{name}: expected an integer, got {value!r}")
        if not -2**63 <= value < 2**64:
            raise ValueError(f"{name}: {value} is out of range")
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name}: expected a number, got {value!r}")
    return float(value)


def _so_args(spec: Any) -> "_core.StructuredOutputArgs":
    if not isinstance(spec, dict):
        raise ValueError(f"so_args: expected a dict with one of {', '.join(_SO_KINDS)}, got {spec!r}")
    unknown = set(spec) - set(_SO_KINDS) - {"any_whitespace"}
    if unknown:
        raise ValueError(f"so_args: unknown key {sorted(unknown)[0]!r} (expected {', '.join(_SO_KINDS)}, any_whitespace)")
    kinds = [k for k in _SO_KINDS if k in spec]
    if len(kinds) != 1:
        raise ValueError(f"so_args: expected exactly one of {', '.join(_SO_KINDS)}, got {kinds or 'none'}")
    kind = kinds[0]
    value = spec[kind]
    args = _core.StructuredOutputArgs()
    args.kind = kind
    if kind == "json_schema":
        args.source = value if isinstance(value, str) else json.dumps(value)
    elif kind == "json_object":
        if value is not True:
            raise ValueError(f"so_args: json_object: expected True, got {value!r}")
    else:
        if not isinstance(value, str):
            raise ValueError(f"so_args: {kind}: expected a string, got {value!r}")
        args.source = value
    args.any_whitespace = _typed("so_args.any_whitespace", spec.get("any_whitespace", False), bool)
    return args


def _message(m: Any, where: str) -> "_core.Message":
    if not isinstance(m, dict) or "role" not in m:
        raise ValueError(f"{where}: expected a message dict with 'role' and 'content', got {m!r}")
    msg = _core.Message()
    msg.role = m["role"]
    content = m.get("content")
    if content is None:
        msg.content_is_null = True
    elif isinstance(content, str):
        msg.content = content
    else:
        raise ValueError(f"{where}.content: expected a string or None, got {type(content).__name__}")
    if m.get("tool_calls"):
        calls = []
        for j, call in enumerate(m["tool_calls"]):
            fn = call.get("function", call) if isinstance(call, dict) else None
            if not isinstance(fn, dict) or "name" not in fn:
                raise ValueError(f"{where}.tool_calls[{j}]: expected {{'function': {{'name', 'arguments'}}}}")
            c = _core.MessageToolCall()
            c.name = fn["name"]
            args = fn.get("arguments", "{}")
            c.arguments = args if isinstance(args, str) else json.dumps(args)
            calls.append(c)
        msg.tool_calls = calls
    return msg


def _prompt(p: Any, where: str) -> "_core.Prompt":
    prompt = _core.Prompt()
    if isinstance(p, str):
        prompt.text = p
    elif isinstance(p, dict) and "role" not in p:
        keys = [k for k in ("prompt", "prompt_token_ids", "messages") if k in p]
        if len(keys) != 1:
            raise ValueError(f"{where}: expected exactly one of prompt, prompt_token_ids, messages")
        inner = _prompt(p[keys[0]], f"{where}.{keys[0]}")
        inner.thinking = _typed(f"{where}.thinking", p.get("thinking", False), bool)
        return inner
    elif isinstance(p, (list, tuple)) and p and all(isinstance(t, int) and not isinstance(t, bool) for t in p):
        prompt.token_ids = list(p)
    elif isinstance(p, (list, tuple)) and p and all(isinstance(m, dict) for m in p):
        prompt.messages = [_message(m, f"{where}[{i}]") for i, m in enumerate(p)]
    else:
        raise ValueError(f"{where}: expected a string, a list of token ids or a list of chat messages, "
                         f"got {type(p).__name__}{' (empty)' if isinstance(p, (list, tuple)) and not p else ''}")
    return prompt


def _prompts(prompts: Any) -> list:
    """One prompt or a list of them; a list of message dicts is one conversation."""
    if isinstance(prompts, (str, dict)):
        items = [prompts]
    elif isinstance(prompts, (list, tuple)) and prompts and isinstance(prompts[0], dict) and "role" in prompts[0]:
        items = [list(prompts)]
    elif isinstance(prompts, (list, tuple)) and prompts and all(isinstance(t, int) and not isinstance(t, bool) for t in prompts):
        items = [list(prompts)]
    elif isinstance(prompts, Iterable):
        items = list(prompts)
    else:
        raise ValueError(f"prompts: expected a prompt or a list of prompts, got {type(prompts).__name__}")
    if not items:
        raise ValueError("prompts: the list is empty")
    return [_prompt(p, f"prompts[{i}]") for i, p in enumerate(items)]


class OfflineEngine:
    """The engine. model_path=None runs the embedded tiny model; backend "cpu" or "cuda";
    any other EngineConfig field (include/deepinfer/engine.h) as a keyword: max_num_seqs,
    max_model_len, batch_invariant, enable_prefix_caching, num_speculative_tokens, seed, ..."""

    def __init__(self, model_path: Optional[str] = None, backend: str = "cpu",
                 tokenizer_path: Optional[str] = None, **options: Any):
        config = _core.EngineConfig()
        config.model_dir = embedded_model_path() if model_path is None and "random_weights_config" not in options \
            else (model_path or "")
        config.backend = backend
        if tokenizer_path is not None:
            config.tokenizer_dir = tokenizer_path
        for name, value in options.items():
            if name.startswith("_") or not hasattr(config, name):
                raise TypeError(f"OfflineEngine: unknown option {name!r}")
            current = getattr(config, name)
            kind = type(current) if not isinstance(current, bool) else bool
            setattr(config, name, _typed(name, value, kind) if kind in (int, float, bool) else value)
        self._engine = _core.Engine(config)  # deepinfer.Error for a bad model or config
        config.max_model_len = self._engine.max_model_len()
        self._config = config                    # as resolved (deepinfer.eval records it)
        self._engine_lock = threading.Lock()     # one thread inside the C++ engine at a time
        self._cond = threading.Condition()       # guards _queues
        self._queues: dict = {}                  # request id -> deque of updates
        self._next_id = 0

    # --- public API -------------------------------------------------------------------------
    def generate(self, prompts: Any, sampling_params: Union[None, SamplingParams, Sequence[SamplingParams]] = None
                 ) -> list:
        """Runs every prompt to completion; returns one RequestOutput per prompt, in input order."""
        ids = self._add(prompts, sampling_params, stream=False)
        final = {}
        for out in self._updates(ids):
            if out.finished:
                final[out.request_id] = out
        return [final[i] for i in ids]

    def stream(self, prompts: Any, sampling_params: Union[None, SamplingParams, Sequence[SamplingParams]] = None
               ) -> Iterator:
        """Yields RequestOutput updates (delta_text / delta_token_ids of each sample) as the engine
        makes them; closing the generator early aborts the requests still running."""
        ids = self._add(prompts, sampling_params, stream=True)
        yield from self._updates(ids)

    def abort(self, request_id: str) -> bool:
        """Stops a request (from any thread); False when it is unknown or already finished."""
        with self._engine_lock:
            return self._engine.abort(request_id)

    def tokenize(self, prompt: Any) -> list:
        with self._engine_lock:
            return self._engine.tokenize(_prompt(prompt, "prompt"))

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self._engine.decode(list(token_ids), skip_special_tokens)

    def prompt_logprobs(self, prompt: Any) -> list:
        """Teacher forcing: log p(token i+1 | tokens 0..i) for each position (perplexity)."""
        with self._engine_lock:
            return self._engine.prompt_logprobs(_prompt(prompt, "prompt"))

    @property
    def stats(self) -> EngineStats:
        with self._engine_lock:
            return self._engine.stats()

    @property
    def max_model_len(self) -> int:
        return self._engine.max_model_len()

    # --- driving the engine -------------------------------------------------------------------
    def _add(self, prompts: Any, sampling_params: Any, stream: bool) -> list:
        items = _prompts(prompts)
        if sampling_params is None:
            params = [SamplingParams()] * len(items)
        elif isinstance(sampling_params, SamplingParams):
            params = [sampling_params] * len(items)
        else:
            params = list(sampling_params)
            if len(params) != len(items):
                raise ValueError(f"sampling_params: {len(params)} given for {len(items)} prompts "
                                 "(give one for all, or one per prompt)")
        for i, p in enumerate(params):
            if not isinstance(p, SamplingParams):
                raise ValueError(f"sampling_params[{i}]: expected SamplingParams, got {type(p).__name__}")
        return self._add_core(items, [p._core for p in params],
                              [stream and p.output_kind == "delta" for p in params])

    def _add_core(self, prompts: list, params: list, delta: Optional[list] = None) -> list:
        """Adds converted requests (_core.Prompt, _core.SamplingParams); all or none. delta[i]:
        request i's updates carry only their new part (the engine copies the parameters when a
        request is added, so setting the flag here, under the engine lock, touches no other
        request made from the same SamplingParams)."""
        ids = []
        with self._engine_lock:
            try:
                for i, (prompt, p) in enumerate(zip(prompts, params)):
                    rid = f"py-{self._next_id}"
                    self._next_id += 1
                    with self._cond:
                        self._queues[rid] = collections.deque()
                    p.delta_outputs = bool(delta[i]) if delta is not None else False
                    try:
                        ids.append(self._engine.add_request(prompt, p, rid))
                    except Error as e:
                        with self._cond:
                            del self._queues[rid]
                        raise Error(f"prompts[{i}]: {e}") from None
            except BaseException:
                for rid in ids:  # nothing of a rejected batch runs
                    self._engine.abort(rid)
                self._forget(ids)
                raise
        return ids

    def _forget(self, ids: list) -> None:
        with self._cond:
            for rid in ids:
                self._queues.pop(rid, None)

    def _updates(self, ids: list) -> Iterator:
        """Updates of `ids` until all finish. Whichever waiting thread finds the engine free runs
        the next step and hands every request's updates to its owner's queue."""
        pending = set(ids)
        try:
            while pending:
                with self._cond:
                    ready = []
                    for rid in ids:
                        q = self._queues.get(rid)
                        while q:
                            ready.append(q.popleft())
                if ready:
                    for out in ready:
                        if out.finished:
                            pending.discard(out.request_id)
                        yield out
                    continue
                if self._engine_lock.acquire(blocking=False):
                    try:
                        outs = self._engine.step()
                        idle = not self._engine.has_unfinished()
                    finally:
                        self._engine_lock.release()
                    with self._cond:
                        for out in outs:
                            q = self._queues.get(out.request_id)
                            if q is not None:
                                q.append(out)
                        self._cond.notify_all()
                    if idle and not outs:
                        with self._cond:
                            if not any(self._queues.get(r) for r in pending):
                                raise Error(f"requests {sorted(pending)} ended without a final output")
                else:
                    with self._cond:
                        if not any(self._queues.get(r) for r in pending):
                            self._cond.wait(timeout=0.05)
        finally:
            if pending:  # Ctrl-C, an exception, or a stream closed early: stop what still runs
                with self._engine_lock:
                    for rid in pending:
                        self._engine.abort(rid)
            self._forget(ids)
from . import eval  # noqa: E402,F401  (deepinfer.eval: two-stage evals; needs OfflineEngine above)

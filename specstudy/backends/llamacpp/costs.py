"""llama.cpp's own cost figures for the report's cost model: T(k)/T(1) and the draft cost c.

* Verification cost: one target forward over k new tokens, timed by llama.cpp itself.  With the
  prompt cache on, a prompt P is sent once; then P + k fresh tokens with ``n_predict = 1``, whose
  ``timings.prompt_ms`` is that forward when ``timings.prompt_n == k`` (and ``cache_n == |P|``).
  Each extension starts with a token different from the previous one's, so the cached common
  prefix is exactly P.  Medians over ``repeats`` after one untimed call per k.  A prompt-pass
  forward computes the logits of its last position only, while a verification forward computes
  all k; the curve therefore slightly under-states verification where the LM head is a large
  part of the model (SmolLM2: ~21 % of the weights) — said in the result's ``caveat``.
* The same curve from real verification forwards: an n-gram run (γ = k_max − 1) on a prompt
  that invites copying; each forward after the prompt pass verified d drafts (k = d + 1 tokens,
  every position's logits) in llama.cpp's Δ ``predicted_ms`` (``extra["llamacpp_forward_ms"]``,
  n-gram drafting and sampling included).  Only the k that occurred are reported, with counts.
* c = the draft GGUF's per-token decode time / the target's (``timings.predicted_per_token_ms``
  of greedy AR runs, medians), each in its own kit-started server with the same threads.

Timings on a shared machine are only as good as its load: the result carries the load average.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Sequence
from typing import Any

from ...records import Cell, Request, Sampling
from ...telemetry import load_average
from .llamacpp_backend import LlamaCppBackend

COPY_PROMPT = (
    "Copy this text exactly, twice: The target model verifies every drafted token in a single "
    "forward pass, and the accepted prefix plus one bonus token leaves each step."
)
DEFAULT_PROMPT = (
    "Speculative decoding drafts several tokens cheaply and lets the target model verify them "
    "in one forward pass; this sentence only gives the prompt cache something to hold."
)


def _ids(backend: LlamaCppBackend, text: str) -> list[int]:
    ids = backend.prompt_ids(Request("cost", text, messages=(("user", text),)))
    if not ids:
        raise RuntimeError(f"no tokenizer for {backend.model!r}: the cost curve needs token ids")
    return ids


def _timed(backend: LlamaCppBackend, cell: Cell, ids: Sequence[int], n_predict: int) -> dict[str, Any]:
    rec = backend.send(Request("cost", "", prompt_ids=tuple(ids)), Sampling(max_new_tokens=n_predict), cell)
    if rec.status != "ok":
        raise RuntimeError(f"llama.cpp request failed: {rec.error}")
    timings: dict[str, Any] = rec.extra["llamacpp_timings"]
    return timings


def verification_curve(
    backend: LlamaCppBackend, prompt_ids: Sequence[int], ks: Sequence[int] = range(1, 9), repeats: int = 5
) -> dict[str, Any]:
    """Median ms of one forward over k new tokens on a cached prefix, per k, and T(k)/T(1)."""
    if repeats < 1 or not ks or min(ks) < 1 or 1 not in ks:
        raise ValueError(f"ks={list(ks)}, repeats={repeats}: need k >= 1 including k = 1, repeats >= 1")
    if not backend.prefix_cache:
        raise ValueError("the verification curve needs prefix_cache=True (it times extensions of a cached prompt)")
    cell = Cell("costs", "local", "llamacpp", "ar", "adhoc", backend.model)
    backend.ensure_server(cell)
    prompt = list(prompt_ids)
    pool = sorted(set(prompt))  # real token ids, cycled so consecutive extensions differ at once
    if len(pool) < max(ks) + 2:
        raise ValueError(f"the prompt has {len(pool)} distinct tokens; k up to {max(ks)} needs at least {max(ks) + 2}")
    _timed(backend, cell, prompt, 1)
    samples: dict[int, list[float]] = {}
    step = 0
    for k in ks:
        for i in range(repeats + 1):
            ext = [pool[(step + j) % len(pool)] for j in range(k)]
            step += k + 1
            t = _timed(backend, cell, prompt + ext, 1)
            if t.get("prompt_n") != k or t.get("cache_n") != len(prompt):
                raise RuntimeError(
                    f"k={k}: llama.cpp evaluated prompt_n={t.get('prompt_n')} with cache_n="
                    f"{t.get('cache_n')} (expected {k} and {len(prompt)}): the prefix was not reused"
                )
            if i:  # the first call per k is untimed
                samples.setdefault(k, []).append(float(t["prompt_ms"]))
    ms = {k: statistics.median(v) for k, v in samples.items()}
    return {
        "verify_ms": ms,
        "verify_ratio": {k: ms[k] / ms[1] for k in ms},
        "samples_ms": samples,
        "prompt_tokens": len(prompt),
    }


def forward_ms_by_tokens(records: Sequence[Any]) -> dict[int, list[float]]:
    """llama.cpp's ms per forward, keyed by the tokens it verified (drafts + 1), from n-gram records."""
    out: dict[int, list[float]] = {}
    for rec in records:
        ms = rec.extra.get("llamacpp_forward_ms")
        if rec.status != "ok" or ms is None or len(ms) != len(rec.steps) - 1:
            continue
        for step, t in zip(rec.steps[1:], ms):
            out.setdefault(step.drafted + 1, []).append(float(t))
    return dict(sorted(out.items()))


def verification_curve_from_steps(
    backend: LlamaCppBackend, prompt_ids: Sequence[int], k_max: int = 8, tokens: int = 96
) -> dict[str, Any]:
    """Median ms of real verification forwards per k (an n-gram run, γ = k_max − 1), ratio to k = 1."""
    if k_max < 2:
        raise ValueError(f"k_max={k_max}: needs at least 2 (one draft)")
    cell = Cell("costs", "local", "llamacpp", "ngram", "adhoc", backend.model, gamma=k_max - 1)
    old, backend.prefix_cache = backend.prefix_cache, False
    try:
        backend.ensure_server(cell)
        recs = [
            backend.send(Request("cost", "", prompt_ids=tuple(prompt_ids)), Sampling(max_new_tokens=tokens), cell)
            for _ in range(2)
        ]
    finally:
        backend.prefix_cache = old
    by_k = forward_ms_by_tokens(recs[1:])  # the first run warms the server up
    ms = {k: statistics.median(v) for k, v in by_k.items()}
    ratio = {k: ms[k] / ms[1] for k in ms} if 1 in ms else {}
    return {"step_ms": ms, "step_ratio": ratio, "step_counts": {k: len(v) for k, v in by_k.items()}}


def decode_ms_per_token(
    backend: LlamaCppBackend, prompt_ids: Sequence[int], tokens: int = 32, repeats: int = 3
) -> float:
    """Median ``timings.predicted_per_token_ms`` of greedy AR runs (prompt cache off)."""
    cell = Cell("costs", "local", "llamacpp", "ar", "adhoc", backend.model)
    backend.ensure_server(cell)
    old, backend.prefix_cache = backend.prefix_cache, False
    try:
        _timed(backend, cell, prompt_ids, tokens)  # warm-up
        return statistics.median(
            float(_timed(backend, cell, prompt_ids, tokens)["predicted_per_token_ms"]) for _ in range(repeats)
        )
    finally:
        backend.prefix_cache = old


def measure_costs(
    model: str,
    drafter: str | None = None,
    *,
    threads: int = 1,
    ks: Sequence[int] = range(1, 9),
    repeats: int = 5,
    decode_tokens: int = 32,
    step_tokens: int = 96,
    prompt: str = DEFAULT_PROMPT,
    log_dir: str | os.PathLike[str] = "outputs/servers",
) -> dict[str, Any]:
    """llama.cpp's T(k)/T(1) for ``model`` and, with a ``drafter`` GGUF, c = draft / target per-token decode time.

    Returns a plain dict: ``model``, ``drafter``, ``threads``, ``build``, ``precision``,
    ``prompt_tokens``, ``ks``, ``verify_ms`` / ``verify_ratio`` / ``samples_ms`` (prompt
    extensions, keyed by k), ``step_ms`` / ``step_ratio`` / ``step_counts`` (real n-gram
    verification forwards of a ``step_tokens`` n-gram run, keyed by k),
    ``target_ms_per_token``, ``draft_ms_per_token`` and ``c`` (None without a drafter),
    ``load_average`` (before, after) and ``caveat``.
    """
    load_before = load_average()
    target = LlamaCppBackend(model, threads=threads, prefix_cache=True, log_dir=log_dir)
    try:
        ids = _ids(target, prompt)
        out: dict[str, Any] = {"model": model, "drafter": drafter, "threads": threads, "ks": list(ks)}
        out.update(verification_curve(target, ids, ks, repeats))
        out.update(verification_curve_from_steps(target, _ids(target, COPY_PROMPT), max(ks), step_tokens))
        out["target_ms_per_token"] = decode_ms_per_token(target, ids, decode_tokens)
        out["build"] = target.server_info.version if target.server_info else None
        out["precision"] = target.plan(Cell("costs", "local", "llamacpp", "ar", "adhoc", model)).model.precision
    finally:
        target.close()
    out["draft_ms_per_token"] = out["c"] = None
    if drafter is not None:
        LlamaCppBackend.check("draft_target", 1, {}, model, drafter)  # same vocabulary, or refuse before timing
        draft = LlamaCppBackend(drafter, threads=threads, log_dir=log_dir)
        try:
            out["draft_ms_per_token"] = decode_ms_per_token(draft, ids, decode_tokens)
        finally:
            draft.close()
        out["c"] = out["draft_ms_per_token"] / out["target_ms_per_token"]
    out["load_average"] = {"before": load_before, "after": load_average()}
    out["caveat"] = (
        "T(k) is a prompt-pass forward over k tokens (logits of the last position only); "
        "a verification forward computes logits for all k positions"
    )
    return out

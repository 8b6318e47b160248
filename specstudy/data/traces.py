"""Trace files: recorded arrivals, with each request's input and output length, for serving runs.

A trace is JSON lines, one request a line, in either of two established formats:

* **Mooncake / AIPerf** (``mooncake``): ``timestamp`` (ms), ``input_length`` (tokens),
  ``output_length`` (tokens) and ``hash_ids`` (one id per block of ``block_size`` = 512 tokens;
  the last block holds ``input_length − (len(hash_ids) − 1) · block_size`` tokens, which must lie
  in 1..block_size).  Two requests with the same hash id share that block's tokens, so a trace's
  prefix sharing reaches the engine's prefix cache as recorded.  A line may give ``text_input``
  (the prompt itself) instead of ``input_length``/``hash_ids``.  Block tokens are windows of the
  task's own ``sources`` tokenized by the target's tokenizer (real text, never random ids: a hash
  id picks the window), so the prompt ids are exact and the same on every engine.
* **vLLM custom dataset** (``vllm_custom``, ``vllm bench serve --dataset-name custom``): ``prompt``
  (text) and ``output_tokens``; vLLM's format has no arrival times, so each line also needs
  ``timestamp`` (ms, as in AIPerf's fixed schedule).

Arrivals are the timestamps minus the first, in seconds, times the task's ``time_scale`` (0.5 replays
twice as fast).  Multi-turn sessions (AIPerf's ``session_id``/``delay``) are refused, named.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..config.errors import ParamsError, ParamsProblems
from ..config.task import TaskConfig, TraceSpec
from .rendering import TaskRequest, encode_text
from .task_sources import task_rows

FORMATS = {
    "mooncake": {"timestamp", "input_length", "output_length", "hash_ids", "text_input"},
    "vllm_custom": {"timestamp", "prompt", "output_tokens"},
}
_REFUSED = {"session_id": "multi-turn sessions", "delay": "multi-turn sessions"}


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _line_problems(spec: TraceSpec, row: Any, at: str) -> list[tuple[str, Any, str]]:
    """(key, value, allowed) for every problem of one line."""
    if not isinstance(row, dict):
        return [("line", row, "a JSON object")]
    out = []
    for k in sorted(set(row) - FORMATS[spec.format]):
        why = _REFUSED.get(k, f"the {spec.format} keys {sorted(FORMATS[spec.format])}")
        out.append((k, row[k], f"not {why}" if k in _REFUSED else why))
    ts = row.get("timestamp")
    if not (isinstance(ts, (int, float)) and not isinstance(ts, bool) and ts >= 0):
        out.append(("timestamp", ts, "milliseconds >= 0 (required on every line to replay arrivals)"))
    if spec.format == "vllm_custom":
        if not isinstance(row.get("prompt"), str) or not row["prompt"].strip():
            out.append(("prompt", row.get("prompt"), "the prompt text"))
        if "output_tokens" in row and not (_int(row["output_tokens"]) and row["output_tokens"] > 0):
            out.append(("output_tokens", row["output_tokens"], "a positive integer"))
        return out
    if "output_length" in row and not (_int(row["output_length"]) and row["output_length"] > 0):
        out.append(("output_length", row["output_length"], "a positive integer"))
    if "text_input" in row:
        if not isinstance(row["text_input"], str) or not row["text_input"].strip():
            out.append(("text_input", row["text_input"], "the prompt text"))
        return out
    n, ids = row.get("input_length"), row.get("hash_ids")
    if not (isinstance(n, int) and not isinstance(n, bool) and n > 0):
        out.append(("input_length", n, "a positive integer (or text_input instead)"))
        n = None
    if not (isinstance(ids, list) and ids and all(_int(h) and h >= 0 for h in ids)):
        out.append(("hash_ids", ids, "a non-empty list of non-negative integers"))
    elif n is not None and not 0 < n - (len(ids) - 1) * spec.block_size <= spec.block_size:
        out.append(
            (
                "input_length",
                n,
                f"{(len(ids) - 1) * spec.block_size + 1}..{len(ids) * spec.block_size} for {len(ids)} hash_ids "
                f"of block_size {spec.block_size}",
            )
        )
    return out


def read_trace(spec: TraceSpec, path: Path, where: str) -> list[dict[str, Any]]:
    """Every line of a trace file, checked; a :class:`ParamsProblems` listing every bad line at once."""
    problems: list[ParamsError] = []
    rows = []
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            problems.append(ParamsError(where, f"trace line {i}", line[:80], "a JSON object", str(e)))
            continue
        for key, value, allowed in _line_problems(spec, row, where):
            problems.append(ParamsError(where, f"trace line {i}: {key}", value, allowed, str(path)))
        rows.append(row)
    if not rows and not problems:
        problems.append(ParamsError(where, "trace.path", str(path), "a JSON-lines file with at least one request"))
    if problems:
        raise ParamsProblems(problems)
    return rows


def arrivals(spec: TraceSpec, rows: Sequence[dict[str, Any]]) -> list[float]:
    """Seconds after the first request, times the time scale (the lines in their file order)."""
    t0 = float(rows[0]["timestamp"])
    out = [(float(r["timestamp"]) - t0) / 1e3 * spec.time_scale for r in rows]
    if any(b < a for a, b in zip(out, out[1:])):
        raise ValueError("trace timestamps must not decrease from one line to the next")
    return out


def mean_rate(offsets: Sequence[float]) -> float:
    """Requests per second over the trace's span ((n − 1) / span; inf when all arrive at once)."""
    span = offsets[-1] - offsets[0] if offsets else 0.0
    return (len(offsets) - 1) / span if span > 0 else float("inf")


def block_tokens(corpus: Sequence[int], hash_id: int, size: int) -> list[int]:
    """The ``size`` tokens of one hash block: a window of the tokenized corpus picked by the id
    (the same id, the same tokens), wrapping around a corpus shorter than the window."""
    if not corpus:
        raise ValueError("a Mooncake trace needs text in the task's sources to fill its hash blocks")
    start = (hash_id * 7919) % len(corpus)
    return [corpus[(start + k) % len(corpus)] for k in range(size)]


def trace_requests(
    cfg: TaskConfig, spec: TraceSpec, rows: Sequence[dict[str, Any]], corpus: Sequence[int] | None, n: int | None
) -> list[TaskRequest]:
    """The first ``n`` requests of the trace (all for None), each with its arrival and output length."""
    offsets = arrivals(spec, rows)
    out: list[TaskRequest] = []
    for i, (row, t) in enumerate(zip(rows, offsets)):
        if n is not None and i >= n:
            break
        out_len = row.get("output_length", row.get("output_tokens"))
        text = row.get("text_input", row.get("prompt"))
        ids = None
        if text is None:
            if corpus is None:
                raise ValueError(f"{cfg.file}: a Mooncake line with hash_ids needs the target's tokenizer")
            ids = []
            last = row["input_length"] - (len(row["hash_ids"]) - 1) * spec.block_size
            for k, h in enumerate(row["hash_ids"]):
                ids += block_tokens(corpus, h, spec.block_size if k < len(row["hash_ids"]) - 1 else last)
        out.append(
            TaskRequest(
                prompt_id=f"{cfg.name}:{i}",
                prompt=text or "",
                task=cfg.name,
                prompt_ids=tuple(ids) if ids is not None else None,
                max_new_tokens=out_len,
                arrival_s=t,
                input_policy=f"trace:{spec.format}",
                source="trace",
            )
        )
    return out


def trace_file(cfg: TaskConfig, fetch: bool = True) -> Path:
    """The task's trace file, found like a file source (the task file's folder, else the repository)
    and checked against its sha256 pin."""
    from ..config.task import Source
    from .task_sources import source_file

    assert cfg.trace is not None
    src = Source(name="trace", kind="file", path=cfg.trace.path, sha256=cfg.trace.sha256, fields={"text": "-"})
    return source_file(src.model_copy(update={"base": str(Path(cfg.file).parent)}), fetch=fetch)


def corpus_ids(cfg: TaskConfig, tokenizer: Any) -> list[int]:
    """The task's sources' text, first turns joined by blank lines, as the target's token ids."""
    return encode_text(tokenizer, "\n\n".join(r.turns[0] for r in task_rows(cfg, cfg.sources)), special=False)


def load_trace_requests(cfg: TaskConfig, n: int | None, tokenizer: Any) -> list[TaskRequest]:
    """The task's trace as requests: the first ``n`` lines, in their recorded order and times."""
    assert cfg.trace is not None
    rows = read_trace(cfg.trace, trace_file(cfg), cfg.file)
    hashed = any("text_input" not in r and "prompt" not in r for r in rows[:n])
    if hashed and tokenizer is None:
        raise ValueError(
            f"{cfg.file}: trace {cfg.trace.path} gives input lengths and hash_ids: building those prompts "
            "needs the target's tokenizer (here with the model, or `make tasks-data` for its GGUF)"
        )
    corpus = corpus_ids(cfg, tokenizer) if hashed else None
    if n is not None and len(rows) < n:
        raise ParamsError(cfg.file, "n", n, f"at most {len(rows)} requests in trace {cfg.trace.path}")
    return trace_requests(cfg, cfg.trace, rows, corpus, n)


def replay_rate(task: str | Path | TaskConfig, n: int) -> float:
    """The mean rate of the first ``n`` requests a trace task replays (what its Poisson twin runs at);
    a ParamsError naming the key when the task has no trace or the trace does not read.  ``task``: the
    study's parsed config, or a name or file."""
    from ..config.task import load_task_config

    cfg = task if isinstance(task, TaskConfig) else load_task_config(task)
    if cfg.trace is None:
        raise ParamsError(cfg.file, "trace", None, "a trace (arrivals: trace replays a trace task's recorded times)")
    rows = read_trace(cfg.trace, trace_file(cfg), cfg.file)
    return mean_rate(arrivals(cfg.trace, rows[:n]))


def needs_target_tokens(task: str | Path | TaskConfig | None) -> bool:
    """Whether a task's prompts are built in the target's tokens (a trace, or input-length tiers), so a
    server's cell needs the target's tokenizer here too; False for anything that is not a task file."""
    from ..config.task import load_task_config

    if task is None:  # a task file that does not validate (the task check reported it)
        return False
    try:
        cfg = task if isinstance(task, TaskConfig) else load_task_config(task)
    except (ValueError, OSError):  # a custom request loader's task names need no file
        return False
    return cfg.trace is not None or cfg.tiers is not None

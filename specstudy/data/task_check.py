"""A task file checked the way a run reads it, before any engine loads: every problem at once.

The study's check (:func:`specstudy.run.task_checks.check_tasks`) calls :func:`check_task` per task file.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..config import ParamsError
from ..config.errors import ParamsProblems, validate_all
from ..config.task import ParsedTask, Source, TaskConfig, parse_task, task_file, with_base
from .task_sources import PromptRow, TaskDataError, load_source_rows
from .tasks import draw_requests


@dataclass
class TaskCheck:
    """What :func:`check_task` found: the config (None when it does not validate), the prompts the
    sources hold before length control (None when not every source could be read), problems, notes."""

    file: str
    config: TaskConfig | None
    available: int | None
    problems: list[ParamsError]
    notes: list[str]


def _sources_to_check(
    cfg: TaskConfig | None, data: Mapping[str, Any], path: Path
) -> tuple[list[tuple[str, Source]], bool]:
    """(key, source) of the sources a run reads, and whether that is all of them (some may not validate)."""
    if cfg is not None:
        key = "online_sources" if cfg.online else "sources"
        return [(f"{key}[{i}]", s) for i, s in enumerate(getattr(cfg, key))], True
    raw = data.get("sources")
    if not isinstance(raw, list):
        return [], False
    out = []
    for i, r in enumerate(raw):
        src, _ = validate_all(Source, r, path)  # its problems are the config's, reported already
        if src is not None and src.kind != "hub":
            out.append((f"sources[{i}]", with_base(src, path)))
    return out, len(out) == len(raw)


def check_task(
    task: str | os.PathLike[str] | ParsedTask,
    need: int = 0,
    need_text: str = "",
    seeds: Sequence[int] = (0,),
    tokenizers: Mapping[str, Any] | None = None,
    fetch: bool = True,
) -> TaskCheck:
    """Read a task file the way a run will and list every problem, each naming the file and key.

    The schema (every unknown key and bad value at once), each source's data (missing file,
    sha256, unreadable file, field map), the prompts the sources hold and, where ``tokenizers``
    (target name -> tokenizer) are given and the input-length policy is not ``none``, whether
    ``need`` prompts survive that policy for each ``seeds`` draw (``need_text`` says why that many).
    ``fetch=False`` downloads nothing: a package not fetched yet is a note, and its prompts uncounted.
    Online sources (``online: true``) need the network: a note, not read here.  ``task``: a name,
    a path, or the file as the study parsed it at load (:class:`~specstudy.config.task.ParsedTask`).
    """
    if not isinstance(task, ParsedTask):
        try:
            task = parse_task(task_file(task))
        except ParamsError as e:
            return TaskCheck(str(task), None, None, [e], [])
    path, data, cfg, problems = Path(task.file), task.data, task.config, list(task.problems)
    notes: list[str] = []
    if cfg is not None and cfg.online:
        notes.append(f"{path}: online sources are read when the study runs (they need the network)")
        return TaskCheck(str(path), cfg, None, problems, notes)
    sources, complete = _sources_to_check(cfg, data, path)
    rows: list[PromptRow] = []
    for key, src in sources:
        try:
            rows.extend(load_source_rows(src, fetch=fetch))
        except TaskDataError as e:
            complete = False
            if e.not_fetched:
                notes.append(f"{path}: {key}: {e} (the run fetches it; its prompts are counted then)")
            else:
                problems.append(
                    ParamsError(path, f"{key}.{e.key}" if e.key else key, e.value, e.allowed or "readable data", "")
                )
    ids = [r.prompt_id for r in rows]
    dup = sorted({x for x in ids if ids.count(x) > 1})
    if dup:
        problems.append(ParamsError(path, "sources", dup[0], "sources whose names (the prompt id prefix) differ"))
        complete = False
    available = len(rows) if complete else None
    if cfg is not None and cfg.trace is not None:  # a trace's lines are the task's requests
        available = _trace_problems(cfg, path, problems)
    elif cfg is not None and cfg.tiers is not None and available is not None:
        from .tier_prompts import tier_capacity

        available = tier_capacity(cfg.tiers, available)
    if cfg is not None and available and tokenizers and cfg.input_length.policy != "none":
        want = min(need, available)  # fewer prompts than needed is the study's problem, not the policy's
        for target, tok in tokenizers.items() if want else ():
            problem = _length_problem(cfg, rows, [s for _, s in sources], want, need_text, seeds, target, tok)
            if problem is not None:
                problems.append(problem)
    return TaskCheck(str(path), cfg, available, problems, notes)


def _trace_problems(cfg: TaskConfig, path: Path, problems: list[ParamsError]) -> int | None:
    """The trace's requests (None when it does not read), its problems appended to ``problems``."""
    from .traces import read_trace, trace_file

    assert cfg.trace is not None
    try:
        return len(read_trace(cfg.trace, trace_file(cfg), str(path)))
    except TaskDataError as e:
        problems.append(ParamsError(path, f"trace.{e.key}", e.value, e.allowed or "a readable trace file"))
    except ParamsProblems as e:
        problems.extend(e.problems)
    return None


def _length_problem(
    cfg: TaskConfig,
    rows: Sequence[PromptRow],
    sources: Sequence[Source],
    need: int,
    need_text: str,
    seeds: Sequence[int],
    target: str,
    tokenizer: Any,
) -> ParamsError | None:
    """Whether ``need`` prompts survive the task's input-length policy with ``target``'s tokenizer, each seed's draw."""
    for seed in seeds:
        try:
            draw_requests(cfg, rows, sources, need, seed, tokenizer)
        except ParamsError as e:
            if e.key != "n":  # a chat template the tokenizer lacks, a limit no prompt can be cut to
                return ParamsError(
                    e.file, e.key, e.value, e.allowed, f"{e.hint}; with {target}'s tokenizer".lstrip("; ")
                )
            drawn = f" (the study draws {need_text})" if need_text else ""
            return ParamsError(
                cfg.file,
                "input_length",
                cfg.input_length.policy_string(),
                f"a policy that keeps >= {need} of the {len(rows)} prompts{drawn}",
                f"{e.allowed} with {target}'s tokenizer",
            )
    return None

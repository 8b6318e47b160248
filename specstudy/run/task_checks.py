"""The study's task files read the way the run will, before any engine loads (:func:`check_tasks`).

Every problem at once: too few prompts for a sweep and its warm-up, a constrained task on an engine
that cannot take its constraint or with ``ignore_eos``, an engine that takes constraints only with an
option left unset.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import Any

from ..config import ParamsError, StudyConfig, Sweep, TaskConfig, load_task_config
from ..config.errors import ParamsProblems
from ..frameworks import declaration as engine_declaration
from ..frameworks import frameworks, tokenizing_frameworks


def parsed_task(cfg: StudyConfig, name: str) -> TaskConfig | str | None:
    """A task as the study parsed it at load (None: it does not validate), or a name outside the study."""
    return cfg.tasks[name].config if name in cfg.tasks else cfg.task_file(name)


def check_tasks(
    cfg: StudyConfig,
    fetch: bool = True,
    tokenizer: Callable[[str], Any] | None = None,
    sweeps: Collection[str] | None = None,
) -> list[str]:
    """Every task file of the study read the way the run will, before any engine loads: every
    problem at once in one :class:`ParamsProblems`, each naming its file, key, value and what is allowed.

    A task must hold the most prompts a sweep measures of it (``prompts_per_task``, or a precision
    target's ``max_prompts``) plus the warm-up's (``warmup.requests``, drawn on top of them).  Where
    its input-length policy is not ``none`` and an engine that hands the loader its tokenizer
    (:data:`tokenizing_frameworks()`) runs it, ``tokenizer(target)`` gives the target's tokenizer to
    count the prompts that survive the policy; None counts nothing (a dry run), and a LookupError
    (the tokenizer comes only with the model) leaves that count to the run, with a note.
    ``fetch=False`` downloads no prompt set.  ``sweeps`` limits the check to those sweeps' tasks.
    Returns the notes (warnings for the caller to print).
    """
    from ..data.task_check import check_task  # reads data (datasets): only when a check is asked for

    most: dict[str, tuple[int, Sweep]] = {}
    runs_on: dict[str, list[Sweep]] = {}
    seeds: dict[str, set[int]] = {}
    targets: dict[str, set[str]] = {}
    for sw in cfg.sweeps:
        if sweeps is not None and sw.name not in sweeps:
            continue
        for t in sw.tasks:
            if t not in most or sw.max_prompts > most[t][0]:
                most[t] = (sw.max_prompts, sw)
            seeds.setdefault(t, set()).update(s.seed for s in sw.samplings)
            runs_on.setdefault(t, []).append(sw)
            if set(sw.frameworks) & set(tokenizing_frameworks()):
                targets.setdefault(t, set()).update(cfg.model(m).target for m in sw.models)
    toks: dict[str, Any] = {}
    problems: list[ParamsError] = []
    notes: list[str] = []
    warm = cfg.warmup_requests
    for name, (n, sw) in most.items():
        parsed, need = cfg.tasks.get(name), n + warm
        need_text = f"{sw.prompts_key.rsplit('.', 1)[-1]} {n} + warmup.requests {warm} in {cfg.file}"
        found = check_task(
            parsed or cfg.task_file(name),
            need,
            need_text,
            sorted(seeds[name]),
            _tokenizers(parsed_task(cfg, name), targets.get(name, set()), tokenizer, toks, notes),
            fetch,
        )
        problems += found.problems
        notes += found.notes
        if found.available is not None and found.available < need:
            problems.append(
                ParamsError(
                    cfg.file,
                    sw.prompts_key,
                    n,
                    f"at most {max(found.available - warm, 0)} for task {name!r}",
                    f"{found.file} has {found.available} prompts and warmup.requests={warm} more are drawn "
                    "before the measured ones: add prompts, or lower this or warmup.requests",
                )
            )
    for name, sws in runs_on.items():
        problems += _structured_problems(cfg, name, sws)
    if problems:
        raise ParamsProblems(problems, f"tasks of {cfg.file} (checked before any engine loads)")
    return notes


def _structured_problems(cfg: StudyConfig, task: str, sweeps: Sequence[Sweep]) -> list[ParamsError]:
    """A constrained task runs only on engines that take its constraint, and never with ignore_eos
    (an object cut at max_new_tokens is neither valid nor invalid)."""
    parsed = cfg.tasks.get(task)
    so = parsed.config.structured_output if parsed is not None and parsed.config is not None else None
    if so is None:
        return []  # no constraint, or a broken file (the task check reports it)
    kind = "json_schema" if so.json_schema is not None else "grammar"
    able = sorted(f for f in frameworks() if kind in engine_declaration(f).structured_output_fields)
    out = []
    for sw in sweeps:
        for fw in sorted(set(sw.frameworks) - set(able)):
            out.append(
                ParamsError(cfg.file, f"sweeps.{sw.name}.frameworks", fw, able, f"task {task!r} states a {kind}")
            )
        if any(s.ignore_eos for s in sw.samplings):
            out.append(
                ParamsError(
                    cfg.file,
                    f"sweeps.{sw.name}.sampling.ignore_eos",
                    True,
                    "false",
                    f"task {task!r} constrains its outputs: a JSON object cut at max_new_tokens says nothing",
                )
            )
    for fw in sorted({f for sw in sweeps for f in sw.frameworks} & set(able)):  # once per framework
        decl = engine_declaration(fw)
        need = decl.structured_needs_option
        if need and not (cfg.framework_options.get(fw) or {}).get(need):
            hint = f"task {task!r} states a {kind}: {fw}'s server takes constraints only with {need} set"
            out.append(
                ParamsError(cfg.file, f"framework_options.{fw}.{need}", None, list(decl.structured_option_values), hint)
            )
    return out


def _tokenizers(
    task: TaskConfig | str | None,
    targets: Collection[str],
    tokenizer: Callable[[str], Any] | None,
    cache: dict[str, Any],
    notes: list[str],
) -> dict[str, Any]:
    """The targets' tokenizers a task's input-length count needs (none when its policy is ``none``)."""
    if tokenizer is None or not targets:
        return {}
    try:
        if (
            task is None
            or (task if isinstance(task, TaskConfig) else load_task_config(task)).input_length.policy == "none"
        ):
            return {}
    except (ValueError, OSError):  # a bad task file: check_task reports it
        return {}
    out = {}
    for target in sorted(targets):
        if target not in cache:
            try:
                cache[target] = tokenizer(target)
            except LookupError as e:
                cache[target] = None
                notes.append(f"{e}; input-length policies are applied, and their prompts counted, when it loads")
        if cache[target] is not None:
            out[target] = cache[target]
    return out

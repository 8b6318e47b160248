"""The acceptance regression gate: a study's per-row acceptance beside a golden file's.

An engine upgrade or a drafter retrain changes acceptance before it changes anything a reader
notices; comparing per-position acceptance and AL per row with a stored golden answers "did it
move?" in one command.  Acceptance comes from :func:`specstudy.metrics.acceptance_summary` (the one
definition of α and AL); a row pools a cell's repeats.  Pure: the command writes the file.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..metrics import Counters, acceptance_summary, draft_steps_of
from ..records import RequestRecord
from .study_records import Study

GOLDEN_VERSION = 1
#: vLLM's acceptance test allows 5 % per position; a deterministic (greedy, one engine) golden uses 0
DEFAULT_REL_TOL = 0.05
#: the tolerance a golden written on one machine kind is checked with on another.  Greedy acceptance
#: is deterministic on one machine, but a CPU kind with other vector widths or thread counts reduces
#: floats in another order, and an argmax near a tie can flip, changing that prompt's text and counters
#: from there on: per position, vLLM's 5 % (docs/study.md, "The acceptance gate across machines")
CROSS_MACHINE_REL_TOL = 0.05
#: float noise only: JSON round-trips floats exactly, so an exact golden stays exact
_ABS_FLOOR = 1e-12
_ROW_FIELDS = (
    "framework",
    "label",
    "task",
    "model",
    "drafter",
    "gamma",
    "batch_size",
    "sampling",
    "max_new_tokens",
    "request_rate",
    "prefix_cache",
)


def row_key(meta: Mapping[str, Any]) -> str:
    """A stable identifier of a row (its cell fields but the repeat and the cell id, as JSON): the
    golden file's key; :func:`row_fields` reads it back."""
    return json.dumps({k: meta.get(k) for k in _ROW_FIELDS}, sort_keys=True, default=str)


def row_fields(key: str) -> dict[str, Any]:
    fields: dict[str, Any] = json.loads(key)
    return {k: fields.get(k) for k in _ROW_FIELDS}


def drafting_reads_the_clock(method: str, options: Mapping[str, Any]) -> bool:
    """Whether a row's drafts depend on measured time, so two runs of the same greedy prompts may draft
    differently: γ chosen by the cost model from timed forwards (``dynamic_gamma: cost``), or a
    Sequoia tree chosen for speedup from costs measured on the cell's first prompt (no
    ``sequoia_cost`` given).  Such rows are left out of the gate (the first golden caught one)."""
    if options.get("dynamic_gamma") == "cost":
        return True
    return (
        method == "sequoia" and options.get("sequoia_choose", "speedup") == "speedup" and "sequoia_cost" not in options
    )


def acceptance_rows(
    study: Study, frameworks: Sequence[str] | None = None, greedy_only: bool = False
) -> dict[str, dict[str, Any]]:
    """Per row (repeats pooled) AL, α and unconditional per-position acceptance of every speculative,
    non-synthetic cell whose engine counted acceptance and whose drafting does not read the clock."""
    groups: dict[str, list[RequestRecord]] = {}
    for cid, meta in study.cells.items():
        if meta["method"] == "ar" or meta.get("synthetic"):
            continue
        if frameworks and meta["framework"] not in frameworks:
            continue
        if greedy_only and meta["sampling"] != "greedy":
            continue
        recs = study.records[cid]
        opts = (recs[0].extra or {}).get("method_options") or {} if recs else {}
        if drafting_reads_the_clock(meta["method"], opts):
            continue
        groups.setdefault(row_key(meta), []).extend(recs)
    out = {}
    for key, recs in sorted(groups.items()):
        s = acceptance_summary(recs)
        if s["alpha"] is None:
            continue  # the engine does not expose acceptance: nothing to gate
        out[key] = {
            "acceptance_length": _num(s["acceptance_length"]),
            "alpha": _num(s["alpha"]),
            "per_position": [_num(v) for v in s["per_position_unconditional"] or []],
            "requests": sum(1 for r in recs if r.status == "ok"),
            "prompts": _prompt_counts(recs),
        }
    return out


def _prompt_counts(recs: Sequence[RequestRecord]) -> dict[str, dict[str, Any]]:
    """Each ok request's acceptance counters, keyed by prompt, repeat and turn: a row grown by a precision
    target holds more prompts on one run than another, so the gate compares the prompts both have."""
    out = {}
    for r in recs:
        steps = draft_steps_of(r)
        if r.status != "ok" or r.drafted_tokens is None or steps is None:
            continue
        out[json.dumps([r.task, r.prompt_id, r.repeat, r.turn])] = {
            "accepted": int(r.accepted_tokens or 0),
            "drafted": int(r.drafted_tokens),
            "draft_steps": int(steps),
            "accepted_per_position": [int(a) for a in r.accepted_per_position or []],
        }
    return out


def _over(prompts: Mapping[str, Mapping[str, Any]], keys: Iterable[str]) -> dict[str, Any]:
    """AL, α and unconditional per-position acceptance pooled over ``keys`` (the metrics' definitions)."""
    c = Counters.pooled(
        Counters(int(r["drafted"]), int(r["accepted"]), int(r["draft_steps"]), tuple(r["accepted_per_position"]))
        for r in (prompts[k] for k in keys)
    )
    return {
        "acceptance_length": _num(c.acceptance_length),
        "alpha": _num(c.alpha),
        "per_position": [_num(v) for v in c.per_position_unconditional or []] if c.draft_steps else [],
    }


def _on_common_prompts(
    want: Mapping[str, Any], got: Mapping[str, Any]
) -> tuple[Mapping[str, Any], Mapping[str, Any]] | None:
    """Both rows restricted to the prompts both measured (None: no prompt in common); rows without
    per-prompt counts compare as stored."""
    wp, gp = want.get("prompts"), got.get("prompts")
    if not wp or not gp:
        return want, got
    common = sorted(set(wp) & set(gp))
    if not common:
        return None
    return _over(wp, common), _over(gp, common)


def _num(v: Any) -> float | None:
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else float(v)


def machine_of(study: Study) -> dict[str, Any]:
    """The machine kind a study ran on (CPU model, logical cores, GPUs) from its provenance ({}: unknown):
    what decides whether an exact golden can be checked exactly."""
    host = (study.provenance or {}).get("host") or {}
    return {k: host.get(k) for k in ("cpu_model", "cpu_cores_logical", "gpus")} if host else {}


def tolerance_for(golden: Mapping[str, Any], machine: Mapping[str, Any] | None, rel_tol: float | None = None) -> float:
    """The tolerance a check uses: ``rel_tol`` when given; else the golden's own on the machine kind it was
    written on (or when either kind is unknown), and at least :data:`CROSS_MACHINE_REL_TOL` on another."""
    if rel_tol is not None:
        return float(rel_tol)
    own = float(golden.get("rel_tol", DEFAULT_REL_TOL))
    written_on = golden.get("machine") or {}
    if machine and written_on and machine != written_on:
        return max(own, CROSS_MACHINE_REL_TOL)
    return own


def golden_doc(study: Study, rows: Mapping[str, Any], rel_tol: float) -> dict[str, Any]:
    """The golden file's content: its rows, the tolerance it was written for, and whence it came (the
    machine kind: a check on another kind loosens an exact golden, :func:`tolerance_for`)."""
    return {
        "version": GOLDEN_VERSION,
        "study": study.config.get("name", ""),
        "hardware": study.hardware,
        "machine": machine_of(study),
        "rel_tol": rel_tol,
        "per_position": "unconditional (accepted at k / draft steps)",
        "rows": dict(rows),
    }


@dataclass(frozen=True)
class Moved:
    """One row that fails the gate and why: ``what`` is "missing" (no such row), "no_common_prompts",
    "depth" (per-position depth ``before`` -> ``after``), or a figure that moved ("acceptance_length",
    "alpha", "position" with its 1-based ``position``) from ``before`` to ``after``."""

    row: str
    what: str
    before: Any = None
    after: Any = None
    position: int | None = None


def _close(a: float | None, b: float | None, rel_tol: float) -> bool:
    if a is None or b is None:
        return a is b
    return math.isclose(a, b, rel_tol=rel_tol, abs_tol=_ABS_FLOOR)


def _row_moves(key: str, want: Mapping[str, Any], got: Mapping[str, Any], rel_tol: float) -> Iterable[Moved]:
    for name in ("acceptance_length", "alpha"):
        if not _close(want.get(name), got.get(name), rel_tol):
            yield Moved(key, name, want.get(name), got.get(name))
    wp, gp = list(want.get("per_position") or []), list(got.get("per_position") or [])
    if len(wp) != len(gp):
        yield Moved(key, "depth", len(wp), len(gp))
    for k, (a, b) in enumerate(zip(wp, gp), start=1):
        if not _close(a, b, rel_tol):
            yield Moved(key, "position", a, b, position=k)


def compare(
    golden: Mapping[str, Any],
    current: Mapping[str, Any],
    rel_tol: float | None = None,
    machine: Mapping[str, Any] | None = None,
) -> list[Moved]:
    """Every golden row missing from ``current`` or moved beyond the tolerance (:func:`tolerance_for`:
    ``rel_tol``, else the golden's own on its machine kind), compared over the prompts both measured
    where both hold per-prompt counts.

    Rows the study has and the golden lacks are not failures (a study may grow): :func:`new_rows`.
    """
    if golden.get("version") != GOLDEN_VERSION:
        raise ValueError(f"golden version={golden.get('version')!r}: allowed {GOLDEN_VERSION}")
    tol = tolerance_for(golden, machine, rel_tol)
    if not 0.0 <= tol < 1.0:
        raise ValueError(f"rel_tol={tol!r}: allowed a number in [0, 1)")
    moved: list[Moved] = []
    for key, want in golden["rows"].items():
        pair = _on_common_prompts(want, current[key]) if key in current else None
        if key not in current:
            moved.append(Moved(key, "missing"))
        elif pair is None:
            moved.append(Moved(key, "no_common_prompts"))
        else:
            moved.extend(_row_moves(key, *pair, tol))
    return moved


def new_rows(golden: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    return sorted(set(current) - set(golden["rows"]))

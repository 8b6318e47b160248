"""A study's rows against published numbers: the verdict and the checks that find its usual causes.

Pure: records and references in, rows of values out (the report words them).  Acceptance is held to
the reference's relative tolerance the way vLLM's acceptance test holds it: the pooled AL
(1 + Σ accepted / Σ drafts, :func:`~specstudy.metrics.acceptance_summary`) within ``rel_tol`` both
ways, each unconditional per-position rate at least ``(1 − rel_tol)`` of the published one.  Speed
never gets a verdict (it does not carry across hardware); a rehearsal gets none either.

The cause checks read what the records hold (``RequestRecord.extra``: ``chat_template``,
``prompt_head_ids``, ``max_model_len``, ``drafter_revision``, ``engine_version``); a value the
backend did not record reads ``None`` (not checked), never a pass.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ..metrics import acceptance_summary
from ..records import RequestRecord

#: verdict codes (the report words them)
WITHIN, OUTSIDE, NO_VERDICT, REHEARSAL, NOT_MEASURED = "within", "outside", "no_verdict", "rehearsal", "not_measured"


def rows_of(
    ref: Any, records: Iterable[RequestRecord], target_of: Mapping[str, str], any_sweep: bool = False
) -> list[RequestRecord]:
    """The ok records of a reference's row: its model (short name or hub id), method label, framework and
    sweep (``any_sweep``: any; a rehearsal runs one cell per configuration, whichever sweep it came from)."""
    ids = {ref.model, target_of.get(ref.model, ref.model)}
    return [
        r
        for r in records
        if r.status == "ok"
        and r.model in ids
        and ref.method in (r.label, r.method)
        and (ref.framework is None or r.framework == ref.framework)
        and (any_sweep or ref.sweep is None or ref.sweep in r.sweeps)
    ]


def acceptance_verdict(
    published_al: float, published_per_pos: Sequence[float], rel_tol: float, measured: Mapping[str, Any]
) -> dict[str, Any]:
    """Measured AL and per-position rates against published ones: relative error and within or not."""
    al, per_pos = measured.get("acceptance_length"), list(measured.get("per_position_unconditional") or [])
    if al is None:
        return {"measured_al": None, "rel_error": None, "verdict": NOT_MEASURED, "short_positions": []}
    rel = abs(al - published_al) / published_al
    short = [
        k + 1
        for k, want in enumerate(published_per_pos)
        if want > 0 and (k >= len(per_pos) or per_pos[k] < want * (1 - rel_tol))
    ]
    ok = rel <= rel_tol and not short
    return {"measured_al": al, "rel_error": rel, "verdict": WITHIN if ok else OUTSIDE, "short_positions": short}


def protocol_differences(protocol: Mapping[str, Any], records: Sequence[RequestRecord]) -> list[dict[str, Any]]:
    """Each protocol field whose measured values differ from the published one (prompts, output length,
    temperature, γ)."""
    seen: dict[str, set[Any]] = {
        "prompts": {len({r.prompt_id for r in records})},
        "max_new_tokens": {r.max_new_tokens for r in records},
        "temperature": {float(r.temperature) for r in records},
        "gamma": {r.gamma for r in records},
    }
    return [
        {"field": key, "published": protocol[key], "measured": sorted(got, key=str)}
        for key, got in seen.items()
        if key in protocol and got != {protocol[key]}
    ]


def cause_checks(protocol: Mapping[str, Any], records: Sequence[RequestRecord]) -> list[dict[str, Any]]:
    """The usual causes of a miss, each with what the records show: ``ok`` True (not the cause), False
    (found), None (not recorded, so not checked)."""
    ex = [r.extra for r in records]
    return [
        _chat_template(protocol, ex),
        _doubled_bos(protocol, ex),
        _same(protocol, ex, "max_model_len"),
        _same(protocol, ex, "drafter_revision"),
        _same(protocol, ex, "engine_version"),
    ]


def _chat_template(protocol: Mapping[str, Any], extras: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    got = [e.get("chat_template") for e in extras if e.get("chat_template") is not None]
    want = protocol.get("chat_template")
    ok = None if not got or want is None else all(bool(g) == bool(want) for g in got)
    return {"check": "chat_template", "published": want, "found": sorted(set(map(bool, got))), "ok": ok}


def _doubled_bos(protocol: Mapping[str, Any], extras: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    bos = protocol.get("bos_token_id")
    heads = [list(e["prompt_head_ids"]) for e in extras if e.get("prompt_head_ids")]
    doubled = sum(1 for h in heads if bos is not None and h[:2] == [bos, bos])
    ok = None if not heads or bos is None else doubled == 0
    return {"check": "doubled_bos", "published": bos, "found": {"doubled": doubled, "prompts": len(heads)}, "ok": ok}


def _same(protocol: Mapping[str, Any], extras: Sequence[Mapping[str, Any]], key: str) -> dict[str, Any]:
    got = sorted({str(e[key]) for e in extras if e.get(key) is not None})
    want = protocol.get(key)
    ok = None if not got or want is None else got == [str(want)]
    return {"check": key, "published": want, "found": got, "ok": ok}


def against_published(
    refs: Iterable[Any],
    records: Iterable[RequestRecord],
    target_of: Mapping[str, str],
    rehearsal: bool = False,
) -> list[dict[str, Any]]:
    """One row per reference: published beside measured, the verdict code, protocol differences and
    the cause checks (``rehearsal``: the numbers shown, no verdict)."""
    records = list(records)
    out = []
    for ref in refs:
        mine = rows_of(ref, records, target_of, any_sweep=rehearsal)
        row: dict[str, Any] = {
            "name": ref.name,
            "kind": ref.kind,
            "model": ref.model,
            "method": ref.method,
            "framework": ref.framework,
            "source": ref.source.cite(),
            "protocol": dict(ref.protocol),
            "rel_tol": ref.rel_tol,
            "published_al": ref.acceptance_length,
            "published_per_position": list(ref.per_position),
            "published_speedup": ref.speedup,
            "n_prompts": len({r.prompt_id for r in mine}),
        }
        summary = acceptance_summary(mine) if mine else {}
        row["measured_per_position"] = summary.get("per_position_unconditional")
        if ref.kind == "acceptance" and ref.acceptance_length is not None and ref.rel_tol is not None:
            row.update(acceptance_verdict(ref.acceptance_length, ref.per_position, ref.rel_tol, summary))
        else:
            row.update({"measured_al": summary.get("acceptance_length"), "rel_error": None, "verdict": NO_VERDICT})
        if not mine:
            row["verdict"] = NOT_MEASURED
        elif rehearsal:
            row["verdict"] = REHEARSAL
        row["protocol_differences"] = protocol_differences(ref.protocol, mine) if mine else []
        row["checks"] = cause_checks(ref.protocol, mine) if mine else []
        out.append(row)
    return out


def causes_found(row: Mapping[str, Any]) -> list[str]:
    """The checks of a row that found a cause (``ok`` False)."""
    return [c["check"] for c in row.get("checks", []) if c["ok"] is False]

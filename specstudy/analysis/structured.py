"""Structured outputs under speculation: constrained decoding with and without drafting, paired.

A JSON schema prunes the target's choices; whether drafts (which do not see the constraint, or do)
are still accepted, and whether the output stays valid, is what a deployment of tool calls or JSON
APIs needs.  Per speculative row on a constrained task: α, AL, the paired speedup (the kit's one
pooled row, :func:`specstudy.analysis.stats.pooled`) and the share of outputs that parse and
validate against the schema, beside the paired AR's share.  The framework table says which engines
combine the two (their declarations).  Pure.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pandas as pd

from ..frameworks import declaration, frameworks
from ..records import RequestRecord
from . import stats
from .study_records import Study


def output_valid(rec: RequestRecord) -> bool | None:
    """Whether an ok output parses as JSON and meets its request's schema; None: no JSON schema on it
    (a grammar is enforced by the engine and not re-parsed here), the request failed, or the output
    was cut at max_new_tokens (an unfinished object says nothing about the constraint)."""
    schema = (rec.extra.get("constraint") or {}).get("json_schema")
    if not schema or rec.status != "ok" or (rec.max_new_tokens and rec.output_tokens >= rec.max_new_tokens):
        return None
    import jsonschema

    try:
        jsonschema.validate(json.loads(rec.output_text), json.loads(schema))
    except (json.JSONDecodeError, jsonschema.ValidationError):
        return False
    return True


def valid_share(records: Sequence[RequestRecord]) -> tuple[float, int]:
    """(share of JSON-schema outputs that are valid, how many were judged)."""
    judged = [v for v in (output_valid(r) for r in records) if v is not None]
    return (sum(judged) / len(judged) if judged else float("nan")), len(judged)


def _constrained(study: Study, cid: str) -> bool:
    return any((r.extra.get("constraint") or {}) for r in study.records.get(cid, []))


def structured_frame(study: Study) -> pd.DataFrame:
    """One row per speculative (framework, method, task, γ, batch) on a constrained task, repeats pooled."""
    groups: dict[tuple[Any, ...], list[str]] = {}
    for cid in study.spec_cell_ids():
        m = study.cells[cid]
        if _constrained(study, cid) and not m.get("synthetic"):
            key = (m["framework"], m["label"], m["task"], m["gamma"], m["batch_size"], m["sampling"])
            groups.setdefault(key, []).append(cid)
    rows = []
    for (fw, label, task, gamma, batch, sampling), cells in sorted(groups.items(), key=lambda kv: str(kv[0])):
        p = stats.pooled(study, cells)
        spec_share, n_spec = valid_share([r for c in cells for r in study.records[c]])
        ar_share, n_ar = valid_share([r for c in cells for r in study.baseline(c)])
        rows.append(
            {
                "framework": fw,
                "label": label,
                "task": task,
                "gamma": gamma,
                "batch_size": batch,
                "sampling": sampling,
                "alpha": p.acceptance.alpha,
                "acceptance_length": p.acceptance.acceptance_length,
                "acceptance_length_ci": p.acceptance.acceptance_length_ci,
                "speedup": p.paired.speedup,
                "speedup_ci": p.paired.speedup_ci,
                "n_prompts": p.sample.n_prompts,
                "valid_share": spec_share,
                "valid_judged": n_spec,
                "ar_valid_share": ar_share,
                "ar_valid_judged": n_ar,
            }
        )
    return pd.DataFrame(rows)


def engines_table() -> pd.DataFrame:
    """Per declared engine: where the kit sends a constraint, whether the engine combines it with
    speculation (True / False / None: not documented) and the source that says so (its declaration)."""
    rows = []
    for fw in frameworks():
        d = declaration(fw)
        rows.append(
            {
                "framework": fw,
                "fields": dict(d.structured_output_fields),
                "with_speculation": d.structured_with_speculation,
                "source": d.structured_source,
            }
        )
    return pd.DataFrame(rows)

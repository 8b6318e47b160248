"""One method, one drafter, several engines: does acceptance agree?

FAQ Q3 of the seed: a fair comparison of frameworks runs the same checkpoints, so the kit runs the
same target and the same drafter (its own EAGLE-3 head, prompt lookup's n-gram rule) in several
engines on the same prompts.  Their speeds differ by design; their acceptance should not, unless
the engines draft differently.  Each group here is one (method label, drafter, γ, task, sampling) at
batch 1 measured by two or more frameworks; each framework's α and AL are
:func:`specstudy.analysis.stats.pooled`'s (intervals over prompts).

The verdict at greedy is exact and paired (:func:`paired_verdict`): greedy decoding of the same
prompts is deterministic, so each prompt's accepted tokens, drafted tokens and draft steps are
compared engine against engine.  Overlapping intervals would hide a head that accepts one token in
fourteen read wrongly by one engine; equal counts prompt by prompt do not.  An engine that caps
its drafts at the tokens left (the reference engine drafts min(γ, r − 1) with r tokens to go, and
none at r = 1) drafts up to γ(γ+1)/2 fewer tokens in at most one fewer step per prompt than one
that always drafts γ: within that bound, with the same accepted tokens, the verdict says
"identical acceptance; drafting differs at the end".  Accepted tokens are compared within the output:
vLLM's scheduler counts a step's accepted drafts before ``max_tokens`` trims the step
(``vllm/v1/core/sched/scheduler.py``: ``make_spec_decoding_stats`` before ``_update_request_with_output``),
so its last step may count drafts accepted past the output's end, which an engine that caps its drafts
never drafts: a prompt's draft steps plus accepted tokens beyond its decoded tokens (output − 1) are
those, and come off its accepted count before the comparison (:attr:`PromptCounts.within`).  At T > 0 the draws differ by engine: every
pair of AL intervals is compared (:func:`specstudy.analysis.claims.overlap`); disjoint intervals
are a difference beyond noise, overlapping ones are not resolved.  Nothing here writes a file.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations
from typing import Any

import pandas as pd

from ..analysis.claims import Estimate, overlap
from ..analysis.stats import Pooled, pooled
from ..analysis.study_records import Study
from ..metrics import Counters, draft_steps_of, prompt_of
from ..records import RequestRecord
from .format import fmt_ci, sampling_text

AGREE = "agree within noise (every pair of AL intervals overlaps)"
IDENTICAL = "identical acceptance and drafting, prompt by prompt"
AT_END = "identical acceptance; drafting differs at the end"


@dataclass(frozen=True)
class PromptCounts:
    """One prompt's greedy request in one engine: what the paired comparison compares."""

    accepted: int
    drafted: int
    steps: int
    output: tuple[int, ...]
    #: drafts counted as accepted past the output's end (draft steps + accepted beyond output − 1 tokens)
    past_end: int = 0

    @property
    def within(self) -> int:
        """Accepted tokens inside the output: what two engines that decode the same output must share."""
        return self.accepted - self.past_end


def prompt_counts(records: list[RequestRecord]) -> dict[tuple[str, str], PromptCounts]:
    """Each prompt's first finished repeat (greedy repeats are the same decode)."""
    out: dict[tuple[str, str], PromptCounts] = {}
    for r in sorted(records, key=lambda r: r.repeat):
        if r.status != "ok" or r.accepted_tokens is None or prompt_of(r) in out:
            continue
        steps = draft_steps_of(r) or 0
        past = max(0, steps + r.accepted_tokens - (r.output_tokens - 1)) if r.output_tokens else 0
        out[prompt_of(r)] = PromptCounts(r.accepted_tokens, r.drafted_tokens or 0, steps, tuple(r.output_ids), past)
    return out


def drafting_differs_at_end(a: PromptCounts, b: PromptCounts, gamma: int) -> bool:
    """Whether a and b's drafting differs by no more than capping drafts at the tokens left can."""
    return abs(a.steps - b.steps) <= 1 and abs(a.drafted - b.drafted) <= gamma * (gamma + 1) // 2


def _totals(counts: dict[tuple[str, str], PromptCounts], keys: list[tuple[str, str]]) -> str:
    c = Counters.pooled(Counters(counts[k].drafted, counts[k].accepted, counts[k].steps) for k in keys)
    return f"{c.accepted} accepted, {c.drafted} drafted in {c.draft_steps} steps"


def paired_verdict(by_fw: dict[str, list[RequestRecord]], gamma: int) -> str:
    """The exact, prompt-by-prompt verdict of greedy rows (module docstring)."""
    counts = {fw: prompt_counts(recs) for fw, recs in sorted(by_fw.items())}
    keys = sorted(set.intersection(*(set(c) for c in counts.values())))
    if not keys:
        return "no prompt measured by every engine: not compared"
    said, at_end = [], True
    for a, b in combinations(sorted(counts), 2):
        ca, cb = counts[a], counts[b]
        outs = sum(bool(ca[k].output and cb[k].output) and ca[k].output != cb[k].output for k in keys)
        acc = sum(ca[k].within != cb[k].within for k in keys)
        if outs:
            said.append(f"greedy outputs of {a} and {b} differ on {outs} of {len(keys)} prompts")
        if acc:
            said.append(
                f"acceptance differs on {acc} of {len(keys)} prompts: {a} {_totals(ca, keys)}, {b} {_totals(cb, keys)}"
            )
        at_end &= all(drafting_differs_at_end(ca[k], cb[k], gamma) for k in keys)
    if said:
        return "; ".join(said)
    if all(len({(c[k].accepted, c[k].drafted, c[k].steps) for c in counts.values()}) == 1 for k in keys):
        return IDENTICAL
    detail = ", ".join(f"{fw} {_totals(c, keys)}" for fw, c in counts.items())
    past = [f"{fw} {n}" for fw, c in counts.items() if (n := sum(c[k].past_end for k in keys))]
    if past:
        detail += f"; accepted past the output's end, counted by the engine's counters: {', '.join(past)}"
    return f"{AT_END} ({detail})" if at_end else f"identical acceptance; drafting differs beyond the end ({detail})"


def groups(study: Study) -> dict[tuple[Any, ...], dict[str, list[str]]]:
    """(label, drafter, γ, task, sampling) → {framework: cell ids}, for groups of ≥ 2 frameworks."""
    out: dict[tuple[Any, ...], dict[str, list[str]]] = {}
    for cid in study.spec_cell_ids():
        m = study.meta(cid)
        if m["batch_size"] != 1 or m.get("request_rate") is not None:
            continue
        key = (m["label"], m["drafter"] or "", m["gamma"], m["task"], m["sampling"])
        out.setdefault(key, {}).setdefault(m["framework"], []).append(cid)
    return {k: v for k, v in sorted(out.items(), key=lambda kv: str(kv[0])) if len(v) >= 2}


def verdict(rows: dict[str, Pooled]) -> str:
    """Which frameworks' AL intervals are disjoint (a difference beyond noise), or that all overlap."""
    est = {fw: Estimate.of(p, "acceptance_length") for fw, p in rows.items()}
    if any(not e.has_interval for e in est.values()):
        return "n too small for intervals: not compared"
    apart = [(a, b) for a, b in combinations(sorted(est), 2) if overlap(est[a], est[b]) is False]
    if not apart:
        return AGREE
    words = [f"{a} {'above' if est[a].value > est[b].value else 'below'} {b}" for a, b in apart]
    return "differ beyond noise: " + "; ".join(words) + " (AL intervals disjoint)"


def per_position(rates: list[float] | None) -> str:
    """Accepted at k / reached k for k = 1.. (SPEED-Bench's conditional form), or — when unseen."""
    return ", ".join(f"{r:.2f}" for r in rates) if rates else "—"


def acceptance_across_engines(study: Study) -> tuple[pd.DataFrame, pd.DataFrame]:
    """One row per (group, framework): α, AL, greedy exact match and the group's verdict."""
    rows, raw = [], []
    flags = getattr(study, "flags", None) or {}
    for (label, drafter, gamma, task, sampling), by_fw in groups(study).items():
        pooled_by = {fw: pooled(study, cids) for fw, cids in sorted(by_fw.items())}
        clean = {fw: [c for c in cids if c not in flags] for fw, cids in by_fw.items()}
        # the verdict from unflagged cells only; an engine whose every cell is flagged is left out of it
        kept = {fw: cids for fw, cids in sorted(clean.items()) if cids}
        recs = {fw: [r for c in cids for r in study.records.get(c, [])] for fw, cids in kept.items()}
        greedy = all(r.temperature == 0.0 for rs in recs.values() for r in rs)
        intervals = verdict({fw: pooled(study, cids) for fw, cids in kept.items()}) if kept else ""
        if len(kept) < 2:
            said = "not compared: flagged cells left out (see Validity)"
        else:
            said = paired_verdict(recs, int(gamma or 0)) if greedy else intervals
        for fw, p in pooled_by.items():
            rows.append(
                {
                    "Method": label + (" ⚑" if len(clean[fw]) < len(by_fw[fw]) else ""),
                    "Drafter": drafter or "—",
                    "γ": gamma,
                    "Task": task,
                    "Sampling": sampling_text(sampling),
                    "Framework": fw,
                    "α": fmt_ci(p.acceptance.alpha, p.acceptance.alpha_ci, 3, "", n=p.sample.n_prompts),
                    "AL": fmt_ci(
                        p.acceptance.acceptance_length, p.acceptance.acceptance_length_ci, n=p.sample.n_prompts
                    ),
                    "Per-position acceptance (conditional)": per_position(p.acceptance.per_position_conditional),
                    "Greedy outputs equal AR's": "—"
                    if p.quality.exact_match != p.quality.exact_match
                    else f"{p.quality.exact_match:.0%}",
                    "n (prompts)": p.sample.n_prompts,
                    "Across engines": said,
                }
            )
            raw.append(
                {
                    "label": label,
                    "drafter": drafter,
                    "gamma": gamma,
                    "task": task,
                    "sampling": sampling,
                    "framework": fw,
                    "alpha": p.acceptance.alpha,
                    "alpha_ci": p.acceptance.alpha_ci,
                    "acceptance_length": p.acceptance.acceptance_length,
                    "acceptance_length_ci": p.acceptance.acceptance_length_ci,
                    "per_position_conditional": p.acceptance.per_position_conditional,
                    "n_prompts": p.sample.n_prompts,
                    "verdict": said,
                    "interval_verdict": intervals,
                }
            )
    return pd.DataFrame(rows), pd.DataFrame(raw)

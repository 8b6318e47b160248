"""The typed parts of a pooled row, each with its point estimates and their 95 % intervals from one function.

Why: a point estimate computed in one place and its interval in another drift apart.  Each part's
``of`` takes the row's requests (or its pairs) and returns both: the centres from
:mod:`specstudy.metrics` (the one definition of every metric), the intervals from
:mod:`specstudy.intervals` over prompts.  A new headline column is a metric in ``metrics``, a field
here (with its interval in the same ``of``), and a column in ``report.tables.HEADLINE_COLUMNS``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import costmodel, intervals, metrics
from ..records import RequestRecord

NAN = float("nan")
Interval = tuple[float, float]
NO_CI: Interval = (NAN, NAN)


@dataclass
class Pairs:
    """What the cells' paired comparisons collect before they are pooled."""

    pairs: list[tuple[RequestRecord, RequestRecord]] = field(default_factory=list)
    repeats: dict[int, list[tuple[RequestRecord, RequestRecord]]] = field(default_factory=dict)
    exact: list[tuple[float, int]] = field(default_factory=list)
    mem: list[float] = field(default_factory=list)
    costs: list[tuple[float, float]] = field(default_factory=list)
    base_recs: list[RequestRecord] = field(default_factory=list)
    spec_recs: list[RequestRecord] = field(default_factory=list)


@dataclass
class Acceptance:
    """α, α̂, AL (pooled over tokens and per request), tokens per target forward and per-position
    acceptance; α's and AL's intervals resample prompts.  Unset (None) without counters and for
    synthetic-acceptance rows (their drafts were accepted at a chosen rate: nothing was measured)."""

    alpha: float | None = None
    alpha_ci: Interval = NO_CI
    alpha_hat: float | None = None
    acceptance_length: float | None = None
    acceptance_length_ci: Interval = NO_CI
    tokens_per_forward: float | None = None
    per_position_conditional: list[float] | None = None
    per_position_unconditional: list[float] | None = None
    acceptance_length_per_request: float | None = None  # AIPerf's per-request mean AL (never drafted: 1.0)
    never_drafted: int | None = None  # requests with counters and no draft step (AL 1.0 in the mean above)

    @classmethod
    def of(cls, ok: Sequence[RequestRecord]) -> Acceptance:
        acc = metrics.acceptance_summary(ok)
        if acc["alpha"] is None:
            return cls()
        out = cls(
            alpha=acc["alpha"],
            alpha_hat=acc["alpha_hat"],
            acceptance_length=acc["acceptance_length"],
            tokens_per_forward=acc["tokens_per_forward"],
            per_position_conditional=acc["per_position_conditional"],
            per_position_unconditional=acc["per_position_unconditional"],
            acceptance_length_per_request=acc["acceptance_length_per_request"],
            never_drafted=acc["never_drafted"],
        )
        seen = [r for r in ok if r.drafted_tokens is not None]
        sums = metrics.per_prompt_sums(
            seen, lambda r: (r.accepted_tokens or 0, r.drafted_tokens or 0, float(metrics.draft_steps_of(r) or 0))
        )
        if sums.size and sums[:, 1].sum() > 0:
            out.alpha_ci = intervals.ratio_ci(sums[:, 0], sums[:, 1], upper=1.0)
        depth = max((len(r.drafts_per_position or []) for r in seen), default=0) or max(
            (r.gamma or 0 for r in seen), default=0
        )
        if out.acceptance_length is not None and sums.size and sums[:, 2].sum() > 0:
            # AL = 1 + Σ accepted / Σ draft steps, where a step accepts at most the deepest draft
            lo, hi = intervals.ratio_ci(sums[:, 0], sums[:, 2], upper=float(depth) if depth else None)
            out.acceptance_length_ci = (1.0 + lo, 1.0 + hi)
        return out


@dataclass
class Throughput:
    """Output tokens per second and its interval (over prompts at batch 1, over batches for one cell of
    batches, over cells otherwise)."""

    tokens_per_s: float = NAN
    tokens_per_s_ci: Interval = NO_CI

    @classmethod
    def of(cls, ok: Sequence[RequestRecord]) -> Throughput:
        """Σ tokens / Σ E2E at batch 1 (one stream); one cell of batches run one after another: Σ tokens
        / Σ batch spans, its CI over batches (each batch holds prompts of its own); else the mean over cells."""
        if not ok:
            return cls()
        if all(r.batch_size == 1 for r in ok):
            tps = metrics.per_request_throughput(ok)
            done = [r for r in ok if r.end_s]
            sums = metrics.per_prompt_sums(done, lambda r: (r.output_tokens, float(r.end_s or 0.0)))
            return cls(tps, intervals.ratio_ci(sums[:, 0], sums[:, 1]) if sums.size else NO_CI)
        by_cell: dict[str, list[RequestRecord]] = {}
        for r in ok:
            by_cell.setdefault(r.cell_id, []).append(r)
        vals = [metrics.output_throughput(v) for v in by_cell.values()]
        if len(vals) == 1:
            return cls._over_batches(ok, vals[0])
        m, lo, hi = intervals.mean_ci(vals)
        return cls(m, (lo, hi))

    @classmethod
    def _over_batches(cls, ok: Sequence[RequestRecord], whole: float) -> Throughput:
        """One cell of batches run one after another: Σ batch tokens / Σ batch wall span, its interval over
        batches.  A batch is batch_size consecutive sends (a server's load generator sends a batch's
        requests microseconds apart, so their start times differ a little)."""
        rows = sorted(ok, key=lambda r: r.start_epoch)
        size = max(1, int(rows[0].batch_size))
        batches = [rows[i : i + size] for i in range(0, len(rows), size)]
        starts = [min(r.start_epoch for r in b) for b in batches]
        walls = [_span(b) for b in batches]
        disjoint = all(nxt >= t + w - 1e-3 for nxt, t, w in zip(starts[1:], starts, walls))
        if len(batches) < 2 or not disjoint:  # a concurrency-limited stream has no batches to resample
            return cls(whole, NO_CI)
        toks = [sum(r.output_tokens for r in b) for b in batches]
        return cls(sum(toks) / sum(walls), intervals.ratio_ci(toks, walls))  # a batch's prompts are its own


def _span(batch: Sequence[RequestRecord]) -> float:
    """Seconds from a batch's first send to its last finish."""
    t0 = min(r.start_epoch for r in batch)
    return max(r.start_epoch - t0 + float(r.end_s or 0.0) for r in batch)


@dataclass
class Latency:
    """TTFT, TPOT and E2E (mean, p50, p99) of the row's requests; TPOT's interval over prompts."""

    ttft_s: float = NAN
    ttft_p50_s: float = NAN
    ttft_p99_s: float = NAN
    tpot_s: float = NAN
    tpot_ci: Interval = NO_CI
    tpot_p50_s: float = NAN
    tpot_p99_s: float = NAN
    e2e_s: float = NAN
    e2e_p50_s: float = NAN
    e2e_p99_s: float = NAN

    @classmethod
    def of(cls, ok: Sequence[RequestRecord]) -> Latency:
        lat = metrics.latency_summary(ok)
        _, lo, hi = intervals.mean_ci(metrics.per_prompt_mean(ok, metrics.tpot))
        return cls(
            lat["ttft_s_mean"], lat["ttft_s_p50"], lat["ttft_s_p99"],
            lat["tpot_s_mean"], (lo, hi), lat["tpot_s_p50"], lat["tpot_s_p99"],
            lat["e2e_s_mean"], lat["e2e_s_p50"], lat["e2e_s_p99"],
        )  # fmt: skip

    def of_kind(self, name: str) -> tuple[float, float, float]:
        """(mean, p50, p99) of ``name``: ttft, tpot or e2e."""
        return getattr(self, f"{name}_s"), getattr(self, f"{name}_p50_s"), getattr(self, f"{name}_p99_s")


@dataclass
class PairedSpeedup:
    """The paired speedup (baseline E2E / speculative E2E over prompts), its decode-phase form (TPOT ratio),
    both with intervals over prompts, the stopping rule's precision and the run-to-run spread."""

    speedup: float = NAN
    speedup_ci: Interval = NO_CI
    speedup_runs: Interval = NO_CI  # lowest and highest per-repeat speedup (run-to-run)
    speedup_precision: float = NAN  # the speedup interval's half-width / the speedup (the stopping rule's figure)
    decode_speedup: float = NAN  # baseline TPOT / speculative TPOT over prompts: the decode phase alone
    decode_speedup_ci: Interval = NO_CI

    @classmethod
    def of(cls, pairs: Pairs) -> PairedSpeedup:
        out = cls()
        if pairs.pairs:
            b, s, _ = metrics.per_prompt_means(pairs.pairs)
            out.speedup, out.speedup_ci = metrics.speedup(b, s), intervals.ratio_ci(b, s)
            out.speedup_precision = intervals.relative_half_width(out.speedup, out.speedup_ci)
            tb, ts, _ = metrics.per_prompt_means(pairs.pairs, metrics.tpot)
            out.decode_speedup, out.decode_speedup_ci = metrics.speedup(tb, ts), intervals.ratio_ci(tb, ts)
        runs = [metrics.speedup(*metrics.per_prompt_means(rp)[:2]) for rp in pairs.repeats.values()]
        if len(runs) > 1:
            out.speedup_runs = (float(min(runs)), float(max(runs)))
        return out


@dataclass
class Quality:
    """Whether speculation changed the output: greedy exact match and divergences, the PPL difference
    under the target, the log-prob shift test (sampled rows), and the mean token entropy with its interval.
    Exact match, PPL Δ and the shift test stay NaN on synthetic-acceptance rows."""

    exact_match: float = NAN
    ppl_diff: float = NAN  # PPL(speculative) − PPL(paired baseline) under the target
    logprob_p: float = NAN  # sign-flip test: outputs score alike under the target (large p: no shift)
    entropy: float = NAN
    entropy_ci: Interval = NO_CI
    divergences: list[dict[str, Any]] | None = None  # greedy outputs that differ from their AR baseline

    @classmethod
    def of(cls, ok: Sequence[RequestRecord], pairs: Pairs, greedy: bool, synthetic: bool) -> Quality:
        _, lo, hi = intervals.mean_ci(metrics.per_prompt_mean(ok, lambda r: float(np.mean(r.token_entropy or [NAN]))))
        out = cls(entropy=metrics.mean_entropy(ok), entropy_ci=(lo, hi))
        n = sum(k for e, k in pairs.exact if e == e)
        out.exact_match = sum(e * k for e, k in pairs.exact if e == e) / n if n and greedy else NAN
        if greedy:
            out.divergences = divergences(pairs.pairs)
        if pairs.spec_recs and any(r.target_logprobs for r in pairs.spec_recs):
            out.ppl_diff = metrics.perplexity_difference(pairs.base_recs, pairs.spec_recs)
            if not greedy:  # greedy outputs are compared token by token (exact match), not in distribution
                out.logprob_p = metrics.logprob_shift_test(pairs.base_recs, pairs.spec_recs)["p_value"]
        if synthetic:
            out.exact_match, out.ppl_diff, out.logprob_p = NAN, NAN, NAN
        return out


def divergences(pairs: Iterable[tuple[RequestRecord, RequestRecord]]) -> list[dict[str, Any]]:
    """Greedy pairs whose outputs differ: the prompt, the first diverging position and, where the engine
    gives the target's log-probabilities, the target's margin there (log p of AR's token − log p of the
    speculative one, both after the same prefix: a near-tie reads as a small margin)."""
    out = []
    for b, s in pairs:
        pos = metrics.first_divergence(b.output_ids, s.output_ids)
        if pos is None:
            continue
        lb, ls = b.target_logprobs or [], s.target_logprobs or []
        margin = lb[pos] - ls[pos] if pos < len(lb) and pos < len(ls) else NAN
        out.append({"task": s.task, "prompt_id": s.prompt_id, "repeat": s.repeat, "position": pos, "margin": margin})
    return out


@dataclass
class Cost:
    """What speculation costs, measured: memory overhead, c and the verification cost in AR steps, the
    baseline's prefill share, and (where filled) the draft mix and model checks the cost model reads."""

    memory_overhead_bytes: float = NAN
    c: float = NAN
    verify_ratio: float = NAN
    prefill_share: float = (
        NAN  # Σ baseline TTFT / Σ baseline E2E of the paired requests (what speculation cannot speed)
    )
    # measured draft lengths and step costs per k (analysis.drafts.with_draft_mix fills it): the cost model's input
    draft_mix: costmodel.DraftMix | None = None
    # what the cost model assumes, as measured (analysis.drafts.model_checks): for the rows' model notes
    model_checks: dict[str, float] = field(default_factory=dict)

    @classmethod
    def of(cls, pairs: Pairs) -> Cost:
        cs = [c for c, _ in pairs.costs if c == c]
        vs = [v for _, v in pairs.costs if v == v]
        return cls(
            memory_overhead_bytes=float(np.max(pairs.mem)) if pairs.mem else NAN,
            c=float(np.mean(cs)) if cs else NAN,
            verify_ratio=float(np.mean(vs)) if vs else NAN,
            prefill_share=prefill_share(pairs.base_recs),
        )


def prefill_share(baseline: Sequence[RequestRecord]) -> float:
    """Σ TTFT / Σ E2E over the baseline's finished requests: the part of a request speculation leaves alone."""
    done = [r for r in baseline if r.status == "ok" and r.first_token_s is not None and r.end_s]
    total = sum(float(r.end_s or 0.0) for r in done)
    return sum(float(r.first_token_s or 0.0) for r in done) / total if total > 0 else NAN


@dataclass
class Sample:
    """What the row pooled, and under which conditions: the n of its intervals (distinct prompts), how its
    pairs were timed, and whether its acceptance was synthetic, its sampling greedy, its drafter separate."""

    n_requests: int = 0
    n_cells: int = 0
    n_errors: int = 0
    n_prompts: int = 0  # distinct paired prompts (AR rows: distinct prompts run): the n of every interval
    n_pairs: int = 0  # paired requests (repeats included): not the n of any interval
    n_repeats: int = 0  # repeats of the cells (run-to-run spread); a prompt's repeats are nested in it
    arms_apart_s: float = NAN  # median seconds between the starts of a pair's AR and speculative requests
    arms_order: str = ""  # how the pairs were timed: in time, cell after cell, mixed
    separate_draft: bool = False  # every cell drafts with its own model (draft_target), which also reads the prompt
    block: bool = False  # every cell drafts its γ tokens in one forward (DFlash): c is per forward, paid once a step
    synthetic: str | None = None  # the synthetic-acceptance rule when the cells used one
    greedy: bool = True

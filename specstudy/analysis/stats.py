"""Statistics over a study's cells: pooled headline numbers with CIs, step costs, break-even points.

The centres come from :mod:`specstudy.metrics` (the one definition of every metric), and so do
the 95 % intervals (:func:`intervals.ratio_ci`, :func:`intervals.mean_ci`).  The unit of every
interval is the prompt: a prompt's repeats (and its cells, when a row pools several) are summed
or averaged first, and ``n_prompts`` counts distinct prompts.  Predictions use
:mod:`specstudy.costmodel` and are always labelled as such where they are shown.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeGuard

import numpy as np

from .. import costmodel, intervals, metrics
from ..frameworks import block_drafting
from ..records import RequestRecord, StepRecord
from .pairing import arms_apart
from .study_records import Study

NAN = float("nan")


def isnum(x: Any) -> TypeGuard[float]:
    """A real number that is not NaN (bools are not numbers here)."""
    return isinstance(x, (int, float, np.floating, np.integer)) and not isinstance(x, bool) and x == x


@dataclass
class Pooled:
    """Headline numbers of a set of cells, each with its n and 95 % CI.

    Acceptance and quality stay unset (None / NaN) for synthetic-acceptance cells: their drafts
    were accepted at a chosen rate for timing, so nothing about acceptance or quality was measured.
    """

    n_requests: int = 0
    n_cells: int = 0
    tokens_per_s: float = NAN
    tokens_per_s_ci: tuple[float, float] = (NAN, NAN)
    alpha: float | None = None
    alpha_ci: tuple[float, float] = (NAN, NAN)
    alpha_hat: float | None = None
    acceptance_length: float | None = None
    acceptance_length_ci: tuple[float, float] = (NAN, NAN)
    tokens_per_forward: float | None = None
    per_position_conditional: list[float] | None = None
    per_position_unconditional: list[float] | None = None
    speedup: float = NAN
    speedup_ci: tuple[float, float] = (NAN, NAN)
    speedup_runs: tuple[float, float] = (NAN, NAN)  # lowest and highest per-repeat speedup (run-to-run)
    speedup_precision: float = NAN  # the speedup interval's half-width / the speedup (the stopping rule's figure)
    decode_speedup: float = NAN  # baseline TPOT / speculative TPOT over prompts: the decode phase alone
    decode_speedup_ci: tuple[float, float] = (NAN, NAN)
    n_repeats: int = 0  # repeats of the cells (run-to-run spread); a prompt's repeats are nested in it
    n_pairs: int = 0  # paired requests (repeats included): not the n of any interval
    n_prompts: int = 0  # distinct paired prompts (AR rows: distinct prompts run): the n of every interval
    arms_apart_s: float = NAN  # median seconds between the starts of a pair's AR and speculative requests
    arms_order: str = ""  # how the pairs were timed: in time, cell after cell, mixed
    acceptance_length_per_request: float | None = None  # AIPerf's per-request mean AL (never drafted: 1.0)
    never_drafted: int | None = None  # requests with counters and no draft step (AL 1.0 in the mean above)
    divergences: list[dict[str, Any]] | None = None  # greedy outputs that differ from their AR baseline
    exact_match: float = NAN
    ppl_diff: float = NAN  # PPL(speculative) − PPL(paired baseline) under the target
    logprob_p: float = NAN  # sign-flip test: outputs score alike under the target (large p: no shift)
    entropy: float = NAN
    entropy_ci: tuple[float, float] = (NAN, NAN)
    ttft_s: float = NAN
    ttft_p50_s: float = NAN
    ttft_p99_s: float = NAN
    tpot_s: float = NAN
    tpot_ci: tuple[float, float] = (NAN, NAN)
    tpot_p50_s: float = NAN
    tpot_p99_s: float = NAN
    e2e_s: float = NAN
    e2e_p50_s: float = NAN
    e2e_p99_s: float = NAN
    memory_overhead_bytes: float = NAN
    c: float = NAN
    verify_ratio: float = NAN
    prefill_share: float = (
        NAN  # Σ baseline TTFT / Σ baseline E2E of the paired requests (what speculation cannot speed)
    )
    n_errors: int = 0
    separate_draft: bool = False  # every cell drafts with its own model (draft_target), which also reads the prompt
    block: bool = False  # every cell drafts its γ tokens in one forward (DFlash): c is per forward, paid once a step
    synthetic: str | None = None  # the synthetic-acceptance rule when the cells used one
    greedy: bool = True
    # measured draft lengths and step costs per k (analysis.drafts.with_draft_mix fills it): the cost model's input
    draft_mix: costmodel.DraftMix | None = None
    # what the cost model assumes, as measured (analysis.drafts.model_checks): for the rows' model notes
    model_checks: dict[str, float] = field(default_factory=dict)


def _span(batch: Sequence[RequestRecord]) -> float:
    """Seconds from a batch's first send to its last finish."""
    t0 = min(r.start_epoch for r in batch)
    return max(r.start_epoch - t0 + float(r.end_s or 0.0) for r in batch)


def _throughput(ok: Sequence[RequestRecord]) -> tuple[float, tuple[float, float]]:
    """tokens/s of the cells' requests: Σ tokens / Σ E2E at batch 1 (one stream); one cell of
    batches run one after another: Σ tokens / Σ batch spans, its CI over batches (each batch holds
    prompts of its own); else the mean over cells."""
    if not ok:
        return NAN, (NAN, NAN)
    if all(r.batch_size == 1 for r in ok):
        tps = metrics.per_request_throughput(ok)
        sums = metrics.per_prompt_sums([r for r in ok if r.end_s], lambda r: (r.output_tokens, float(r.end_s or 0.0)))
        return tps, intervals.ratio_ci(sums[:, 0], sums[:, 1]) if sums.size else (NAN, NAN)
    by_cell: dict[str, list[RequestRecord]] = {}
    for r in ok:
        by_cell.setdefault(r.cell_id, []).append(r)
    vals = [metrics.output_throughput(v) for v in by_cell.values()]
    if len(vals) == 1:
        # one cell of batches run one after another: an interval over its batches, Σ batch tokens /
        # Σ batch wall span.  A batch is batch_size consecutive sends (a server's load generator
        # sends a batch's requests microseconds apart, so their start times differ a little)
        rows = sorted(ok, key=lambda r: r.start_epoch)
        size = max(1, int(rows[0].batch_size))
        batches = [rows[i : i + size] for i in range(0, len(rows), size)]
        starts = [min(r.start_epoch for r in b) for b in batches]
        walls = [_span(b) for b in batches]
        disjoint = all(nxt >= t + w - 1e-3 for nxt, t, w in zip(starts[1:], starts, walls))
        if len(batches) < 2 or not disjoint:  # a concurrency-limited stream has no batches to resample
            return vals[0], (NAN, NAN)
        toks = [sum(r.output_tokens for r in b) for b in batches]
        return sum(toks) / sum(walls), intervals.ratio_ci(
            toks, walls
        )  # a batch's prompts are its own: batches are units
    m, lo, hi = intervals.mean_ci(vals)
    return m, (lo, hi)


def _step_times(rec: RequestRecord) -> tuple[list[tuple[StepRecord, float]], bool]:
    """(decode step, its seconds) after the prompt pass, and whether the time is the whole step.

    The reference engine times drafting (``draft_s``) and the target's forward (``verify_s``)
    apart; llama.cpp reports each forward's own time with its drafting inside
    (``extra["llamacpp_forward_ms"]``), so there the whole step is the verification cost and c is 0.
    """
    timed = [(st, st.verify_s) for st in rec.steps[1:] if st.verify_s is not None]
    if timed:
        return timed, False
    ms = rec.extra.get("llamacpp_forward_ms") if rec.extra else None
    if ms:
        return [(st, m / 1e3) for st, m in zip(rec.steps[1:], ms)], True
    return [], False


def step_costs(
    spec: Sequence[RequestRecord], baseline: Sequence[RequestRecord], block: bool = False
) -> tuple[float, float]:
    """(c, verify_ratio) from step timings, in units of the baseline's AR decode step T1.

    c = draft time per drafted token / T1 (the c of Leviathan et al. and DESIGN.md), or for a block
    drafter (``block``: DFlash) per draft forward, one per step whatever γ; verify_ratio =
    time of one verification forward over γ+1 tokens / T1.  T1 is the mean time of the baseline's
    decode steps (the prefill step, which emits the first token, is excluded).  NaN when the engine
    does not time its steps.
    """
    t1 = [t for r in baseline if r.status == "ok" for _, t in _step_times(r)[0]]
    timed = [(_step_times(r)) for r in spec if r.status == "ok"]
    steps = [(st, t, whole) for pairs, whole in timed for st, t in pairs if st.drafted > 0]
    if not t1 or not steps:
        return NAN, NAN
    T1 = float(np.mean(t1))
    if T1 <= 0:
        return NAN, NAN
    if all(whole for _, _, whole in steps):  # drafting is inside each step's own time
        c = 0.0
    else:
        ds = [(st.draft_s, st.drafted) for st, _, _ in steps if st.draft_s is not None]
        drafted = sum(1 if block else d for _, d in ds)
        c = (sum(t for t, _ in ds) / drafted) / T1 if ds and drafted else NAN
    v = float(np.mean([t for _, t, _ in steps])) / T1
    return c, v


def _acceptance(out: Pooled, ok: Sequence[RequestRecord]) -> None:
    acc = metrics.acceptance_summary(ok)
    if acc["alpha"] is None:
        return
    out.alpha, out.alpha_hat = acc["alpha"], acc["alpha_hat"]
    out.acceptance_length, out.tokens_per_forward = acc["acceptance_length"], acc["tokens_per_forward"]
    out.acceptance_length_per_request = acc["acceptance_length_per_request"]
    out.never_drafted = acc["never_drafted"]
    out.per_position_conditional = acc["per_position_conditional"]
    out.per_position_unconditional = acc["per_position_unconditional"]
    seen = [r for r in ok if r.drafted_tokens is not None]
    sums = metrics.per_prompt_sums(
        seen, lambda r: (r.accepted_tokens or 0, r.drafted_tokens or 0, float(metrics.draft_steps_of(r) or 0))
    )
    if sums.size and sums[:, 1].sum() > 0:
        out.alpha_ci = intervals.ratio_ci(sums[:, 0], sums[:, 1], upper=1.0)
    depth = max((len(r.drafts_per_position or []) for r in seen), default=0) or max(
        (r.gamma or 0 for r in seen), default=0
    )
    if acc["acceptance_length"] is not None and sums.size and sums[:, 2].sum() > 0:
        # AL = 1 + Σ accepted / Σ draft steps, where a step accepts at most the deepest draft
        lo, hi = intervals.ratio_ci(sums[:, 0], sums[:, 2], upper=float(depth) if depth else None)
        out.acceptance_length_ci = (1.0 + lo, 1.0 + hi)


def _latency(out: Pooled, ok: Sequence[RequestRecord]) -> None:
    lat = metrics.latency_summary(ok)
    out.ttft_s, out.ttft_p50_s, out.ttft_p99_s = lat["ttft_s_mean"], lat["ttft_s_p50"], lat["ttft_s_p99"]
    out.tpot_s, out.tpot_p50_s, out.tpot_p99_s = lat["tpot_s_mean"], lat["tpot_s_p50"], lat["tpot_s_p99"]
    out.e2e_s, out.e2e_p50_s, out.e2e_p99_s = lat["e2e_s_mean"], lat["e2e_s_p50"], lat["e2e_s_p99"]
    _, lo, hi = intervals.mean_ci(metrics.per_prompt_mean(ok, metrics.tpot))
    out.tpot_ci = (lo, hi)


@dataclass
class _Pairs:
    """What the cells' paired comparisons collect before they are pooled."""

    pairs: list[tuple[RequestRecord, RequestRecord]]
    repeats: dict[int, list[tuple[RequestRecord, RequestRecord]]]
    exact: list[tuple[float, int]]
    mem: list[float]
    costs: list[tuple[float, float]]
    base_recs: list[RequestRecord]
    spec_recs: list[RequestRecord]


Keep = Callable[[RequestRecord], bool]


def subset(records: Sequence[RequestRecord], keep: Keep | None) -> list[RequestRecord]:
    """The requests ``keep`` selects (a turn of the conversations, an input-length tier; all for None)."""
    return list(records) if keep is None else [r for r in records if keep(r)]


def _collect_pairs(data: Study, cell_ids: Sequence[str], keep: Keep | None = None, block: bool = False) -> _Pairs:
    acc = _Pairs([], {}, [], [], [], [], [])
    for cid in cell_ids:
        base, spec = subset(data.baseline(cid), keep), subset(data.records.get(cid, []), keep)
        if not base or not spec:
            continue
        pairs = metrics.paired_records(base, spec)
        acc.pairs += pairs
        acc.repeats.setdefault(data.meta(cid)["repeat"], []).extend(pairs)
        acc.exact.append((metrics.exact_match_rate(base, spec), len(pairs)))
        pk_s = [r.peak_memory_bytes for r in spec if r.peak_memory_bytes is not None]
        pk_b = [r.peak_memory_bytes for r in base if r.peak_memory_bytes is not None]
        if pk_s and pk_b:
            acc.mem.append(metrics.memory_overhead(max(pk_s), max(pk_b)))
        acc.costs.append(step_costs(spec, base, block))
        acc.base_recs += base
        acc.spec_recs += spec
    return acc


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


def _paired(out: Pooled, pairs: _Pairs) -> None:
    if pairs.pairs:
        b, s, _ = metrics.per_prompt_means(pairs.pairs)
        out.speedup = metrics.speedup(b, s)
        out.speedup_ci = intervals.ratio_ci(b, s)
        out.speedup_precision = intervals.relative_half_width(out.speedup, out.speedup_ci)
        out.n_pairs, out.n_prompts = len(pairs.pairs), int(b.size)
        apart = arms_apart(pairs.pairs)
        out.arms_apart_s, out.arms_order = apart.median_s, apart.order
        tb, ts, _ = metrics.per_prompt_means(pairs.pairs, metrics.tpot)
        out.decode_speedup, out.decode_speedup_ci = metrics.speedup(tb, ts), intervals.ratio_ci(tb, ts)
    runs = [metrics.speedup(*metrics.per_prompt_means(rp)[:2]) for rp in pairs.repeats.values()]
    out.n_repeats = len(runs)
    if len(runs) > 1:
        out.speedup_runs = (float(min(runs)), float(max(runs)))
    n = sum(k for e, k in pairs.exact if e == e)
    out.exact_match = sum(e * k for e, k in pairs.exact if e == e) / n if n and out.greedy else NAN
    if out.greedy:
        out.divergences = divergences(pairs.pairs)
    if pairs.mem:
        out.memory_overhead_bytes = float(np.max(pairs.mem))
    cs = [c for c, _ in pairs.costs if c == c]
    vs = [v for _, v in pairs.costs if v == v]
    out.c = float(np.mean(cs)) if cs else NAN
    out.verify_ratio = float(np.mean(vs)) if vs else NAN
    out.prefill_share = prefill_share(pairs.base_recs)
    if pairs.spec_recs and any(r.target_logprobs for r in pairs.spec_recs):
        out.ppl_diff = metrics.perplexity_difference(pairs.base_recs, pairs.spec_recs)
        if not out.greedy:  # greedy outputs are compared token by token (exact match), not in distribution
            out.logprob_p = metrics.logprob_shift_test(pairs.base_recs, pairs.spec_recs)["p_value"]


def pooled(data: Study, cell_ids: Iterable[str], keep: Keep | None = None) -> Pooled:
    """Pool the requests of ``cell_ids`` (each paired with its own baseline cell); ``keep``: only the
    requests it selects, on both sides of each pair (one turn, one input-length tier)."""
    cell_ids = list(cell_ids)
    recs = [r for cid in cell_ids for r in subset(data.records.get(cid, []), keep)]
    ok = [r for r in recs if r.status == "ok"]
    out = Pooled(n_requests=len(recs), n_cells=len(cell_ids), n_errors=len(recs) - len(ok))
    if not ok:
        return out
    out.synthetic = next((r.synthetic_acceptance for r in ok if r.synthetic_acceptance), None)
    out.separate_draft = all(r.method == "draft_target" for r in ok)
    out.block = all(block_drafting(r.framework, r.method) for r in ok)
    out.greedy = all(r.temperature == 0.0 for r in ok)
    out.tokens_per_s, out.tokens_per_s_ci = _throughput(ok)
    if out.synthetic is None:  # fixed acceptance measures step costs, not acceptance or quality
        _acceptance(out, ok)
    out.entropy = metrics.mean_entropy(ok)
    _, lo, hi = intervals.mean_ci(metrics.per_prompt_mean(ok, lambda r: float(np.mean(r.token_entropy or [NAN]))))
    out.entropy_ci = (lo, hi)
    out.n_prompts = len({metrics.prompt_of(r) for r in ok})  # AR rows; a paired row counts its pairs below
    _latency(out, ok)
    _paired(out, _collect_pairs(data, cell_ids, keep, out.block))
    if out.synthetic is not None:
        out.exact_match, out.ppl_diff, out.logprob_p = NAN, NAN, NAN
    return out


def prefill_share(baseline: Sequence[RequestRecord]) -> float:
    """Σ TTFT / Σ E2E over the baseline's finished requests: the part of a request speculation leaves alone."""
    done = [r for r in baseline if r.status == "ok" and r.first_token_s is not None and r.end_s]
    total = sum(float(r.end_s or 0.0) for r in done)
    return sum(float(r.first_token_s or 0.0) for r in done) / total if total > 0 else NAN


def predicted_speedup(
    alpha_hat: float | None,
    gamma: int | None,
    c: float,
    verify_ratio: float,
    prefill: float = 0.0,
    draft_prefill: float = 0.0,
    block: bool = False,
) -> float:
    """Cost-model speedup from *measured* α̂, c and verification cost (NaN when any is unknown).

    The cost model speeds up the decode steps only (s_decode); :func:`request_speedup` turns that
    into the request-level speedup the measured E2E speedup compares with.  This form assumes γ
    drafted every step with i.i.d. acceptance; :func:`predicted_for` uses a row's measured draft
    lengths instead where it has them.
    """
    if not isnum(alpha_hat) or not gamma or not isnum(c) or not isnum(verify_ratio):
        return NAN
    s = costmodel.speedup_with_verify_cost(min(max(float(alpha_hat), 0.0), 1.0), int(gamma), c, verify_ratio, block)
    return request_speedup(s, prefill, draft_prefill)


def request_speedup(s_decode: float, prefill: float = 0.0, draft_prefill: float = 0.0) -> float:
    """1 / (f (1 + d) + (1 − f) / s_decode): speculation speeds up the decode steps only.

    f = ``prefill``, the baseline's measured share of E2E spent before the first token
    (:func:`prefill_share`); d = ``draft_prefill``, the draft model's prompt pass relative to the
    target's (a separate draft reads the prompt too; taken as c).
    """
    if not isnum(s_decode) or s_decode <= 0:
        return NAN
    f = prefill if isnum(prefill) and 0.0 <= prefill < 1.0 else 0.0
    d = draft_prefill if isnum(draft_prefill) and draft_prefill > 0 else 0.0
    return 1.0 / (f * (1.0 + d) + (1.0 - f) / s_decode)


VerifyCost = float | Callable[[int], float]  # T(k+1)/T(1) for a draft of k: one figure, or one per k


def mix_costs(
    p: Pooled, c: float | None = None, verify_ratio: VerifyCost | None = None
) -> tuple[float, Callable[[int], float] | None, float]:
    """(c, verify cost per drafted k, cost of a step without a draft) for :func:`costmodel.mix_speedup`.

    The row's own measured costs by default: per k where its steps were timed, else the row's mean
    verification cost for every k, and its steps without a draft as measured (else one AR step).
    ``c``/``verify_ratio`` override them (a cost measured elsewhere, in units of one AR step).
    """
    mix = p.draft_mix
    own_c = mix.c if mix is not None and isnum(mix.c) else p.c
    c = own_c if c is None else c
    if callable(verify_ratio):
        return c, verify_ratio, 1.0
    if verify_ratio is not None:
        fixed = verify_ratio
        return c, (lambda k: fixed) if isnum(fixed) else None, 1.0
    curve = verify_curve(dict(mix.verify_by_k)) if mix is not None else None
    v = p.verify_ratio
    if curve is None and isnum(v):
        curve = lambda k: v  # noqa: E731
    no_draft = mix.no_draft if mix is not None and isnum(mix.no_draft) else 1.0
    return c, curve, no_draft


def predicted_for(
    p: Pooled, gamma: int | None, c: float | None = None, verify_ratio: VerifyCost | None = None
) -> float:
    """The cost model's request-level speedup of a pooled row, with its own prefill share and, for a
    separate draft model, its prompt pass (c of the target's); ``c``/``verify_ratio`` override the row's.

    With the row's measured draft lengths (``p.draft_mix``): :func:`costmodel.mix_speedup`, so steps
    without a draft and drafts shorter than γ count as measured; γ past the measured depth takes
    α̂ there.  Without them: :func:`predicted_speedup` (γ every step, i.i.d. α̂).  Synthetic rows: NaN.
    """
    mix = p.draft_mix
    if mix is None or p.synthetic is not None or not gamma:
        c = p.c if c is None else c
        v = p.verify_ratio if verify_ratio is None else verify_ratio
        v = v(int(gamma or 0)) if callable(v) else v
        return predicted_speedup(p.alpha_hat, gamma, c, v, p.prefill_share, c if p.separate_draft else 0.0, p.block)
    c, curve, no_draft = mix_costs(p, c, verify_ratio)
    if not mix.draft_steps:  # nothing drafted: every step costs a lookup and an AR step, whatever c is
        c, curve = 0.0, lambda k: NAN
    if not isnum(c) or curve is None:
        return NAN
    beyond = min(max(float(p.alpha_hat), 0.0), 1.0) if isnum(p.alpha_hat) else None
    if int(gamma) > mix.gamma and beyond is None:
        return NAN
    s = costmodel.mix_speedup(mix, int(gamma), c, curve, no_draft, beyond)
    return request_speedup(s, p.prefill_share, c if p.separate_draft else 0.0)


def break_even(batches: Sequence[float], speedups: Sequence[float]) -> float | None:
    """First batch size where the measured speedup crosses below 1 (log-linear interpolation)."""
    pts = [(b, s) for b, s in zip(batches, speedups) if isnum(s)]
    for (b0, s0), (b1, s1) in zip(pts, pts[1:]):
        if s0 >= 1.0 > s1:
            f = (s0 - 1.0) / (s0 - s1)
            return float(2 ** (math.log2(b0) + f * (math.log2(b1) - math.log2(b0))))
    if pts and pts[0][1] < 1.0:
        return float(pts[0][0])
    return None


def verify_curve(ratios: dict[int, float]) -> Callable[[int], float] | None:
    """Verification cost per γ from the γ values measured (nearest measured γ; 1 when none)."""
    if not ratios:
        return None
    gs = sorted(ratios)
    return lambda g: ratios[min(gs, key=lambda x: (abs(x - g), x))]


def break_even_alpha(c: float, verify_ratio: float) -> float:
    """Smallest α at which some γ in 1..16 predicts a speedup ≥ 1 (bisection on the cost model)."""

    def best(a: float) -> float:
        return costmodel.optimal_gamma(a, c, 16, lambda g: verify_ratio)[1]

    if best(0.999) < 1.0:
        return 1.0
    lo, hi = 0.0, 0.999
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if best(mid) < 1.0 else (lo, mid)
    return hi


def entropy_correlation(points: Any) -> float | None:
    """Pearson r of α with entropy over requests; None when fewer than 3 points or constant entropy."""
    if len(points) > 2 and points["entropy"].nunique() > 1:
        return float(np.corrcoef(points["entropy"], points["alpha"])[0, 1])
    return None

"""Statistics over a study's cells: pooled headline numbers with CIs, step costs, break-even points.

A pooled row (:class:`Pooled`) is made of the typed parts of :mod:`.row_parts`, each with its centres
from :mod:`specstudy.metrics` (the one definition of every metric) and its 95 % intervals
(:func:`intervals.ratio_ci`, :func:`intervals.mean_ci`) from one function.  The unit of every
interval is the prompt: a prompt's repeats (and its cells, when a row pools several) are summed
or averaged first, and ``sample.n_prompts`` counts distinct prompts.  Predictions use
:mod:`specstudy.costmodel` and are always labelled as such where they are shown.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeGuard

import numpy as np

from .. import costmodel, metrics
from ..frameworks import block_drafting
from ..records import RequestRecord, StepRecord
from .pairing import arms_apart
from .row_parts import Acceptance, Cost, Latency, PairedSpeedup, Pairs, Quality, Sample, Throughput
from .study_records import Study

NAN = float("nan")


def isnum(x: Any) -> TypeGuard[float]:
    """A real number that is not NaN (bools are not numbers here)."""
    return isinstance(x, (int, float, np.floating, np.integer)) and not isinstance(x, bool) and x == x


@dataclass
class Pooled:
    """Headline numbers of a set of cells in typed parts (:mod:`.row_parts`), each part's estimates with
    their n and 95 % CI from one function.

    Acceptance and quality stay unset (None / NaN) for synthetic-acceptance cells: their drafts
    were accepted at a chosen rate for timing, so nothing about acceptance or quality was measured.
    """

    sample: Sample = field(default_factory=Sample)
    throughput: Throughput = field(default_factory=Throughput)
    acceptance: Acceptance = field(default_factory=Acceptance)
    latency: Latency = field(default_factory=Latency)
    paired: PairedSpeedup = field(default_factory=PairedSpeedup)
    quality: Quality = field(default_factory=Quality)
    cost: Cost = field(default_factory=Cost)

    def value(self, name: str) -> Any:
        """The field ``name`` of whichever part holds it (field names are unique across parts): for code
        that names a figure in data, as a claim does (``"speedup"``, ``"acceptance_length"``)."""
        for f in dataclasses.fields(self):
            part = getattr(self, f.name)
            if name in {g.name for g in dataclasses.fields(part)}:
                return getattr(part, name)
        raise KeyError(f"no part of a pooled row holds {name!r}")

    def record(self) -> dict[str, Any]:
        """Every field of every part, flat: a table's CSV columns (field names are unique across parts)."""
        return {k: v for f in dataclasses.fields(self) for k, v in dataclasses.asdict(getattr(self, f.name)).items()}


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


Keep = Callable[[RequestRecord], bool]


def subset(records: Sequence[RequestRecord], keep: Keep | None) -> list[RequestRecord]:
    """The requests ``keep`` selects (a turn of the conversations, an input-length tier; all for None)."""
    return list(records) if keep is None else [r for r in records if keep(r)]


def _collect_pairs(data: Study, cell_ids: Sequence[str], keep: Keep | None = None, block: bool = False) -> Pairs:
    acc = Pairs()
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


def is_block(ok: Sequence[RequestRecord]) -> bool:
    """Every request drafted its γ tokens in one forward (DFlash): c is per forward, paid once a step."""
    return bool(ok) and all(block_drafting(r.framework, r.method) for r in ok)


def _sample(
    cell_ids: Sequence[str],
    recs: Sequence[RequestRecord],
    ok: Sequence[RequestRecord],
    pairs: Pairs,
    block: bool = False,
) -> Sample:
    """What a row pooled: n of requests, cells, errors and prompts (paired prompts where it has pairs),
    how its pairs were timed, and its conditions (synthetic acceptance, greedy, separate draft, ``block``:
    :func:`is_block` of ``ok``, which the pairs' step costs took too)."""
    out = Sample(n_requests=len(recs), n_cells=len(cell_ids), n_errors=len(recs) - len(ok))
    if not ok:
        return out
    out.synthetic = next((r.synthetic_acceptance for r in ok if r.synthetic_acceptance), None)
    out.separate_draft = all(r.method == "draft_target" for r in ok)
    out.block = block
    out.greedy = all(r.temperature == 0.0 for r in ok)
    out.n_prompts = len({metrics.prompt_of(r) for r in ok})  # AR rows; a paired row counts its pairs below
    if pairs.pairs:
        out.n_pairs, out.n_prompts = len(pairs.pairs), int(metrics.per_prompt_means(pairs.pairs)[0].size)
        apart = arms_apart(pairs.pairs)
        out.arms_apart_s, out.arms_order = apart.median_s, apart.order
    out.n_repeats = len(pairs.repeats)
    return out


def pooled(data: Study, cell_ids: Iterable[str], keep: Keep | None = None) -> Pooled:
    """Pool the requests of ``cell_ids`` (each paired with its own baseline cell); ``keep``: only the
    requests it selects, on both sides of each pair (one turn, one input-length tier)."""
    cell_ids = list(cell_ids)
    recs = [r for cid in cell_ids for r in subset(data.records.get(cid, []), keep)]
    ok = [r for r in recs if r.status == "ok"]
    if not ok:
        return Pooled(_sample(cell_ids, recs, ok, Pairs()))
    block = is_block(ok)
    pairs = _collect_pairs(data, cell_ids, keep, block)
    sample = _sample(cell_ids, recs, ok, pairs, block)
    return Pooled(
        sample=sample,
        throughput=Throughput.of(ok),
        # fixed acceptance measures step costs, not acceptance or quality
        acceptance=Acceptance.of(ok) if sample.synthetic is None else Acceptance(),
        latency=Latency.of(ok),
        paired=PairedSpeedup.of(pairs),
        quality=Quality.of(ok, pairs, sample.greedy, sample.synthetic is not None),
        cost=Cost.of(pairs),
    )


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
    (:func:`.row_parts.prefill_share`); d = ``draft_prefill``, the draft model's prompt pass relative to the
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
    mix = p.cost.draft_mix
    own_c = mix.c if mix is not None and isnum(mix.c) else p.cost.c
    c = own_c if c is None else c
    if callable(verify_ratio):
        return c, verify_ratio, 1.0
    if verify_ratio is not None:
        fixed = verify_ratio
        return c, (lambda k: fixed) if isnum(fixed) else None, 1.0
    curve = verify_curve(dict(mix.verify_by_k)) if mix is not None else None
    v = p.cost.verify_ratio
    if curve is None and isnum(v):
        curve = lambda k: v  # noqa: E731
    no_draft = mix.no_draft if mix is not None and isnum(mix.no_draft) else 1.0
    return c, curve, no_draft


def predicted_for(
    p: Pooled, gamma: int | None, c: float | None = None, verify_ratio: VerifyCost | None = None
) -> float:
    """The cost model's request-level speedup of a pooled row, with its own prefill share and, for a
    separate draft model, its prompt pass (c of the target's); ``c``/``verify_ratio`` override the row's.

    With the row's measured draft lengths (``p.cost.draft_mix``): :func:`costmodel.mix_speedup`, so steps
    without a draft and drafts shorter than γ count as measured; γ past the measured depth takes
    α̂ there.  Without them: :func:`predicted_speedup` (γ every step, i.i.d. α̂).  Synthetic rows: NaN.
    """
    mix = p.cost.draft_mix
    if mix is None or p.sample.synthetic is not None or not gamma:
        c = p.cost.c if c is None else c
        v = p.cost.verify_ratio if verify_ratio is None else verify_ratio
        v = v(int(gamma or 0)) if callable(v) else v
        return predicted_speedup(
            p.acceptance.alpha_hat,
            gamma,
            c,
            v,
            p.cost.prefill_share,
            c if p.sample.separate_draft else 0.0,
            p.sample.block,
        )
    c, curve, no_draft = mix_costs(p, c, verify_ratio)
    if not mix.draft_steps:  # nothing drafted: every step costs a lookup and an AR step, whatever c is
        c, curve = 0.0, lambda k: NAN
    if not isnum(c) or curve is None:
        return NAN
    beyond = min(max(float(p.acceptance.alpha_hat), 0.0), 1.0) if isnum(p.acceptance.alpha_hat) else None
    if int(gamma) > mix.gamma and beyond is None:
        return NAN
    s = costmodel.mix_speedup(mix, int(gamma), c, curve, no_draft, beyond)
    return request_speedup(s, p.cost.prefill_share, c if p.sample.separate_draft else 0.0)


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

"""The one definition of every metric: pure functions over numbers and :class:`RequestRecord`s.

Conventions (the seed article's metric table):

* **α (acceptance rate, 採択率)** = accepted draft tokens / drafted tokens.  This is the
  *empirical* rate over all drafted positions; it is not the i.i.d. α of Leviathan et al.
  (positions after a rejection are never reached but still counted as drafted).
  :func:`alpha_hat` estimates the i.i.d. α from per-position counts.
* **AL (acceptance length, 期待採択長)** = 1 + accepted / draft steps, where a *draft step* is a
  target forward that verified at least one drafted token: the tokens one verification step
  yields, bonus token included.  It is the seed's expected accepted length (comparable with
  (1 − α^(γ+1)) / (1 − α), :func:`expected_acceptance_length`) and vLLM's, SGLang's, SPEED-Bench's
  and AIPerf's figure, and TensorRT-LLM 1.x's too: its PyTorch executor
  (``tensorrt_llm/_torch/pyexecutor/py_executor.py``) sets ``acceptance_length`` = (accepted +
  requests with drafts) / requests with drafts, the bonus token included (its backend records the
  convention it finds, and normalises a release that would report AL − 1).
* **tokens per target forward** = output tokens / every target forward (the prompt pass and
  forwards that drafted nothing included): a cost figure, not AL.
* **per-position acceptance**, two forms: *conditional* (accepted at k / steps that reached k,
  SPEED-Bench's) and *unconditional* (accepted at k / draft steps, vLLM's).
* **TTFT** = time from sending the request to the first output token.
* **TPOT** = (E2E − TTFT) / (n − 1) for n output tokens; NaN when n ≤ 1.
* **ITL** = gaps between consecutive arrivals of output chunks.
* **speedup** = paired baseline latency / speculative latency, same prompts, sampling, engine.
* **memory overhead** = peak(speculative) − peak(baseline).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from .intervals import ratio_ci
from .records import RequestRecord

NAN = float("nan")

#: latencies of paired requests, one float per pair
FloatArray = npt.NDArray[np.float64]

# --------------------------------------------------------------------------------------------
# acceptance


def acceptance_rate(accepted: int, drafted: int) -> float:
    """α = accepted / drafted; NaN when nothing was drafted."""
    if drafted < 0 or accepted < 0 or accepted > drafted:
        raise ValueError(f"need 0 <= accepted ({accepted}) <= drafted ({drafted})")
    return accepted / drafted if drafted else NAN


def acceptance_length(accepted: int, draft_steps: int) -> float:
    """AL = 1 + accepted / draft steps (the tokens one verification yields); NaN without draft steps."""
    if accepted < 0 or draft_steps < 0:
        raise ValueError(f"need accepted ({accepted}) >= 0 and draft_steps ({draft_steps}) >= 0")
    return 1.0 + accepted / draft_steps if draft_steps else NAN


def tokens_per_forward(output_tokens: int, target_forwards: int) -> float:
    """Output tokens / every target forward (prompt pass included): a cost figure, not AL."""
    return output_tokens / target_forwards if target_forwards else NAN


def per_position_unconditional(accepted_per_position: Sequence[int], draft_steps: int) -> list[float]:
    """a_k / draft steps: P(position k accepted) per draft step, k = 1..γ (vLLM's form)."""
    return [a / draft_steps if draft_steps else NAN for a in accepted_per_position]


def reached_per_position(accepted_per_position: Sequence[int], drafts_per_position: Sequence[int]) -> list[int]:
    """Steps that reached position k: all that drafted it for k = 1, else those that accepted k − 1."""
    acc, drafted = list(accepted_per_position), list(drafts_per_position)
    return [min(drafted[0] if k == 0 else acc[k - 1], drafted[k]) for k in range(len(drafted))]


def per_position_conditional(accepted_per_position: Sequence[int], drafts_per_position: Sequence[int]) -> list[float]:
    """accepted at k / steps that reached k (SPEED-Bench's form): the i.i.d. α at every k if acceptance is i.i.d."""
    reached = reached_per_position(accepted_per_position, drafts_per_position)
    return [a / r if r else NAN for a, r in zip(accepted_per_position, reached)]


def alpha_hat(
    accepted_per_position: Sequence[int], drafts_per_position: Sequence[int], prior: tuple[float, float] = (0.0, 0.0)
) -> float:
    """Maximum-likelihood i.i.d. α from per-position counts.

    Position k is *reached* in a step when positions 1..k−1 were accepted, i.e. in
    ``accepted_per_position[k-2]`` steps (all ``drafts_per_position[0]`` steps for k = 1), capped
    by how many steps drafted position k.  α̂ = Σ accepted / Σ reached.  A Beta(a, b) ``prior``
    gives the posterior mean (Σ accepted + a) / (Σ reached + a + b) instead, defined before any
    draft (what an online γ policy needs).
    """
    acc = list(accepted_per_position)
    reached = sum(reached_per_position(acc, drafts_per_position))
    a, b = prior
    return (sum(acc) + a) / (reached + a + b) if reached + a + b else NAN


def expected_acceptance_length(alpha: float, gamma: int) -> float:
    """AL(α, γ) = (1 − α^(γ+1)) / (1 − α): expected tokens per draft step under i.i.d. acceptance."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha={alpha!r}: must lie in [0, 1]")
    if gamma < 0:
        raise ValueError(f"gamma={gamma!r}: must be >= 0")
    if alpha == 1.0:
        return float(gamma + 1)
    return (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)


def alpha_from_acceptance_length(al: float, gamma: int, tol: float = 1e-12) -> float:
    """Inverse of :func:`expected_acceptance_length` in α (monotone increasing), by bisection."""
    if not 1.0 <= al <= gamma + 1:
        raise ValueError(f"acceptance length={al!r}: must lie in [1, gamma+1={gamma + 1}]")
    lo, hi = 0.0, 1.0
    while hi - lo > tol:
        mid = (lo + hi) / 2
        if expected_acceptance_length(mid, gamma) < al:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


# --------------------------------------------------------------------------------------------
# latency


def ttft(rec: RequestRecord) -> float:
    return rec.first_token_s if rec.first_token_s is not None else NAN


def e2e(rec: RequestRecord) -> float:
    return rec.end_s if rec.end_s is not None else NAN


def tpot(rec: RequestRecord) -> float:
    """(E2E − TTFT) / (n − 1); NaN for a one-token (or empty) output."""
    n = rec.output_tokens
    if n <= 1 or rec.end_s is None or rec.first_token_s is None:
        return NAN
    return (rec.end_s - rec.first_token_s) / (n - 1)


def queued(rec: RequestRecord) -> float:
    """Seconds a request waited at the client for a free slot before it was sent (0 without a cap).
    TTFT and E2E run from the send; a capacity judged at a request *rate* adds this wait, which a user
    arriving at that moment waits too (the load generator keeps it as ``extra["queued_s"]``)."""
    return float((rec.extra or {}).get("queued_s", 0.0))


def itl(rec: RequestRecord) -> list[float]:
    """Inter-chunk latencies (seconds) between consecutive output arrivals."""
    t = rec.chunk_times_s
    return [b - a for a, b in zip(t, t[1:])]


def output_throughput(records: Sequence[RequestRecord], wall_s: float | None = None) -> float:
    """Total output tokens / wall time.  Wall time defaults to the span of the requests."""
    ok = [r for r in records if r.status == "ok"]
    tokens = sum(r.output_tokens for r in ok)
    if wall_s is None:
        if not ok:
            return NAN
        starts = [r.start_epoch for r in ok]
        ends = [r.start_epoch + (r.end_s or 0.0) for r in ok]
        wall_s = max(ends) - min(starts)
    return tokens / wall_s if wall_s > 0 else NAN


def _run_span(records: Sequence[RequestRecord]) -> float:
    """Wall time from the first request's send to the last ok request's end (NaN if none)."""
    ok = [r for r in records if r.status == "ok"]
    if not ok:
        return NAN
    return max(r.start_epoch + (r.end_s or 0.0) for r in ok) - min(r.start_epoch for r in records)


def request_throughput(records: Sequence[RequestRecord], wall_s: float | None = None) -> float:
    """Completed (ok) requests / wall time; wall time defaults to the span of the run."""
    wall = _run_span(records) if wall_s is None else wall_s
    n = sum(1 for r in records if r.status == "ok")
    return n / wall if wall and wall > 0 else NAN


def meets_slo(
    rec: RequestRecord, ttft_s: float | None = None, tpot_s: float | None = None, e2e_s: float | None = None
) -> bool:
    """An ok request within every given SLO (TTFT, TPOT, E2E in seconds; None = no limit).

    A one-token output has no TPOT and passes a TPOT limit (nothing to exceed), as in vLLM's
    benchmark.
    """
    if rec.status != "ok":
        return False
    if ttft_s is not None and not ttft(rec) <= ttft_s:  # NaN (unknown) fails
        return False
    if e2e_s is not None and not e2e(rec) <= e2e_s:
        return False
    t = tpot(rec)
    return tpot_s is None or t != t or t <= tpot_s


def goodput(
    records: Sequence[RequestRecord],
    wall_s: float | None = None,
    ttft_s: float | None = None,
    tpot_s: float | None = None,
    e2e_s: float | None = None,
) -> float:
    """Requests per second that met every SLO (DistServe's goodput); wall time as in
    :func:`request_throughput`."""
    wall = _run_span(records) if wall_s is None else wall_s
    n = sum(1 for r in records if meets_slo(r, ttft_s, tpot_s, e2e_s))
    return n / wall if wall and wall > 0 else NAN


def slo_holds(
    records: Sequence[RequestRecord],
    ttft_s: float | None = None,
    tpot_s: float | None = None,
    e2e_s: float | None = None,
    percentile: float = 90.0,
    from_arrival: bool = False,
) -> bool | None:
    """Whether a run met a percentile SLO (MLPerf's form: p99 TTFT and p99 TPOT within their limits):
    the ``percentile`` of each limited latency over the run's requests, a request that failed counting
    as infinitely slow and a one-token output's TPOT as 0 (nothing to exceed).  None: no requests.
    ``from_arrival``: TTFT and E2E counted from each request's arrival, its wait for a slot
    (:func:`queued`) included, as MLPerf's server scenario counts them; without it a capped client
    hides the queue (coordinated omission) and an overloaded server still "meets" a TTFT limit."""
    if not records:
        return None
    for limit, fn, waits in ((ttft_s, ttft, from_arrival), (tpot_s, tpot, False), (e2e_s, e2e, from_arrival)):
        if limit is None:
            continue
        vals = [fn(r) + (queued(r) if waits else 0.0) if r.status == "ok" else math.inf for r in records]
        vals = [0.0 if v != v and fn is tpot else (math.inf if v != v else v) for v in vals]
        with np.errstate(invalid="ignore"):  # inf beside inf interpolates to NaN: read as a break
            at = float(np.percentile(vals, percentile))
        if not at <= limit:
            return False
    return True


def percentiles(values: Iterable[float], qs: Sequence[float] = (50, 90, 99)) -> dict[str, float]:
    v = np.asarray([x for x in values if x == x], dtype=float)
    return {f"p{int(q) if float(q).is_integer() else q}": (float(np.percentile(v, q)) if v.size else NAN) for q in qs}


# --------------------------------------------------------------------------------------------
# aggregation over records


def draft_steps_of(rec: RequestRecord) -> int | None:
    """A record's draft steps: its counter, else counted from its steps (parts written before the counter)."""
    if rec.draft_steps is not None:
        return rec.draft_steps
    if rec.steps:
        return sum(1 for s in rec.steps if s.drafted > 0)
    return None


@dataclass(frozen=True)
class Counters:
    """Acceptance counters summed over requests, prompts, iterations or a run: what α, AL and the
    per-position figures pool.  Why one type: every place that pools counters (a row, a golden row,
    a server's run counters, TensorRT-LLM's iteration stats) sums them here and nowhere else.

    ``draft_steps`` is None when some part lacks step counts (AL is then unknown); per-position
    lists are padded with zeros to the deepest part.
    """

    drafted: int = 0
    accepted: int = 0
    draft_steps: int | None = 0
    accepted_per_position: tuple[int, ...] = ()
    drafts_per_position: tuple[int, ...] = ()

    @classmethod
    def of(cls, rec: RequestRecord) -> Counters:
        """One request's counters (``draft_steps`` counted from its steps where it has no counter)."""
        return cls(
            int(rec.drafted_tokens or 0),
            int(rec.accepted_tokens or 0),
            draft_steps_of(rec),
            tuple(int(a) for a in rec.accepted_per_position or ()),
            tuple(int(d) for d in rec.drafts_per_position or ()),
        )

    @classmethod
    def pooled(cls, parts: Iterable[Counters]) -> Counters:
        """The sum of ``parts`` (an empty sum: nothing drafted, zero draft steps)."""
        out = cls()
        for c in parts:
            out = out + c
        return out

    def __add__(self, other: Counters) -> Counters:
        steps = None if self.draft_steps is None or other.draft_steps is None else self.draft_steps + other.draft_steps
        return Counters(
            self.drafted + other.drafted,
            self.accepted + other.accepted,
            steps,
            _padded_sum(self.accepted_per_position, other.accepted_per_position),
            _padded_sum(self.drafts_per_position, other.drafts_per_position),
        )

    @property
    def alpha(self) -> float:
        return acceptance_rate(self.accepted, self.drafted)

    @property
    def acceptance_length(self) -> float | None:
        return acceptance_length(self.accepted, self.draft_steps) if self.draft_steps is not None else None

    @property
    def per_position_unconditional(self) -> list[float] | None:
        if not self.accepted_per_position or self.draft_steps is None:
            return None
        return per_position_unconditional(self.accepted_per_position, self.draft_steps)


def _padded_sum(a: Sequence[int], b: Sequence[int]) -> tuple[int, ...]:
    n = max(len(a), len(b))
    return tuple((a[k] if k < len(a) else 0) + (b[k] if k < len(b) else 0) for k in range(n))


def counter_acceptance(
    source: str, drafts: int, drafted: int, accepted: int, accepted_per_position: Sequence[int]
) -> dict[str, Any]:
    """Run-scoped acceptance from an engine's own counters (after − before): the kit's α, AL
    (drafts = draft steps, so AL = 1 + accepted / drafts is vLLM's and llama.cpp's mean acceptance
    length) and per-position acceptance (unconditional: accepted at k / draft steps, vLLM's form)."""
    c = Counters(int(drafted), int(accepted), int(drafts), tuple(int(a) for a in accepted_per_position))
    return {
        "source": source,
        "drafts": drafts,
        "drafted_tokens": drafted,
        "accepted_tokens": accepted,
        "accepted_per_position": list(c.accepted_per_position),
        "alpha": c.alpha if drafted else None,
        "acceptance_length": c.acceptance_length if drafts else None,
        "per_position": c.per_position_unconditional if drafts and c.accepted_per_position else None,
    }


def acceptance_summary(records: Sequence[RequestRecord]) -> dict[str, Any]:
    """α, AL, tokens per target forward, α̂ and both per-position forms, pooled over ok requests with counters.

    AL comes both ways: ``acceptance_length`` pooled over tokens (1 + Σ accepted / Σ draft steps, what
    vLLM's counters give for a run) and ``acceptance_length_per_request`` (the mean over requests
    of each request's 1 + accepted / draft steps, AIPerf's ``mean_acceptance_length`` averaged over
    requests, where a request that never drafted counts 1.0 as AIPerf counts it).  They differ when
    requests of many draft steps accept more or less than short ones.  ``never_drafted`` counts the
    requests with counters and no draft step (what moves the per-request mean and not the pooled AL).
    """
    seen = [r for r in records if r.status == "ok" and r.drafted_tokens is not None]
    keys = (
        "alpha",
        "acceptance_length",
        "tokens_per_forward",
        "alpha_hat",
        "per_position_conditional",
        "per_position_unconditional",
        "acceptance_length_per_request",
        "draft_steps",
        "target_forwards",
        "never_drafted",
    )
    if not seen:
        return dict.fromkeys(keys)
    c = Counters.pooled(Counters.of(r) for r in seen)
    forwards = [r for r in seen if r.target_forwards is not None]
    depth = max((len(r.drafts_per_position or []) for r in seen), default=0)
    acc_k, dr_k = list(c.accepted_per_position[:depth]), list(c.drafts_per_position[:depth])
    acc_k += [0] * (depth - len(acc_k))
    return {
        "alpha": c.alpha,
        "acceptance_length": c.acceptance_length,
        "tokens_per_forward": (
            tokens_per_forward(sum(r.output_tokens for r in forwards), sum(r.target_forwards or 0 for r in forwards))
            if forwards
            else None
        ),
        "alpha_hat": alpha_hat(acc_k, dr_k) if depth else NAN,
        "per_position_conditional": per_position_conditional(acc_k, dr_k) if depth else None,
        "per_position_unconditional": (
            per_position_unconditional(acc_k, c.draft_steps) if depth and c.draft_steps is not None else None
        ),
        "acceptance_length_per_request": acceptance_length_per_request(seen),
        "draft_steps": c.draft_steps,
        "target_forwards": sum(r.target_forwards or 0 for r in forwards) if forwards else None,
        "never_drafted": sum(draft_steps_of(r) == 0 for r in seen) if c.draft_steps is not None else None,
    }


def acceptance_length_per_request(records: Sequence[RequestRecord]) -> float | None:
    """Mean over requests with counters of 1 + accepted / draft steps, a request that never drafted
    counting 1.0 (AIPerf's convention: the anchor the report names); None without step counts."""
    per = [(r.accepted_tokens or 0, draft_steps_of(r)) for r in records if r.drafted_tokens is not None]
    if not per or any(d is None for _, d in per):
        return None
    return float(np.mean([acceptance_length(a, d) if d else 1.0 for a, d in per]))


def latency_summary(records: Sequence[RequestRecord]) -> dict[str, float]:
    ok = [r for r in records if r.status == "ok"]
    out: dict[str, float] = {"n": float(len(ok))}
    for name, fn in (("ttft_s", ttft), ("tpot_s", tpot), ("e2e_s", e2e)):
        vals = [fn(r) for r in ok]
        out[f"{name}_mean"] = float(np.nanmean(vals)) if any(v == v for v in vals) else NAN
        for k, v in percentiles(vals).items():
            out[f"{name}_{k}"] = v
    itls = [x for r in ok for x in itl(r)]
    for k, v in percentiles(itls).items():
        out[f"itl_s_{k}"] = v
    out["output_tokens_per_s"] = per_request_throughput(ok)
    return out


def per_request_throughput(records: Sequence[RequestRecord]) -> float:
    """Σ output tokens / Σ E2E: tokens/s of one stream when requests run one after another."""
    ok = [r for r in records if r.status == "ok" and r.end_s]
    total_t = sum(r.end_s for r in ok)  # type: ignore[misc]
    return sum(r.output_tokens for r in ok) / total_t if total_t > 0 else NAN


# --------------------------------------------------------------------------------------------
# paired comparisons


def prompt_of(r: RequestRecord) -> tuple[str, str]:
    """The unit of every interval: one prompt of one task (its repeats and cells nested in it)."""
    return (r.task, r.prompt_id)


def _pair_key(r: RequestRecord) -> tuple[str, str, int, int]:
    """What pairs a speculative request with its baseline: the same prompt, repeat and turn."""
    return (r.task, r.prompt_id, r.repeat, r.turn)


def per_prompt_sums(
    records: Sequence[RequestRecord], values: Callable[[RequestRecord], tuple[float, ...]]
) -> FloatArray:
    """One row per distinct prompt: ``values`` summed over that prompt's requests (repeats, cells).

    What every ratio interval resamples: Σ accepted and Σ drafted of a prompt stay together.
    """
    acc: dict[tuple[str, str], np.ndarray] = {}
    for r in records:
        v = np.asarray(values(r), dtype=float)
        key = prompt_of(r)
        acc[key] = acc[key] + v if key in acc else v
    return np.asarray(list(acc.values()), dtype=float)


def per_prompt_mean(records: Sequence[RequestRecord], value: Callable[[RequestRecord], float]) -> list[float]:
    """The mean of ``value`` over each distinct prompt's requests (NaNs left out): one number per prompt."""
    acc: dict[tuple[str, str], list[float]] = {}
    for r in records:
        v = value(r)
        if v == v:
            acc.setdefault(prompt_of(r), []).append(v)
    return [float(np.mean(v)) for v in acc.values()]


def paired_records(
    baseline: Sequence[RequestRecord], spec: Sequence[RequestRecord]
) -> list[tuple[RequestRecord, RequestRecord]]:
    """(baseline, speculative) requests, both ok and finished, matched on prompt and repeat."""
    base = {_pair_key(r): r for r in baseline if r.status == "ok" and r.end_s is not None}
    return [(base[_pair_key(r)], r) for r in spec if r.status == "ok" and r.end_s is not None and _pair_key(r) in base]


def per_prompt_means(
    pairs: Iterable[tuple[RequestRecord, RequestRecord]], value: Any = None
) -> tuple[FloatArray, FloatArray, int]:
    """(baseline, speculative) means of ``value`` (E2E by default) per prompt, and the most repeats of one.

    Repeats of a prompt are averaged first, so every interval resamples prompts, not requests; the
    turns of one conversation are summed after that (a conversation is one prompt).
    Pairs whose value is NaN for either side (a one-token TPOT) are left out.
    """
    fn = value or e2e
    acc: dict[tuple[str, str], dict[int, list[tuple[float, float]]]] = {}
    for b, s in pairs:
        vb, vs = fn(b), fn(s)
        if vb == vb and vs == vs:
            acc.setdefault(prompt_of(s), {}).setdefault(s.turn, []).append((vb, vs))
    if not acc:
        return np.empty(0), np.empty(0), 0
    # a conversation's turns are one prompt: each turn's repeats averaged, then the turns summed
    means = np.asarray([np.sum([np.mean(v, axis=0) for v in t.values()], axis=0) for t in acc.values()], dtype=float)
    return means[:, 0], means[:, 1], max(len(v) for t in acc.values() for v in t.values())


def paired_latencies(baseline: Sequence[RequestRecord], spec: Sequence[RequestRecord]) -> tuple[FloatArray, FloatArray]:
    """Per-prompt mean E2E latencies (baseline, speculative) of the prompts ok in both runs."""
    b, s, _ = per_prompt_means(paired_records(baseline, spec))
    return b, s


def speedup(baseline_latency: Sequence[float] | FloatArray, spec_latency: Sequence[float] | FloatArray) -> float:
    """Σ baseline latency / Σ speculative latency over paired prompts (a ratio of means)."""
    b, s = np.asarray(baseline_latency, float), np.asarray(spec_latency, float)
    if b.shape != s.shape:
        raise ValueError(f"paired samples differ in length: {b.shape} vs {s.shape}")
    return float(b.sum() / s.sum()) if s.size and s.sum() > 0 else NAN


def paired_speedup(
    baseline: Sequence[RequestRecord], spec: Sequence[RequestRecord], level: float = 0.95
) -> dict[str, float]:
    """E2E speedup over prompts with its interval, n distinct prompts and the most repeats of one."""
    b, s, reps = per_prompt_means(paired_records(baseline, spec))
    lo, hi = ratio_ci(b, s, level)
    return {"speedup": speedup(b, s), "ci_low": lo, "ci_high": hi, "n_prompts": float(b.size), "repeats": float(reps)}


def paired_decode_speedup(
    baseline: Sequence[RequestRecord], spec: Sequence[RequestRecord], level: float = 0.95
) -> dict[str, float]:
    """The decode phase's speedup: baseline TPOT / speculative TPOT over prompts (what prefill cannot dilute)."""
    b, s, reps = per_prompt_means(paired_records(baseline, spec), tpot)
    lo, hi = ratio_ci(b, s, level)
    return {"speedup": speedup(b, s), "ci_low": lo, "ci_high": hi, "n_prompts": float(b.size), "repeats": float(reps)}


def memory_overhead(peak_spec_bytes: int | None, peak_baseline_bytes: int | None) -> float:
    """peak(spec) − peak(baseline) in bytes; NaN when either is unknown."""
    if peak_spec_bytes is None or peak_baseline_bytes is None:
        return NAN
    return float(peak_spec_bytes - peak_baseline_bytes)


def perplexity(logprobs: Sequence[float]) -> float:
    """exp(− mean log p) of generated tokens under the target."""
    if len(logprobs) == 0:
        return NAN
    return float(math.exp(-float(np.mean(logprobs))))


def perplexity_of_records(records: Sequence[RequestRecord]) -> float:
    """Perplexity under the target of all ok requests' generated tokens pooled."""
    lps = [x for r in records if r.status == "ok" and r.target_logprobs for x in r.target_logprobs]
    return perplexity(lps)


def perplexity_difference(baseline: Sequence[RequestRecord], spec: Sequence[RequestRecord]) -> float:
    """PPL(speculative output) − PPL(paired baseline output), both under the target; 0 when lossless."""
    return perplexity_of_records(spec) - perplexity_of_records(baseline)


def logprob_shift_test(
    baseline: Sequence[RequestRecord], spec: Sequence[RequestRecord], n_perm: int = 4000, seed: int = 0
) -> dict[str, float]:
    """Do speculative and baseline outputs score alike under the target, beyond chance?

    Per prompt, the difference of the two outputs' mean per-token log-probability under the
    target (repeats of the prompt averaged first: the prompt is the unit); a sign-flip
    permutation test of their mean (two-sided).  Lossless speculative sampling draws from the
    target's own distribution, so p should be large; under that null p < level happens at a
    rate of at most level (tests/test_intervals.py).
    """
    base = {_pair_key(r): lp for r in baseline if r.status == "ok" and (lp := r.target_logprobs)}
    per_prompt: dict[tuple[str, str], list[float]] = {}
    for r in spec:
        if r.status == "ok" and (lp := r.target_logprobs) and _pair_key(r) in base:
            per_prompt.setdefault(prompt_of(r), []).append(float(np.mean(lp)) - float(np.mean(base[_pair_key(r)])))
    diffs = np.asarray([np.mean(v) for v in per_prompt.values()], dtype=np.float64)
    if diffs.size < 2:
        return {"mean_diff": float(diffs.mean()) if diffs.size else NAN, "p_value": NAN, "n_prompts": float(diffs.size)}
    rng = np.random.default_rng(seed)
    signs = rng.choice((-1.0, 1.0), size=(n_perm, diffs.size))
    null = np.abs((signs * diffs).mean(axis=1))
    p = (1 + np.sum(null >= abs(diffs.mean()) - 1e-15)) / (n_perm + 1)
    return {"mean_diff": float(diffs.mean()), "p_value": float(p), "n_prompts": float(diffs.size)}


def exact_match_rate(baseline: Sequence[RequestRecord], spec: Sequence[RequestRecord]) -> float:
    """Share of paired requests whose output token ids are identical (a greedy losslessness check)."""
    base = {_pair_key(r): r.output_ids for r in baseline if r.status == "ok"}
    pairs = [(base[_pair_key(r)], r.output_ids) for r in spec if r.status == "ok" and _pair_key(r) in base]
    return sum(a == b for a, b in pairs) / len(pairs) if pairs else NAN


def first_divergence(baseline_ids: Sequence[int], spec_ids: Sequence[int]) -> int | None:
    """The first output position where two token sequences differ (None when identical)."""
    for i, (a, b) in enumerate(zip(baseline_ids, spec_ids)):
        if a != b:
            return i
    return None if len(baseline_ids) == len(spec_ids) else min(len(baseline_ids), len(spec_ids))


def mean_entropy(records: Sequence[RequestRecord]) -> float:
    vals = [x for r in records if r.status == "ok" and r.token_entropy for x in r.token_entropy]
    return float(np.mean(vals)) if vals else NAN

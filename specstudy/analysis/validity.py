"""What the kit can vouch for: every cell checked for the artifacts that fake a speedup.

Pure functions of records (the runner calls :func:`stalls` to decide a rerun and :func:`prompt_checks`
to stamp what only it can see, the prompt; the report calls :func:`assess`).  A check yields
:class:`Finding` rows; a finding that ``flags`` its cell keeps that cell out of every verdict, the
summary and the best-method lines, and a flag on an AR baseline flags every cell paired with it
(a paired speedup is only as good as both halves).  The rules and why their thresholds are what
they are: ``docs/validity.md``.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .. import metrics
from ..records import Request, RequestRecord
from ..telemetry import busy_reasons

#: a request whose decode time per forward (or largest inter-token gap) exceeds this many times its
#: cell's median is an outlier: clean cells stay within 1.15x, a CPU-starved llama.cpp request read
#: 29x (260 ms against 9 ms), and 7 of 220 llama.cpp requests on a loaded machine 3-27.8x
STALL_FACTOR = 3.0
#: least time (s) a stall must have cost its request: a pause shorter than a few scheduler slices is
#: the OS's ordinary jitter, and on a 1 ms-per-token model it alone would read as 3x (the starved
#: llama.cpp request lost 5 s, its longest forward 2.1 s)
STALL_MIN_EXTRA_S = 0.05
#: fewest ok requests for a cell median to judge a request by
STALL_MIN_REQUESTS = 3
#: words per n-gram that counts as copied from the prompt
COPY_NGRAM = 4
#: a task whose outputs sit this much inside copied n-grams reads its acceptance as copying
COPY_SHARE_HIGH = 0.5
#: median token id / vocabulary size above which a prompt reads as random tokens: BPE vocabularies
#: number tokens in merge order, so text uses the low ids (SmolLM2's tokenizer: 0.001-0.024 on the
#: kit's task files) and uniformly drawn ids sit near one half (0.36-0.56 at 16-256 tokens); zlib's
#: ratio could not tell them apart (0.53-0.55 for text, 0.59-0.66 for random tokens)
RANDOM_ID_SHARE = 0.2
#: fewest prompt tokens whose median id means anything
RANDOM_MIN_TOKENS = 16
#: smallest vocabulary read this way: a byte-level or toy vocabulary is not in frequency order
RANDOM_MIN_VOCAB = 1000


@dataclass(frozen=True)
class Finding:
    """One check's finding on one cell: the numbers the report's Validity section words
    (:mod:`specstudy.report.validity_text`), and whether it leaves the cell out of verdicts."""

    check: str
    cell_id: str
    values: Mapping[str, Any]
    flags: bool  # True: the cell is left out of verdicts, the summary and best-method lines
    requests: tuple[str, ...] = ()


# --------------------------------------------------------------------------------------------
# stalls and cold requests


def decode_time(r: RequestRecord) -> float:
    """Seconds per decode forward after the first token: TPOT where the forwards are not counted
    (one token per forward), per target forward where they are, so a speculative request that
    accepted little is not read as slow (its forwards take as long as the others')."""
    f = r.target_forwards
    if f and f > 1 and r.end_s is not None and r.first_token_s is not None:
        return (r.end_s - r.first_token_s) / (f - 1)
    return metrics.tpot(r)


def _median(values: Iterable[float]) -> float:
    v = [x for x in values if x == x]
    return statistics.median(v) if v else float("nan")


def _engine_cause(r: RequestRecord, cell_forward_median: float, factor: float) -> dict[str, Any]:
    """From llama.cpp's own forward timings: the engine starved (its longest forward beyond ``factor``
    times the cell's median forward), the client or transport (its forwards normal), or unknown."""
    ms = r.extra.get("llamacpp_forward_ms") if r.extra else None
    if not ms or cell_forward_median != cell_forward_median:
        return {"cause": "unknown"}
    worst = float(max(ms))
    cause = "engine starved" if worst > factor * cell_forward_median else "client or transport"
    return {"cause": cause, "worst_forward_ms": worst, "median_forward_ms": cell_forward_median}


def _explained_gaps(records: Sequence[RequestRecord], slack: float) -> dict[int, set[int]]:
    """Under concurrency (batch size above 1), per request (by position in ``records``), the indexes of
    its inter-token gaps during which another request of the cell had its first token (within
    ``slack`` after the gap): that request's prefill ran in the batch, and llama.cpp and vLLM put a
    whole prompt's prefill into the forward that also decodes the others, a gap reproduced on every
    rerun (a batch-4 llama.cpp cell: 2.36 s against a 55 ms median, three prompts' prefill)."""
    firsts = [r.start_epoch + r.first_token_s for r in records if r.first_token_s is not None]
    out: dict[int, set[int]] = {}
    for k, r in enumerate(records):
        if not (r.batch_size and r.batch_size > 1 and r.start_epoch):
            continue
        own = r.start_epoch + (r.first_token_s or 0.0)
        t = [r.start_epoch + x for x in r.chunk_times_s]
        out[k] = {i for i in range(len(t) - 1) if any(t[i] < f <= t[i + 1] + slack and f != own for f in firsts)}
    return out


def _forwards(r: RequestRecord) -> int:
    f = r.target_forwards or r.output_tokens
    return max(f - 1, 1)


def request_shape(r: RequestRecord) -> tuple[str, int]:
    """What a request's decode speed depends on besides the machine: its input (the task's input-length
    tier or policy: a 4,000-token context decodes slower than a 300-token one) and its turn."""
    return (r.input_policy or "", r.turn)


def _shape_peers(ok: Sequence[RequestRecord]) -> list[list[int]]:
    """Per request, the requests it is judged against: those of its shape where there are enough of them
    (:data:`STALL_MIN_REQUESTS`), else the whole cell."""
    groups: dict[tuple[str, int], list[int]] = {}
    for k, r in enumerate(ok):
        groups.setdefault(request_shape(r), []).append(k)
    every = list(range(len(ok)))
    return [g if len(g := groups[request_shape(r)]) >= STALL_MIN_REQUESTS else every for r in ok]


def stalls(records: Sequence[RequestRecord], factor: float = STALL_FACTOR) -> list[Finding]:
    """The cell's requests whose decode time per forward or largest inter-token gap exceeds
    ``factor`` times the median of the requests of the same shape (:func:`request_shape`; the cell's
    where too few share it) and cost at least :data:`STALL_MIN_EXTRA_S` (offline cells; under a
    request rate other requests' prefills legitimately lengthen a request's gaps, and the busy check
    covers those cells).  At batch sizes above 1 a gap in which another request of the cell got its
    first token is that request's prefill, not a stall (:func:`_explained_gaps`)."""
    floor = STALL_MIN_EXTRA_S  # read at the call: tests of other things set it out of reach
    ok = [r for r in records if r.status == "ok" and r.request_rate is None]
    if len(ok) < STALL_MIN_REQUESTS:
        return []
    itls = [metrics.itl(r) for r in ok]
    explained = _explained_gaps(ok, floor + _median(g for gs in itls for g in gs))
    gaps = [[g for i, g in enumerate(gs) if i not in explained.get(k, set())] for k, gs in enumerate(itls)]
    largest = [max(g) if g else float("nan") for g in gaps]
    # decode time per forward with the explained gaps taken out (another request's prefill in the batch)
    cut = [sum(gs) - sum(g) for gs, g in zip(itls, gaps)]
    dec = [decode_time(r) - c / _forwards(r) for r, c in zip(ok, cut)]
    peers = _shape_peers(ok)
    out = []
    for r, t, g, near in zip(ok, dec, largest, peers):
        med_t, med_g = _median(dec[i] for i in near), _median(largest[i] for i in near)
        fwd = _median(x for i in near for x in (ok[i].extra.get("llamacpp_forward_ms") or []))
        rt, rg = t / med_t if med_t > 0 else 0.0, g / med_g if med_g > 0 else 0.0
        lost = max((t - med_t) * _forwards(r), g - med_g)
        if max(rt, rg) > factor and lost >= floor:
            values = {"prompt_id": r.prompt_id, "time_ratio": rt, "gap_ratio": rg, **_engine_cause(r, fwd, factor)}
            out.append(Finding("stall", r.cell_id, values, True, (r.prompt_id,)))
    return out


# --------------------------------------------------------------------------------------------
# the machine


def busy_during(summary: Mapping[str, Any]) -> list[str]:
    """Why the machine was busy while a run was measured, from its telemetry summary (the
    :meth:`~specstudy.telemetry.Telemetry.summary` keys) against :func:`busy_reasons`; [] when quiet."""
    cores = summary.get("cpu_cores")
    if not cores:
        return []
    return busy_reasons(
        summary.get("load_1m_mean"),
        int(cores),
        int(cores),
        during=True,
        steal_pct=summary.get("cpu_steal_mean_pct"),
        freq_dropped=bool(summary.get("cpu_freq_dropped")),
        gpu_other_procs=summary.get("gpu_other_procs_max"),
        others_cores=summary.get("cpu_others_cores_mean"),
    )


def machine_findings(records: Sequence[RequestRecord]) -> list[Finding]:
    """The cell's telemetry (stamped on each record by the runner) against :func:`busy_reasons`."""
    if not records or not records[0].extra:
        return []
    e = records[0].extra
    reasons = busy_during({k.removeprefix("tel_"): v for k, v in e.items() if k.startswith("tel_")})
    if not reasons:
        return []
    return [Finding("busy machine", records[0].cell_id, {"reasons": reasons}, True)]


# --------------------------------------------------------------------------------------------
# the workload's own traps


def _words(text: str) -> list[str]:
    return text.split()


def copy_share(prompt: str, output: str, n: int = COPY_NGRAM) -> float | None:
    """Share of the output's words inside an ``n``-word run that also occurs in the prompt
    (None for an output shorter than ``n`` words)."""
    p, o = _words(prompt), _words(output)
    if len(o) < n:
        return None
    grams = {tuple(p[i : i + n]) for i in range(len(p) - n + 1)}
    covered = [False] * len(o)
    for j in range(len(o) - n + 1):
        if tuple(o[j : j + n]) in grams:
            covered[j : j + n] = [True] * n
    return sum(covered) / len(o)


def random_id_share(ids: Sequence[int], vocab: int) -> float | None:
    """The prompt's median token id over the vocabulary size (None for a short prompt or a vocabulary
    too small to be in frequency order)."""
    if len(ids) < RANDOM_MIN_TOKENS or vocab < RANDOM_MIN_VOCAB:
        return None
    return float(statistics.median(ids)) / vocab


def prompt_checks(request: Request, record: RequestRecord, tokenizer: Any = None) -> dict[str, Any]:
    """What only the runner sees (the prompt and the engine's tokenizer), stamped on the record:
    the copy share, the prompt's median-id share, a doubled BOS and a chat template left unused."""
    out: dict[str, Any] = {"prompt_copy_share": copy_share(request.prompt, record.output_text)}
    if tokenizer is None:
        return out
    try:
        ids = list(request.prompt_ids or tokenizer(request.prompt)["input_ids"])
        vocab = len(tokenizer)
    except Exception:  # a tokenizer stand-in without __call__ or __len__
        ids, vocab = list(request.prompt_ids or ()), 0
    out["prompt_id_share"] = random_id_share(ids, vocab)
    bos = getattr(tokenizer, "bos_token_id", None)
    if bos is not None:
        out["double_bos"] = len(ids) >= 2 and ids[0] == ids[1] == bos
    out["chat_template_unused"] = bool(getattr(tokenizer, "chat_template", None)) and request.messages is None
    return out


def _share(records: Sequence[RequestRecord], key: str) -> tuple[int, int]:
    """(requests where ``extra[key]`` is true, requests where it was checked)."""
    seen = [bool(r.extra.get(key)) for r in records if r.extra and r.extra.get(key) is not None]
    return sum(seen), len(seen)


def workload_findings(records: Sequence[RequestRecord]) -> list[Finding]:
    """The workload traps one cell's records show.  Synthetic acceptance is noted, not flagged: its
    rows already count in no acceptance table and no best-method line."""
    if not records:
        return []
    cid, out = records[0].cell_id, []
    if any(r.synthetic_acceptance for r in records):
        out.append(Finding("synthetic acceptance", cid, {"rule": records[0].synthetic_acceptance}, False))
    rnd = tuple(
        r.prompt_id
        for r in records
        if (r.extra.get("prompt_id_share") or 0) > RANDOM_ID_SHARE and not r.input_policy.endswith(":random")
    )
    if rnd:
        out.append(Finding("random-token prompts", cid, {"n": len(rnd)}, True, rnd))
    for check, key, flags in (("double BOS", "double_bos", True), ("no chat template", "chat_template_unused", False)):
        k, n = _share(records, key)
        if k:
            out.append(Finding(check, cid, {"k": k, "n": n}, flags))
    return out + _eos_findings(records) + _counter_findings(records) + _idle_findings(records)


def _idle_findings(records: Sequence[RequestRecord]) -> list[Finding]:
    """A server that was running or holding back requests when the cell's run began (its own gauges)."""
    for r in records:
        q = (r.extra or {}).get("server_at_start") or {}
        busy = {k: v for k, v in q.items() if v}
        if busy:
            return [Finding("server not idle", r.cell_id, {"queue": busy}, True)]
    return []


def _eos_findings(records: Sequence[RequestRecord]) -> list[Finding]:
    """With ``ignore_eos`` the engine decodes past where it would have stopped: how many did."""
    past = [r for r in records if r.extra and r.extra.get("past_eos_at") is not None]
    checked = [r for r in records if r.extra and "past_eos_at" in r.extra]
    if not past:
        return []
    share = sum(r.output_tokens - r.extra["past_eos_at"] for r in past) / max(sum(r.output_tokens for r in checked), 1)
    values = {"k": len(past), "n": len(checked), "share": share}
    return [Finding("ran past EOS", records[0].cell_id, values, False, tuple(r.prompt_id for r in past))]


def _counter_findings(records: Sequence[RequestRecord]) -> list[Finding]:
    """A server's run counters (after − before) that went down: reset or flushed inside the cell."""
    for r in records:
        ra = (r.extra or {}).get("run_acceptance") or {}
        neg = [k for k in ("drafts", "drafted_tokens", "accepted_tokens") if (ra.get(k) or 0) < 0]
        neg += ["per-position"] if any(a < 0 for a in ra.get("accepted_per_position") or []) else []
        if neg:
            return [Finding("counters reset", r.cell_id, {"counters": neg}, True)]
    return []


def prefix_cache_reuse(records_by_cell: Mapping[str, Sequence[RequestRecord]]) -> list[Finding]:
    """Cells with the prefix cache on whose prompts an earlier cell on the same engine instance (the
    runner's ``engine_instance``: a restarted server's cache is cold; parts without it: the same
    framework and model) sent already: their prefill is a cache hit the paired cell did not get."""
    sent: dict[tuple[Any, ...], float] = {}
    order = sorted(
        (r.start_epoch, cid, r)
        for cid, rs in records_by_cell.items()
        for r in rs
        if r.prefix_cache and r.status == "ok"
    )
    hits: dict[str, list[str]] = {}
    for t, cid, r in order:
        key = (r.extra.get("engine_instance") or r.framework, r.model, r.task, r.prompt_id, r.turn)
        if key in sent and sent[key] < t and key[3] not in hits.get(cid, []):
            hits.setdefault(cid, []).append(r.prompt_id)
        sent.setdefault(key, t)
    return [Finding("prefix cache warm", cid, {"n": len(p)}, True, tuple(p)) for cid, p in sorted(hits.items())]


def copy_by_task(records: Iterable[RequestRecord]) -> dict[str, float]:
    """Per task, the mean share of output words inside an n-gram copied from the prompt."""
    acc: dict[str, list[float]] = {}
    for r in records:
        v = (r.extra or {}).get("prompt_copy_share")
        if v is not None and r.status == "ok":
            acc.setdefault(r.task, []).append(float(v))
    return {t: sum(v) / len(v) for t, v in sorted(acc.items())}


# --------------------------------------------------------------------------------------------
# a study


def assess(records_by_cell: Mapping[str, Sequence[RequestRecord]]) -> list[Finding]:
    """Every check on every cell."""
    out: list[Finding] = []
    for cid in sorted(records_by_cell):
        recs = records_by_cell[cid]
        out += stalls(recs) + machine_findings(recs) + workload_findings(recs)
    return out + prefix_cache_reuse(records_by_cell)


#: why a cell is left out: (check, True when it is its AR baseline's flag rather than its own)
Reason = tuple[str, bool]


def flagged(findings: Iterable[Finding], baselines: Mapping[str, str | None]) -> dict[str, tuple[Reason, ...]]:
    """cell id -> why it is left out of verdicts: its own flags, and its AR baseline's.

    ``baselines`` maps each cell to its paired baseline (None for a baseline itself).
    """
    own: dict[str, list[str]] = {}
    for f in findings:
        if f.flags and f.check not in own.get(f.cell_id, []):
            own.setdefault(f.cell_id, []).append(f.check)
    out: dict[str, tuple[Reason, ...]] = {c: tuple((k, False) for k in v) for c, v in own.items()}
    for c, b in baselines.items():
        if b and b in own:
            out[c] = out.get(c, ()) + tuple((k, True) for k in own[b])
    return out

"""llama.cpp's server as a study framework: AR, n-gram self-speculation, draft models, EAGLE-3 heads.

The kit starts llama.cpp as a child process (:mod:`specstudy.backends.llamacpp.serve`, the
``xllamacpp`` wheel), or a user's ``llama-server`` binary (``llama_server=PATH``), or attaches to
a running one (``base_url=URL``); all three go through the same request and parsing code below.
Requests stream llama.cpp's native ``/completion``: the OpenAI route ``/v1/completions`` returns
neither the token ids of a chunk nor its per-token timings, and both are needed here.  The prompt
is sent as token ids (the kit applies the chat template, as for every framework), with
``n_predict``, temperature / top_p / top_k / seed, ``min_p = 0`` (llama.cpp's default 0.05 and
top_k 40 would change sampling against the other frameworks), ``ignore_eos`` and
``cache_prompt`` from the ``prefix_cache`` option.

What llama.cpp reports, and how the kit counts (checked on xllamacpp 2026.10.11549)
------------------------------------------------------------------------------------
* Every response's ``timings`` carries ``draft_n`` (tokens drafted) and ``draft_n_accepted``
  (absent while nothing was drafted), beside ``prompt_n``/``prompt_ms``/``cache_n`` and
  ``predicted_n``/``predicted_ms``/``predicted_per_token_ms``.  It does not carry the number of
  draft steps or per-position counts.
* ``/metrics`` (Prometheus) has server-wide counters ``llamacpp:spec_decode_num_drafts_total``
  (verification steps), ``..._num_draft_tokens_total``, ``..._num_accepted_tokens_total`` and
  ``..._num_accepted_tokens_per_pos_total{position="k"}`` (k = 0..γ−1: steps that accepted
  position k).  They are scraped before and after each run (``run_scope``).  The server's log
  prints its own per-request "mean len" (1 + accepted / steps).  ``/slots`` shows only the
  speculative type.
* With ``timings_per_token`` every streamed chunk (one token each) carries the cumulative
  ``draft_n``/``draft_n_accepted`` and ``predicted_ms``, which advances once per target forward.
  Chunks are not steps, but the chunks of one forward share its ``predicted_ms``; so the kit groups
  chunks by it into :class:`~specstudy.records.StepRecord`\\ s (drafted = Δdraft_n, accepted =
  Δdraft_n_accepted, emitted = tokens in the group).  A reconstruction is used only if every
  group emits accepted + 1 tokens (the last may emit fewer) and its totals equal the final
  ``timings``; otherwise ``drafted_tokens``/``accepted_tokens`` come from ``timings`` alone and
  ``draft_steps``/``target_forwards`` stay None with the reason in ``extra["llamacpp_steps"]``.
  Measured on SmolLM2 with ngram-simple γ 4: the reconstructed draft steps, drafted, accepted and
  per-position counts equalled the ``/metrics`` deltas of every request.
* ``extra["llamacpp_forward_ms"]``: llama.cpp's own ms of each forward after the prompt pass
  (Δ ``predicted_ms``; drafting and sampling included), from which
  :mod:`specstudy.backends.llamacpp.costs` reads the cost of real verification forwards.
* ``target_forwards`` counts every group, the prompt pass included (as the reference engine);
  ``draft_steps`` those that verified ≥ 1 draft, so AL = 1 + accepted / draft_steps is
  llama.cpp's own "mean len".
* Unknown: the time split between drafting and verifying inside a step (``draft_s``/``verify_s``
  stay None), and, when attached to a server the kit did not start, its speculative parameters
  other than the type (``/slots``).

Memory: the peak RSS of the server's process tree during each run, batch and request-rate cells
alike (``server_rss``, :mod:`specstudy.backends.watch`); None when attached.  The server's
``requests_processing`` gauge, sampled during the run, is its running batch.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from ...data.model_files import needs_download
from ...frameworks.declaration import CellCheck, constraint_body
from ...frameworks.llamacpp import LLAMACPP
from ...metrics import counter_acceptance as run_counter_acceptance
from ...records import Cell, Request, RequestRecord, Sampling, StepRecord
from ..lifecycle import http_get
from ..prometheus import MetricSamples, counter_deltas, labelled_deltas, metric_total
from ..server_base import ServerBackend
from ..sse import StreamState
from .eagle3_draft import check_folder
from .llamacpp_spec import NOT_SERVER_KEYS, Plan, server_argv, spec_config
from .llamacpp_spec import check as _check

COUNTERS = {
    "drafts": "llamacpp:spec_decode_num_drafts_total",
    "drafted_tokens": "llamacpp:spec_decode_num_draft_tokens_total",
    "accepted_tokens": "llamacpp:spec_decode_num_accepted_tokens_total",
}
PER_POS_COUNTER = "llamacpp:spec_decode_num_accepted_tokens_per_pos_total"
TIMING_KEYS = (
    "cache_n",
    "prompt_n",
    "prompt_ms",
    "prompt_per_token_ms",
    "predicted_n",
    "predicted_ms",
    "predicted_per_token_ms",
    "draft_n",
    "draft_n_accepted",
)
STOP_TYPES = {"limit": "length", "eos": "stop", "word": "stop"}


# --------------------------------------------------------------------------------------------
# per-request acceptance from the stream


def chunk_trace(st: StreamState) -> list[tuple[int, float | None, int, int]]:
    """Per token-carrying chunk: (tokens, predicted_ms, cumulative draft_n, cumulative accepted)."""
    trace: list[tuple[int, float | None, int, int]] = st.__dict__.setdefault("llamacpp_chunks", [])
    return trace


def forward_groups(
    trace: Sequence[tuple[int, float | None, int, int]], times: Sequence[float]
) -> tuple[list[list[Any]] | None, str]:
    """Consecutive chunks with one ``predicted_ms`` (one target forward):
    [predicted_ms, draft_n, accepted, tokens, last arrival s] each, or (None, why)."""
    if not trace:
        return None, "no token chunks"
    if any(ms is None for _, ms, _, _ in trace):
        return None, "chunks carry no per-token timings (server ignores timings_per_token)"
    if len(times) != len(trace):
        return None, f"{len(trace)} token chunks but {len(times)} chunk times"
    groups: list[list[Any]] = []
    for (n, ms, d, a), t in zip(trace, times):
        if groups and groups[-1][0] == ms:
            if (groups[-1][1], groups[-1][2]) != (d, a):
                return None, f"draft counters changed inside one forward (predicted_ms={ms})"
            groups[-1][3] += n
            groups[-1][4] = t
        else:
            groups.append([ms, d, a, n, t])
    return groups, "ok"


def steps_from_trace(
    trace: Sequence[tuple[int, float | None, int, int]], times: Sequence[float], final: Mapping[str, Any]
) -> tuple[list[StepRecord] | None, str]:
    """Target forwards rebuilt from per-token timings (see the module docstring), or (None, why)."""
    groups, why = forward_groups(trace, times)
    if groups is None:
        return None, why
    steps, prev_d, prev_a = [], 0, 0
    for i, (_, d, a, emitted, t) in enumerate(groups):
        drafted, accepted = d - prev_d, a - prev_a
        last = i == len(groups) - 1
        if drafted < 0 or not 0 <= accepted <= drafted:
            return None, f"forward {i}: drafted {drafted}, accepted {accepted} is impossible"
        if emitted != accepted + 1 and not (last and 1 <= emitted <= accepted + 1):
            return None, f"forward {i} emitted {emitted} tokens for {accepted} accepted drafts"
        steps.append(StepRecord(drafted=drafted, accepted=accepted, emitted=emitted, t_s=t))
        prev_d, prev_a = d, a
    want = (int(final.get("draft_n", 0)), int(final.get("draft_n_accepted", 0)))
    if (prev_d, prev_a) != want:
        return None, f"chunk counters end at {(prev_d, prev_a)}, final timings say {want}"
    return steps, "ok"


def forward_ms(trace: Sequence[tuple[int, float | None, int, int]], times: Sequence[float]) -> list[float] | None:
    """llama.cpp's own ms of each forward after the prompt pass (Δ ``predicted_ms``: drafting,
    the forward and sampling), aligned with the steps from the second on."""
    groups, _ = forward_groups(trace, times)
    if groups is None:
        return None
    return [round(b[0] - a[0], 3) for a, b in zip(groups, groups[1:])]


def counter_acceptance(before: MetricSamples, after: MetricSamples) -> dict[str, Any]:
    """The run's llama.cpp counters (after − before): AL = 1 + accepted / drafts is llama.cpp's own "mean len"."""
    d = counter_deltas(before, after, COUNTERS)
    per_pos = labelled_deltas(before, after, PER_POS_COUNTER, "position")
    return run_counter_acceptance("server_counters", d["drafts"], d["drafted_tokens"], d["accepted_tokens"], per_pos)


def _get_json(url: str) -> Any:
    try:
        status, body = http_get(url, 5.0)
        return json.loads(body) if status == 200 else None
    except (OSError, ValueError):
        return None


def self_report(url: str, attached: bool) -> dict[str, Any]:
    """What a llama.cpp server says about itself: ``/props`` build, model, quantization, slots, and,
    for a server the kit did not start, the speculative type its ``/slots`` shows."""
    props = _get_json(url + "/props") or {}
    out = {k: props[k] for k in ("build_info", "model_path", "model_ftype", "total_slots") if props.get(k) is not None}
    if attached:
        slots = _get_json(url + "/slots")
        first = slots[0] if isinstance(slots, list) and slots and isinstance(slots[0], dict) else {}
        out["speculative_types"] = (first.get("params") or {}).get("speculative.types")
    return out


# --------------------------------------------------------------------------------------------
# the backend


class LlamaCppBackend(ServerBackend):
    """llama.cpp server per speculative configuration (see the module docstring).

    Options: ``threads`` (default: half the logical CPUs, llama.cpp's own rule), ``ctx_size``
    (context per slot, default 4096), ``prefix_cache`` (False: every request recomputes its
    prompt, ``cache_prompt=false``), ``llama_server`` (path of a ``llama-server`` binary instead of
    the xllamacpp entry point), ``base_url`` (attach), ``python`` (interpreter that has xllamacpp),
    ``rss_period_s`` (memory sampling period, default 0.02), plus the :class:`ServerBackend` ones.
    Slots = the cell's batch size.
    """

    framework = "llamacpp"
    methods = LLAMACPP.methods

    @property
    def warms_itself(self) -> bool:
        """A server the kit starts runs llama.cpp's own warm-up decode at load (``warmup``, set
        explicitly): its first request was as fast as later ones (side by side, 207-token prompt:
        prefill 1,529 vs 1,536 ms, decode 15.9 vs 15.8 ms/token).  A server someone else started
        may run without it (``--no-warmup``), so it gets the study's warm-up requests."""
        return self.base_url is None

    api_path = "/completion"
    health_path = "/health"
    metrics_path = "/metrics"
    #: llama.cpp's own gauges (``--metrics``): requests decoding now, requests waiting for a slot
    GAUGES = {"running": "llamacpp:requests_processing", "waiting": "llamacpp:requests_deferred"}
    #: llama.cpp drops a deferred request whose connection closed only when it reaches it, after its
    #: prefill (measured here: 10 deferred 200-token prompts took 6.2 s to drain after a cut), and its
    #: server starts in about a second: a cut run's server is stopped unless idle within 1 s
    SETTLE_S = 1.0

    def __init__(
        self,
        model: str,
        drafter: str | None = None,
        *,
        threads: int | None = None,
        ctx_size: int = 4096,
        prefix_cache: bool = False,
        llama_server: str | os.PathLike[str] | None = None,
        rss_period_s: float = 0.02,
        **kw: Any,
    ):
        super().__init__(model, drafter, **kw)
        threads = max(1, (os.cpu_count() or 2) // 2) if threads is None else threads
        for name, v in (("threads", threads), ("ctx_size", ctx_size)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name}={v!r}: must be an integer >= 1")
        if not isinstance(prefix_cache, bool):
            raise ValueError(f"prefix_cache={prefix_cache!r}: must be True or False")
        if llama_server is not None and not os.access(str(llama_server), os.X_OK):
            raise FileNotFoundError(f"llama_server={llama_server!s}: not an executable file")
        self.threads, self.ctx_size, self.prefix_cache = threads, ctx_size, prefix_cache
        self.llama_server = str(llama_server) if llama_server is not None else None
        self.rss_period_s = rss_period_s
        self._plans: dict[str, Plan] = {}
        self._build: dict[str, Any] = {}

    # ---- validation and configuration -------------------------------------------------------

    @staticmethod
    def check(
        method: str, gamma: int | None, options: Mapping[str, Any] | None, model: str, drafter: str | None = None
    ) -> Plan:
        """Pre-flight check for the config layer (no model loads): options, GGUF sha256, draft vocabulary."""
        return _check(method, gamma, options, model, drafter)

    @classmethod
    def check_cell(cls, cell: CellCheck) -> None:
        """Options always; the GGUF files (sha256, draft vocabulary) when they are here.  A registry model
        still to be fetched from PyPI is not downloaded by validation: its engine load checks it."""
        files = [cell.model] + ([cell.drafter] if cell.method == "draft_target" and cell.drafter else [])
        if any(needs_download(f) for f in files):
            spec_config(cell.method, cell.gamma, dict(cell.options))
            if cell.method == "eagle3" and cell.drafter:  # the folder alone until the target is here
                check_folder(cell.drafter, cell.model, None)
            return
        _check(cell.method, cell.gamma, cell.options, cell.model, cell.drafter, convert=False)

    @property
    def effective_prefix_cache(self) -> bool:
        """llama.cpp reads ``cache_prompt`` from every request, so the kit sets it even on a server
        it attached to (unlike vLLM's and SGLang's server-wide flags)."""
        return self.prefix_cache

    @staticmethod
    def _server_options(cell: Cell) -> dict[str, Any]:
        """The options that shape the server (``tp`` kept so a multi-GPU cell is refused)."""
        return {k: v for k, v in cell.options if k not in NOT_SERVER_KEYS or k == "tp"}

    def plan(self, cell: Cell) -> Plan:
        """The checked plan of a cell (files hashed once per configuration)."""
        wanted = cell.option("prefix_cache")
        if wanted is not None and bool(wanted) != self.prefix_cache:
            raise ValueError(
                f"cell {cell.cell_id} asks prefix_cache={wanted!r} but this llamacpp backend was built "
                f"with prefix_cache={self.prefix_cache}: pass prefix_cache to the backend"
            )
        drafter = (cell.drafter or self.drafter) if cell.method in LLAMACPP.needs_drafter else None
        key = json.dumps(
            [
                cell.method,
                cell.gamma if cell.method != "ar" else None,
                drafter,
                sorted(self._server_options(cell).items()),
            ],
            default=str,
        )
        if key not in self._plans:
            self._plans[key] = self.check(cell.method, cell.gamma, self._server_options(cell), self.model, drafter)
        return self._plans[key]

    def server_key(self, cell: Cell) -> Any:
        p = self.plan(cell)
        return json.dumps([p.spec.as_dict(), p.model.path, p.draft.path if p.draft else None, cell.batch_size])

    def server_argv(self, cell: Cell) -> list[str]:
        argv = server_argv(
            self.plan(cell),
            self.threads,
            self.ctx_size,
            max(1, cell.batch_size),
            python=self.python,
            llama_server=self.llama_server,
        )
        return argv + self.server_args

    def version_probe(self, url: str) -> str | None:
        """llama.cpp's ``/props`` build info, plus the xllamacpp wheel when the kit's entry point runs."""
        build: dict[str, Any] = {
            "launcher": "attached" if self.base_url else ("llama-server" if self.llama_server else "xllamacpp")
        }
        build.update(self_report(url, attached=self.base_url is not None))
        if build["launcher"] == "xllamacpp" and self.python in (None, sys.executable):
            from .serve import build_info

            build.update(build_info())
        self._build = build
        parts = [f"llama.cpp {build.get('build_info', '?')}"]
        if "xllamacpp" in build:
            parts.append(f"xllamacpp {build['xllamacpp']} ({str(build.get('xllamacpp_revision'))[:12]})")
        return ", ".join(parts)

    def provenance(self, cell: Cell) -> dict[str, Any]:
        """What every record of the cell says about the engine (GGUFs, build, speculation, cache)."""
        out: dict[str, Any] = {
            "build": dict(self._build),
            "threads": self.threads,
            "ctx_size": self.ctx_size,
            "slots": max(1, cell.batch_size),
            "cache_prompt": self.prefix_cache,
        }
        if self.base_url is None:
            out.update(self.plan(cell).provenance())
        else:  # a server someone else configured: only what it reports about itself
            out.update(
                started_by_kit=False,
                precision=self._build.get("model_ftype"),
                model={"path": self._build.get("model_path")},
                spec=None,
            )
        return out

    # ---- requests -----------------------------------------------------------------------------

    def request_body(self, request: Request, sampling: Sampling) -> dict[str, Any]:
        ids = self.prompt_ids(request)
        body: dict[str, Any] = {
            "prompt": ids if ids is not None else request.prompt,
            "n_predict": sampling.max_new_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "top_k": sampling.top_k,
            "min_p": 0.0,
            "seed": sampling.seed,
            "ignore_eos": sampling.ignore_eos,
            "cache_prompt": self.prefix_cache,
            "stream": True,
            "timings_per_token": True,
            "return_tokens": True,
            **constraint_body(LLAMACPP, request.json_schema, request.grammar),
        }
        return {**body, **self.extra_body}

    def consume(self, obj: dict[str, Any], st: StreamState) -> int:
        """One native ``/completion`` chunk: ``content``, ``tokens`` (ids), ``timings``; ``stop`` ends it."""
        ids = obj.get("tokens") or []
        text = obj.get("content") or ""
        t = obj.get("timings") if isinstance(obj.get("timings"), dict) else None
        if t is not None:
            st.timings = t
        n = len(ids) if ids else (1 if text else 0)
        if ids:
            st.output_ids.extend(int(i) for i in ids)
            st.count_source = "token_ids"
        elif text:
            st.count_source = st.count_source or "one_per_chunk"
        st.text_parts.append(text)
        if n:
            ms = t.get("predicted_ms") if t else None
            chunk_trace(st).append((n, ms, int((t or {}).get("draft_n", 0)), int((t or {}).get("draft_n_accepted", 0))))
        if obj.get("stop"):
            stop_type = obj.get("stop_type")
            st.finish_reason = STOP_TYPES.get(stop_type, stop_type) if isinstance(stop_type, str) else stop_type
            if obj.get("tokens_predicted") is not None:
                st.usage = {
                    "completion_tokens": int(obj["tokens_predicted"]),
                    "prompt_tokens": obj.get("tokens_evaluated"),
                }
        st.tokens += n
        return n

    def fill_acceptance(self, rec: RequestRecord, st: StreamState) -> None:
        t = st.timings or {}
        rec.extra["llamacpp_timings"] = {k: t[k] for k in TIMING_KEYS if k in t}
        steps, why = (
            steps_from_trace(chunk_trace(st), rec.chunk_times_s, t) if rec.status == "ok" else (None, rec.status)
        )
        if steps is not None:
            rec.steps = steps
            rec.fill_acceptance_from_steps()
            rec.extra["llamacpp_forward_ms"] = forward_ms(chunk_trace(st), rec.chunk_times_s)
            rec.extra["acceptance_source"] = (
                "llama.cpp per-token timings (draft_n, draft_n_accepted) grouped by forward"
            )
            return
        rec.extra["llamacpp_steps"] = f"draft steps unknown: {why}"
        if "draft_n" in t:
            rec.drafted_tokens, rec.accepted_tokens = int(t["draft_n"]), int(t["draft_n_accepted"])
            rec.extra["acceptance_source"] = "llama.cpp timings.draft_n/draft_n_accepted"

    def after_send(self, rec: RequestRecord, cell: Cell) -> None:
        """Every record says which GGUFs, build, speculation and prompt cache served it."""
        if self.server_info is not None:
            prov = self.provenance(cell)
            rec.extra["llamacpp"] = prov
            rec.extra["precision"] = prov.get("precision")

    # ---- a run --------------------------------------------------------------------------------

    def run_prefix_cache(
        self, before: MetricSamples | None, after: MetricSamples | None, records: Sequence[RequestRecord]
    ) -> dict[str, Any] | None:
        """Prompt tokens llama.cpp took from its slot cache (``timings.cache_n``) over all prompt tokens
        (``cache_n + prompt_n``), summed over the run's requests; None when no request reported them."""
        timed = [(r.extra.get("llamacpp_timings") or {}) for r in records]
        timed = [t for t in timed if "cache_n" in t and "prompt_n" in t]
        if not timed:
            return None
        hits = sum(int(t["cache_n"]) for t in timed)
        queries = hits + sum(int(t["prompt_n"]) for t in timed)
        return {
            "source": "llama.cpp timings.cache_n / (cache_n + prompt_n), summed over the run's requests (tokens)",
            "queries": queries,
            "hits": hits,
            "hit_rate": hits / queries if queries else None,
        }

    def run_acceptance(
        self, before: MetricSamples | None, after: MetricSamples | None, records: Sequence[RequestRecord]
    ) -> dict[str, Any] | None:
        """Per-request sums, llama.cpp's counters over the run, and whether the two agree."""
        per_request = super().run_acceptance(before, after, records)
        if before is None or after is None or metric_total(after, COUNTERS["drafts"]) is None:
            return per_request
        counters = counter_acceptance(before, after)
        if per_request is not None:
            counters["per_request_sum"] = per_request
            counters["counters_match"] = all(
                per_request.get(k) == counters[k] for k in ("drafted_tokens", "accepted_tokens")
            ) and per_request.get("draft_steps") in (None, counters["drafts"])
        return counters

"""The shared machinery of every server backend (vLLM, SGLang, llama.cpp, any OpenAI-compatible).

:class:`StreamingServerBackend` (:class:`ServerBackend` where the server's metrics are
Prometheus text) starts (or attaches to) the server that matches the cell's method, sends each
request with a hard per-request deadline over one asyncio client (:mod:`.loadgen`: batch cells
and request-rate cells alike), turns the SSE stream into a
:class:`~specstudy.records.RequestRecord` (:mod:`.exchange`: one request, prepared ahead),
scopes acceptance to the run and watches the server
while it lasts (:mod:`.watch`: process-tree memory, its own batch gauges).  A failed or
timed-out request is a record with ``status`` set, never an exception.  Acceptance a server does
not report stays ``None``.  Subclasses say how to start their server (:meth:`server_argv`), how
to build a request (:meth:`request_body`), how to read a chunk (:meth:`consume`) and where the
acceptance counters are (:meth:`fill_acceptance`, :meth:`run_acceptance`).
"""

from __future__ import annotations

import itertools
import json
import os
import shlex
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from ..data.model_files import resolve_for_engine as resolve_model
from ..frameworks import declaration as engine_declaration
from ..frameworks.declaration import (
    LOAD_OPTIONS,  # cell options of the offered load, not the server's configuration
    check_engine_options,
    constraint_body,
)
from ..metrics import Counters, acceptance_summary
from ..records import Cell, Request, RequestRecord, Sampling
from .base import ServingBackend, encode_request
from .connections import Http, address
from .exchange import StreamedRequests
from .lifecycle import ManagedServer, ServerInfo, connect, http_get, split_url
from .loadgen import Offer, batch_deadline, offer, run_sync
from .prometheus import MetricSamples, metric_total, parse_prometheus
from .sse import StreamState
from .watch import ServerWatch, WatchResult

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

#: what one read of a server's metrics endpoint gives (:meth:`StreamingServerBackend.scrape`)
SnapshotT = TypeVar("SnapshotT")


_SERVER_LOGS = itertools.count(1)  # a number per server this process starts, for its log's name
#: how long a run with failed requests waits for the server's process to exit, if it is exiting
DEATH_GRACE_S = 2.0


class StreamingServerBackend(ServingBackend, StreamedRequests, Generic[SnapshotT]):
    """Shared client of a streaming HTTP inference server.

    Options: ``base_url`` attaches to a running server (the kit then cannot change its
    speculative configuration: the records say ``started_by_kit: False``); otherwise the server
    is started from :meth:`server_argv` for each distinct speculative configuration a cell asks
    for.  ``request_timeout_s`` bounds every request (connect to last byte); ``idle_timeout_s``
    bounds the silence between two chunks.

    ``SnapshotT`` is what :meth:`scrape` reads from the server's metrics endpoint before and after
    a run, handed to :meth:`run_acceptance`, :meth:`run_prefix_cache` and :meth:`engine_memory`:
    Prometheus samples for :class:`ServerBackend`, TensorRT-LLM's iteration stats for its backend.
    """

    framework = "openai"
    methods: tuple[str, ...] = ("ar",)
    api_path = "/v1/completions"
    health_path = "/health"
    metrics_path: str | None = None

    def __init__(
        self,
        model: str,
        drafter: str | None = None,
        *,
        base_url: str | None = None,
        served_model: str | None = None,
        request_timeout_s: float = 300.0,
        idle_timeout_s: float | None = None,
        ready_timeout_s: float = 1200.0,
        log_dir: str | os.PathLike[str] = "outputs/servers",
        server_args: Sequence[str] = (),
        env: dict[str, str] | None = None,
        extra_body: dict[str, Any] | None = None,
        api_key: str | None = None,
        python: str | None = None,
        **options: Any,
    ):
        if request_timeout_s <= 0:
            raise ValueError(f"request_timeout_s={request_timeout_s!r}: must be > 0")
        if base_url is not None:
            split_url(base_url)
        self.model = model
        self.drafter = drafter
        self.base_url = base_url.rstrip("/") if base_url else None
        self.served_model = served_model
        self.request_timeout_s = float(request_timeout_s)
        self.idle_timeout_s = float(idle_timeout_s) if idle_timeout_s else self.request_timeout_s
        self.ready_timeout_s = float(ready_timeout_s)
        self.log_dir = Path(log_dir)
        self.server_args = [str(a) for a in server_args]
        self.env = dict(env or {})
        self.extra_body = dict(extra_body or {})
        self.api_key = api_key
        self.python = python
        self.options = options
        self.check_engine_options({**options, **({"base_url": base_url} if base_url else {})})
        self.server: ManagedServer | None = None
        self.server_info: ServerInfo | None = None
        self._server_key: Any = None
        self.last_run_acceptance: dict[str, Any] | None = None
        self._start_lock = threading.Lock()

    #: the kit starts its server with the prefix cache the ``prefix_cache`` option says
    sets_prefix_cache = False

    @property
    def effective_prefix_cache(self) -> bool | None:
        """The prefix cache as the kit started the server; None attached (or where it sets none)."""
        if self.base_url or not self.sets_prefix_cache:
            return None
        return bool(self.options.get("prefix_cache") or False)

    @classmethod
    def check_engine_options(cls, options: dict[str, Any]) -> None:
        """Reject options no code reads, naming the ones that are read (the framework's declaration:
        the same check the study ran at load, before any server starts)."""
        check_engine_options(engine_declaration(cls.framework), options)

    # ---- what subclasses define -----------------------------------------------------------

    def server_argv(self, cell: Cell) -> list[str]:
        """Command line (with ``{port}``/``{host}`` placeholders) for the cell's configuration."""
        command = self.options.get("command")
        if not command:
            raise ValueError(
                "framework 'openai' needs base_url=URL of a running server or command='... --port {port}' to start one"
            )
        argv = shlex.split(command) if isinstance(command, str) else [str(a) for a in command]
        subst = {
            "{model}": resolve_model(self.model),
            "{drafter}": resolve_model(self.drafter or ""),
            "{gamma}": str(cell.gamma or ""),
        }
        out = []
        for a in argv:
            for k, v in subst.items():
                a = a.replace(k, v)
            out.append(a)
        return out + self.server_args

    def server_env(self, cell: Cell) -> dict[str, str]:
        return dict(self.env)

    def server_key(self, cell: Cell) -> Any:
        """Cells with equal keys can share one server process (load settings do not matter)."""
        return (cell.method, cell.gamma, cell.drafter, tuple(o for o in cell.options if o[0] not in LOAD_OPTIONS))

    def version_probe(self, url: str) -> str | None:
        """The server build, asked over HTTP (``/version``, else ``/props`` build info)."""
        for path, key in (("/version", "version"), ("/props", "build_info")):
            try:
                status, body = http_get(url + path, 5.0)
                if status == 200:
                    value = json.loads(body).get(key)
                    if value:
                        return str(value)
            except (OSError, ValueError, AttributeError):
                continue
        return None

    def prompt_ids(self, request: Request) -> list[int] | None:
        """Token ids to send, so a server decodes the same input as the in-process engines: the
        request's own ids, else its chat messages rendered by the target's tokenizer (loaded once,
        locally).  None sends the text as it is (no messages, or no local tokenizer for a hub id
        without network)."""
        if request.prompt_ids is not None:
            return list(request.prompt_ids)
        if not request.messages:
            return None
        if not hasattr(self, "_tokenizer"):
            try:
                from transformers import AutoTokenizer

                self._tokenizer: PreTrainedTokenizerBase | None = AutoTokenizer.from_pretrained(
                    resolve_model(self.model)
                )
            except (OSError, ValueError):
                self._tokenizer = None
        return encode_request(self._tokenizer, request) if self._tokenizer is not None else None

    def request_body(self, request: Request, sampling: Sampling) -> dict[str, Any]:
        ids = self.prompt_ids(request)
        body: dict[str, Any] = {
            "model": self.served_model or self.model,
            "prompt": ids if ids is not None else request.prompt,
            "max_tokens": sampling.max_new_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "seed": sampling.seed,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if sampling.top_k > 0:
            body["top_k"] = sampling.top_k
        if sampling.ignore_eos:
            body["ignore_eos"] = True
        body.update(constraint_body(engine_declaration(self.framework), request.json_schema, request.grammar))
        body.update(self.extra_body)
        return body

    def consume(self, obj: dict[str, Any], st: StreamState) -> int:
        """Fold one OpenAI completions chunk into ``st``; return the output tokens it carried."""
        n = 0
        usage = obj.get("usage")
        if usage:
            st.usage = usage
        for key in ("timings", "metrics"):
            if isinstance(obj.get(key), dict):
                setattr(st, key, obj[key])
        for ch in obj.get("choices") or []:
            text = ch.get("text")
            if text is None:
                text = (ch.get("delta") or {}).get("content") or ""
            ids = ch.get("token_ids")
            if ids is not None:
                st.output_ids.extend(int(i) for i in ids)
                n += len(ids)
                st.count_source = "token_ids"
            elif usage and usage.get("completion_tokens") is not None:
                n += int(usage["completion_tokens"]) - st.tokens - n
                st.count_source = st.count_source or "usage"
            elif text:
                n += 1
                st.count_source = "one_per_chunk"
            st.text_parts.append(text)
            if ch.get("finish_reason"):
                st.finish_reason = ch["finish_reason"]
        st.tokens += max(n, 0)
        return max(n, 0)

    def fill_acceptance(self, rec: RequestRecord, st: StreamState) -> None:
        """Per-request acceptance the server reported (llama.cpp timings); None otherwise."""
        t = st.timings or {}
        if "draft_n" in t and "draft_n_accepted" in t:
            rec.drafted_tokens = int(t["draft_n"])
            rec.accepted_tokens = int(t["draft_n_accepted"])
            rec.extra["acceptance_source"] = "llama.cpp timings.draft_n/draft_n_accepted"

    def scrape(self) -> SnapshotT | None:
        """The server's metrics now, or None when it has none (this base reads none)."""
        return None

    def gauge_scrape(self) -> Callable[[], MetricSamples | None] | None:
        """What :class:`ServerWatch` samples the :attr:`GAUGES` with while a run lasts; None: no gauges."""
        return None

    def run_acceptance(
        self, before: SnapshotT | None, after: SnapshotT | None, records: Sequence[RequestRecord]
    ) -> dict[str, Any] | None:
        """Acceptance of exactly this run from the per-request counts (subclasses add the server's counters)."""
        seen = [r for r in records if r.drafted_tokens is not None]
        if not seen:
            return None
        acc, c = acceptance_summary(seen), Counters.pooled(Counters.of(r) for r in seen)
        return {
            "source": "per_request_sum",
            "n_requests": len(seen),
            "drafted_tokens": c.drafted,
            "accepted_tokens": c.accepted,
            "draft_steps": acc["draft_steps"],
            "target_forwards": acc["target_forwards"],
            "output_tokens": sum(r.output_tokens for r in seen),
            "alpha": acc["alpha"],
            "acceptance_length": acc["acceptance_length"],
            "tokens_per_forward": acc["tokens_per_forward"],
        }

    # ---- lifecycle --------------------------------------------------------------------------

    def ensure_server(self, cell: Cell) -> ServerInfo:
        """Attach, or start the server for this cell's configuration (restarting if it differs)."""
        if self.base_url is not None:
            if self.server_info is None:
                self.server_info = connect(self.base_url, self.health_path, version=self.version_probe)
            return self.server_info
        key = self.server_key(cell)
        if self.server is not None and self._server_key == key and self.server.running():
            assert self.server_info is not None
            return self.server_info
        self.stop_server()
        argv = self.server_argv(cell)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        # two servers of one configuration may start in the same second (an A/A control's arm beside its baseline's)
        log = (
            self.log_dir
            / f"{self.framework}_{cell.method}_g{cell.gamma}_{stamp}_{os.getpid()}_{next(_SERVER_LOGS)}.log"
        )
        self.server = ManagedServer(
            argv,
            log_path=log,
            env=self.server_env(cell),
            health_path=self.health_path,
            ready_timeout_s=self.ready_timeout_s,
            version=self.version_probe,
        )
        self.server_info = self.server.start()
        self._server_key = key
        return self.server_info

    def stop_server(self) -> None:
        if self.server is not None:
            self.server.stop()
        self.server = None
        if self.base_url is None:
            self.server_info = None
        self._server_key = None

    def close(self) -> None:
        self.stop_server()

    # ---- one request ----------------------------------------------------------------------

    def send(self, request: Request, sampling: Sampling, cell: Cell, timeout_s: float | None = None) -> RequestRecord:
        """One streamed request → one record (warm-up, cost probes); the same path as a run's sends."""
        if self.url is None:
            try:
                with self._start_lock:
                    self.ensure_server(cell)
            except (OSError, ValueError, RuntimeError) as e:  # ServerStartError is a RuntimeError
                rec = cell.new_record(request, sampling, input_policy=getattr(request, "input_policy", "") or "")
                rec.status, rec.error = "error", f"no server: {e}"[:2000]
                return rec

        async def once() -> RequestRecord:
            async with Http() as http:
                prep = self.prepare_send(http, request, sampling, cell, timeout_s)
                await http.connections.open(address(prep))  # as in a run: connected before the send
                return await self.transmit(http, prep, cell)

        return run_sync(once)

    # ---- a run ------------------------------------------------------------------------------

    #: the server's own gauges sampled while a run lasts: {key: Prometheus metric name}
    GAUGES: dict[str, str] = {}
    gauge_period_s: float = 0.5
    rss_period_s: float = 0.02

    def offer_run(self, run: Offer, *, gauges: bool = True) -> ServedBatch:
        """The one path of every server run: counters scraped before and after, the server
        watched (memory, and with ``gauges`` its batch gauges), the requests offered on schedule
        by the load generator.

        Gauges are for request-rate runs, where the running batch is the unknown; a closed loop of
        ``batch_size`` clients skips them, since every scrape perturbs the server: on 2 cores,
        llama.cpp decoded 16.8 ms/token unwatched vs 20.7 with /metrics + /slots read every 0.5 s
        (even /health alone: 15.1 vs 17.4).

        Raises :class:`ServerDied` (carrying the records, unfinished ones as ``error`` rows with
        the server's last log lines) when the server the kit started exits during the run.
        """
        self.ensure_server(run.cell)
        pid = self.server.proc.pid if self.server is not None and self.server.proc is not None else None
        before = self.scrape()
        at_start = self.queue_at_start(before)
        with ServerWatch(
            pid,
            self.gauge_scrape() if gauges else None,
            self.GAUGES if gauges else {},
            rss_period_s=self.rss_period_s,
            gauge_period_s=self.gauge_period_s,
        ) as watch:
            records, wall = offer(self, run)
        self.check_alive(records)
        after = self.scrape()
        acceptance = self.run_acceptance(before, after, records)
        self.last_run_acceptance = acceptance
        prefix = self.run_prefix_cache(before, after, records)
        peak, source = watch.result.memory()
        block = {**watch.result.as_extra(), **self.engine_memory(after)}
        for rec in records:
            if peak is not None:
                rec.peak_memory_bytes, rec.memory_source = peak, source
            rec.extra["server_watch"] = block
            if at_start is not None:  # run-level: the server's own gauges when the run began
                rec.extra["server_at_start"] = at_start
            if prefix is not None:  # run-level, like run_scope: NOT a per-request number
                rec.extra["prefix_cache_counters"] = prefix
        return ServedBatch(records, wall, acceptance, watch.result)

    #: how long a cut run's server may take to drop the requests whose connections closed (vLLM aborts
    #: them at once) before the kit stops it, so the next cell starts a fresh, idle one
    SETTLE_S = 10.0

    def settle(self) -> tuple[str, bool]:
        """After a cut run: wait until the server's own gauges read nothing running or waiting, at most
        :attr:`SETTLE_S`; a server the kit started that is still busy then (or reports no gauges) is
        stopped.  What happened, for the cell's line, and whether the server was stopped (its next cell
        then starts a cold one and warms it up)."""
        t0 = time.perf_counter()
        while True:
            queue = self.queue_at_start(self.scrape())
            waited = time.perf_counter() - t0
            if queue is not None and not any(queue.values()):
                return f"server idle {waited:.1f} s after", False
            if queue is None or waited >= self.SETTLE_S:
                if self.base_url is not None:  # not the kit's to stop
                    return "server not known idle after (attached, not the kit's)", False
                self.stop_server()
                why = "reports no queue" if queue is None else f"still busy after {waited:.1f} s"
                return f"server stopped ({why}): the next cell starts a fresh one", True
            time.sleep(0.1)

    def queue_at_start(self, samples: SnapshotT | None) -> dict[str, float] | None:
        """Requests the server was running and holding back before the run's first one (its own
        :attr:`GAUGES`): anything but zero means the run did not start on an idle server."""
        if not isinstance(samples, dict) or not self.GAUGES:
            return None
        out = {k: metric_total(samples, self.GAUGES[k]) for k in ("running", "waiting") if k in self.GAUGES}
        return {k: float(v) for k, v in out.items() if v is not None} or None

    def engine_memory(self, samples: SnapshotT | None) -> dict[str, Any]:
        """The engine's own memory figures (KV cache) where its /metrics report them."""
        return {}

    def run_prefix_cache(
        self, before: SnapshotT | None, after: SnapshotT | None, records: Sequence[RequestRecord]
    ) -> dict[str, Any] | None:
        """The run's prefix-cache hits from what the server reports; None where it reports none."""
        return None

    def check_alive(self, records: Sequence[RequestRecord]) -> None:
        """Raise :class:`ServerDied` if the kit's server exited during the run (records kept)."""
        server = self.server
        proc = server.proc if server is not None else None
        if server is None or proc is None:
            return
        if proc.poll() is None and any(r.status == "error" for r in records):
            try:  # a crash fails its requests a moment before the process is gone (slower on a busy machine)
                proc.wait(timeout=DEATH_GRACE_S)
            except subprocess.TimeoutExpired:
                return
        if proc.poll() is None:
            return
        tail = server.log_tail(20)
        why = f"server exited with code {proc.returncode} during the run; log {server.log_path}, last lines:\n{tail}"
        for rec in records:
            if rec.status != "ok":
                rec.status, rec.error = "error", f"{why}\n(request: {rec.error})"[:4000]
        self.stop_server()
        raise ServerDied(why, list(records))

    def run(self, requests: Sequence[Request], sampling: Sampling, cell: Cell) -> Iterator[RequestRecord]:
        """The cell's requests ``cell.batch_size`` at a time (a closed loop of that many clients)."""
        if cell.batch_size < 1:
            raise ValueError(f"batch_size={cell.batch_size!r}: must be >= 1")
        closed_loop = Offer(
            list(requests),
            sampling,
            cell,
            [0.0] * len(requests),
            concurrency=cell.batch_size,
            request_timeout_s=self.request_timeout_s,
            run_timeout_s=batch_deadline(len(requests), cell.batch_size, self.request_timeout_s),
        )
        batch = self.offer_run(closed_loop, gauges=False)
        for rec in batch.records:
            # the same run-level block on every record of the run: NOT a per-request number
            rec.extra["run_scope"] = {"acceptance": batch.run_acceptance, "n_requests": len(batch.records)}
            yield rec


class ServerBackend(StreamingServerBackend[MetricSamples]):
    """A server whose metrics endpoint (``metrics_path``, when set) serves Prometheus text."""

    def scrape(self) -> MetricSamples | None:
        """The server's /metrics now, or None when it has none."""
        if self.metrics_path is None or self.url is None:
            return None
        try:
            status, body = http_get(self.url + self.metrics_path, 10.0)
        except OSError:
            return None
        return parse_prometheus(body) if status == 200 else None

    def gauge_scrape(self) -> Callable[[], MetricSamples | None] | None:
        return self.scrape if self.GAUGES else None


@dataclass
class ServedBatch:
    """One server run: its records in request order, wall time, run-scoped acceptance, what the watch saw."""

    records: list[RequestRecord]
    wall_s: float
    run_acceptance: dict[str, Any] | None
    watch: WatchResult


class ServerDied(RuntimeError):
    """The server the kit started exited during a run; ``records`` hold the run's rows (the
    unfinished ones as ``error`` rows naming the exit code and the log's last lines)."""

    def __init__(self, message: str, records: list[RequestRecord]):
        super().__init__(message)
        self.records = records

"""MLC-LLM's ``mlc_llm serve``: speculative mode on its command line, acceptance from its engine
metrics.

Read from mlc-ai/mlc-llm's sources (main at 79d603f, 2026-07-23):

* ``python/mlc_llm/cli/serve.py``: ``mlc_llm serve MODEL [--model-lib LIB] [--device D] [--mode
  local|interactive|server] [--enable-debug] [--additional-models PATH[,LIB] ...]
  [--speculative-mode disable|small_draft|eagle|medusa] [--prefix-cache-mode disable|radix]
  [--overrides "spec_draft_length=K;spec_tree_width=1;tensor_parallel_shards=N;..."] --host --port``.
  MODEL is MLC's own compiled weights (``HF://mlc-ai/...-q4f16_1-MLC`` or a converted folder), not
  the original checkpoint: framework option ``weights`` maps the kit's model names to them.
* ``python/mlc_llm/protocol/openai_api_protocol.py`` ``CompletionRequest``: ``prompt`` text or
  token ids, ``stream_options.include_usage``; no ``top_k`` (refused here, never dropped
  silently); ``ignore_eos`` only in ``debug_config`` (``protocol/debug_protocol.py``), which
  the server reads only with ``--enable-debug``, so the kit always starts it with that flag.
* ``python/mlc_llm/serve/engine_base.py`` ``process_completion_stream_output``: each chunk
  carries the step's new text only (no token ids, no usage; empty text is not sent), the last
  chunk ``choices: []`` with ``usage`` whose ``extra`` (``cpp/serve/metrics.cc``
  ``RequestMetrics::AsJSON``: ttft_s, decode_tokens_per_s, ...) is kept with ``--enable-debug``.
  It has no per-request speculative counts.
* ``cpp/serve/metrics.h`` ``SpecDecodeMetrics::Update(draft_length, accept_length)``, called
  once per request and verification step by ``engine_actions/batch_verify.cc`` and
  ``eagle_batch_verify.cc`` with draft_length = drafts + 1 (the last committed token is verified
  too) and accept_length = tokens committed (accepted drafts + the target's own token, ≥ 1):
  ``draft_count[j]`` and ``accept_count[j]`` count steps that reached / accepted position j,
  position 0 being that bonus token.  So the counts are unconditional (every step counts at
  every position it drafted), bonus included at j = 0: the kit reads draft steps =
  ``draft_count[0]``, drafted = Σ ``draft_count[1:]``, accepted per draft position k =
  ``accept_count[k]``.  MLC's own ``accept_len{step=i}`` (Σ of ``accept_prob`` up to i) also
  counts the bonus token; ``accept_rate{step=i}`` = accept_count[i] / accept_count[i−1] is the
  conditional form.  ``/metrics`` (``engine_base.EngineMetrics.prometheus_text``) drops the count
  lists and keeps those ratios, which cannot be scoped to a run, so the kit reads the counts from
  ``POST /debug/dump_engine_metrics`` (``serve/entrypoints/debug_entrypoints.py``, with
  ``--enable-debug``) before and after a run.

MLC-LLM's PyPI names are placeholders (its wheels come from mlc.ai/wheels) and it is not
installed here: this backend is tested against fixtures in the formats above
(tests/backends/test_mlc.py), never a live server.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from ...data.model_files import resolve_for_engine as resolve_model
from ...frameworks.declaration import check_choice
from ...frameworks.mlc import KIT_TO_MLC, MLC, OVERRIDES
from ...metrics import counter_acceptance, per_position_conditional
from ...records import Cell, Request, RequestRecord, Sampling
from ..lifecycle import http_request
from ..server_base import StreamingServerBackend
from ..sse import StreamState

#: --device choices are open (cuda, cuda:1, vulkan, ...); --mode choices are fixed (interface/help.py:
#: "local" caps the batch at 4, "interactive" at 1; "server" sizes it from GPU memory: the kit's default,
#: so batch and request-rate cells are not queued silently)
MLC_MODES = ("local", "interactive", "server")
MLC_DEFAULT_MODE = "server"
_QUANT = re.compile(r"q\d+f(?:16|32)(?:_\d+)?")


def quantization_of(weights: str) -> str | None:
    """MLC's quantization code in a weights name (``...-q4f16_1-MLC`` → ``q4f16_1``), if any."""
    m = _QUANT.search(weights)
    return m.group(0) if m else None


def speculative_flags(method: str, drafter: str, lib: str | None) -> list[str]:
    """The speculative part of the command line (empty for AR): its one additional model (γ: --overrides)."""
    if method == "ar":
        return []
    model = f"{drafter},{lib}" if lib else drafter
    return ["--additional-models", model, "--speculative-mode", KIT_TO_MLC[method]]


def describe_mlc(method: str, gamma: int | None) -> str:
    """What MLC-LLM runs for a study method; its weights are its own compiled (usually INT4) ones."""
    precision = "on MLC's compiled weights (INT4 q4f16_1 is its norm: the precision is the weights' own)"
    if method == "ar":
        return f"MLC-LLM autoregressive decoding (no speculation), {precision}"
    mode = KIT_TO_MLC[method]
    return f"MLC-LLM --speculative-mode {mode}: a chain of {gamma} draft tokens per step, {precision}"


class MlcServerBackend(StreamingServerBackend[dict[str, Any]]):
    """``mlc_llm serve`` per speculative configuration, or attach via ``base_url`` (started with
    ``--enable-debug``, else acceptance stays unseen).

    Options: ``mlc_llm`` (the executable, default ``mlc_llm`` on PATH), ``weights`` ({kit model
    or drafter name: MLC weights}; unmapped names are passed as they are), ``model_lib`` ({name:
    compiled library}; unmapped: MLC compiles it at start), ``device`` (default ``auto``), ``mode``
    (default ``server``: MLC's own default, ``local``, runs at most 4 requests at once),
    ``prefix_cache`` (``--prefix-cache-mode radix``; default off), and the overrides
    ``tensor_parallel_size``, ``max_model_len``, ``gpu_memory_utilization``, ``max_num_sequence``.
    """

    framework = "mlc"
    sets_prefix_cache = True
    methods = MLC.methods
    api_path = "/v1/completions"
    health_path = "/v1/models"  # MLC's server has no /health
    metrics_path = "/debug/dump_engine_metrics"
    _dump_answered: bool | None = None

    @classmethod
    def check_engine_options(cls, options: dict[str, Any]) -> None:
        super().check_engine_options(options)
        check_choice("mlc", "mode", options.get("mode", MLC_DEFAULT_MODE), MLC_MODES)
        for key in ("weights", "model_lib"):
            if not isinstance(options.get(key) or {}, Mapping):
                raise ValueError(f"mlc {key} must map model names to MLC paths, got {options[key]!r}")

    def weights(self, name: str) -> str:
        """MLC's weights for a kit model name (the ``weights`` map, else the name as it is)."""
        return str((self.options.get("weights") or {}).get(name) or resolve_model(name))

    def overrides(self, cell: Cell) -> str:
        """The ``--overrides`` string: γ as spec_draft_length (never 0, MLC's adaptive length), a chain."""
        parts = [f"{key}={self.options[opt]}" for opt, key in OVERRIDES.items() if self.options.get(opt) is not None]
        if cell.method != "ar":
            parts += [f"spec_draft_length={int(cell.gamma or 0)}", "spec_tree_width=1"]
        return ";".join(parts)

    def server_argv(self, cell: Cell) -> list[str]:
        libs = self.options.get("model_lib") or {}
        argv = [str(self.options.get("mlc_llm", "mlc_llm")), "serve", self.weights(self.model)]
        if libs.get(self.model):
            argv += ["--model-lib", str(libs[self.model])]
        argv += [
            "--device",
            str(self.options.get("device", "auto")),
            "--mode",
            self.options.get("mode", MLC_DEFAULT_MODE),
        ]
        argv += ["--prefix-cache-mode", "radix" if self.options.get("prefix_cache") else "disable"]
        argv += ["--enable-debug", "--host", "{host}", "--port", "{port}"]
        drafter = cell.drafter or self.drafter or ""
        argv += speculative_flags(cell.method, self.weights(drafter), libs.get(drafter))
        if self.overrides(cell):
            argv += ["--overrides", self.overrides(cell)]
        return argv + self.server_args

    def server_key(self, cell: Cell) -> Any:
        drafter = cell.drafter or self.drafter or ""
        return (tuple(speculative_flags(cell.method, self.weights(drafter), None)), self.overrides(cell))

    def request_body(self, request: Request, sampling: Sampling) -> dict[str, Any]:
        """OpenAI completions as MLC reads them: ``ignore_eos`` in ``debug_config``; no ``top_k``."""
        if sampling.top_k > 0:
            raise ValueError(f"MLC-LLM's CompletionRequest has no top_k (asked for top_k={sampling.top_k})")
        body = super().request_body(request, sampling)
        body["model"] = self.served_model or self.weights(self.model)
        if body.pop("ignore_eos", False):
            body["debug_config"] = {"ignore_eos": True}
        return {**body, **self.extra_body}

    def consume(self, obj: dict[str, Any], st: StreamState) -> int:
        """One chunk: the step's new text (tokens per chunk unknown: counted 1, the total from usage)."""
        n = super().consume(obj, st)
        if st.count_source == "one_per_chunk":
            st.count_source = "text_chunks (one per engine step; the total from usage)"
        return n

    def fill_acceptance(self, rec: RequestRecord, st: StreamState) -> None:
        """No per-request speculative counts in MLC's usage: keep its own request metrics beside the record."""
        rec.extra["mlc_weights"] = self.weights(self.model)
        rec.extra["mlc_quantization"] = quantization_of(self.weights(self.model))
        extra = (st.usage or {}).get("extra")
        if isinstance(extra, dict):
            rec.extra["mlc_request_metrics"] = extra
        # without --enable-debug MLC drops debug_config (ignore_eos) and has no metrics dump
        rec.extra["mlc_enable_debug"] = self.debug_enabled

    @property
    def debug_enabled(self) -> bool | None:
        """True when the kit started the server (with --enable-debug); attached: whether its
        metrics dump answered (None before any scrape)."""
        return True if self.base_url is None else self._dump_answered

    # ---- acceptance ---------------------------------------------------------------------------

    def scrape(self) -> dict[str, Any] | None:
        """The engine metrics now (POST /debug/dump_engine_metrics), or None without them."""
        if self.url is None:
            return None
        try:
            status, body = http_request("POST", self.url + self.metrics_path, 30.0, {"model": self.served_model})
        except OSError:
            return None
        self._dump_answered = status == 200
        try:
            return engine_metrics(json.loads(body)) if status == 200 else None
        except ValueError:
            return None

    def run_acceptance(
        self, before: dict[str, Any] | None, after: dict[str, Any] | None, records: Sequence[RequestRecord]
    ) -> dict[str, Any] | None:
        return spec_decode_acceptance(before or {}, after) if after else None


def engine_metrics(payload: Mapping[str, Any]) -> dict[str, Any]:
    """The engine metrics object of a dump: FastAPI serialises MLC's ``EngineMetrics`` through its
    attributes (``{"metrics": {...}}``); a bare metrics object is accepted as well."""
    inner = payload.get("metrics")
    return dict(inner) if isinstance(inner, Mapping) else dict(payload)


def spec_decode_counts(metrics: Mapping[str, Any]) -> tuple[list[int], list[int]]:
    """(draft_count, accept_count) per step position of ``spec_decode``; empty without speculation."""
    spec = metrics.get("spec_decode") or {}
    return [int(x) for x in spec.get("draft_count") or []], [int(x) for x in spec.get("accept_count") or []]


def _delta(after: list[int], before: list[int]) -> list[int]:
    return [a - (before[i] if i < len(before) else 0) for i, a in enumerate(after)]


def spec_decode_acceptance(before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, Any] | None:
    """The run's α, AL and per-position acceptance from two engine-metrics dumps (after − before);
    None without drafting in between or when the counts went back (an engine reset)."""
    d1, a1 = spec_decode_counts(after)
    d0, a0 = spec_decode_counts(before)
    draft, accept = _delta(d1, d0), _delta(a1, a0)
    if len(draft) < 2 or draft[0] <= 0 or min(draft + accept) < 0:
        return None
    steps = draft[0]  # position 0 is the target's own token: once per verification step
    out = counter_acceptance(
        "mlc engine metrics spec_decode (draft_count/accept_count deltas)",
        steps,
        sum(draft[1:]),
        sum(accept[1:]),
        accept[1:],
    )
    out["drafts_per_position"] = draft[1:]
    out["per_position_conditional"] = per_position_conditional(accept[1:], draft[1:])
    # MLC's own accept_len at the last position (Σ accept_count / draft_count), bonus included
    out["mlc_accept_len"] = sum(a / d for a, d in zip(accept, draft, strict=True) if d)
    return out


__all__ = [
    "MlcServerBackend",
    "describe_mlc",
    "engine_metrics",
    "quantization_of",
    "spec_decode_acceptance",
    "spec_decode_counts",
    "speculative_flags",
]

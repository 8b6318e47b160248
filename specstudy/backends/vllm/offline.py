"""vLLM offline (``vllm.LLM``): batches of requests, acceptance from ``llm.get_metrics()`` deltas.

vLLM's pins (torch, transformers) conflict with the kit's, so vLLM lives in its own venv
(:mod:`specstudy.environments.install`).  :class:`VllmOfflineBackend` is therefore usually a
*client*: it spawns ``<vllm venv>/bin/python -m specstudy.backends.vllm.worker`` and streams the
same records back (:mod:`specstudy.backends.vllm.protocol`).  Where ``vllm`` imports in this
interpreter (the worker itself, or an env that has both), it runs in-process.  Both paths build
records with the one :class:`VllmEngine` below.

The engine is built once per speculative configuration with ``disable_log_stats=False`` (so the
spec-decode counters and per-request timestamps exist) and
``per_request_spec_decode_metrics="detailed"`` (so each output carries its own acceptance).
Offline generation does not stream: per-request TTFT and end come from vLLM's own engine
timestamps (``RequestOutput.metrics``); no per-chunk times exist.  The kit's generic options are
translated into ``EngineArgs`` (:func:`engine_kwargs`); ``prefix_cache`` becomes
``enable_prefix_caching`` and always follows the study's setting (vLLM turns it on by default,
which would let repeats hit the cache).
"""

from __future__ import annotations

import gc
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from ...data.model_files import resolve_for_engine
from ...frameworks.declaration import check_engine_options, constraint_body
from ...frameworks.vllm import CLIENT_OPTIONS, ENGINE_ARG_OPTIONS, KIT_TO_VLLM, OFFLINE
from ...metrics import counter_acceptance
from ...records import Cell, Request, RequestRecord, Sampling
from ..base import Backend, BackendUnavailable, encode_request
from .speculative_config import VllmCellCheck, engine_key, engine_model, spec_fields, speculative_config

INSTALL_HINT = "make engine-vllm (or: python -m specstudy.environments install vllm [--cpu|--cuda])"

_COUNTERS = {
    "drafts": "vllm:spec_decode_num_drafts",
    "draft_tokens": "vllm:spec_decode_num_draft_tokens",
    "accepted_tokens": "vllm:spec_decode_num_accepted_tokens",
}
_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"
#: prefix-cache counters of ``llm.get_metrics()`` (tokens looked up / found), as on the server's /metrics
_PREFIX = {"prefix_queries": "vllm:prefix_cache_queries", "prefix_hits": "vllm:prefix_cache_hits"}


def import_vllm() -> Any:
    """The ``vllm`` module (untyped here: the kit's environment does not install it)."""
    try:
        import vllm  # noqa: F401
    except ImportError as e:
        raise BackendUnavailable(
            f"framework 'vllm' needs vLLM, which is not installed here ({e}); "
            f"install its environment with: {INSTALL_HINT}"
        ) from e
    return vllm


def engine_kwargs(model_path: str, options: Mapping[str, Any], spec_cfg: dict[str, Any] | None) -> dict[str, Any]:
    """``EngineArgs`` keyword arguments for the kit's options (pure; tested against EngineArgs)."""
    check_engine_options(OFFLINE, options)
    kw: dict[str, Any] = {
        "model": model_path,
        "seed": 0,
        "disable_log_stats": False,
        "enable_prefix_caching": bool(options.get("prefix_cache") or False),
    }
    for kit, field in ENGINE_ARG_OPTIONS.items():
        if options.get(kit) is not None:
            kw[field] = options[kit]
    extra = dict(options.get("engine_args") or {})
    clash = sorted(set(extra) & (set(kw) | {"speculative_config"}))
    if clash:
        raise ValueError(
            f"engine_args {clash} duplicate settings the kit makes; use the kit options "
            f"{sorted(ENGINE_ARG_OPTIONS)} / prefix_cache instead"
        )
    kw.update(extra)
    if spec_cfg is not None:
        kw["speculative_config"] = spec_cfg
        kw["per_request_spec_decode_metrics"] = "detailed"
    return kw


def counters_snapshot(metrics: Sequence[Any]) -> dict[str, Any]:
    """{drafts, draft_tokens, accepted_tokens, per_pos} summed over engines from ``get_metrics()``."""
    out: dict[str, Any] = {k: 0 for k in (*_COUNTERS, *_PREFIX)}
    per_pos: list[int] = []
    for m in metrics:
        for key, name in (*_COUNTERS.items(), *_PREFIX.items()):
            if m.name == name:
                out[key] += int(m.value)
        if m.name == _PER_POS:
            values = list(m.values)
            per_pos = [a + b for a, b in zip(per_pos + [0] * (len(values) - len(per_pos)), values)]
    out["per_pos"] = per_pos
    return out


def snapshot_delta(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """Run-scoped acceptance (after − before) of two ``llm.get_metrics()`` snapshots."""
    d = {k: after[k] - before[k] for k in _COUNTERS}
    pb = before["per_pos"] + [0] * (len(after["per_pos"]) - len(before["per_pos"]))
    per_pos = [a - b for a, b in zip(after["per_pos"], pb)]
    return counter_acceptance("llm.get_metrics", d["drafts"], d["draft_tokens"], d["accepted_tokens"], per_pos)


def prefix_delta(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """The run's prefix-cache lookups and hits (tokens) from ``llm.get_metrics()`` (after − before)."""
    q = after.get("prefix_queries", 0) - before.get("prefix_queries", 0)
    h = after.get("prefix_hits", 0) - before.get("prefix_hits", 0)
    return {
        "source": "llm.get_metrics vllm:prefix_cache_queries / vllm:prefix_cache_hits (run deltas, tokens)",
        "queries": q,
        "hits": h,
        "hit_rate": h / q if q else None,
    }


class VllmEngine:
    """``vllm.LLM`` in this process: one engine per speculative configuration, records per batch."""

    def __init__(self, model_path: str, drafter: str | None, options: Mapping[str, Any]):
        self.vllm = import_vllm()
        self.model_path, self.drafter, self.options = model_path, drafter, dict(options)
        self.llm: Any = None  # the vllm.LLM of configuration ``key``
        self.key: str | None = None
        self.last_run_acceptance: dict[str, Any] | None = None

    def engine(self, cell: Cell) -> Any:
        key = engine_key(cell, self.drafter)
        if self.llm is not None and key == self.key:
            return self.llm
        self.close()
        cfg = speculative_config(cell.method, cell.gamma, cell.drafter or self.drafter, dict(cell.options))
        model = engine_model(self.model_path, cell.method, cell.drafter or self.drafter)
        kwargs = engine_kwargs(model, self.options, cfg)
        if model != self.model_path:  # a MiMo model of the target: the target's own tokenizer (model_type qwen2
            kwargs["tokenizer"] = self.model_path  # would make transformers pick Qwen2's, which splits text otherwise)
        try:
            self.llm = self.vllm.LLM(**kwargs)
        except Exception as e:  # a config vLLM refuses or a model that does not fit: fail the engine fast
            raise BackendUnavailable(
                f"vLLM could not build the engine for {cell.method} γ={cell.gamma}: {type(e).__name__}: {e}"[:3000]
            ) from e
        self.key = key
        return self.llm

    def run(self, requests: Sequence[Request], sampling: Sampling, cell: Cell) -> list[RequestRecord]:
        llm = self.engine(cell)
        params = self.vllm.SamplingParams(
            max_tokens=sampling.max_new_tokens,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k if sampling.top_k > 0 else -1,
            seed=sampling.seed,
            ignore_eos=sampling.ignore_eos,
        )
        before = counters_snapshot(llm.get_metrics())
        records: list[RequestRecord] = []
        for i in range(0, len(requests), cell.batch_size):
            records.extend(self._batch(llm, list(requests[i : i + cell.batch_size]), params, sampling, cell))
        after = counters_snapshot(llm.get_metrics())
        self.last_run_acceptance = snapshot_delta(before, after)
        prefix = prefix_delta(before, after)
        for rec in records:
            rec.extra["run_scope"] = {"acceptance": self.last_run_acceptance, "n_requests": len(records)}
            rec.extra["engine_prefix_cache"] = bool(self.options.get("prefix_cache") or False)
            rec.extra["prefix_cache_counters"] = prefix  # run-level: NOT a per-request number
            rec.extra["max_model_len"] = self.options.get("max_model_len")  # read by the published-number checks
        return records

    @staticmethod
    def _prompt(request: Request, llm: Any) -> Any:
        if request.prompt_ids is not None:
            return {"prompt_token_ids": list(request.prompt_ids)}
        if request.messages:
            return {"prompt_token_ids": encode_request(llm.get_tokenizer(), request)}
        return request.prompt

    def _batch(
        self, llm: Any, batch: list[Request], params: Any, sampling: Sampling, cell: Cell
    ) -> list[RequestRecord]:
        epoch, t0 = time.time(), time.monotonic()
        try:
            per_request = [constrained(self.vllm, params, r) for r in batch]
            outputs = llm.generate([self._prompt(r, llm) for r in batch], per_request, use_tqdm=False)
        except Exception as e:  # one failed batch is records with a status, not a lost cell
            status = "oom" if "out of memory" in str(e).lower() else "error"
            return [
                cell.new_record(r, sampling, start_epoch=epoch, status=status, error=f"{type(e).__name__}: {e}"[:2000])
                for r in batch
            ]
        wall = time.monotonic() - t0
        return [self._record(req, out, sampling, cell, epoch, t0, wall) for req, out in zip(batch, outputs)]

    @staticmethod
    def _record(
        req: Request, out: Any, sampling: Sampling, cell: Cell, epoch: float, t0: float, wall: float
    ) -> RequestRecord:
        comp = out.outputs[0]
        rec = cell.new_record(
            req,
            sampling,
            start_epoch=epoch,
            input_tokens=len(out.prompt_token_ids or []),
            output_tokens=len(comp.token_ids),
            output_ids=list(comp.token_ids),
            output_text=comp.text,
        )
        m = getattr(out, "metrics", None)
        if m is not None and getattr(m, "first_token_ts", 0) > 0 and getattr(m, "last_token_ts", 0) > 0:
            rec.first_token_s, rec.end_s = float(m.first_token_ts - t0), float(m.last_token_ts - t0)
            rec.extra["timing_source"] = "vllm RequestStateStats (engine monotonic clock)"
        else:
            rec.end_s = wall
            rec.extra["timing_source"] = "batch wall time (no per-request timestamps)"
        spec = getattr(comp, "spec_decode_metrics", None)
        if spec is not None:
            for k, v in spec_fields(spec.to_dict(), rec.output_tokens).items():
                setattr(rec, k, v)
            rec.extra["acceptance_source"] = "vllm CompletionOutput.spec_decode_metrics"
            rec.extra["vllm_spec"] = spec.to_dict()
        rec.extra["finish_reason"] = comp.finish_reason
        # what the published-number checks read: the prompt's first ids (a doubled BOS) and the template
        rec.extra["prompt_head_ids"] = list(out.prompt_token_ids or [])[:4]
        rec.extra["chat_template"] = bool(req.messages)  # messages: rendered by the chat template (data.tasks)
        return rec

    def close(self) -> None:
        """Shut the engine core down and free its memory before another configuration loads."""
        llm, self.llm, self.key = self.llm, None, None
        if llm is None:
            return
        core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
        if core is not None and hasattr(core, "shutdown"):
            core.shutdown()
        del llm
        gc.collect()
        try:
            import torch

            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        except ImportError:
            pass


class VllmOfflineBackend(VllmCellCheck, Backend):
    """``vllm.LLM`` with ``speculative_config`` from the cell's method, γ and options.

    Options: the kit's generic ``dtype``, ``tensor_parallel_size``, ``max_model_len``,
    ``gpu_memory_utilization``, ``enforce_eager``, ``quantization``, ``max_num_seqs``, ``seed``,
    ``prefix_cache`` (translated to EngineArgs), ``engine_args`` (more EngineArgs fields, as is),
    and for the worker ``python`` (its interpreter; default: the kit's vLLM env), ``worker``
    (``auto``, ``process``, ``inprocess``), ``env``, ``startup_timeout_s``, ``run_timeout_s``.
    """

    framework = "vllm"
    methods = OFFLINE.methods

    def __init__(self, model: str, drafter: str | None = None, **options: Any):
        check_engine_options(OFFLINE, options)

        self.model, self.drafter, self.options = model, drafter, options
        self.last_run_acceptance: dict[str, Any] | None = None
        mode = options.get("worker", "auto")
        if mode not in ("auto", "process", "inprocess"):
            raise ValueError(f"worker={mode!r}: allowed 'auto', 'process', 'inprocess'")
        engine_opts = {
            k: v for k, v in options.items() if k not in set(CLIENT_OPTIONS) - {"prefix_cache", "engine_args"}
        }
        path, draft = resolve_for_engine(model), resolve_for_engine(drafter) if drafter else None
        if mode == "inprocess" or (mode == "auto" and not options.get("python") and _vllm_importable()):
            self.impl: Any = VllmEngine(path, draft, engine_opts)
        else:
            from .client import WorkerClient

            self.impl = WorkerClient(
                path,
                draft,
                engine_opts,
                python=options.get("python"),
                env=options.get("env"),
                startup_timeout_s=float(options.get("startup_timeout_s", 900)),
                run_timeout_s=float(options.get("run_timeout_s", 3600)),
                log_dir=options.get("log_dir", "outputs/servers"),
            )

    # ---- validation (pure, before any model loads) --------------------------------------------

    @property
    def effective_prefix_cache(self) -> bool:
        """The engine's prefix caching as the kit set it (never vLLM's silent default)."""
        return bool(self.options.get("prefix_cache") or False)

    # ---- running ----------------------------------------------------------------------------

    def run(self, requests: Sequence[Request], sampling: Sampling, cell: Cell) -> Iterator[RequestRecord]:
        if cell.method not in ("ar", *KIT_TO_VLLM):
            raise ValueError(f"method={cell.method!r} is not available in vLLM; allowed: {self.methods}")
        if cell.batch_size < 1:
            raise ValueError(f"batch_size={cell.batch_size!r}: must be >= 1")
        records = self.impl.run(list(requests), sampling, cell)
        self.last_run_acceptance = self.impl.last_run_acceptance
        yield from records

    def close(self) -> None:
        self.impl.close()


def _vllm_importable() -> bool:
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


def constrained(vllm: Any, params: Any, request: Request) -> Any:
    """``params`` for one request: as given without a constraint, else a copy whose ``structured_outputs``
    carries the request's JSON schema or grammar (vLLM's StructuredOutputsParams, the fields the
    declaration names), so one batch mixes constrained and free requests."""
    fields = constraint_body(OFFLINE, request.json_schema, request.grammar).get("structured_outputs")
    if not fields:
        return params
    own = params.clone()
    own.structured_outputs = vllm.sampling_params.StructuredOutputsParams(**fields)
    return own

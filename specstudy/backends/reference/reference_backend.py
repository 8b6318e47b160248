"""The reference backend: the in-process engine (:mod:`specstudy.engine`) behind the Backend API.

It loads the target (and a drafter when the method needs one) once, tokenizes each request
(the chat template when the request carries messages or the cell sets ``chat: true``), decodes
the requests in batches of ``cell.batch_size`` with ``cell.method`` and yields one
RequestRecord per request with every verification step, the target log-probs and entropies,
and the batch's peak memory.  A failing batch becomes records with status oom/error.  A cell
with the method option ``synthetic_acceptance`` (benchmark-only: drafts kept at a fixed rate)
marks every record's ``synthetic_acceptance`` with the rule, e.g. ``"alpha=0.8"``.
"""

from __future__ import annotations

import gc
import time
import traceback
import weakref
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from ...config.vocab import TORCH_DTYPES
from ...data.model_files import get_entry, load_model, model_names, quantize_dynamic_int8, require_int8_device
from ...engine.lean import prepare as prepare_lean
from ...engine.methods import SYNTHETIC, DecodeJob, get_method, method_names
from ...engine.trace import cell_memory, current_rss, reset_peak_memory
from ...frameworks.declaration import CellCheck, check_engine_options
from ...frameworks.reference import REFERENCE, method_headers
from ...records import Cell, Request, RequestRecord, Sampling
from ..base import Backend, encode_request

#: cell options the backend itself reads (the rest go to the method)
BACKEND_CELL_OPTIONS = ("chat", "rate")


def torch_module() -> type:
    import torch

    return torch.nn.Module


class ReferenceBackend(Backend):
    framework = "reference"

    def __init__(
        self, model: Any, drafter: str | None = None, device: str = "cpu", dtype: str = "float32", **options: Any
    ):
        check_engine_options(REFERENCE, options)
        if dtype not in TORCH_DTYPES:
            raise ValueError(f"reference backend: dtype={dtype!r}; allowed: {list(TORCH_DTYPES)}")
        if not (device == "cpu" or str(device).startswith("cuda")):
            raise ValueError(f"reference backend: device={device!r}; allowed: 'cpu', 'cuda', 'cuda:N'")
        self.methods = tuple(method_names())
        self.device, self.dtype = str(device), dtype
        self.chat_default = bool(options.get("chat", False))
        if options.get("threads"):
            import torch

            torch.set_num_threads(int(options["threads"]))
        # names are checked (no download) before anything is loaded
        self.model_name = model if isinstance(model, str) else getattr(model, "name_or_path", type(model).__name__)
        if isinstance(model, str):
            target_entry = get_entry(model)
        self.drafter_name = drafter
        if drafter is not None and isinstance(model, str):
            self._check_tokenizer_match(target_entry, drafter)
        self.model: Any  # the target causal LM (None once closed)
        self._owns_model = isinstance(model, str)
        self.tokenizer: Any  # None when a loaded module is passed without one
        if isinstance(model, str):
            self.model, self.tokenizer = load_model(model, self.device, dtype)
        else:  # an already loaded module (tests, notebooks); requests then need prompt_ids or a tokenizer
            self.model, self.tokenizer = model, options.get("tokenizer")
        prepare_lean(self.model)  # the target's packed weights, before any batch is timed or measured
        self._drafters: dict[tuple[str | None, ...], Any] = {}  # (method, drafter[, quantization])

    @classmethod
    def describe(cls, method: str, gamma: int | None, options: Mapping[str, Any], cuda: bool | None = None) -> str:
        """What the reference engine runs for a study method (a label that does not overstate): the
        method header's ``describe`` (or ``describe_when`` an option is set), its options filled in."""
        header = method_headers().get(method)
        opts = {**(header.option_defaults if header else {}), **dict(options), "gamma": gamma}
        branching = str(options.get("tree_branching", ""))
        if header is not None and header.tree and branching and set(branching.replace(",", "").strip()) == {"1"}:
            return f"the kit's reference engine: a chain of {gamma} draft tokens, verified in one forward"
        when = [text for opt, text in (header.describe_when.items() if header else ()) if opt in options]
        text = (when or [header.describe if header else ""])[0]
        if text:
            return "the kit's reference engine: " + text.format(**opts)
        return f"the kit's reference engine: {method}, {gamma} draft tokens per step"

    @classmethod
    def check_cell(cls, cell: CellCheck) -> None:
        """The engine method's own check (option names and ranges, drafter, batch limit), before any model loads."""
        if cell.method not in method_names():
            raise ValueError(f"reference does not run method={cell.method!r}; allowed: {method_names()}")
        spec = get_method(cell.method)
        opts = {k: v for k, v in cell.options.items() if k not in BACKEND_CELL_OPTIONS}
        spec.check(cell.gamma, cell.batch_size, cell.drafter if spec.needs_drafter or cell.drafter else None, opts)

    # ---------------------------------------------------------------------------------------
    @staticmethod
    def _check_tokenizer_match(target_entry: Any, drafter: str) -> None:
        if drafter not in model_names():
            return  # not a model entry (e.g. a heads checkpoint a method loads itself)
        d = get_entry(drafter)
        if d.tokenizer_family != target_entry.tokenizer_family:
            raise ValueError(
                f"drafter {drafter!r} (tokenizer {d.tokenizer_family!r}) does not share the target "
                f"{target_entry.name!r}'s tokenizer ({target_entry.tokenizer_family!r})"
            )

    def _drafter(self, spec: Any, name: str | None, quantization: str = "none") -> Any:
        if not spec.needs_drafter:
            return None
        key = (spec.name, name) if quantization == "none" else (spec.name, name, quantization)
        if key not in self._drafters and quantization != "none":
            require_int8_device(self.device)  # before the fp32 drafter is loaded
            self._drafters[key] = quantize_dynamic_int8(self._drafter(spec, name), self.device)
        if key not in self._drafters:
            if not isinstance(name, str):
                self._drafters[key] = name  # a module passed directly
            elif spec.load_drafter is not None:
                self._drafters[key] = spec.load_drafter(name, self.model, self.device, self.dtype)
            else:
                self._drafters[key] = load_model(name, self.device, self.dtype)[0]
        return self._drafters[key]

    def eos_token_ids(self) -> list[int]:
        ids: set[int] = set()
        for src in (
            getattr(self.model, "generation_config", None),
            getattr(self.model, "config", None),
            self.tokenizer,
        ):
            v = getattr(src, "eos_token_id", None) if src is not None else None
            if isinstance(v, int):
                ids.add(v)
            elif isinstance(v, (list, tuple)):
                ids.update(int(x) for x in v)
        return sorted(ids)

    def encode(self, request: Request, chat: bool) -> list[int]:
        """Prompt token ids (:func:`specstudy.backends.base.encode_request`)."""
        return encode_request(self.tokenizer, request, chat)

    def decode_text(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True) if self.tokenizer is not None else ""

    # ---------------------------------------------------------------------------------------
    def run(self, requests: Sequence[Request], sampling: Sampling, cell: Cell) -> Iterator[RequestRecord]:
        spec = get_method(cell.method)
        raw = dict(cell.options)
        chat = bool(raw.pop("chat", self.chat_default))
        rate = raw.pop("rate", None)
        drafter_name = cell.drafter if cell.drafter is not None else self.drafter_name
        options = spec.check(cell.gamma, cell.batch_size, drafter_name if spec.needs_drafter else cell.drafter, raw)
        drafter = self._drafter(spec, drafter_name, options.get("draft_quantization", "none"))
        prompts = [self.encode(r, chat) for r in requests]
        eos = self.eos_token_ids()
        for start in range(0, len(requests), cell.batch_size):
            batch = list(requests[start : start + cell.batch_size])
            ids = prompts[start : start + cell.batch_size]
            job = DecodeJob(
                target=self.model,
                prompts=ids,
                sampling=sampling,
                gamma=cell.gamma,
                drafter=drafter,
                options=options,
                eos_token_ids=eos,
                device=self.device,
            )
            yield from self._run_batch(spec, job, batch, ids, sampling, cell, rate)

    def _run_batch(
        self, spec: Any, job: Any, batch: list[Request], ids: list[list[int]], sampling: Sampling, cell: Cell, rate: Any
    ) -> Iterator[RequestRecord]:
        import torch

        if job.drafter is not None:
            prepare_lean(job.drafter, pack=False)  # its fused weights, before the batch's memory is measured
        reset_peak_memory(self.device)
        rss_before = current_rss()
        start_epoch = time.time()
        status, error, rows = "ok", "", None
        try:
            rows = spec.decode(job)
        except (torch.OutOfMemoryError, MemoryError) as e:
            status, error = "oom", f"{type(e).__name__}: {e}"
        except Exception as e:  # a failed batch is records with a status, not a lost cell
            status, error = "error", f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=6)}"
        peak, source = cell_memory(self.device, rss_before, self.model, job.drafter)
        if status != "ok" and self.device.startswith("cuda"):
            torch.cuda.empty_cache()
        for i, req in enumerate(batch):
            extra: dict[str, Any] = {"device": self.device, "dtype": self.dtype}
            if rate is not None:
                extra["rate_ignored"] = rate  # the reference engine decodes offline batches
            fields: dict[str, Any] = dict(
                input_tokens=len(ids[i]),
                start_epoch=start_epoch,
                input_policy=getattr(req, "input_policy", "") or "",
                peak_memory_bytes=peak,
                memory_source=source,
                status=status,
                error=error,
                extra=extra,
            )
            if rows is not None:
                r = rows[i]
                extra["stop_reason"] = r.stop_reason
                if getattr(r, "tree_nodes", None) is not None:
                    extra["tree_nodes"] = r.tree_nodes  # nodes verified by tree methods
                extra.update(getattr(r, "notes", {}))  # method facts (drafter shares, the tree chosen)
                fields.update(
                    output_tokens=len(r.output_ids),
                    output_ids=list(r.output_ids),
                    output_text=self.decode_text(r.output_ids),
                    first_token_s=r.first_token_s,
                    end_s=r.end_s,
                    chunk_times_s=list(r.chunk_times_s),
                    chunk_tokens=list(r.chunk_tokens),
                    steps=list(r.steps),
                    target_logprobs=list(r.target_logprobs),
                    token_entropy=list(r.token_entropy),
                )
            rec = cell.new_record(req, sampling, **fields)
            if job.options.get(SYNTHETIC) is not None:  # acceptance fixed for timing: not measured, not lossless
                rec.synthetic_acceptance = job.options[SYNTHETIC].label
            if cell.drafter is None and job.drafter is not None and isinstance(self.drafter_name, str):
                rec.drafter = self.drafter_name
            yield rec.fill_acceptance_from_steps()

    def close(self) -> None:
        """Drop the models and hand their GPU memory back (a vLLM server may start next on this GPU);
        a MemoryError when something still holds the target (its memory would not be handed back)."""
        # only a model it loaded itself: one passed in (tests, notebooks) is its caller's to keep
        held = weakref.ref(self.model) if self._owns_model and isinstance(self.model, torch_module()) else None
        self._drafters.clear()
        self.model = None
        gc.collect()
        if self.device.startswith("cuda"):
            import torch

            torch.cuda.empty_cache()
        if held is not None and held() is not None:
            raise MemoryError(
                f"reference engine of {self.model_name}: its model is still referenced after close "
                f"({type(held()).__name__}); its memory is not handed back to the engines that start next"
            )

"""HF transformers ``generate()``: assisted generation, prompt lookup and early-exit self-speculation.

Methods map onto transformers' own options: ``ngram`` → ``prompt_lookup_num_tokens=γ`` (with
``max_matching_ngram_size``), ``draft_target`` → ``assistant_model=`` (constant schedule of γ
tokens), ``layer_skip`` → ``assistant_early_exit=k``; ``ar`` is plain ``generate()``.

Acceptance is counted per verification step without copying transformers code: for the duration
of one ``generate`` call the model's ``_get_candidate_generator`` is shadowed by an instance
attribute that wraps the generator it returns, so every ``get_candidates`` (timed as drafting)
and every ``update_candidate_strategy(input_ids, scores, num_matches)`` (called once per
verification, after the accepted tokens were appended) is seen.  Per step: drafted =
``scores.shape[1] − 1`` (the target scored the candidates plus one bonus position), emitted =
growth of ``input_ids``; accepted = the longest prefix of the candidates equal to the target's
choices under greedy decoding (exact even when the last step is cut by ``max_new_tokens``),
transformers' ``num_matches`` otherwise.  Chunk times come from a streamer.

Against the reference engine's ``ngram`` (same n-gram rule) on SmolLM2 the tokens and the
per-step counts agree except where transformers works differently: its first verification is
the prefill pass, which already checks drafts looked up in the prompt (the reference's first
step is a plain prefill), and it does not shorten drafts that run past ``max_new_tokens``
(see the slow test in ``tests/backends/test_hf.py``).

Assisted generation in transformers is batch-size 1 only: a cell with ``batch_size > 1`` is
refused up front, and every record says ``extra["batching"] = "sequential (HF assisted
generation supports batch size 1 only)"``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

from ...data.model_files import resolve_for_engine as resolve_model
from ...engine.trace import cell_memory, current_rss, reset_peak_memory
from ...frameworks.declaration import CellCheck, check_engine_options
from ...frameworks.hf import HF
from ...records import Cell, Request, RequestRecord, Sampling, StepRecord
from ..base import Backend, encode_request

BATCH_NOTE = "sequential (HF assisted generation supports batch size 1 only)"


#: transformers' num_assistant_tokens_schedule values the kit passes
HF_SCHEDULES = ("constant", "heuristic")


def check_hf_options(method: str, options: dict[str, Any]) -> None:
    """What transformers' generate refuses or ignores: prompt lookup always tries n-grams down to 1."""
    if method == "ngram" and options.get("ngram_min", 1) != 1:
        raise ValueError(
            f"ngram_min={options['ngram_min']!r}: HF prompt lookup always tries n-grams down to n=1; allowed: 1"
        )
    schedule = options.get("assistant_schedule", "constant")
    if method == "draft_target" and schedule not in HF_SCHEDULES:
        raise ValueError(f"assistant_schedule={schedule!r}: allowed {list(HF_SCHEDULES)}")


class _TimingStreamer:
    """Receives every token chunk ``generate`` emits (the prompt first) and stamps its arrival."""

    def __init__(self, t0: float):
        self.t0 = t0
        self.prompt_seen = False
        self.times: list[float] = []
        self.counts: list[int] = []
        self.ids: list[int] = []

    def put(self, value: torch.Tensor) -> None:
        if not self.prompt_seen:
            self.prompt_seen = True
            return
        ids = value.reshape(-1).tolist()
        self.times.append(time.perf_counter() - self.t0)
        self.counts.append(len(ids))
        self.ids.extend(int(i) for i in ids)

    def end(self) -> None:
        pass


class _StepCounter:
    """Wraps one candidate generator's two calls and turns them into :class:`StepRecord`s."""

    def __init__(self, t0: float, prompt_len: int, greedy: bool):
        self.t0 = t0
        self.prev_len = prompt_len
        self.greedy = greedy
        self.steps: list[StepRecord] = []
        self._candidates = None
        self._draft_start = self._draft_end = 0.0

    def wrap(self, gen: Any) -> Any:
        orig_get, orig_update = gen.get_candidates, gen.update_candidate_strategy

        def get_candidates(input_ids: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            self._draft_start = time.perf_counter()
            out = orig_get(input_ids, *args, **kwargs)
            self._draft_end = time.perf_counter()
            self._candidates = out[0][:, input_ids.shape[1] :].detach().cpu()
            return out

        def update_candidate_strategy(input_ids: torch.Tensor, scores: torch.Tensor, num_matches: Any) -> Any:
            self.record(input_ids, scores, num_matches)
            return orig_update(input_ids, scores, num_matches)

        gen.get_candidates = get_candidates
        gen.update_candidate_strategy = update_candidate_strategy
        return gen

    def record(self, input_ids: torch.Tensor, scores: torch.Tensor, num_matches: Any) -> None:
        now = time.perf_counter()
        drafted = int(scores.shape[1]) - 1
        emitted = int(input_ids.shape[1]) - self.prev_len
        self.prev_len = int(input_ids.shape[1])
        accepted = int(num_matches)
        cand = self._candidates
        if self.greedy and cand is not None and cand.shape[1] == drafted and drafted > 0:
            choice = scores[0, :drafted].argmax(dim=-1).cpu()
            agree = (cand[0] == choice).int().tolist()
            accepted = next((i for i, a in enumerate(agree) if not a), drafted)
        accepted = max(accepted, emitted - 1)  # never fewer than the drafts that were emitted
        self.steps.append(
            StepRecord(
                drafted=drafted,
                accepted=min(accepted, drafted),
                emitted=emitted,
                t_s=now - self.t0,
                draft_s=self._draft_end - self._draft_start,
                verify_s=now - self._draft_end,
            )
        )
        self._candidates = None


class HfBackend(Backend):
    """transformers ``generate()`` on one model (plus a drafter for ``draft_target``).

    Options: ``dtype`` (default ``float32``), ``device`` (``cpu``), ``model_obj`` /
    ``drafter_obj`` / ``tokenizer`` (already loaded objects, e.g. tiny test models),
    ``max_matching_ngram_size`` (default: the cell option ``ngram_max``, else 2),
    ``assistant_confidence_threshold`` (default 0: always draft γ tokens).
    """

    framework = "hf"
    methods = HF.methods

    @classmethod
    def check_cell(cls, cell: CellCheck) -> None:
        """The declaration's checks (batch size 1 included), then what transformers itself refuses."""
        super().check_cell(cell)
        check_hf_options(cell.method, dict(cell.options))

    def __init__(
        self,
        model: str,
        drafter: str | None = None,
        *,
        dtype: str = "float32",
        device: str = "cpu",
        model_obj: Any = None,
        drafter_obj: Any = None,
        tokenizer: Any = None,
        **options: Any,
    ):
        import torch

        check_engine_options(HF, options)  # what the study checked at load, for direct callers too
        self.torch = torch
        self.model_name, self.drafter_name = model, drafter
        self.device = device
        self.options = options
        dt = getattr(torch, dtype, None)
        if not isinstance(dt, torch.dtype):
            raise ValueError(f"dtype={dtype!r} is not a torch dtype (e.g. float32, bfloat16, float16)")
        self.dtype = dt
        self.tokenizer = tokenizer
        self.model = model_obj if model_obj is not None else self._load(model)
        self.drafter = drafter_obj
        if self.tokenizer is None and model_obj is None:
            from transformers import AutoTokenizer

            self.tokenizer = AutoTokenizer.from_pretrained(resolve_model(model))

    def _load(self, name: str) -> Any:  # a causal LM whose generate() internals run() patches
        """Registry names and local paths through :mod:`specstudy.data.model_files`; hub ids directly."""
        from transformers import AutoModelForCausalLM

        m = AutoModelForCausalLM.from_pretrained(resolve_model(name), dtype=self.dtype)
        return m.to(self.device).eval()  # type: ignore[arg-type]  # transformers' .to wrapper is typed for self only

    def _drafter(self, cell: Cell) -> Any:
        name = cell.drafter or self.drafter_name
        if self.drafter is None:
            if not name:
                raise ValueError("method 'draft_target' needs a drafter model (cell.drafter or drafter=)")
            self.drafter = self._load(name)
        return self.drafter

    # ---- request → generate kwargs ------------------------------------------------------------

    def _method_kwargs(self, cell: Cell) -> tuple[dict[str, Any], Any, dict[str, Any]]:
        """(generate kwargs, the model whose generation_config sets the drafting, its settings).

        transformers 5 reads the draft length, its schedule and the confidence cut-off from the
        *drafting* model's ``generation_config`` (the assistant, or the target itself for early
        exit), not from ``generate`` kwargs, so they are set there for the call and restored.
        """
        gamma = cell.gamma
        if cell.method == "ar":
            return {}, None, {}
        if not gamma or gamma < 1:
            raise ValueError(f"method={cell.method!r} needs gamma >= 1, got {gamma!r}")
        drafting = {
            "num_assistant_tokens": int(gamma),
            # "heuristic": transformers' own schedule (+2 after a fully accepted draft, −1 otherwise)
            "num_assistant_tokens_schedule": str(cell.option("assistant_schedule", "constant")),
            "assistant_confidence_threshold": float(self.options.get("assistant_confidence_threshold", 0.0)),
        }
        check_hf_options(cell.method, dict(cell.options))
        if cell.method == "ngram":
            n = self.options.get("max_matching_ngram_size", cell.option("ngram_max", 2))
            return {"prompt_lookup_num_tokens": int(gamma), "max_matching_ngram_size": int(n)}, None, {}
        if cell.method == "draft_target":
            drafter = self._drafter(cell)
            return {"assistant_model": drafter}, drafter, drafting
        if cell.method == "layer_skip":
            k = cell.option("exit_layer", cell.option("layers", self.options.get("exit_layer")))
            if k is None:
                raise ValueError("method 'layer_skip' needs the exit layer: cell option 'exit_layer'")
            return {"assistant_early_exit": int(k)}, self.model, drafting
        raise ValueError(f"method={cell.method!r} is not available in HF transformers; allowed: {self.methods}")

    def _input_ids(self, request: Request) -> torch.Tensor:
        ids = encode_request(self.tokenizer, request)  # the chat template when the request has messages
        return self.torch.tensor([ids], dtype=self.torch.long, device=self.device)

    # ---- run ----------------------------------------------------------------------------------

    def run(self, requests: Sequence[Request], sampling: Sampling, cell: Cell) -> Iterator[RequestRecord]:
        if cell.batch_size != 1:
            raise ValueError(
                f"batch_size={cell.batch_size}: the hf backend runs batch size 1 only "
                "(transformers' assisted generation is batch-1); use the reference or vllm backends"
            )
        if cell.method not in self.methods:
            raise ValueError(f"method={cell.method!r} is not available in HF transformers; allowed: {self.methods}")
        kwargs, drafting_model, drafting = self._method_kwargs(cell)  # validates (and loads a drafter) first
        saved = {k: getattr(drafting_model.generation_config, k, None) for k in drafting} if drafting_model else {}
        try:
            for k, v in drafting.items():
                setattr(drafting_model.generation_config, k, v)
            for request in requests:
                yield self.generate_one(request, sampling, cell, kwargs)
        finally:
            for k, v in saved.items():
                setattr(drafting_model.generation_config, k, v)

    def generate_one(
        self, request: Request, sampling: Sampling, cell: Cell, method_kwargs: dict[str, Any]
    ) -> RequestRecord:
        torch = self.torch
        rec = cell.new_record(request, sampling, input_policy=getattr(request, "input_policy", "") or "")
        rec.extra["batching"] = BATCH_NOTE
        try:
            input_ids = self._input_ids(request)
        except ValueError as e:
            rec.status, rec.error = "error", str(e)
            return rec
        rec.input_tokens = int(input_ids.shape[1])
        gen_kwargs: dict[str, Any] = dict(
            max_new_tokens=sampling.max_new_tokens,
            do_sample=not sampling.greedy,
            attention_mask=torch.ones_like(input_ids),
            **method_kwargs,
        )
        if not sampling.greedy:
            gen_kwargs.update(temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k)
        if sampling.ignore_eos:
            gen_kwargs["eos_token_id"] = None
        pad = getattr(self.model.generation_config, "pad_token_id", None)
        if pad is None:
            gen_kwargs["pad_token_id"] = 0
        t0 = time.perf_counter()
        streamer = _TimingStreamer(t0)
        counter = _StepCounter(t0, rec.input_tokens, sampling.greedy)
        hooked = bool(method_kwargs)
        if hooked:
            original = self.model._get_candidate_generator

            def get_candidate_generator(*args: Any, **kw: Any) -> Any:
                return counter.wrap(original(*args, **kw))

            self.model._get_candidate_generator = get_candidate_generator
        reset_peak_memory(self.device)
        rss_before = current_rss()
        torch.manual_seed(sampling.seed)
        rec.start_epoch = time.time()
        try:
            with torch.inference_mode():
                out = self.model.generate(input_ids, streamer=streamer, **gen_kwargs)
            rec.end_s = time.perf_counter() - t0
        except RuntimeError as e:
            rec.status = "oom" if "out of memory" in str(e).lower() else "error"
            rec.error = f"{type(e).__name__}: {e}"[:2000]
            return rec
        finally:
            if hooked:
                del self.model._get_candidate_generator  # back to the class method
        new_ids = out[0, rec.input_tokens :].tolist()
        rec.output_ids = [int(i) for i in new_ids]
        rec.output_tokens = len(new_ids)
        rec.chunk_times_s, rec.chunk_tokens = streamer.times, streamer.counts
        rec.first_token_s = streamer.times[0] if streamer.times else None
        if self.tokenizer is not None:
            rec.output_text = self.tokenizer.decode(new_ids, skip_special_tokens=True)
        if hooked:
            rec.steps = counter.steps
        else:  # plain generate: one target forward per token, each an AR "step"
            rec.steps = [
                StepRecord(drafted=0, accepted=0, emitted=c, t_s=t) for t, c in zip(streamer.times, streamer.counts)
            ]
        rec.fill_acceptance_from_steps()
        drafter = method_kwargs.get("assistant_model")
        rec.peak_memory_bytes, rec.memory_source = cell_memory(self.device, rss_before, self.model, drafter)
        return rec

    def close(self) -> None:
        self.model = self.drafter = None

"""Per-row bookkeeping of one batched decode: emitted tokens, steps, timestamps, log-probs.

Every method drives a :class:`BatchTrace`: after each target pass it calls :meth:`emit` with the
tokens each active row emits, the target logits that scored them (for log p and entropy, no
extra forward), and the step's draft/verify times.  The trace applies the output budget and
EOS, records one :class:`~specstudy.records.StepRecord` per verification step, and tells the
method which rows are finished so their caches can leave the batch.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ..records import StepRecord
from .entropy import entropy_and_logprobs
from .lean import pack_bytes


@dataclass
class RowTrace:
    """Everything one request produced; turned into a RequestRecord by the backend."""

    prompt_ids: list[int]
    max_new_tokens: int
    output_ids: list[int] = field(default_factory=list)
    steps: list[StepRecord] = field(default_factory=list)
    chunk_times_s: list[float] = field(default_factory=list)
    chunk_tokens: list[int] = field(default_factory=list)
    target_logprobs: list[float] = field(default_factory=list)
    token_entropy: list[float] = field(default_factory=list)
    first_token_s: float | None = None
    end_s: float | None = None
    finished: bool = False
    stop_reason: str = ""  # "length" or "eos"
    tree_nodes: int | None = None  # tree nodes verified (tree methods only)
    notes: dict[str, Any] = field(default_factory=dict)  # method facts for the record's extra

    @property
    def remaining(self) -> int:
        return self.max_new_tokens - len(self.output_ids)

    @property
    def context(self) -> list[int]:
        """Prompt plus everything emitted so far (what an n-gram drafter searches)."""
        return self.prompt_ids + self.output_ids


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


#: the clock every :class:`Timer` reads: wall seconds, or the calling thread's CPU seconds
_CLOCK = [time.perf_counter]


def use_thread_clock(on: bool) -> bool:
    """Time every block in the calling thread's CPU seconds instead of wall seconds; returns the
    previous setting.  For a benchmark at one torch thread on a shared machine: the time slices
    other processes take no longer count, the work itself (memory stalls included) does."""
    previous = _CLOCK[0] is time.thread_time
    _CLOCK[0] = time.thread_time if on else time.perf_counter
    return previous


class Timer:
    """Seconds of a block (wall clock unless :func:`use_thread_clock`), synchronising CUDA so GPU
    work is counted where it runs."""

    def __init__(self, device: str | torch.device = "cpu"):
        self.device = torch.device(device)
        self.s = 0.0

    def __enter__(self) -> Timer:
        _sync(self.device)
        self._clock = _CLOCK[0]
        self._t0 = self._clock()
        return self

    def __exit__(self, *exc: object) -> None:
        _sync(self.device)
        self.s = self._clock() - self._t0


class BatchTrace:
    """The rows of one batch; ``active`` lists the indices of rows still decoding, in the order
    of the rows of every KV state the method holds."""

    def __init__(
        self,
        prompts: Sequence[Sequence[int]],
        max_new_tokens: int,
        eos_token_ids: Sequence[int] = (),
        ignore_eos: bool = True,
        device: str | torch.device = "cpu",
    ):
        if not prompts:
            raise ValueError("no prompts to decode")
        for i, p in enumerate(prompts):
            if len(p) == 0:
                raise ValueError(f"prompt {i} is empty: need at least one token")
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens={max_new_tokens!r}: must be >= 1")
        self.rows = [RowTrace(list(map(int, p)), max_new_tokens) for p in prompts]
        self.active = list(range(len(self.rows)))
        self.eos = frozenset(int(e) for e in eos_token_ids)
        self.ignore_eos = ignore_eos
        self.device = torch.device(device)
        _sync(self.device)
        self.t0 = time.perf_counter()

    def now(self) -> float:
        """Seconds since the batch started (CUDA synchronised)."""
        _sync(self.device)
        return time.perf_counter() - self.t0

    def remaining(self) -> list[int]:
        """Output budget left per active row."""
        return [self.rows[i].remaining for i in self.active]

    def contexts(self) -> list[list[int]]:
        return [self.rows[i].context for i in self.active]

    @property
    def done(self) -> bool:
        return not self.active

    def emit(
        self,
        tokens: Sequence[Sequence[int]],
        target_logits: torch.Tensor,
        drafted: Sequence[int] | int,
        accepted: Sequence[int] | int,
        draft_s: float | None,
        verify_s: float | None,
    ) -> list[int]:
        """Record one verification step for every active row.

        ``tokens[j]`` are the tokens active row j emits (accepted drafts, then the next token);
        ``target_logits[j, i]`` is the target's raw distribution that token i was drawn from or
        checked against.  Returns the positions (in the active order) of rows that go on; the
        caller keeps exactly those rows in its KV states (:meth:`KVState.select_rows`).
        """
        n = len(self.active)
        if len(tokens) != n or target_logits.shape[0] != n:
            raise ValueError(
                f"emit got {len(tokens)} token rows / {target_logits.shape[0]} logit rows for {n} active rows"
            )
        drafted = [drafted] * n if isinstance(drafted, int) else list(drafted)
        accepted = [accepted] * n if isinstance(accepted, int) else list(accepted)
        width = max(len(t) for t in tokens)
        ids = torch.zeros((n, width), dtype=torch.long, device=target_logits.device)
        for j, t in enumerate(tokens):
            ids[j, : len(t)] = torch.as_tensor(list(t), dtype=torch.long)
        ent_t, lp_t = entropy_and_logprobs(target_logits[:, :width], ids)
        ent, lp = ent_t.tolist(), lp_t.tolist()
        t_s = self.now()
        keep: list[int] = []
        for j, i in enumerate(self.active):
            row = self.rows[i]
            out = list(tokens[j])[: row.remaining]
            if not self.ignore_eos:
                for k, tok in enumerate(out):
                    if tok in self.eos:
                        out = out[: k + 1]
                        row.stop_reason = "eos"
                        break
            row.output_ids.extend(out)
            row.target_logprobs.extend(lp[j][: len(out)])
            row.token_entropy.extend(ent[j][: len(out)])
            row.steps.append(
                StepRecord(
                    drafted=int(drafted[j]),
                    accepted=int(accepted[j]),
                    emitted=len(out),
                    t_s=t_s,
                    draft_s=draft_s,
                    verify_s=verify_s,
                )
            )
            if out:
                row.chunk_times_s.append(t_s)
                row.chunk_tokens.append(len(out))
                if row.first_token_s is None:
                    row.first_token_s = t_s
            if row.stop_reason == "eos" or row.remaining <= 0:
                row.finished = True
                row.stop_reason = row.stop_reason or "length"
                row.end_s = t_s
            else:
                keep.append(j)
        self.active = [self.active[j] for j in keep]
        return keep


# --------------------------------------------------------------------------------------------
# memory


def reset_peak_memory(device: str | torch.device) -> None:
    """Start a fresh peak: torch's allocator on CUDA, the kernel's RSS high-water mark on Linux."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return
    try:  # "5" resets VmHWM (Linux >= 4.0); harmless elsewhere
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def peak_memory(device: str | torch.device) -> tuple[int | None, str | None]:
    """(bytes, source): torch.cuda.max_memory_allocated on CUDA, else the process's peak RSS."""
    device = torch.device(device)
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device)), "torch_cuda"
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024, "rss_peak"
    except OSError:
        pass
    try:
        import resource
        import sys

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return int(peak if sys.platform == "darwin" else peak * 1024), "rss_peak_lifetime"
    except Exception:  # pragma: no cover
        return None, None


def current_rss() -> int | None:
    """This process's resident set size now (bytes), from /proc; None where there is none."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def module_bytes(*modules: object) -> int:
    """Bytes of the distinct parameters and buffers of the given modules (shared tensors counted once)."""
    seen, total = set(), 0
    for m in modules:
        if not isinstance(m, torch.nn.Module):
            continue
        for t in list(m.parameters()) + list(m.buffers()):
            if t.data_ptr() not in seen:
                seen.add(t.data_ptr())
                total += t.numel() * t.element_size()
    return total


def cell_memory(device: str | torch.device, rss_before: int | None, *modules: object) -> tuple[int | None, str | None]:
    """A batch's peak memory, measured against the same process state for every method.

    On CUDA: ``max_memory_allocated`` since the reset (every live tensor: weights, KV cache,
    activations).  On a CPU the process RSS also holds whatever else the process loaded earlier
    (other cells' drafters, HF's copy of the model), so the peak is the bytes of the modules this
    batch decodes with (target and its drafter) plus the RSS high-water mark above the batch's
    start (KV caches, activations): prompt lookup then adds ~0, a draft model its weights and cache.
    """
    peak, source = peak_memory(device)
    if torch.device(device).type == "cuda" or peak is None or rss_before is None or source != "rss_peak":
        return peak, source
    # the lean forward's packed weight copies (made before the batch by lean.prepare) are the modules' too
    resident = module_bytes(*modules) + pack_bytes(*modules)
    return resident + max(0, peak - rss_before), "module_bytes+transient_rss"

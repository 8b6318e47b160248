"""The target's verification-cost curve T(k)/T(1), measured on the machine it runs on.

One target forward over k new tokens does not cost one forward over one token: on a GPU at
small batch it costs about the same (memory-bound), on a CPU it grows, and not monotonically
(SmolLM2-135M on the 2-core dev machine: 1.11 at k=2, 1.64 at k=4, 2.0 at k=16).  The cost
model (:func:`specstudy.costmodel.optimal_gamma`) needs this curve to say how long a draft pays;
``bench/engine.py`` prints it and the cost-aware γ policy decides with it.
"""

from __future__ import annotations

import statistics
import weakref
from collections.abc import Sequence

import torch

from .kv import KVState
from .trace import Timer

#: per model: (batch size, device) -> {k: measured verification time}
_CACHE: weakref.WeakKeyDictionary[torch.nn.Module, dict[tuple[int, str], dict[int, float]]] = (
    weakref.WeakKeyDictionary()
)


def measure_verify_time(
    model: torch.nn.Module,
    prompt_ids: Sequence[int],
    ks: Sequence[int],
    repeats: int = 5,
    batch_size: int = 1,
    device: str | torch.device = "cpu",
) -> dict[int, float]:
    """Median seconds of one forward over k new tokens on a cached ``prompt_ids`` prefix, per k.

    Each k is timed ``repeats`` times after one untimed call (kernel set-up is per shape), the
    cache rolled back after every call, so every k sees the same prefix.  The ks take turns
    (round r times every k once), so a machine whose speed drifts (other jobs on its cores) shifts
    every k alike instead of bending the curve.
    """
    if not prompt_ids:
        raise ValueError("prompt_ids is empty: the curve is measured on a cached prefix")
    if repeats < 1 or any(k < 1 for k in ks):
        raise ValueError(f"repeats={repeats}, ks={list(ks)}: need repeats >= 1 and every k >= 1")
    device = torch.device(device)
    ids = list(prompt_ids)
    state = KVState(model, batch_size, device)
    blocks = {k: torch.tensor([(ids * k)[-k:]] * batch_size, device=device) for k in ks}
    times: dict[int, list[float]] = {k: [] for k in ks}
    with torch.inference_mode():
        state.forward(torch.tensor([ids] * batch_size, device=device))
        for _ in range(repeats + 1):
            for k, block in blocks.items():
                with Timer(device) as t:
                    state.forward(block)
                times[k].append(t.s)
                state.rollback(k)
    return {k: statistics.median(ts[1:]) for k, ts in times.items()}


def _cached_times(
    model: torch.nn.Module,
    prompt_ids: Sequence[int],
    ks: Sequence[int],
    batch_size: int,
    device: str | torch.device,
    repeats: int,
) -> dict[int, float]:
    """:func:`measure_verify_time` for the ks not yet measured for this model, batch size and
    device in this process; the cache holds every k measured so far."""
    times = _CACHE.setdefault(model, {}).setdefault((batch_size, str(device)), {})
    missing = [k for k in ks if k not in times]
    if missing:
        times.update(measure_verify_time(model, prompt_ids, missing, repeats, batch_size, device))
    return times


def verify_ratio(
    model: torch.nn.Module,
    prompt_ids: Sequence[int],
    gamma_max: int,
    batch_size: int = 1,
    device: str | torch.device = "cpu",
    repeats: int = 5,
) -> list[float]:
    """``r[g] = T(g+1)/T(1)`` for g = 0..gamma_max (r[0] = 1), measured once per model, batch size
    and device in this process and cached (the indexing :func:`costmodel.optimal_gamma` takes)."""
    times = _cached_times(model, prompt_ids, range(1, gamma_max + 2), batch_size, device, repeats)
    return [times[g + 1] / times[1] for g in range(gamma_max + 1)]


def draft_cost_ratio(
    draft: torch.nn.Module,
    target: torch.nn.Module,
    prompt_ids: Sequence[int],
    batch_size: int = 1,
    device: str | torch.device = "cpu",
    repeats: int = 5,
) -> float:
    """c = T_draft(1) / T_target(1): one draft token's forward over one target step, each
    measured once per model, batch size and device in this process (the target's T(1) is the
    one :func:`verify_ratio` measured)."""
    t_draft = _cached_times(draft, prompt_ids, [1], batch_size, device, repeats)[1]
    t_target = _cached_times(target, prompt_ids, [1], batch_size, device, repeats)[1]
    return t_draft / t_target


def matmul_pass_time(
    model: torch.nn.Module, ks: Sequence[int], repeats: int = 5, packed: bool = False
) -> dict[int, float]:
    """Best-of-``repeats`` seconds of ``F.linear`` at M = k rows over every ``nn.Linear`` weight of
    ``model`` (its layers' projections and the LM head), one after another as a forward streams
    them from memory: the matmul floor of a k-token forward.  Where the matmuls are most of a step
    (``bench/README.md``), T(k)/T(1) cannot fall below this pass's own ratio.  ``packed``: through
    the lean forward's prepacked weights (:class:`specstudy.engine.lean.Matmul`) instead."""
    from .lean import Matmul

    seen: set[int] = set()
    weights = []
    for m in model.modules():
        if type(m) is torch.nn.Linear and m.weight.data_ptr() not in seen:
            seen.add(m.weight.data_ptr())
            weights.append(m.weight)
    mms = [Matmul(w.detach(), pack=packed) for w in weights]
    out: dict[int, float] = {}
    with torch.inference_mode():
        for k in ks:
            xs = {n: torch.randn(1, k, n, dtype=w.dtype, device=w.device) for w in weights for n in [w.shape[1]]}
            best = float("inf")
            for _ in range(repeats + 1):
                with Timer(weights[0].device) as t:
                    for mm in mms:
                        mm(xs[mm.weight.shape[1]])
                best = min(best, t.s)
            out[k] = best
    return out

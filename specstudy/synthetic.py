"""Synthetic acceptance: keep drafts at a chosen rate, to time a system at a given acceptance.

vLLM (``rejection_sample_method: synthetic``), SGLang (``SGLANG_SIMULATE_ACC_LEN``) and
llama.cpp have benchmark-only modes like this one: a fair system comparison at equal
acceptance, or a timing of shapes whose trained drafter is not at hand (random weights accept
nothing).  The drafter still drafts and the target's verification forward still runs over the
real drafts, so every step costs what it costs; only the decision how many drafts a step keeps
is replaced.  Per drafting step with n_draft drafts, u_i ~ U(0, 1) i.i.d. from a generator of
its own (seeded from the sampling seed, on the CPU, so CPU and CUDA runs keep the same counts):

* ``alpha=a`` (i.i.d. acceptance, a in [0, 1]): position i is accepted iff u_i < a; the step
  keeps the leading run, n = min(first i with u_i >= a, n_draft + 1) − 1.  With γ drafts per
  step E[AL] = (1 − a^(γ+1)) / (1 − a), Leviathan's expected AL(a, γ), and a is exactly the i.i.d. α
  that :func:`specstudy.metrics.alpha_hat` estimates.
* ``length=L`` (fixed acceptance length, L in [1, γ + 1]): every step keeps m = L − 1 drafts on
  average, n = floor(m) + [u_1 < m − floor(m)] (the two integers around m, mixed so that
  E[n] = m), then n = min(n, n_draft).  AL = 1 + accepted / drafting steps is then L in
  expectation whenever every step drafts at least ceil(m) tokens; steps that draft fewer (an
  n-gram lookup with a short match, a request's last step, a confidence stop, a dynamic γ)
  are capped and pull AL below L; the records show the AL reached.

After the n kept drafts the step emits the target's own choice, as real verification does
(:func:`specstudy.engine.verify.verify_step`): argmax p_{n+1} (greedy), a sample of the residual
norm(max(p_{n+1} − q_{n+1}, 0)) after a rejection, or of p_{n+1} after all n_draft were kept.
The output is therefore *not* the target's: never lossless, never a quality, exact-match or
acceptance figure.  The reference backend marks every record of such a cell
(``RequestRecord.synthetic_acceptance``, e.g. ``"alpha=0.8"``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the rule itself is parsed by validation and the engines' mappings, which must not load torch
    import torch

MODES = ("alpha", "length")
#: the synthetic generator's seed is the sampling seed plus this, so its uniforms are not the
#: sampling generator's own
SEED_OFFSET = 0x5A17

ALLOWED = "'alpha=A' with A in [0, 1] (i.i.d. acceptance) or 'length=L' with L in [1, gamma + 1] (acceptance length)"


@dataclass(frozen=True)
class SyntheticAcceptance:
    """The rule of one cell: ``mode`` "alpha" or "length" and its ``value``."""

    mode: str
    value: float

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode {self.mode!r} is not known; need {ALLOWED}")
        if not math.isfinite(self.value):
            raise ValueError(f"{self.mode}={self.value!r} is not a finite number; need {ALLOWED}")
        if self.mode == "alpha" and not 0.0 <= self.value <= 1.0:
            raise ValueError(f"alpha={self.value!r} is outside [0, 1]; need {ALLOWED}")
        if self.mode == "length" and self.value < 1.0:
            raise ValueError(f"length={self.value!r} is below 1 (AL counts the bonus token); need {ALLOWED}")

    @property
    def label(self) -> str:
        """What records carry: ``"alpha=0.8"``, ``"length=3.0"``."""
        return f"{self.mode}={float(self.value)!r}"

    def check_gamma(self, gamma: int) -> None:
        """A fixed length needs γ ≥ L − 1 drafts per step to be reachable."""
        if self.mode == "length" and self.value > gamma + 1:
            raise ValueError(
                f"length={self.value!r} cannot be reached with gamma={gamma}: need L in [1, gamma + 1 = {gamma + 1}]"
            )

    def accepted(self, n_draft: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """Drafts kept per row ``[B]`` (long, on ``n_draft``'s device) for ``n_draft [B]``."""
        import torch

        n = n_draft.to("cpu", torch.long)
        g = int(n.max()) if n.numel() else 0
        if self.mode == "alpha":
            u = torch.rand((n.shape[0], g), generator=generator, dtype=torch.float64)
            run = torch.cumprod((u < self.value).long(), dim=1).sum(dim=1)  # leading accepted run
            kept = torch.minimum(run, n)
        else:
            m = self.value - 1.0
            u = torch.rand(n.shape[0], generator=generator, dtype=torch.float64)
            kept = torch.minimum(math.floor(m) + (u < m - math.floor(m)).long(), n)
        return kept.to(n_draft.device)

    def draws(self, seed: int) -> Callable[[torch.Tensor], torch.Tensor]:
        """``n_draft -> kept`` for one decode, with its own seeded CPU generator."""
        import torch

        generator = torch.Generator(device="cpu")
        generator.manual_seed(int(seed) + SEED_OFFSET)
        return lambda n_draft: self.accepted(n_draft, generator)


def parse_synthetic(value: Any) -> SyntheticAcceptance:
    """The option's value: ``"alpha=0.8"``, ``"length=3"``, ``{"alpha": 0.8}`` or an instance."""
    if isinstance(value, SyntheticAcceptance):
        return value
    if isinstance(value, Mapping):
        if len(value) != 1:
            raise ValueError(f"{dict(value)!r} needs exactly one key; need {ALLOWED}")
        ((mode, number),) = value.items()
    elif isinstance(value, str) and "=" in value:
        mode, number = (x.strip() for x in value.split("=", 1))
    else:
        raise ValueError(f"{value!r} is not a rule; need {ALLOWED}")
    if isinstance(number, bool):
        raise ValueError(f"{mode}={number!r} is not a number; need {ALLOWED}")
    try:
        number = float(number)
    except (TypeError, ValueError):
        raise ValueError(f"{mode}={number!r} is not a number; need {ALLOWED}") from None
    return SyntheticAcceptance(str(mode), number)

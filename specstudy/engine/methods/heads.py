"""``heads`` — Medusa-style drafting from extra heads on the target's last hidden state.

Head k (k = 1..K, a trained :class:`~specstudy.engine.drafters.MedusaHeads` file) reads the
hidden state h_t at the last accepted token and predicts token t+1+k; token t+1 is the pending
token the target itself produced from h_t.  Token-conditioned (Hydra-style) heads also read
the embedding of token t+k (the pending token, then the previous head's draft).  No drafter
forward: the heads cost K small blocks and K LM-head products per step.

Two verification modes:

* linear (default): the chain head_1..head_γ (argmax, or a sample from each head's distribution
  q_k under T > 0) goes through the shared chain loop and verify step
  (:func:`specstudy.engine.speculate.speculative_decode`), any batch size.  The hidden state
  comes from a forward hook on the target's final norm, i.e. from the verification pass the
  loop runs anyway.
* tree (option ``heads_tree="3,2,1"``): the children of every node at depth d-1 are head d's
  top-b_d tokens (greedy) or b_d i.i.d. samples from q_d, verified in one pass with a tree
  mask (:mod:`specstudy.engine.methods.tree`), batch 1.

Under sampling, head k's distribution q_k (a function of h_t and, token-conditioned, of the
draft before it) is exactly the distribution draft k was drawn from, which is all rejection
sampling needs: the output is distributed exactly as the target's.  ``synthetic_acceptance``
keeps drafts (or tree paths) at a fixed rate instead (:mod:`specstudy.synthetic`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ...synthetic import parse_synthetic
from ..drafters import MedusaHeads, drafter_file_metadata, load_drafter
from ..lean import LEAN_AWARE
from ..sampling import probs_for
from ..speculate import Draft
from ..tokentree import TokenTree
from ..trace import RowTrace
from . import SYNTHETIC, DecodeJob, EngineMethod, chain_decode, synthetic_acceptance
from .tree import parse_branching, pick_children, tree_decode

#: what a study is checked against, read as a literal (no import, no torch) by
#: specstudy.frameworks.reference; SPEC below is built from it
HEADER = {
    "name": "heads",
    "family": "heads",
    "order": 40,
    "needs_drafter": True,
    "uses_gamma": True,
    "max_batch": None,
    "options": ("heads_tree", "synthetic_acceptance"),
    "title": "Extra heads (Medusa/EAGLE)",
    "seed_row": "Medusa-2",
    "extra_weights": True,
}


class HiddenCapture:
    """Keeps the output of the target's final norm (its last hidden state) from every forward, or
    with ``before_norm`` its input (the residual stream after the last layer, MTP's feature); a
    context manager that removes its hook on exit."""

    def __init__(self, target: Any, before_norm: bool = False):
        base = getattr(target, target.base_model_prefix)
        self.last: torch.Tensor | None = None
        if before_norm:
            self._handle = base.norm.register_forward_pre_hook(lambda m, args: self._hook(m, args, args[0]))
        else:
            self._handle = base.norm.register_forward_hook(self._hook)

    def _hook(self, module, inputs, output) -> None:
        self.last = output

    def close(self) -> None:
        self._handle.remove()

    def __enter__(self) -> HiddenCapture:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class AuxCapture:
    """Keeps the residual stream entering each of the target's layers ``layers`` (transformers'
    ``hidden_states[k]``; vLLM's aux hidden state k) from every forward; ``last`` is their
    concatenation ``[B, T, len(layers) * H]`` (EAGLE-3's features).  A context manager, as
    :class:`HiddenCapture`."""

    def __init__(self, target: Any, layers: Sequence[int]):
        base = getattr(target, target.base_model_prefix)
        n = len(base.layers)
        if not layers or not all(0 <= k < n for k in layers):
            raise ValueError(f"feature layers {list(layers)}: each must lie in [0, {n}) for this target")
        self._parts: dict[int, torch.Tensor] = {}
        self._order = list(layers)
        self._handles = [base.layers[k].register_forward_pre_hook(self._keeper(k)) for k in sorted(set(self._order))]

    def _keeper(self, k: int) -> Any:
        """Layer k's pre-hook; marked for the lean batch-1 forward, which calls it itself (a plain
        layer hook would send every verification through transformers' slower forward)."""

        def keep(module: Any, args: tuple[Any, ...]) -> None:
            self._parts[k] = args[0]

        setattr(keep, LEAN_AWARE, True)
        return keep

    @property
    def last(self) -> torch.Tensor | None:
        if any(k not in self._parts for k in self._order):
            return None
        return torch.cat([self._parts[k] for k in self._order], dim=-1)

    def close(self) -> None:
        for h in self._handles:
            h.remove()

    def __enter__(self) -> AuxCapture:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def head_distributions(
    heads: MedusaHeads, target: Any, head: int, hidden: torch.Tensor, prev_tokens: torch.Tensor, sampling
) -> torch.Tensor:
    """Head ``head`` (0-based) at ``hidden [B, H]`` after ``prev_tokens [B]`` → logits (greedy)
    or the sampling distribution q ``[B, V]`` (the shared transform)."""
    prev = target.get_input_embeddings()(prev_tokens) if heads.token_conditioned else None
    logits = target.get_output_embeddings()(heads.vectors(head, hidden, prev))
    return logits if sampling.greedy else probs_for(logits, sampling)


def draft_chain(
    heads: MedusaHeads,
    target: Any,
    hidden: torch.Tensor,
    pending: torch.Tensor,
    n: int,
    sampling,
    generator: torch.Generator | None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Heads 1..n in turn: ``tokens [B, n]`` and (sampling) their distributions ``[B, n, V]``.

    Each head's draft is the next head's previous token (token-conditioned heads read it).
    """
    prev, tokens, probs = pending, [], []
    for k in range(n):
        d = head_distributions(heads, target, k, hidden, prev, sampling)
        if sampling.greedy:
            tok = d.argmax(-1)
        else:
            tok = torch.multinomial(d, 1, generator=generator).squeeze(-1)
            probs.append(d)
        tokens.append(tok)
        prev = tok
    return torch.stack(tokens, dim=1), (torch.stack(probs, dim=1) if probs else None)


class HeadsChainDrafter:
    """The :class:`~specstudy.engine.speculate.Drafter` of linear mode."""

    def __init__(self, heads: MedusaHeads, target: Any, capture: HiddenCapture, sampling, generator):
        self.heads, self.target, self.capture = heads, target, capture
        self.sampling, self.generator = sampling, generator
        self.hidden: torch.Tensor | None = None  # [B, H] at each row's last accepted token

    def _ensure_hidden(self) -> None:
        if self.hidden is None:  # first call after the prefill (left-padded: last column)
            self.hidden = self.capture.last[:, -1]

    @torch.no_grad()
    def propose(self, contexts: list[list[int]], max_draft: list[int]) -> Draft:
        self._ensure_hidden()
        pending = torch.tensor([c[-1] for c in contexts], dtype=torch.long, device=self.hidden.device)
        tokens, probs = draft_chain(
            self.heads, self.target, self.hidden, pending, max(max_draft), self.sampling, self.generator
        )
        return Draft(tokens, torch.as_tensor(max_draft, dtype=torch.long, device=tokens.device), probs)

    def accepted(self, n_accepted: torch.Tensor, draft: Draft) -> None:
        # the verification block is [pending, d_1..d_n] (right-padded): the last accepted token
        # of row b sits at column n_accepted[b]
        last = self.capture.last
        rows = torch.arange(last.shape[0], device=last.device)
        self.hidden = last[rows, n_accepted.to(last.device)]

    def select_rows(self, keep: list[int]) -> None:
        self._ensure_hidden()
        self.hidden = self.hidden[torch.as_tensor(keep, dtype=torch.long, device=self.hidden.device)]


class HeadsTreeDrafter:
    """Tree mode: the children of a node at depth d come from head d+1 (the tree loop's drafter
    protocol); token-conditioned heads read the node's own token."""

    def __init__(self, heads: MedusaHeads, target: Any, branching: Sequence[int], sampling):
        self.heads, self.target, self.branching, self.sampling = heads, target, tuple(branching), sampling
        self.hidden: torch.Tensor | None = None

    def start(self, prompt_hidden: torch.Tensor) -> None:
        self.hidden = prompt_hidden

    @torch.no_grad()
    def propose(
        self, committed: Sequence[int], root: int, max_depth: int, generator: torch.Generator | None
    ) -> TokenTree:
        tree = TokenTree(tokens=[int(root)], parents=[-1])
        frontier = [0]
        for d, b in enumerate(self.branching[:max_depth]):
            rows = frontier if self.heads.token_conditioned else frontier[:1]  # plain heads: one distribution
            prev = torch.tensor([tree.tokens[f] for f in rows], dtype=torch.long, device=self.hidden.device)
            dists = head_distributions(
                self.heads, self.target, d, self.hidden.expand(len(rows), -1), prev, self.sampling
            )
            new = []
            for i, f in enumerate(frontier):
                dist = dists[i if self.heads.token_conditioned else 0]
                if not self.sampling.greedy:
                    tree.child_q[f] = dist
                new += [tree.add(f, t) for t in pick_children(dist, b, self.sampling.greedy, generator)]
            frontier = new
        return tree

    def accept(self, path: Sequence[int], hidden: torch.Tensor) -> None:
        self.hidden = hidden


def load_heads(name: str, target: Any, device: str = "cpu", dtype: str = "float32") -> MedusaHeads:
    """cell.drafter (a heads file from ``specstudy train-drafter --kind heads``) → the heads,
    in the target's dtype."""
    heads = load_drafter(name, kind="heads", hidden_size=target.config.hidden_size)
    assert isinstance(heads, MedusaHeads)  # load_drafter checked the file's kind
    return heads.to(device=device, dtype=next(target.parameters()).dtype)


def decode(job: DecodeJob) -> list[RowTrace]:
    heads = job.drafter
    if not isinstance(heads, MedusaHeads):
        raise ValueError(f"method 'heads' needs MedusaHeads as its drafter, got {type(heads).__name__}")
    heads = heads.to(device=job.device, dtype=next(job.target.parameters()).dtype)
    branching = job.option("heads_tree")
    gen = job.generator()
    if branching is not None:
        if len(job.prompts) > 1:
            raise ValueError(
                f"method 'heads' with heads_tree decodes one request at a time: batch_size={len(job.prompts)}"
            )
        drafter = HeadsTreeDrafter(heads, job.target, branching, job.sampling)
        return [
            tree_decode(
                job.target,
                job.prompts[0],
                job.sampling,
                drafter,
                gen,
                job.eos_token_ids,
                job.device,
                synthetic_acceptance(job),
            )
        ]
    with HiddenCapture(job.target) as capture:
        drafter = HeadsChainDrafter(heads, job.target, capture, job.sampling, gen)
        return chain_decode(job, drafter, gen)


def _heads_file(name: str) -> int:
    """Number of heads in a heads file (checked before any model is loaded)."""
    return int(drafter_file_metadata(name, "heads")["num_heads"])


@dataclass(frozen=True)
class HeadsSpec(EngineMethod):
    """Checks the heads file against γ and the tree shape before any model is loaded."""

    def check(self, gamma, batch_size, drafter, options):
        out = EngineMethod.check(self, gamma, batch_size, drafter, options)
        if "heads_tree" in out:
            if len(out["heads_tree"]) != gamma:
                raise ValueError(
                    f"method 'heads': heads_tree={','.join(map(str, out['heads_tree']))} has depth "
                    f"{len(out['heads_tree'])}, but gamma={gamma}: the tree depth is gamma"
                )
            if batch_size > 1:
                raise ValueError(
                    f"method 'heads' with heads_tree decodes one request at a time: "
                    f"batch_size={batch_size} is not supported (use linear mode, or batch 1)"
                )
        k = drafter.num_heads if isinstance(drafter, MedusaHeads) else _heads_file(drafter)
        if gamma > k:
            what = drafter if isinstance(drafter, str) else f"{type(drafter).__name__} module"
            raise ValueError(f"method 'heads': gamma={gamma} needs {gamma} heads; drafter {what!r} has {k}")
        return out


SPEC = HeadsSpec.from_header(
    HEADER,
    decode=decode,
    load_drafter=load_heads,
    options={"heads_tree": parse_branching, SYNTHETIC: parse_synthetic},
    description="Medusa-style heads on the target's last hidden state (linear or tree verification); "
    "drafter: a heads file from `specstudy train-drafter --kind heads`",
)

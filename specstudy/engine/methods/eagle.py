"""``eagle`` — EAGLE-style drafting: a one-layer drafter that runs at the feature level.

Position j of a context has the target's last hidden state f_j (captured from the target's
final norm during its own passes) and token j+1 after it.  The drafter
(:class:`~specstudy.engine.drafters.EagleDraft`, a file from ``specstudy train-drafter --kind
eagle``) reads each pair (f_j, token j+1) and predicts f̂_{j+1}; the target's LM head turns that
into a distribution for token j+2.  Per step:

1. the pairs whose features the last target pass produced (the pending token's and the accepted
   drafts') go into the drafter's KV cache;
2. drafting feeds its own f̂ back with each drafted token, γ times (those cache entries are
   rolled back after verification: the target's true features replace them);
3. the chain goes through the shared loop and verify step
   (:func:`specstudy.engine.speculate.speculative_decode`), any batch size.

With option ``tree_nodes`` (and ``tree_topk``, default 4) the drafter grows EAGLE-2's dynamic
tree instead (:mod:`specstudy.engine.dynamic_tree`; :class:`EagleTreeDrafter`): γ levels, the
``tree_topk`` most confident nodes of each level expanded, the ``tree_nodes`` most confident of
all verified in one target forward (batch 1, the tree loop of
:func:`specstudy.engine.methods.tree.tree_decode`).  ``eagle3`` takes the same options.

Under sampling each draft is drawn from the drafter's distribution q (the shared sampling
transform on its logits), which is all exact rejection sampling needs.  ``synthetic_acceptance``
keeps drafts at a fixed rate instead (:mod:`specstudy.synthetic`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import torch

from ...synthetic import parse_synthetic
from ..drafters import EagleDraft, drafter_file_metadata, load_drafter
from ..dynamic_tree import DraftNode, grow, rerank, verified_tree
from ..eagle3_drafter import Eagle3Draft
from ..kv import KVState, new_cache, pad_ragged
from ..mtp_drafter import MtpDraft
from ..proposals import ProposalTree, accept_proposals
from ..sampling import probs_for
from ..speculate import Draft, sample_chain
from ..tokentree import keep_cache_positions
from ..trace import RowTrace
from . import SYNTHETIC, DecodeJob, EngineMethod, chain_decode, job_drafter, positive_int
from .heads import AuxCapture, HiddenCapture
from .tree import check_one_request, tree_decode

#: the drafters this loop drives: EAGLE-style, EAGLE-3 and MTP layers
FeatureDraft = EagleDraft | Eagle3Draft | MtpDraft

#: what a study is checked against, read as a literal (no import, no torch) by
#: specstudy.frameworks.reference; SPEC below is built from it
HEADER = {
    "name": "eagle",
    "family": "heads",
    "order": 60,
    "needs_drafter": True,
    "uses_gamma": True,
    "max_batch": None,
    "options": ("synthetic_acceptance", "tree_nodes", "tree_topk"),
    "seed_row": "EAGLE-2",
    "option_defaults": {"tree_topk": 4},
    "describe_when": {
        "tree_nodes": "EAGLE-2's dynamic tree of {tree_nodes} nodes (top-{tree_topk} expansion, depth {gamma}), verified in one forward",
    },
}


class EagleModel(torch.nn.Module):
    """The drafter called like a causal LM (what :class:`KVState` drives): token ids j+1 and
    features f_j in, logits and predicted features out.  Holds the target's embedding and LM head
    by reference (no copy)."""

    def __init__(self, target: Any, draft: FeatureDraft):
        super().__init__()
        object.__setattr__(self, "_target", target)  # not registered: the target's weights stay its own
        self.draft = draft
        self.cache_config = draft.cache_config

    @torch.no_grad()
    def forward(
        self,
        input_ids: torch.Tensor,
        features: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        cache: Any = None,
        use_cache: bool = True,
        logits_to_keep: int = 0,
    ) -> SimpleNamespace:
        e = self._target.get_input_embeddings()(input_ids)
        f = self.draft(
            e, features, attention_mask=attention_mask, position_ids=position_ids, cache=cache, use_cache=use_cache
        )
        if logits_to_keep:
            f = f[:, -logits_to_keep:]
        return SimpleNamespace(logits=self.draft.target_logits(f, self._target), features=f)


class EagleDrafter:
    """The :class:`~specstudy.engine.speculate.Drafter` of ``eagle`` and ``eagle3`` (whose
    features are the target's low, middle and high layers, :class:`AuxCapture`).

    ``known[b]``: the target features of row b's positions whose pair is not in the drafter's
    cache yet (cache length = pairs fed = the position of the first of them).
    """

    def __init__(
        self,
        target: Any,
        draft: FeatureDraft,
        capture: HiddenCapture | AuxCapture,
        batch_size: int,
        sampling,
        generator: torch.Generator | None,
        device: str | torch.device = "cpu",
    ):
        self.state = KVState(EagleModel(target, draft), batch_size, device)
        self.capture, self.sampling, self.generator = capture, sampling, generator
        self.known: list[torch.Tensor] = []
        self._fed = 0

    def prefill(self, prompts: list[list[int]]) -> None:
        """After the target's prompt pass (left-padded): every prompt position's feature is known."""
        last = self.capture.last
        w = last.shape[1]
        self.known = [last[b, w - len(p) :] for b, p in enumerate(prompts)]

    def _feed_known(self, contexts: list[list[int]]) -> torch.Tensor:
        """Pairs (f_j, token j+1) of the known features → the logits after the last one [B, V]."""
        lengths = self.state.lengths.tolist()
        toks = [c[n + 1 : n + 1 + len(k)] for c, n, k in zip(contexts, lengths, self.known)]
        for b, (t, k) in enumerate(zip(toks, self.known)):
            if len(t) != len(k) or not len(t):
                raise RuntimeError(f"eagle row {b}: {len(k)} known features but {len(t)} tokens after them")
        ids, valid = pad_ragged(toks, "left", device=self.state.device)
        feats = torch.zeros((*ids.shape, self.known[0].shape[-1]), dtype=self.known[0].dtype, device=self.state.device)
        for b, k in enumerate(self.known):
            feats[b, ids.shape[1] - len(k) :] = k
        logits = self.state.forward(ids, valid, logits_to_keep=1, features=feats)[:, -1]
        self.known = []
        return logits

    def propose(self, contexts: list[list[int]], max_draft: list[int]) -> Draft:
        logits = self._feed_known(contexts)
        feature = self.state.last_output.features[:, -1:]
        self._fed = 0

        def feed(tok: torch.Tensor) -> torch.Tensor:  # the drafted token with the feature predicted before it
            nonlocal feature
            self._fed += 1
            out = self.state.forward(tok[:, None], logits_to_keep=1, features=feature)[:, -1]
            feature = self.state.last_output.features[:, -1:]
            return out

        return sample_chain(logits, max_draft, self.sampling, self.generator, feed)

    def accepted(self, n_accepted: torch.Tensor, draft: Draft) -> None:
        # drop every pair fed with a predicted feature; the verification pass ([pending, d_1..d_n],
        # right-padded) gave the true features of the pending token and the accepted drafts
        self.state.rollback(self._fed)
        self._fed = 0
        last = self.capture.last
        self.known = [last[b, : int(a) + 1] for b, a in enumerate(n_accepted.tolist())]

    def select_rows(self, keep: list[int]) -> None:
        self.state.select_rows(keep)
        if self.known:
            self.known = [self.known[i] for i in keep]


class EagleTreeDrafter:
    """EAGLE-2's dynamic tree from an EAGLE drafter (the tree loop's drafter protocol, batch 1).

    The drafter's cache holds the true pairs (f_j, token j+1) up to the root's, ``pairs`` of them;
    tree nodes are fed after it with a mask that shows each node the cache and its own fed
    ancestors, at position ``pairs - 1 + depth``, with the feature its parent predicted.  After
    verification the cache is cut back to the true pairs and the accepted path's target features
    (read from ``capture``, which the target's tree forward just filled) wait in ``known``.
    """

    def __init__(self, target: Any, draft: FeatureDraft, capture: Any, sampling, depth: int, topk: int, budget: int):
        self.model = EagleModel(target, draft)
        self.capture, self.sampling = capture, sampling
        self.depth, self.topk, self.budget = depth, topk, budget
        self.cache = new_cache(self.model)
        self.pairs = 0
        self.known: torch.Tensor | None = None  # [m, F] target features of positions pairs.. not yet fed

    def start(self, prompt_hidden: torch.Tensor) -> None:
        self.known = self.capture.last[0]

    def _q(self, logits: torch.Tensor) -> torch.Tensor:
        """The confidence the tree ranks by: the drafter's sampling distribution (softmax at greedy)."""
        return logits.softmax(-1) if self.sampling.greedy else probs_for(logits, self.sampling)

    @torch.no_grad()
    def _feed_known(self, committed: Sequence[int], root: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The waiting true pairs, up to the root's → (root's distribution, its predicted feature)."""
        assert self.known is not None
        toks = (list(committed) + [int(root)])[self.pairs + 1 :]
        if len(toks) != len(self.known):
            raise RuntimeError(f"eagle tree: {len(self.known)} known features but {len(toks)} tokens after them")
        dev = self.known.device
        out = self.model(
            torch.tensor([toks], device=dev),
            self.known[None],
            position_ids=torch.arange(self.pairs, self.pairs + len(toks), device=dev)[None],
            cache=self.cache,
        )
        self.pairs += len(toks)
        self.known = None
        return self._q(out.logits[0, -1]), out.features[0, -1]

    @torch.no_grad()
    def propose(
        self, committed: Sequence[int], root: int, max_depth: int, generator: torch.Generator | None
    ) -> ProposalTree:
        root_q, root_f = self._feed_known(committed, root)
        feats: dict[int, torch.Tensor] = {0: root_f}  # node -> the feature its drafter pass predicted
        fed: list[int] = []  # nodes in the drafter's cache after the true pairs, in order

        def expand(nodes: list[DraftNode], rows: list[int]) -> torch.Tensor:
            out = self.model(
                torch.tensor([[nodes[i].token for i in rows]], device=root_f.device),
                torch.stack([feats[nodes[i].parent] for i in rows])[None],
                attention_mask=self._mask(nodes, fed, rows, root_f.dtype).to(root_f.device),
                position_ids=torch.tensor([[self.pairs - 1 + nodes[i].depth for i in rows]], device=root_f.device),
                cache=self.cache,
            )
            fed.extend(rows)
            feats.update({i: out.features[0, r] for r, i in enumerate(rows)})
            return self._q(out.logits[0])

        nodes = grow(root, root_q, expand, min(max_depth, self.depth), self.topk)
        return verified_tree(nodes, rerank(nodes, self.budget))

    def _mask(self, nodes: list[DraftNode], fed: list[int], rows: list[int], dtype: torch.dtype) -> torch.Tensor:
        """Additive mask [1, 1, len(rows), pairs + len(fed) + len(rows)]: the true pairs, and of the
        fed nodes each row's ancestors and itself."""
        slot = {n: self.pairs + j for j, n in enumerate(fed + rows)}
        allowed = torch.zeros(len(rows), self.pairs + len(fed) + len(rows), dtype=torch.bool)
        allowed[:, : self.pairs] = True
        for r, i in enumerate(rows):
            while i > 0:
                allowed[r, slot[i]] = True
                i = nodes[i].parent
        mask = torch.zeros(allowed.shape, dtype=dtype)
        return mask.masked_fill_(~allowed, torch.finfo(dtype).min)[None, None]

    def accept(self, path: Sequence[int], hidden: torch.Tensor) -> None:
        keep_cache_positions(self.cache, self.pairs, [])  # the true pairs only
        self.known = self.capture.last[0, list(path)]


def load_eagle(name: str, target: Any, device: str = "cpu", dtype: str = "float32") -> EagleDraft:
    """cell.drafter (a file from ``specstudy train-drafter --kind eagle``) → the drafter, in the
    target's dtype."""
    draft = load_drafter(name, kind="eagle", hidden_size=target.config.hidden_size)
    assert isinstance(draft, EagleDraft)  # load_drafter checked the file's kind
    return draft.to(device=device, dtype=next(target.parameters()).dtype)


def decode(job: DecodeJob) -> list[RowTrace]:
    draft = job_drafter(job, EagleDraft, "eagle")
    with HiddenCapture(job.target) as capture:
        return decode_with(job, draft, capture)


def decode_with(job: DecodeJob, draft: FeatureDraft, capture: HiddenCapture | AuxCapture) -> list[RowTrace]:
    """The chain loop with a feature drafter whose features ``capture`` reads (eagle and eagle3);
    EAGLE-2's dynamic tree with option ``tree_nodes``."""
    if job.option("tree_nodes") is not None:
        return [decode_tree(job, draft, capture)]
    gen = job.generator()
    drafter = EagleDrafter(job.target, draft, capture, len(job.prompts), job.sampling, gen, job.device)
    return chain_decode(job, drafter, gen)


def decode_tree(job: DecodeJob, draft: FeatureDraft, capture: HiddenCapture | AuxCapture) -> RowTrace:
    """EAGLE-2: one request, its dynamic tree verified by :func:`accept_proposals` each step."""
    check_one_request(job, "eagle with tree_nodes")
    topk, budget = int(job.option("tree_topk", DEFAULT_TOPK)), int(job.option("tree_nodes"))
    drafter = EagleTreeDrafter(job.target, draft, capture, job.sampling, job.draft_length, topk, budget)
    row = tree_decode(
        job.target,
        job.prompts[0],
        job.sampling,
        drafter,
        job.generator(),
        job.eos_token_ids,
        job.device,
        verify=accept_proposals,
    )
    row.notes.update({"tree": "eagle2_dynamic", "tree_topk": topk, "tree_nodes_budget": budget})
    return row


#: EAGLE-2's top-k per expanded node when ``tree_topk`` is not given (the paper uses 10 at a budget
#: of 60 nodes; at the few nodes a CPU affords, 4 leaves room for depth)
DEFAULT_TOPK = HEADER["option_defaults"]["tree_topk"]


def check_tree_options(options: dict[str, Any]) -> None:
    """``tree_topk`` means nothing without ``tree_nodes``; synthetic acceptance times chains only."""
    if "tree_topk" in options and "tree_nodes" not in options:
        raise ValueError("option tree_topk needs tree_nodes (the node budget of EAGLE-2's dynamic tree)")
    if "tree_nodes" in options and SYNTHETIC in options:
        raise ValueError(f"options tree_nodes and {SYNTHETIC} do not combine: synthetic acceptance times chains")


def check_tree_batch(options: dict[str, Any], batch_size: int) -> None:
    """The dynamic tree verifies one request's tree per target forward."""
    if "tree_nodes" in options and batch_size > 1:
        raise ValueError(
            f"option tree_nodes (EAGLE-2's dynamic tree) decodes one request at a time: batch_size={batch_size}"
        )


#: the options of the EAGLE methods (eagle and eagle3)
EAGLE_OPTIONS = {SYNTHETIC: parse_synthetic, "tree_nodes": positive_int, "tree_topk": positive_int}


@dataclass(frozen=True)
class EagleSpec(EngineMethod):
    """Checks that the drafter is an eagle file before any model is loaded."""

    def check(self, gamma, batch_size, drafter, options):
        out = EngineMethod.check(self, gamma, batch_size, drafter, options)
        check_tree_batch(out, batch_size)
        if not isinstance(drafter, EagleDraft):
            drafter_file_metadata(drafter, "eagle")
        return out


SPEC = EagleSpec.from_header(
    HEADER,
    decode=decode,
    load_drafter=load_eagle,
    options=EAGLE_OPTIONS,
    cross_check=check_tree_options,
    description="EAGLE-style feature-level drafter (one decoder layer on the target's last hidden "
    "state); drafter: a file from `specstudy train-drafter --kind eagle`",
)

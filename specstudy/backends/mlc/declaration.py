"""MLC-LLM's declaration (``mlc_llm serve``), read from mlc-ai/mlc-llm's sources (main at
79d603f, 2026-07-23): ``python/mlc_llm/cli/serve.py`` ``--speculative-mode {disable,
small_draft, eagle, medusa}``; the draft model, EAGLE head or Medusa heads are its one
``--additional-models`` entry, so every speculative method needs a drafter.  Chains only: the kit
sets ``spec_tree_width=1`` (a tree's ``draft_count`` counts nodes, not positions).
"""

from __future__ import annotations

from ..declaration import EngineDeclaration

#: kit method -> MLC-LLM --speculative-mode
KIT_TO_MLC = {"draft_target": "small_draft", "eagle": "eagle", "medusa": "medusa"}

MLC = EngineDeclaration(
    framework="mlc",
    backend="mlc.server:MlcServerBackend",
    methods=("ar", *KIT_TO_MLC),
    method_options={},  # γ is spec_draft_length; no method reads a cell option
    needs_drafter=frozenset(KIT_TO_MLC),
    server=True,
    tensor_parallel=True,  # --overrides tensor_parallel_shards=N
    environment=None,  # MLC's wheels are on mlc.ai/wheels, not PyPI: the user's own install
    requirement=None,  # preflight looks for mlc_llm on PATH
    takes_dtype=False,  # the precision is the compiled weights' own (q4f16_1 and the like)
    reads_checkpoints=False,  # MLC's converted weights (framework option ``weights``), fetched by MLC
)

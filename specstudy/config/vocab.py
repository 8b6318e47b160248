"""The kit's one vocabulary: task categories, method families, frameworks, dtypes, quantizations.

Every module that names one of these imports it from here, so a new task or dtype is added once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

#: the seed article's seven task categories, in its table's order
TASKS = ("code", "translation", "summarization", "qa", "creative_writing", "math", "chat")

#: method families (the report's sections); engines may call a family member by its own name
METHOD_FAMILIES = ("ar", "draft_target", "ngram", "layer_skip", "heads", "tree")
#: engine-specific method names and the family they belong to
METHOD_ALIASES = {
    "eagle": "heads",
    "eagle3": "heads",
    "medusa": "heads",
    "mtp": "heads",
    "suffix": "ngram",
    "specinfer": "tree",
    "sequoia": "tree",
}
#: what the in-process reference engine runs (a test keeps this equal to engine.methods.METHODS)
REFERENCE_METHODS = METHOD_FAMILIES + ("eagle", "eagle3", "specinfer", "sequoia")
#: families that need a drafter (a model, heads or an adapter) named in the model pair
NEEDS_DRAFTER = ("draft_target",)
#: the reference engine's own-layers drafter: "self" (half the layers) or "self:K"
SELF_DRAFTER = "self"


def method_family(method: str) -> str:
    """The family of an engine method name (eagle and medusa are heads)."""
    return METHOD_ALIASES.get(method, method)


#: every framework the study can name (a test keeps this equal to specstudy.backends.BACKENDS)
FRAMEWORKS = ("reference", "hf", "llamacpp", "vllm", "vllm-server", "sglang", "trtllm", "openai")
#: frameworks whose speculation is fixed when the engine starts (one engine per method config)
SERVER_FRAMEWORKS = ("llamacpp", "vllm", "vllm-server", "sglang", "trtllm", "openai")
#: in-process engines that load the drafter named in each cell themselves (one engine per target)
DRAFTER_PER_CELL = ("reference",)
#: engines that hand the prompt loader their tokenizer: a task's input-length policy applies there
#: (servers get the prompts as they are, and their records say the policy was ``unapplied``)
TOKENIZING_FRAMEWORKS = ("reference", "hf")
#: framework -> (python module that must be importable, what provides it)
FRAMEWORK_REQUIREMENTS: dict[str, tuple[str, str]] = {
    "reference": ("torch", "the base install (pip install -e .)"),
    "hf": ("transformers", "the base install (pip install -e .)"),
    "llamacpp": ("xllamacpp", "the base install (pip install -e .)"),
    "vllm": ("vllm", "its own pinned environment .venv-vllm: make engine-vllm"),
    "vllm-server": ("vllm", "its own pinned environment .venv-vllm: make engine-vllm"),
    "sglang": ("sglang", "its own pinned environment .venv-sglang: make engine-sglang"),
    "openai": ("urllib", "nothing (any OpenAI-compatible server URL)"),
}

#: weight dtypes by their torch / vLLM names ("auto": the checkpoint's own)
DTYPES = ("float32", "bfloat16", "float16", "float64", "auto")
#: dtypes an in-process torch engine loads ("auto" is for engines that read the checkpoint)
TORCH_DTYPES = ("float32", "float16", "bfloat16", "float64")
#: weight quantization of a target checkpoint (the engine reads it; the cost model needs it)
QUANTIZATIONS = ("none", "awq", "gptq", "fp8", "int8")


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype of a :data:`TORCH_DTYPES` name."""
    import torch  # lazy: the vocabulary is read by validation, which never loads torch

    if name not in TORCH_DTYPES:
        raise ValueError(f"dtype={name!r}: allowed {list(TORCH_DTYPES)}")
    dtype: torch.dtype = getattr(torch, name)
    return dtype


def cost_dtype(dtype: str, quantization: str = "none") -> str:
    """The cost model's weight format of a checkpoint: its quantization, else its dtype."""
    if quantization in ("awq", "gptq"):
        return "int4"
    if quantization in ("fp8", "int8"):
        return quantization
    return {"auto": "bf16", "float64": "fp32"}.get(dtype, dtype)

"""The kit's one vocabulary: task categories, method families, frameworks, dtypes, quantizations.

Every module that names one of these imports it from here, so a new task or dtype is added once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..frameworks import method_families
from ..frameworks.reference import families

if TYPE_CHECKING:
    import torch

#: the seed article's seven task categories, in its table's order
TASKS = ("code", "translation", "summarization", "qa", "creative_writing", "math", "chat")

#: method families (the report's sections, in order): the reference methods that found one, read from
#: their files' headers; engines may call a family member by its own name
METHOD_FAMILIES: tuple[str, ...] = families()
#: engine-specific method names and the family they belong to: what the engines' declarations say
#: (specstudy.frameworks), collected once
METHOD_ALIASES: dict[str, str] = method_families()


def method_family(method: str) -> str:
    """The family of an engine method name (eagle and medusa are heads), as the catalogue says now
    (an engine registered after import included)."""
    return method_families().get(method, method)


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

"""Every engine's declaration, by framework name: the one table the rest of the kit reads."""

from __future__ import annotations

from .declaration import EngineDeclaration
from .hf.declaration import HF
from .llamacpp.declaration import LLAMACPP
from .openai.declaration import OPENAI
from .reference.declaration import REFERENCE
from .sglang.declaration import SGLANG
from .trtllm.declaration import TRTLLM, TRTLLM_ENGINE
from .vllm.declaration import OFFLINE as VLLM
from .vllm.declaration import SERVER as VLLM_SERVER

DECLARATIONS: dict[str, EngineDeclaration] = {
    d.framework: d for d in (REFERENCE, HF, LLAMACPP, VLLM, VLLM_SERVER, SGLANG, TRTLLM, TRTLLM_ENGINE, OPENAI)
}
#: every framework a study can name
FRAMEWORKS = tuple(DECLARATIONS)
#: frameworks whose speculation is fixed when the engine starts (one engine per method config)
SERVER_FRAMEWORKS = tuple(f for f, d in DECLARATIONS.items() if d.server)
#: in-process engines that load each cell's drafter themselves (one engine per target)
DRAFTER_PER_CELL = tuple(f for f, d in DECLARATIONS.items() if d.drafter_per_cell)
#: engines that hand the prompt loader their tokenizer: a task's input-length policy applies there
TOKENIZING_FRAMEWORKS = tuple(f for f, d in DECLARATIONS.items() if d.tokenizing)
#: frameworks that split a model over GPUs
TENSOR_PARALLEL = tuple(f for f, d in DECLARATIONS.items() if d.tensor_parallel)
#: framework -> the kit-managed environment it runs in
FRAMEWORK_ENGINE = {f: d.environment for f, d in DECLARATIONS.items() if d.environment}


def declaration(framework: str) -> EngineDeclaration:
    """The declaration of ``framework``; ValueError naming the known ones."""
    if framework not in DECLARATIONS:
        raise ValueError(f"framework={framework!r} is not known; allowed: {sorted(DECLARATIONS)}")
    return DECLARATIONS[framework]


def drafter_methods() -> frozenset[str]:
    """Methods that load a drafter on every framework that runs them and loads drafters at all (a
    server named by URL holds its own): a study row of one must name a drafter."""
    loaders = [d for d in DECLARATIONS.values() if d.needs_drafter]
    runs = {m for d in loaders for m in d.methods if m != "ar"}
    return frozenset(m for m in runs if all(m in d.needs_drafter for d in loaders if m in d.methods))

"""Any OpenAI-compatible server (TensorRT-LLM ``trtllm-serve``, MLC-LLM, a user's own server):
stream ``/v1/completions``, time every chunk, read acceptance where the server reports it.

The server is started from ``command=`` (with ``{port}``, ``{host}``, ``{model}``, ``{drafter}``,
``{gamma}`` placeholders) or attached with ``base_url=``.
"""

from __future__ import annotations

from ..data.models import resolve_for_engine as resolve_model
from ..records import Cell
from .server import ServerBackend


class OpenAIBackend(ServerBackend):
    """A generic OpenAI-compatible server; started from ``command=`` or attached via ``base_url=``.

    ``preset="llama.cpp"`` builds the ``llama-server`` command line for ``ar``, ``ngram``
    (``--spec-type ngram-simple``) and ``draft_target`` (``-md DRAFT --spec-type draft-simple``),
    with ``--draft-max`` = γ and ``--metrics``; ``llama_server=PATH`` names the binary.
    """

    framework = "openai"
    methods = ("ar", "ngram", "draft_target")

    def server_argv(self, cell: Cell) -> list[str]:
        if self.options.get("preset") != "llama.cpp":
            return super().server_argv(cell)
        if cell.method not in self.methods:
            raise ValueError(f"method={cell.method!r} is not available with llama.cpp here; allowed: {self.methods}")
        argv = [str(self.options.get("llama_server", "llama-server")), "-m", resolve_model(self.model),
                "--host", "{host}", "--port", "{port}", "--metrics"]
        if cell.method == "ngram":
            argv += ["--spec-type", "ngram-simple", "--draft-max", str(cell.gamma or 4)]
        elif cell.method == "draft_target":
            if not cell.drafter and not self.drafter:
                raise ValueError("method 'draft_target' needs a drafter (a GGUF path)")
            argv += ["-md", resolve_model(cell.drafter or self.drafter or ""), "--spec-type", "draft-simple",
                     "--draft-max", str(cell.gamma or 4)]
        return argv + self.server_args

"""A study cell's EAGLE-3 drafter for llama.cpp: the kit's EAGLE-3 folder checked against the
target GGUF at study load, and converted to the ``eagle3`` GGUF (:mod:`.eagle3_gguf`) once.

The check reads only ``config.json``, ``specstudy.json`` and the safetensors header (no tensor
data): an EAGLE-3 architecture with one midlayer, the tensors the writer maps, and the target's
width, vocabulary and (when the training record names one) the target itself.  A wrong folder or a
head trained for another target is refused before any server starts, all problems at once.

The converted file is cached under the kit's cache (``$SPECSTUDY_CACHE/gguf/eagle3/``) by a
checksum of everything it is made from (the head's files, the feature layers, the target GGUF's
sha256 whose tokenizer it copies, and :data:`FORMAT`), so a retrained head or another target gets
its own file and a study never reads a stale one.  Nothing converted is committed.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ...data.fetch import cache_dir
from ...paths import REPO_ROOT
from .eagle3_gguf import TENSOR_NAMES

ARCHITECTURE = "LlamaForCausalLMEagle3"
CONFIG_FILE, WEIGHTS_FILE, RECORD_FILE = "config.json", "model.safetensors", "specstudy.json"
#: bumped when :mod:`.eagle3_gguf` writes a different file for the same head (a new cache key)
FORMAT = "eagle3-gguf-1"


def resolve_folder(name: str | os.PathLike[str]) -> Path:
    """A drafter folder as given (from the working directory), else relative to the repository."""
    p = Path(name).expanduser()
    if not p.exists() and not p.is_absolute() and (REPO_ROOT / p).exists():
        p = REPO_ROOT / p
    return p


def _safetensors_keys(path: Path) -> set[str]:
    """Tensor names from the header only (8-byte length + JSON)."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
    return {k for k in header if k != "__metadata__"}


def default_aux_layers(num_layers: int) -> tuple[int, int, int]:
    """Low, middle, high (vLLM's and SGLang's default for an L-layer target): (2, L // 2, L - 3)."""
    return (2, num_layers // 2, num_layers - 3)


def folder_problems(folder: Path) -> tuple[list[str], dict[str, Any], dict[str, Any]]:
    """(problems, config, training record) of an EAGLE-3 folder on its own (no target needed)."""
    if not folder.is_dir():
        return (
            [
                f"drafter={str(folder)!r}: no such folder (an EAGLE-3 folder from `specstudy train-drafter --kind eagle3`)"
            ],
            {},
            {},
        )
    problems: list[str] = []
    cfg: dict[str, Any] = {}
    if (folder / CONFIG_FILE).is_file():
        cfg = json.loads((folder / CONFIG_FILE).read_text())
        if ARCHITECTURE not in (cfg.get("architectures") or []):
            problems.append(
                f"{folder / CONFIG_FILE}: architectures {cfg.get('architectures')!r}, not [{ARCHITECTURE!r}]"
            )
        if int(cfg.get("num_hidden_layers", 1)) != 1:
            problems.append(
                f"{folder / CONFIG_FILE}: num_hidden_layers={cfg['num_hidden_layers']}; llama.cpp's eagle3 has one"
            )
    else:
        problems.append(f"drafter={str(folder)!r}: no {CONFIG_FILE}")
    if (folder / WEIGHTS_FILE).is_file():
        missing = sorted((set(TENSOR_NAMES) | {"d2t"}) - _safetensors_keys(folder / WEIGHTS_FILE))
        if missing:
            problems.append(f"{folder / WEIGHTS_FILE}: no tensor(s) {missing} (llama.cpp's eagle3 GGUF needs them)")
    else:
        problems.append(f"drafter={str(folder)!r}: no {WEIGHTS_FILE}")
    record = json.loads((folder / RECORD_FILE).read_text()) if (folder / RECORD_FILE).is_file() else {}
    return problems, cfg, record


def aux_layers(cfg: Mapping[str, Any], record: Mapping[str, Any], num_layers: int) -> tuple[int, ...]:
    """The feature layers the head was trained on: its record, else the config's pinned ids
    (vLLM's meaning), else the engines' default for the target's depth."""
    pinned = cfg.get("eagle_aux_hidden_state_layer_ids") or (cfg.get("eagle_config") or {}).get(
        "eagle_aux_hidden_state_layer_ids"
    )
    ids = record.get("aux_layers") or pinned
    return tuple(int(i) for i in ids) if ids else default_aux_layers(num_layers)


def target_problems(
    cfg: Mapping[str, Any], record: Mapping[str, Any], target_meta: Mapping[str, Any], model: str
) -> list[str]:
    """What makes the head wrong for this target GGUF: width, vocabulary, depth, the trained target."""
    arch = target_meta.get("general.architecture")
    width = target_meta.get(f"{arch}.embedding_length")
    depth = target_meta.get(f"{arch}.block_count")
    tokens = target_meta.get("tokenizer.ggml.tokens")
    vocab = len(tokens) if isinstance(tokens, list) else None
    out = []
    want_width = int(cfg.get("target_hidden_size", cfg.get("hidden_size", 0)))
    if width is not None and want_width != int(width):
        out.append(f"target_hidden_size {want_width} is not target {model!r}'s embedding_length {width}")
    if vocab is not None and int(cfg.get("vocab_size", -1)) != vocab:
        out.append(f"vocab_size {cfg.get('vocab_size')} is not target {model!r}'s {vocab} tokens")
    if depth is not None:
        bad = [i for i in aux_layers(cfg, record, int(depth)) if not 0 <= i < int(depth)]
        if bad:
            out.append(f"feature layer(s) {bad} outside target {model!r}'s {depth} layers")
    trained = record.get("target")
    if trained and str(trained) != str(model) and Path(str(model)).stem != str(trained):
        out.append(f"trained for target {trained!r} (specstudy.json), not {model!r}")
    return out


def check_folder(drafter: str, model: str, target_meta: Mapping[str, Any] | None) -> Path:
    """The folder, or one ValueError listing every problem (``target_meta`` None: folder only)."""
    folder = resolve_folder(drafter)
    problems, cfg, record = folder_problems(folder)
    if not problems and target_meta is not None:
        problems = target_problems(cfg, record, target_meta, model)
    if problems:
        raise ValueError(f"llamacpp method='eagle3' drafter {drafter!r}: " + "; ".join(problems))
    return folder


def checksum(folder: Path, layers: Sequence[int], target_sha256: str) -> str:
    """sha256 over what the converted file is made from (see the module docstring)."""
    h = hashlib.sha256(f"{FORMAT}\n{list(layers)}\n{target_sha256}\n".encode())
    for name in (CONFIG_FILE, WEIGHTS_FILE):
        with open(folder / name, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


def converted_gguf(folder: Path, target_path: str, target_sha256: str, num_layers: int) -> Path:
    """The head as llama.cpp's eagle3 GGUF, written once per checksum (by rename: a reader never
    sees a half-written file)."""
    from .eagle3_gguf import write_eagle3_gguf

    _, cfg, record = folder_problems(folder)
    layers = aux_layers(cfg, record, num_layers)
    out = cache_dir() / "gguf" / "eagle3" / f"{checksum(folder, layers, target_sha256)[:24]}.gguf"
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(f".{os.getpid()}.tmp")
    try:
        write_eagle3_gguf(folder, target_path, tmp, layers)
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return out

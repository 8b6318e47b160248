"""Preflight of a drafter checkpoint against the engine that will load it: never run a random drafter.

Read from the engines' loaders:

* vLLM (0.32.0 and 0.33.0, ``model_executor/models/llama_eagle.py``): the EAGLE head's ``fc`` is
  built with ``bias=False`` and ``AutoWeightsLoader`` refuses weights it has no parameter for, so
  an EAGLE-1 checkpoint (``fc.bias``, e.g. ``yuhuili/EAGLE-llama2-chat-70B``) cannot load: refused.
* SGLang 0.5.23 picks the model class from ``architectures``; an EAGLE head must say
  ``LlamaForCausalLMEagle`` (its ``fc`` has a bias).  Declared as plain ``LlamaForCausalLM`` it
  is built as a full Llama whose loader skips every unprefixed key (``layers.0.…``, ``fc.…``)
  without a word: random draft layers.  Adapted by :func:`adapt_for_sglang` (a local copy whose
  config names the EAGLE class, weights linked), or refused.
* llama.cpp (``draft-eagle3``): an EAGLE-3 folder, which its backend converts to the eagle3 GGUF
  (:mod:`specstudy.backends.llamacpp.eagle3_draft` checks it against the target GGUF).
* TensorRT-LLM: Eagle (EAGLE-1/2) checkpoints load only through the TensorRT engine backend; the
  PyTorch backend accepts ``Eagle3`` heads only.

Only ``config.json`` and, where the weights are local safetensors, their headers are read (no
tensor data, no network).
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..frameworks import DECLARATIONS, eagle_methods

SGLANG_EAGLE_ARCHS = {"eagle": ("LlamaForCausalLMEagle",), "eagle3": ("LlamaForCausalLMEagle3",)}


@dataclass
class DrafterReport:
    """What the preflight saw; ``notes`` are warnings (e.g. keys not checkable without the weights)."""

    engine: str
    method: str
    architectures: list[str]
    keys: list[str] | None  # weight names from safetensors headers; None when not local
    fc_bias: bool | None  # True/False when known, None when neither keys nor config say
    notes: list[str] = field(default_factory=list)


def safetensors_keys(path: str | os.PathLike[str]) -> list[str]:
    """Tensor names from a ``.safetensors`` file's header only (8-byte length + JSON)."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        if n > 100_000_000:
            raise ValueError(f"{path}: header length {n} is not a safetensors header")
        header = json.loads(f.read(n))
    return sorted(k for k in header if k != "__metadata__")


def _local_dir(drafter: str | os.PathLike[str] | Mapping[str, Any]) -> Path | None:
    if isinstance(drafter, Mapping):
        return None
    p = Path(drafter)
    if p.is_dir():
        return p
    try:  # a hub id already in the local cache (no network)
        from huggingface_hub import try_to_load_from_cache

        cfg = try_to_load_from_cache(str(drafter), "config.json")
        return Path(cfg).parent if isinstance(cfg, str) else None
    except Exception:
        return None


def read_drafter(drafter: str | os.PathLike[str] | Mapping[str, Any]) -> tuple[dict[str, Any] | None, list[str] | None]:
    """(config.json, weight keys) of a local drafter directory or cached hub id; None where absent."""
    if isinstance(drafter, Mapping):
        return dict(drafter), None
    d = _local_dir(drafter)
    if d is None or not (d / "config.json").exists():
        return None, None
    config = json.loads((d / "config.json").read_text())
    files = sorted(d.glob("*.safetensors"))
    keys = sorted({k for f in files for k in safetensors_keys(f)}) if files else None
    return config, keys


def _fc_bias(config: Mapping[str, Any], keys: list[str] | None) -> bool | None:
    if keys is not None:
        return any(k.split(".")[-2:] == ["fc", "bias"] for k in keys)
    for flag in ("bias", "fc_bias"):
        value = config.get(flag)
        if isinstance(value, bool):
            return value
    return None


def check_drafter(engine: str, method: str, drafter: str | os.PathLike[str] | Mapping[str, Any]) -> DrafterReport:
    """Refuse (ValueError naming the checkpoint, what the engine needs and how to provide it) a
    drafter the engine would not load as a trained drafter; return what was checked otherwise.

    ``drafter``: a local directory, a hub id (read from the local HF cache only) or a config dict.
    A drafter with no local config cannot be checked yet: the report says so in ``notes`` (the
    study's preflight lists it as missing before any GPU time is spent).
    """
    formats = {f: d.drafter_format for f, d in DECLARATIONS.items() if d.drafter_format}
    if engine not in formats:
        raise ValueError(f"engine={engine!r}: allowed {sorted(formats)}")
    config, keys = read_drafter(drafter)
    name = drafter if not isinstance(drafter, Mapping) else "<config>"
    if config is None:
        return DrafterReport(
            engine,
            method,
            [],
            None,
            None,
            [f"{name}: config.json not local; the drafter is checked once it is downloaded"],
        )
    report = DrafterReport(engine, method, list(config.get("architectures") or []), keys, _fc_bias(config, keys))
    if keys is None:
        report.notes.append(f"{name}: no local safetensors; weight names unchecked (config only)")
    if method in eagle_methods():
        {"sglang": _sglang, "trtllm": _trtllm, "vllm": _vllm, "llamacpp": _llamacpp}[formats[engine]](report, name)
    return report


def _eagle1(report: DrafterReport) -> bool:
    """An EAGLE-1/2 style head: a Llama layer plus ``fc`` with a bias, not an EAGLE-3 head."""
    archs = " ".join(report.architectures)
    return report.method == "eagle" and "Eagle3" not in archs and report.fc_bias is not False


def _vllm(report: DrafterReport, name: Any) -> None:
    if report.method == "eagle" and report.fc_bias:
        raise ValueError(
            f"drafter {name}: an EAGLE-1 checkpoint (fc.bias present); vLLM's EAGLE loader builds fc "
            "without bias and refuses unexpected weights. Use an EAGLE head in vLLM's format "
            "(fc without bias), EAGLE-3 (method eagle3), or run this head on sglang or trtllm"
        )
    if report.method == "eagle" and report.fc_bias is None:
        report.notes.append(f"{name}: fc bias unknown until the weights are local; vLLM refuses fc.bias")


def _llamacpp(report: DrafterReport, name: Any) -> None:
    if report.method == "eagle3" and SGLANG_EAGLE_ARCHS["eagle3"][0] not in report.architectures:
        raise ValueError(
            f"drafter {name}: architectures={report.architectures}; llama.cpp's draft-eagle3 runs the kit's "
            f"EAGLE-3 folder ({list(SGLANG_EAGLE_ARCHS['eagle3'])}, from `specstudy train-drafter --kind eagle3`), "
            "converted to its eagle3 GGUF by the llamacpp backend"
        )


def _sglang(report: DrafterReport, name: Any) -> None:
    need = SGLANG_EAGLE_ARCHS[report.method]
    if not any(a in need for a in report.architectures):
        raise ValueError(
            f"drafter {name}: architectures={report.architectures}; SGLang builds that as a plain "
            f"model and silently skips the head's weights (random draft layers). It needs {list(need)}: "
            f"adapt a local copy with specstudy.environments.drafter_preflight.adapt_for_sglang(path, out_dir)"
        )


def _trtllm(report: DrafterReport, name: Any) -> None:
    if _eagle1(report):
        report.notes.append(
            f"{name}: an EAGLE-1/2 head: TensorRT-LLM loads it only with --backend tensorrt "
            "(decoding_type Eagle); the PyTorch backend runs Eagle3 heads only"
        )


def adapt_for_sglang(path: str | os.PathLike[str], out_dir: str | os.PathLike[str], method: str = "eagle") -> Path:
    """A local copy of an EAGLE head that SGLang loads as one: config.json with the EAGLE class
    in ``architectures``, every other file linked (no weights are copied or changed)."""
    src, out = Path(path), Path(out_dir)
    config = json.loads((src / "config.json").read_text())
    out.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.name != "config.json" and not (out / f.name).exists():
            (out / f.name).symlink_to(f.resolve())
    config["architectures"] = list(SGLANG_EAGLE_ARCHS[method])
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return out

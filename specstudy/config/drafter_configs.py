"""What a drafter's own config must say for the method that runs it: EAGLE-3's auxiliary target
layers and verifier, a DFlash block, the target's MTP layers, PARD's parallel-drafting token.

The engines read these keys (vLLM 0.32/0.33 ``vllm/config/speculative.py`` and
``vllm/v1/worker/gpu/spec_decode/utils.py``; SGLang's ``dflash_utils``); a mismatch fails there
after the weights load, so the kit names it first.  Published drafters come in two layouts: a plain
HF config, and the ``speculators`` layout (RedHatAI's EAGLE-3 heads), whose decoder layer sits
under ``transformer_layer_config``: :func:`layer_view` reads both alike.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .errors import ParamsError

#: a target config's count of its own multi-token-prediction layers (DeepSeek/MiMo, Qwen3.5/Qwen3-Next)
MTP_LAYER_KEYS = ("num_nextn_predict_layers", "mtp_num_hidden_layers")
#: the keys vLLM reads for the token that fills parallel-drafting slots (PARD, DFlash), in its order
PARALLEL_TOKEN_KEYS = ("mask_token_id", "dspark_noise_token_id", "pard_token", "ptd_token_id")


def layer_view(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """A drafter config with a ``speculators`` layout's decoder-layer keys lifted to the top level
    (top-level keys win); a plain config is returned as it is."""
    inner = cfg.get("transformer_layer_config")
    return {**inner, **cfg} if isinstance(inner, Mapping) else dict(cfg)


def mtp_layers(cfg: Mapping[str, Any]) -> int | None:
    """How many MTP layers a target ships (None: its config names none)."""
    for key in MTP_LAYER_KEYS:
        if isinstance(cfg.get(key), int):
            return int(cfg[key])
    return None


def aux_layers(cfg: Mapping[str, Any]) -> list[int] | None:
    """An EAGLE-3 head's auxiliary target layers (None: the engine's default, [2, L/2, L-3])."""
    nested = cfg.get("eagle_config")
    ids = cfg.get("eagle_aux_hidden_state_layer_ids") or (
        nested.get("eagle_aux_hidden_state_layer_ids") if isinstance(nested, Mapping) else None
    )
    return [int(i) for i in ids] if ids else None


def dflash_fields(cfg: Mapping[str, Any]) -> tuple[int | None, list[int], int | None]:
    """A DFlash drafter's (block size, target layer ids, mask token id)."""
    nested = cfg.get("dflash_config")
    inner: Mapping[str, Any] = nested if isinstance(nested, Mapping) else {}
    block = cfg.get("block_size", inner.get("block_size"))
    return (
        int(block) if isinstance(block, int) else None,
        [int(i) for i in inner.get("target_layer_ids") or []],
        inner.get("mask_token_id", cfg.get("mask_token_id")),
    )


def drafter_problems(file: Any, use: Any, t: Mapping[str, Any], d: Mapping[str, Any] | None) -> list[ParamsError]:
    """Every problem of ``use`` (a :class:`~.model_configs.Use`) in its target's and drafter's configs."""
    if use.method == "mtp":
        return _mtp(file, use, t)
    if d is None:
        return []
    if use.method == "eagle3":
        return _eagle3(file, use, t, d)
    if use.method == "dflash":
        return _dflash(file, use, t, d)
    if use.method == "pard":
        return _pard(file, use, d)
    return []


def _mtp(file: Any, use: Any, t: Mapping[str, Any]) -> list[ParamsError]:
    n = mtp_layers(t)
    if n and n >= 1:
        return []
    hint = f"{use.target}: none of {list(MTP_LAYER_KEYS)} in its config.json; it ships no MTP layers to draft with"
    return [ParamsError(file, f"study.models[{use.target}] with method mtp", n, "a target with >= 1 MTP layer", hint)]


def _target_layers(file: Any, use: Any, t: Mapping[str, Any], ids: list[int], what: str) -> list[ParamsError]:
    n = t.get("num_hidden_layers")
    if not isinstance(n, int) or all(0 <= i < n for i in ids):
        return []
    hint = f"{use.drafter}: {what}={ids}; {use.target} has num_hidden_layers={n} (a head trained on another target)"
    return [ParamsError(file, f"study.models[{use.target}].drafters", use.drafter, f"layer ids in 0..{n - 1}", hint)]


def _eagle3(file: Any, use: Any, t: Mapping[str, Any], d: Mapping[str, Any]) -> list[ParamsError]:
    out = _target_layers(file, use, t, aux_layers(d) or [], "eagle_aux_hidden_state_layer_ids")
    nested = d.get("speculators_config")
    spec: Mapping[str, Any] = nested if isinstance(nested, Mapping) else {}
    v = spec.get("verifier")
    verifier = v.get("name_or_path") if isinstance(v, Mapping) else None
    if verifier and verifier != use.target:
        hint = f"{use.drafter}: speculators_config.verifier.name_or_path={verifier!r}: trained for another target"
        out.append(
            ParamsError(file, f"study.models[{use.target}].drafters", use.drafter, f"a head for {use.target}", hint)
        )
    return out


def _dflash(file: Any, use: Any, t: Mapping[str, Any], d: Mapping[str, Any]) -> list[ParamsError]:
    block, ids, mask = dflash_fields(d)
    out = _target_layers(file, use, t, ids, "dflash_config.target_layer_ids")
    n_target = d.get("num_target_layers")
    if isinstance(n_target, int) and n_target != t.get("num_hidden_layers"):
        hint = (
            f"{use.drafter}: num_target_layers={n_target}, {use.target}: num_hidden_layers={t.get('num_hidden_layers')}"
        )
        out.append(
            ParamsError(file, f"study.models[{use.target}].drafters", use.drafter, "a drafter for this target", hint)
        )
    if mask is None:
        hint = f"{use.drafter}: no dflash_config.mask_token_id (vLLM and SGLang fill the block's slots with it)"
        out.append(ParamsError(file, f"study.models[{use.target}].drafters", use.drafter, "a DFlash drafter", hint))
    too_long = [g for g in use.gammas if block is not None and g > block - 1]
    if too_long and block is not None:
        hint = f"{use.drafter}: block_size={block} (one bonus token and γ masked slots per block)"
        out.append(ParamsError(file, f"gammas of {use.framework} dflash", too_long, f"<= {block - 1}", hint))
    return out


def _pard(file: Any, use: Any, d: Mapping[str, Any]) -> list[ParamsError]:
    if any(d.get(k) is not None for k in PARALLEL_TOKEN_KEYS) or dflash_fields(d)[2] is not None:
        return []
    hint = f"{use.drafter}: none of {list(PARALLEL_TOKEN_KEYS)} in its config.json (vLLM's parallel drafting needs one)"
    return [ParamsError(file, f"study.models[{use.target}].drafters", use.drafter, "a PARD-trained draft model", hint)]

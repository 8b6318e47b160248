"""Each model's own facts (its ``config.json``), checked against the study before anything is rented.

A GPU profile names hub models; what they can run is in their configs, a few KB each: the context
(``max_position_embeddings``), the head and KV-head counts tensor parallelism divides, the vocabulary
a draft must share, an EAGLE head's width and context.  :func:`read_config` finds a config in
``$SPECSTUDY_MODEL_CONFIGS/<owner>--<name>/`` (fixtures, a rehearsal), a local folder, or the Hugging
Face cache (``specstudy models configs`` fetches them there); :func:`config_problems` returns every
problem at once, each naming the model, the key, its value and what is allowed.  A model with no
config here is listed as not checked, never guessed.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..frameworks import DECLARATIONS, head_drafter_methods
from .drafter_configs import drafter_problems, layer_view
from .errors import ParamsError

#: a folder of ``<owner>--<name>/config.json`` read before the cache (tests, the rehearsal)
CONFIGS_ENV = "SPECSTUDY_MODEL_CONFIGS"
#: the files ``specstudy models configs`` fetches per model (a few KB; never weights)
CONFIG_FILES = ("config.json", "tokenizer_config.json")
#: bytes per parameter, by dtype or weight quantization
WEIGHT_BYTES = {"float32": 4, "float64": 8, "bfloat16": 2, "float16": 2, "auto": 2, "awq": 0.5, "gptq": 0.5}
#: the share of a GPU an engine may fill when the study sets none (vLLM's default)
DEFAULT_MEMORY_SHARE = 0.9

Reader = Callable[[str], "Mapping[str, Any] | None"]


def read_config(model: str, name: str = "config.json") -> dict[str, Any] | None:
    """``model``'s config from the fixtures folder, a local folder, or the HF cache; None if none here."""
    roots = [Path(os.environ[CONFIGS_ENV]) / model.replace("/", "--")] if os.environ.get(CONFIGS_ENV) else []
    roots.append(Path(model).expanduser())
    for root in roots:
        if (root / name).is_file():
            return dict(json.loads((root / name).read_text()))
    try:
        from huggingface_hub import try_to_load_from_cache

        path = try_to_load_from_cache(model, name)
    except (ImportError, ValueError):
        return None
    return dict(json.loads(Path(path).read_text())) if isinstance(path, str) else None


def fetch_configs(models: Iterable[str], log: Callable[[str], None] = print) -> list[str]:
    """Download each hub model's config and tokenizer config into the HF cache (those not here yet);
    returns what was not fetched.  The first connection failure stops it: no hub, read the cache only."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError, LocalEntryNotFoundError

    todo = [m for m in sorted(set(models)) if read_config(m) is None]
    if todo and not hub_reachable():
        return [f"{m}: the hub is not reachable from here" for m in todo]
    for i, model in enumerate(todo):
        try:
            hf_hub_download(model, "config.json")
        except LocalEntryNotFoundError:  # no connection to the hub
            return [f"{m}: the hub is not reachable from here" for m in todo[i:]]
        except Exception as e:  # gated without a token, absent
            log(f"{model}/config.json: {type(e).__name__}")
            continue
        try:
            hf_hub_download(model, "tokenizer_config.json")
        except EntryNotFoundError:  # heads have no tokenizer of their own
            pass
        except Exception as e:
            log(f"{model}/tokenizer_config.json: {type(e).__name__}")
    return []


def hub_reachable(timeout_s: float = 3.0) -> bool:
    """Whether the hub's host answers a TCP connection (its client would retry for half a minute)."""
    import socket
    from urllib.parse import urlparse

    from huggingface_hub import constants

    host = urlparse(constants.ENDPOINT).hostname or "huggingface.co"
    try:
        socket.create_connection((host, 443), timeout=timeout_s).close()
        return True
    except OSError:
        return False


def _view(cfg: Mapping[str, Any] | None) -> dict[str, Any] | None:
    return None if cfg is None else layer_view(cfg)


def context(cfg: Mapping[str, Any]) -> int | None:
    for key in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        if isinstance(cfg.get(key), int):
            return int(cfg[key])
    return None


def heads(cfg: Mapping[str, Any]) -> tuple[int | None, int | None]:
    """(attention heads, KV heads): a config without KV heads has one per attention head."""
    n = cfg.get("num_attention_heads")
    return n, cfg.get("num_key_value_heads") or n


def params_of(cfg: Mapping[str, Any]) -> float | None:
    """A Llama-shaped decoder's parameter count from its config (embeddings, attention, MLP)."""
    try:
        h, n_layers, inter, vocab = (
            int(cfg[k]) for k in ("hidden_size", "num_hidden_layers", "intermediate_size", "vocab_size")
        )
    except (KeyError, TypeError, ValueError):
        return None
    n, kv = heads(cfg)
    head_dim = int(cfg.get("head_dim") or h // int(n or 1))
    attn = h * head_dim * (2 * int(n or 1) + 2 * int(kv or 1))
    embed = vocab * h * (1 if cfg.get("tie_word_embeddings") else 2)
    return float(embed + n_layers * (attn + 3 * h * inter))


@dataclass(frozen=True)
class Use:
    """One (framework, method, target, drafter) the study runs, with what its engine is given."""

    framework: str
    method: str
    target: str
    drafter: str | None
    tensor_parallel_size: int
    dtype: str
    max_model_len: int | None
    memory_share: float
    #: the γ values the study runs it at (a DFlash block bounds them)
    gammas: tuple[int, ...] = ()


def uses_of(cfg: Any) -> list[Use]:
    """Every distinct (framework, method, target, drafter) of a loaded study, with its engine settings."""
    out: dict[tuple[Any, ...], Use] = {}
    for sw in cfg.sweeps:
        for model, fw, label in ((m, f, lb) for m in sw.models for f in sw.frameworks for lb in sw.methods):
            pair, m = cfg.model(model), cfg.method(label)
            if (m.frameworks is not None and fw not in m.frameworks) or (m.drafter and m.drafter not in pair.drafters):
                continue
            gammas = tuple(sorted(set(m.gammas or sw.gammas)))
            opts = cfg.framework_options.get(fw, {})
            use = Use(
                framework=fw,
                method=m.method or m.family,
                target=pair.target,
                drafter=pair.drafters[m.drafter] if m.drafter else None,
                tensor_parallel_size=pair.tensor_parallel_size,
                dtype=pair.quantization if pair.quantization != "none" else pair.dtype,
                max_model_len=opts.get("max_model_len"),
                memory_share=float(opts.get("gpu_memory_utilization") or DEFAULT_MEMORY_SHARE),
                gammas=gammas,
            )
            key = (use.framework, use.method, use.target, use.drafter)
            if key in out:
                use = replace(use, gammas=tuple(sorted(set(out[key].gammas) | set(gammas))))
            out[key] = use
    return list(out.values())


def config_problems(
    cfg: Any, memory_gb: float | None = None, read: Reader = read_config
) -> tuple[list[ParamsError], list[str]]:
    """Every problem of the study against its models' own configs, and the models not checked (no config)."""
    problems: dict[str, ParamsError] = {}
    unchecked: set[str] = set()
    for use in uses_of(cfg):
        t = read(use.target)
        d = _view(read(use.drafter)) if use.drafter and "/" in use.drafter and "+" not in use.drafter else None
        if use.drafter and d is None and "+" not in use.drafter and "/" in use.drafter:
            unchecked.add(use.drafter)
        if t is None:
            unchecked.add(use.target)
            continue
        for p in _checks(cfg.file, use, t, d, memory_gb):
            problems.setdefault(str(p), p)
    return list(problems.values()), sorted(unchecked)


def _checks(
    file: Any, use: Use, t: Mapping[str, Any], d: Mapping[str, Any] | None, memory_gb: float | None
) -> list[ParamsError]:
    out = [*_context(file, use, t, d), *_tensor_parallel(file, use, t), *drafter_problems(file, use, t, d)]
    if d is not None:
        out += _draft_shape(file, use, t, d)
    if memory_gb:
        out += _memory(file, use, t, d, memory_gb)
    return out


def _context(file: Any, use: Use, t: Mapping[str, Any], d: Mapping[str, Any] | None) -> list[ParamsError]:
    """max_model_len against the target's context; on an engine that gives an EAGLE head the target's
    context (SGLang), against the head's own context too."""
    key, out = f"study.framework_options.{use.framework}.max_model_len", []
    ctx = context(t)
    if use.max_model_len and ctx and use.max_model_len > ctx:
        hint = f"{use.target}: max_position_embeddings={ctx}; the engine refuses a longer context"
        out.append(ParamsError(file, key, use.max_model_len, f"<= {ctx}", hint))
    head_ctx = context(d) if d is not None and use.method in head_drafter_methods() else None
    rule = DECLARATIONS[use.framework].draft_takes_target_context if use.framework in DECLARATIONS else False
    given = use.max_model_len or ctx
    if rule and head_ctx and given and given > head_ctx:
        hint = (
            f"{use.drafter}: max_position_embeddings={head_ctx}; {use.framework} builds the {use.method} draft with "
            f"the target's context ({given}) and refuses a longer one than the draft's own "
            "(the kit does not set SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN)"
        )
        out.append(ParamsError(file, key, use.max_model_len, f"<= {head_ctx}", hint))
    return out


def _tensor_parallel(file: Any, use: Use, t: Mapping[str, Any]) -> list[ParamsError]:
    """Heads split evenly over the GPUs; KV heads too, or each replicated over a whole number of GPUs."""
    tp, (n, kv) = use.tensor_parallel_size, heads(t)
    if tp == 1 or not n:
        return []
    kv_ok = not kv or (kv % tp == 0 if kv >= tp else tp % kv == 0)
    if n % tp == 0 and kv_ok:
        return []
    allowed = [k for k in range(1, 9) if n % k == 0 and (not kv or (kv % k == 0 if kv >= k else k % kv == 0))]
    hint = f"{use.target}: num_attention_heads={n}, num_key_value_heads={kv}"
    return [ParamsError(file, f"study.models[{use.target}].tensor_parallel_size", tp, allowed, hint)]


def _draft_shape(file: Any, use: Use, t: Mapping[str, Any], d: Mapping[str, Any]) -> list[ParamsError]:
    """A draft's vocabulary is the target's; a head's width (and vocabulary, where it has one) too."""
    out, key = [], f"study.models[{use.target}].drafters"
    for what in ("vocab_size", "hidden_size") if use.method in head_drafter_methods() else ("vocab_size",):
        tv, dv = t.get(what), d.get(what)
        if tv is not None and dv is not None and tv != dv:
            hint = f"{use.drafter}: {what}={dv}, its target {use.target}: {what}={tv} ({use.framework} {use.method})"
            out.append(ParamsError(file, key, use.drafter, f"a drafter with {what} {tv}", hint))
    return out


def _memory(
    file: Any, use: Use, t: Mapping[str, Any], d: Mapping[str, Any] | None, memory_gb: float
) -> list[ParamsError]:
    """The weights per GPU (target and draft split over the same GPUs, the engines' default) within the
    engine's share; a quantized target's draft is counted in 16 bits."""
    target = (params_of(t) or 0.0) * WEIGHT_BYTES.get(use.dtype, 2)
    draft = ((params_of(d) if d is not None else 0.0) or 0.0) * 2
    need, budget = (target + draft) / use.tensor_parallel_size / 1e9, memory_gb * use.memory_share
    if need <= budget:
        return []
    hint = (
        f"{use.target} ({use.dtype}, tensor_parallel_size {use.tensor_parallel_size})"
        f"{' + ' + str(use.drafter) if d is not None else ''}: {need:.1f} GB of weights per GPU, before any KV cache"
    )
    return [
        ParamsError(
            file,
            f"study.models[{use.target}] on {use.framework}",
            f"{need:.1f} GB per GPU",
            f"<= {budget:.1f} GB",
            hint,
        )
    ]

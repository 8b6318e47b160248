"""Is this machine ready for a study: the GPUs its profile describes, the engines, the weights?

Separate from validation, so a GPU profile validates (and dry-runs) on any machine.  The checks
are :func:`specstudy.environments.preflight.preflight`'s: GPU model and count, each engine's pinned
environment present and importable, each model local or in the Hugging Face cache, a token for
gated repositories, disk space, each drafter checkpoint against the engine that loads it.  A dry
run prints them as warnings; a real run installs the missing engine environments it can and then
fails once with everything still missing.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

from ..config import ParamsError, StudyConfig, hardware_names, load_hardware_profile
from ..drafter_names import LOOKUP, is_self, merged_parts
from ..environments import install as envs
from ..environments.preflight import DrafterUse, Missing, Probes, Weights, matching_gpus, preflight
from ..frameworks import DECLARATIONS, EngineEnv
from .plan import CellPlan, expand, uses_cuda


def machine_needs(
    cfg: StudyConfig, probes: Probes | None = None, plans: Sequence[CellPlan] | None = None
) -> list[Missing]:
    """Everything this machine lacks for ``cfg`` (empty: ready); loads nothing, asks no hub.
    ``plans``: the study's cells as the command expanded them (expanded here without them)."""
    plans = expand(cfg) if plans is None else plans
    frameworks = sorted({p.cell.framework for p in plans})
    params = {}
    for pair in cfg.models:
        params[pair.target] = pair.params.get("target")
        params.update({mid: pair.params.get(short) for short, mid in pair.drafters.items()})
    dtype = {pair.target: pair.dtype if pair.quantization == "none" else pair.quantization for pair in cfg.models}
    targets = {p.target for p in plans if DECLARATIONS[p.cell.framework].reads_checkpoints}  # not MLC's own
    models = [Weights(t, params.get(t), dtype.get(t, "bfloat16")) for t in sorted(targets)]
    uses: dict[str, set[tuple[str, str]]] = {}
    for p in plans:  # the engines that load a drafter checkpoint of their own format
        if p.drafter_id and DECLARATIONS[p.cell.framework].drafter_format:
            uses.setdefault(p.drafter_id, set()).add((p.cell.framework, p.cell.method))
    drafters = [DrafterUse(d, tuple(sorted(u)), params.get(d)) for d, u in sorted(uses.items())]
    models += [Weights(d, params.get(d)) for d in sorted(other_drafters(plans) - set(uses) - targets)]
    profile = (
        load_hardware_profile(cfg.hardware, measure=False)
        if cfg.hardware in hardware_names()
        else {"kind": "gpu" if cfg.device.startswith("cuda") else "cpu"}
    )
    cuda, probes = uses_cuda(cfg), probes or Probes()
    found = preflight(frameworks, models, drafters, profile, 1, cuda=cuda, probes=probes)
    found += tensor_parallel_rows(plans, profile, probes)
    return found + ([] if cuda else vllm_cpu_memory(cfg, frameworks, probes))


def tensor_parallel_rows(plans: Sequence[CellPlan], profile: object, probes: Probes) -> list[Missing]:
    """A model whose tensor_parallel_size exceeds the GPUs here refuses its own rows, not the study's."""
    kind = profile.get("kind") if isinstance(profile, dict) else getattr(profile, "kind", None)
    if kind != "gpu":
        return []
    have = matching_gpus(profile, probes)
    if have is None:
        return []  # no GPU at all: preflight's own finding stops the run
    sizes = {p.target: p.tensor_parallel_size for p in plans if p.tensor_parallel_size > have}
    return [
        Missing(
            "gpu",
            f"{tp} GPUs for {target}",
            f"its tensor_parallel_size={tp} needs {tp} GPUs; {have} here",
            "its rows are refused; run them on a machine with more GPUs, or lower its tensor_parallel_size",
            target=target,
        )
        for target, tp in sorted(sizes.items())
    ]


def other_drafters(plans: Sequence[CellPlan]) -> set[str]:
    """Every checkpoint a row drafts with (Medusa heads for TensorRT-LLM's engine build, the reference
    engine's draft models, each model of a merged tree): each must be here before an offline run."""
    out: set[str] = set()
    for p in plans:
        if not DECLARATIONS[p.cell.framework].reads_checkpoints:
            continue  # MLC fetches weights of its own format
        for part in merged_parts(p.drafter_id) if p.drafter_id else []:
            if part != LOOKUP and not is_self(part):
                out.add(part)
    return out


#: vLLM's default ``gpu_memory_utilization``: on its CPU build the share of NUMA node 0 it reserves
VLLM_DEFAULT_MEMORY_SHARE = 0.92


def vllm_cpu_memory(cfg: StudyConfig, frameworks: list[str], probes: Probes) -> list[Missing]:
    """vLLM's CPU build reserves ``gpu_memory_utilization`` (0.92) of NUMA node 0 unless the KV cache
    has a fixed size (``VLLM_CPU_KVCACHE_SPACE``, GiB), and its engine refuses to start when that much
    is not free there: found here before any engine starts, with the setting that fixes it."""
    unsized = [
        f
        for f in frameworks
        if DECLARATIONS[f].environment == "vllm"
        and not ((cfg.framework_options.get(f, {}).get("env") or {}).get("VLLM_CPU_KVCACHE_SPACE"))
    ]
    if not unsized or os.environ.get("VLLM_CPU_KVCACHE_SPACE"):
        return []  # no node to read: every vLLM framework has a fixed KV size, or there is none
    node = probes.node_memory()
    if node is None:  # no per-node meminfo here: nothing to compare against
        return []
    gib, out = 1024**3, []
    for fw in unsized:
        share = float(cfg.framework_options.get(fw, {}).get("gpu_memory_utilization") or VLLM_DEFAULT_MEMORY_SHARE)
        if share * node[0] <= node[1]:
            continue
        out.append(
            Missing(
                "memory",
                f"{fw}: vLLM's CPU memory reservation",
                f"vLLM CPU reserves gpu_memory_utilization={share} of NUMA node 0's {node[0] / gib:.1f} GiB "
                f"= {share * node[0] / gib:.1f} GiB, and {node[1] / gib:.1f} GiB are free there (its engine would refuse to start)",
                f"set study.framework_options.{fw}.env.VLLM_CPU_KVCACHE_SPACE to the KV cache's GiB (the engines "
                f"study uses '1'), or a gpu_memory_utilization below {node[1] / node[0]:.2f}",
            )
        )
    return out


def _missing_text(found: list[Missing]) -> str:
    return "\n".join(f"  - [{m.kind}] {m.what}: {m.why}; {m.how}" for m in found)


def prepare_machine(
    cfg: StudyConfig,
    force: bool = False,
    log: Callable[[str], None] = print,
    probes: Probes | None = None,
    install: Callable[[EngineEnv], object] | None = None,
    plans: Sequence[CellPlan] | None = None,
) -> list[Missing]:
    """Check the machine, install the engine environments the study needs (pinned, reused), check
    again, and refuse once with everything still missing.

    What no install can provide (the GPUs, disk, weights, a hub token) is checked first: while any
    of it is missing nothing is installed, and the refusal lists it beside the environments that
    would be installed.  A drafter checkpoint an engine cannot load refuses only the rows that
    need it (returned as notes; :func:`refused_rows` names them).  ``force`` runs a GPU profile on
    another machine anyway (the numbers then belong to this machine).  Returns the notes that did
    not stop the run."""
    install = install or (lambda env: envs.install(env))
    plans = expand(cfg) if plans is None else plans
    missing = machine_needs(cfg, probes, plans)
    installed = False
    if not _blocking(missing, force, engines=False) and any(m.kind == "engine" for m in missing):
        installed = True
        for env in envs.required_engines(sorted({p.cell.framework for p in plans}), uses_cuda(cfg)):
            if not (probes.installed(env) if probes else envs.is_installed(env)):
                log(f"installing the {env.name} environment ({env.engine_requirement}) at {envs.venv_dir(env)}")
                install(env)
        missing = machine_needs(cfg, probes, plans)
    blocking = _blocking(missing, force, engines=True)
    if blocking:
        raise ParamsError(
            cfg.file,
            "hardware",
            cfg.hardware,
            "a machine with what the study needs",
            f"this machine lacks{'' if installed else ' (nothing was installed)'}:\n"
            + _missing_text(blocking)
            + ("\n(--force runs a GPU profile without its GPU)" if any(m.kind == "gpu" for m in blocking) else ""),
        )
    return [m for m in missing if m not in blocking]


def _blocking(missing: list[Missing], force: bool, engines: bool) -> list[Missing]:
    """What stops the run: every finding but forced GPU notes and per-row findings (a drafter's format,
    an engine version, a model's GPU count) (``engines=False``: leaving out the engines an install
    would provide, too)."""
    per_row = ("drafter", "version")
    return [
        m
        for m in missing
        if not (m.kind == "gpu" and force)
        and m.kind not in per_row
        and not m.target
        and (engines or m.kind != "engine")
    ]


def refused_rows(notes: list[Missing]) -> set[tuple[str, str, str]]:
    """(framework, method, drafter id) of the rows a drafter finding refuses."""
    return {(m.framework, m.method, m.drafter) for m in notes if m.kind == "drafter" and m.framework}


def refused_frameworks(notes: list[Missing]) -> set[str]:
    """The frameworks whose installed engine version cannot run their rows (TensorRT-LLM's engine build after 1.2)."""
    return {m.framework for m in notes if m.kind == "version" and m.framework}


def refused_targets(notes: list[Missing]) -> set[str]:
    """The targets whose rows a tensor-parallel finding refuses (too few GPUs here)."""
    return {m.target for m in notes if m.target}


def keep_rows(plans: list[CellPlan], notes: list[Missing]) -> list[CellPlan]:
    """``plans`` without the rows the machine's findings refuse (drafter format, GPU count)."""
    rows, targets, frameworks = refused_rows(notes), refused_targets(notes), refused_frameworks(notes)
    return [
        p
        for p in plans
        if (p.cell.framework, p.cell.method, p.drafter_id or "") not in rows
        and p.target not in targets
        and p.cell.framework not in frameworks
    ]

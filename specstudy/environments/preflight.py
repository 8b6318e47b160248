"""Before the rented hour starts: everything a study needs on this machine, as one list.

:func:`preflight` loads no model and uses no network (by default): GPU model and count (NVML) vs
the hardware profile and tensor parallelism, each engine environment present and importable
(its interpreter spawned with a timeout), each model a local path or in the Hugging Face cache,
a token for gated repositories, disk space for the weights still to download, and each drafter
checkpoint against the engine that will load it (:mod:`specstudy.environments.drafter_preflight`).  It returns
every :class:`Missing` at once; the caller decides which are errors.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..config.model import get_entry
from ..frameworks import DECLARATIONS, EngineEnv
from . import install as envs
from .drafter_preflight import check_drafter

#: hub repositories that need an accepted licence and a token
GATED_PREFIXES = ("meta-llama/",)
#: bytes per parameter of a checkpoint in each dtype / weight quantization
DTYPE_BYTES = {
    "float32": 4,
    "float64": 8,
    "bfloat16": 2,
    "float16": 2,
    "auto": 2,
    "awq": 0.5,
    "gptq": 0.5,
    "fp8": 1,
    "int8": 1,
}


@dataclass(frozen=True)
class Missing:
    """One thing the study needs and this machine lacks: what, why, and how to provide it."""

    kind: str  # gpu, engine, model, token, disk, drafter
    what: str
    why: str
    how: str
    #: a drafter finding's row: the framework, method and drafter it refuses (the rest still run)
    framework: str = ""
    method: str = ""
    drafter: str = ""


@dataclass(frozen=True)
class Weights:
    """A checkpoint the study loads: hub id, local path or kit registry name; params for disk space."""

    id: str
    params: float | None = None
    dtype: str = "bfloat16"  # or a weight quantization name (awq, gptq, fp8, int8)


@dataclass(frozen=True)
class DrafterUse:
    """A drafter checkpoint and the (framework, method) pairs that will load it."""

    id: str
    uses: tuple[tuple[str, str], ...]
    params: float | None = None
    dtype: str = "bfloat16"


@dataclass
class Probes:
    """The machine, behind functions a test can replace."""

    gpus: Callable[[], list[str] | None] = field(default=lambda: nvml_gpus())
    installed: Callable[[EngineEnv], bool] = field(default=lambda env: envs.is_installed(env))
    imports: Callable[[str, str], tuple[bool, str]] = field(default=lambda py, mod: import_probe(py, mod))
    cached: Callable[[str], str | None] = field(default=lambda repo: hf_cached(repo))
    token: Callable[[], bool] = field(default=lambda: hf_token_present())
    disk_free: Callable[[Path], int] = field(default=lambda p: shutil.disk_usage(_existing(p)).free)
    which: Callable[[str], str | None] = field(default=shutil.which)
    hf_home: Callable[[], Path] = field(default=lambda: hf_cache_dir())
    node_memory: Callable[[], tuple[int, int] | None] = field(default=lambda: numa_node_memory())


# ---- the real probes ----------------------------------------------------------------------------


def nvml_gpus() -> list[str] | None:
    """Names of the NVIDIA GPUs NVML sees; None when there is no driver."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        return None
    try:
        names = [
            pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i)) for i in range(pynvml.nvmlDeviceGetCount())
        ]
        return [n.decode() if isinstance(n, bytes) else str(n) for n in names]
    finally:
        pynvml.nvmlShutdown()


def numa_node_memory(
    node: int = 0, root: Path = Path("/sys/devices/system/node"), cgroup: Path = Path("/sys/fs/cgroup")
) -> tuple[int, int] | None:
    """(total, available) bytes of NUMA node ``node`` as vLLM's CPU worker reads them
    (``vllm/utils/cpu_resource_utils.py``: MemFree + file pages + SReclaimable, both clamped to a
    smaller cgroup limit), or None without per-node meminfo.  Some VMs report a node far smaller
    than the machine (8.3 of 24 GiB seen)."""
    path = root / f"node{node}" / "meminfo"
    try:
        info = {p[2].rstrip(":"): int(p[3]) * 1024 for p in (ln.split() for ln in path.read_text().splitlines())}
        total = info["MemTotal"]
        free = info["MemFree"] + info["Active(file)"] + info["Inactive(file)"] + info["SReclaimable"]
    except (OSError, KeyError, IndexError, ValueError):
        return None
    limit, usage = _cgroup_memory(cgroup)
    if limit is not None and limit < total:
        total, free = limit, max(0, min(free, limit - (usage or 0)))
    return total, free


def _cgroup_memory(cgroup: Path) -> tuple[int | None, int | None]:
    """(limit, usage) bytes of this process's memory cgroup, v2 or v1, as vLLM reads them
    (v2's ``max`` and v1's huge sentinel mean no limit)."""

    def read(name: str) -> int | None:
        try:
            return int((cgroup / name).read_text().strip())
        except (OSError, ValueError):
            return None

    if (limit := read("memory.max")) is not None:
        return limit, read("memory.current")
    limit = read("memory/memory.limit_in_bytes")
    if limit is None or limit >= 1 << 62:
        return None, None
    return limit, read("memory/memory.usage_in_bytes")


def import_probe(python: str, module: str, timeout_s: float = 180.0) -> tuple[bool, str]:
    """Spawn ``python -c 'import module'``; (ok, last lines of its error)."""
    try:
        out = subprocess.run(
            [python, "-c", f"import {module}"], capture_output=True, text=True, timeout=timeout_s, cwd="/"
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return False, str(e)
    return out.returncode == 0, "\n".join((out.stderr or "").strip().splitlines()[-3:])


def hf_cached(repo: str) -> str | None:
    """The cached config.json of a hub repo, or None (never asks the hub)."""
    try:
        from huggingface_hub import try_to_load_from_cache

        hit = try_to_load_from_cache(repo, "config.json")
    except Exception:
        return None
    return hit if isinstance(hit, str) else None


def hf_token_present() -> bool:
    if os.environ.get("HF_TOKEN") or os.environ.get("HUGGING_FACE_HUB_TOKEN"):
        return True
    try:
        from huggingface_hub import constants

        return Path(constants.HF_TOKEN_PATH).is_file()
    except Exception:
        return (Path.home() / ".cache" / "huggingface" / "token").is_file()


def hf_cache_dir() -> Path:
    try:
        from huggingface_hub import constants

        return Path(constants.HF_HUB_CACHE)
    except Exception:
        return Path.home() / ".cache" / "huggingface" / "hub"


def _existing(p: Path) -> Path:
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


# ---- the checks -------------------------------------------------------------------------------------


def preflight(
    frameworks: Iterable[str],
    models: Sequence[Weights | str],
    drafters: Sequence[DrafterUse | str],
    hardware_profile: Mapping[str, Any] | Any,
    tensor_parallel_size: int = 1,
    *,
    cuda: bool | None = None,
    probes: Probes | None = None,
) -> list[Missing]:
    """Everything missing for a study on this machine (empty: ready).  Loads nothing, asks no hub."""
    p = probes or Probes()
    frameworks = list(dict.fromkeys(frameworks))
    hardware_profile = _as_mapping(hardware_profile)
    gpu_profile = hardware_profile.get("kind") == "gpu"
    use_cuda = gpu_profile if cuda is None else cuda
    out = _gpus(hardware_profile, tensor_parallel_size, p) if gpu_profile else []
    out += _engines(frameworks, use_cuda, p)
    weights = [w if isinstance(w, Weights) else Weights(w) for w in models]
    weights += [Weights(d.id, d.params, d.dtype) if isinstance(d, DrafterUse) else Weights(d) for d in drafters]
    out += _weights(weights, p)
    out += _drafters([d for d in drafters if isinstance(d, DrafterUse)], p)
    return out


def _as_mapping(profile: Any) -> Mapping[str, Any]:
    """A profile given as a mapping (the YAML's ``profile:``) or an object with those attributes."""
    if isinstance(profile, Mapping):
        return profile
    return {k: getattr(profile, k, None) for k in ("device", "kind", "memory_gb")}


def _gpus(profile: Mapping[str, Any], tp: int, p: Probes) -> list[Missing]:
    want = str(profile.get("device", "an NVIDIA GPU"))
    names = p.gpus()
    how = f"run on a machine with {tp} x {want}, or choose the profile that matches this one (GPU=...)"
    if not names:
        return [Missing("gpu", want, f"the profile needs {tp} x {want}; NVML sees no NVIDIA GPU here", how)]
    out = []
    match = [n for n in names if _same_gpu(want, n)]
    if not match:
        out.append(Missing("gpu", want, f"the profile is for {want}; this machine has {sorted(set(names))}", how))
    if len(match or names) < tp:
        out.append(
            Missing(
                "gpu", f"{tp} GPUs", f"tensor_parallel_size={tp} needs {tp} GPUs; {len(match or names)} match here", how
            )
        )
    return out


def _same_gpu(want: str, have: str) -> bool:
    norm = [s.lower().replace("nvidia", "").replace("-", " ").split() for s in (want, have)]
    return set(norm[0]) <= set(norm[1]) or set(norm[1]) <= set(norm[0])


def _engines(frameworks: list[str], cuda: bool, p: Probes) -> list[Missing]:
    out = []
    try:
        needed = envs.required_engines(frameworks, cuda)
    except ValueError as e:
        return [Missing("engine", ", ".join(frameworks), str(e), "drop the framework from the profile on this machine")]
    to_install = [env for env in needed if not p.installed(env)]
    want = sum(env.disk_gb for env in to_install)
    if want:
        free = p.disk_free(envs.engines_root()) / 1e9
        if free < want * 1.1:
            names = ", ".join(env.name for env in to_install)
            out.append(
                Missing(
                    "disk",
                    str(envs.engines_root()),
                    f"the {names} environment(s) need about {want:.0f} GB, {free:.0f} GB free",
                    f"free disk space or set {envs.ROOT_ENV_VAR} to a larger disk",
                )
            )
    for env in needed:
        make = f"make engine-{env.engine} (python -m specstudy.environments install {env.engine} --{env.build})"
        py = str(envs.python_of(env))
        if not p.installed(env):
            out.append(
                Missing(
                    "engine",
                    f"{env.name} environment",
                    f"{env.engine_requirement} is not installed at {envs.venv_dir(env)}",
                    make,
                )
            )
            continue
        ok, err = p.imports(py, env.engine)
        if not ok:
            out.append(
                Missing(
                    "engine",
                    f"{env.name} environment",
                    f"`{py} -c 'import {env.engine}'` failed: {err}",
                    f"rebuild it: {make} --force",
                )
            )
    binaries = {d.binary.name: d.binary for f, d in DECLARATIONS.items() if f in frameworks and d.binary}
    for name, binary in binaries.items():  # executables the user installs (TensorRT-LLM, MLC-LLM)
        if binary.cuda_only and not cuda:
            why = f"{name} runs on NVIDIA GPUs only: it cannot run here"
            out.append(Missing("engine", name, why, "run its rows on the GPU box"))
        elif not p.which(name):
            out.append(Missing("engine", name, binary.why, binary.hint))
    return out


def _registry_name(name: str) -> bool:
    try:
        get_entry(name)
        return True
    except Exception:
        return False


def _weights(weights: list[Weights], p: Probes) -> list[Missing]:
    out, to_download, seen = [], 0.0, set()
    for w in weights:
        if w.id in seen or Path(w.id).exists() or _registry_name(w.id):
            seen.add(w.id)
            continue
        seen.add(w.id)
        if "/" not in w.id or w.id.startswith((".", "/")):
            out.append(
                Missing("model", w.id, "neither a local path nor a hub id (owner/name)", "fix the id in the profile")
            )
            continue
        if p.cached(w.id):
            continue
        gb = (w.params or 0) * DTYPE_BYTES.get(w.dtype, 2) / 1e9
        to_download += gb
        size = f" (about {gb:.0f} GB)" if gb else ""
        out.append(
            Missing(
                "model",
                w.id,
                f"not in the Hugging Face cache at {p.hf_home()}{size}",
                f"hf download {w.id} (with network; HF_HUB_OFFLINE=1 is set by the Makefile)",
            )
        )
        if w.id.startswith(GATED_PREFIXES) and not p.token():
            out.append(
                Missing(
                    "token",
                    w.id,
                    "a gated repository: downloading it needs an accepted licence and a token",
                    f"accept the licence on the model page of {w.id}, then set HF_TOKEN or run `hf auth login`",
                )
            )
    if to_download:
        free = p.disk_free(p.hf_home()) / 1e9
        if free < to_download * 1.1:
            out.append(
                Missing(
                    "disk",
                    str(p.hf_home()),
                    f"{to_download:.0f} GB of weights to download, {free:.0f} GB free",
                    "free disk space or point HF_HOME at a larger disk",
                )
            )
    return out


def _drafters(drafters: list[DrafterUse], p: Probes) -> list[Missing]:

    out = []
    for d in drafters:
        if not (Path(d.id).exists() or p.cached(d.id)):
            continue  # listed as a missing model above; checked once downloaded
        for fw, method in d.uses:
            try:
                check_drafter(fw, method, d.id)
            except ValueError as e:
                out.append(
                    Missing(
                        "drafter",
                        f"{d.id} ({fw} {method})",
                        str(e),
                        "use a checkpoint in the engine's format, or drop this framework for the row",
                        framework=fw,
                        method=method,
                        drafter=d.id,
                    )
                )
    return out

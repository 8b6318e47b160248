"""The set-up files agree with each other: one set of pins, CI runs the README's command."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _pyproject_pins() -> dict[str, str]:
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    deps = project["dependencies"] + project["optional-dependencies"]["dev"]
    pins = {}
    for d in deps:
        name, _, ver = d.partition("==")
        assert ver, f"{d!r} in pyproject.toml is not pinned with =="
        pins[name.lower()] = ver
    return pins


def test_environment_yml_mirrors_pyproject_pins():
    env = dict(re.findall(r"^\s*- ([A-Za-z0-9_.\-]+)==([^\s]+)$", (ROOT / "environment.yml").read_text(), re.M))
    assert {k.lower(): v for k, v in env.items()} == _pyproject_pins()


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    assert "make test" in readme.split("\n## ")[0], "the README leads with the two commands"
    assert "make study" in readme.split("\n## ")[0]
    assert re.search(r"^make test$", ci, re.M)


def test_test_tools_are_not_runtime_dependencies():
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    runtime = {d.partition("==")[0].lower() for d in project["dependencies"]}
    assert not runtime & {"pytest", "hypothesis", "ruff", "mypy", "pre-commit"}
    assert {"pytest", "hypothesis", "ruff", "mypy"} <= {
        d.partition("==")[0].lower() for d in project["optional-dependencies"]["dev"]
    }

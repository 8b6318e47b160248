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
    first_screen = "\n".join(readme.splitlines()[:25])
    assert "make test" in first_screen and "make study" in first_screen, "the README leads with the two commands"
    assert re.search(r"^make test$", ci, re.M)


def _stale(text: str) -> list[str]:
    """Lines that date (a UTC time, a calendar date) or carry a measured interval: they go stale."""
    pattern = re.compile(r"\d\d:\d\d(:\d\d)? UTC|\b20\d\d-\d\d-\d\d\b|\[\d+(\.\d+)?, \d+(\.\d+)?\]")
    return [line for line in text.splitlines() if pattern.search(line)]


def test_the_readme_guides_and_holds_no_dated_figure():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 200
    assert _stale(readme) == []
    for link in re.findall(r"\]\(((?:docs|bench)/[^)]+)\)", readme):
        assert (ROOT / link).is_file(), link  # every guide it points to exists
    assert _stale("prompt lookup 1.52× [1.01, 2.28] on 2026-12-03 08:42 UTC") != []  # the check can fail


def test_test_tools_are_not_runtime_dependencies():
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    runtime = {d.partition("==")[0].lower() for d in project["dependencies"]}
    assert not runtime & {"pytest", "hypothesis", "ruff", "mypy", "pre-commit"}
    assert {"pytest", "hypothesis", "ruff", "mypy"} <= {
        d.partition("==")[0].lower() for d in project["optional-dependencies"]["dev"]
    }

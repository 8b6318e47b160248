"""A user's own package adds an engine and a reference method through entry points, and the console
script sees both: the package is pip-installed into a fresh venv that sees the kit (no file of the kit
is touched).  One pip install of a two-file package: about 10 s."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import textwrap
import venv
from pathlib import Path

import specstudy

KIT_ROOT = Path(specstudy.__file__).resolve().parents[1]

PYPROJECT = """
[build-system]
requires = ["setuptools"]
build-backend = "setuptools.build_meta"

[project]
name = "my-spec-plugin"
version = "0.1"

[project.entry-points."specstudy.frameworks"]
my-server = "my_spec_plugin.engines:DECLARATIONS"

[project.entry-points."specstudy.methods"]
mine = "my_spec_plugin.methods"

[tool.setuptools]
packages = ["my_spec_plugin", "my_spec_plugin.methods"]
"""

ENGINES = """
from specstudy.frameworks.declaration import EngineDeclaration

DECLARATIONS = (
    EngineDeclaration(
        framework="my-server",
        backend="openai.openai_server:OpenAIBackend",
        methods=("ar", "ngram"),
        method_options={"*": ("ngram_min", "ngram_max")},
        engine_options={"command": None},
        server=True,
        http=True,
        serve_bench=True,
    ),
)
"""

METHOD = """
HEADER = {
    "name": "my_lookup",
    "family": "ngram",
    "order": 99,
    "needs_drafter": False,
    "uses_gamma": True,
    "max_batch": None,
    "options": (),
    "drafts_from": "my own table",
}
"""

PROBE = """
import sys
from specstudy.cli import main
from specstudy.frameworks import DECLARATIONS, drafts_from
print("engines", sorted(DECLARATIONS))
print("reference methods", DECLARATIONS["reference"].methods)
print("drafts from", drafts_from("my_lookup"))
sys.exit(main(["serve-bench", "--help"]))
"""


def _venv_seeing_the_kit(where: Path) -> Path:
    """A fresh venv whose site-packages reach the kit's environment and the kit itself (a .pth file)."""
    venv.create(where, with_pip=False)  # pip and setuptools: the kit environment's, through the .pth below
    py = where / "bin" / "python"
    site = subprocess.run(
        [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    Path(site, "specstudy-kit.pth").write_text(f"{sysconfig.get_paths()['purelib']}\n{KIT_ROOT}\n")
    return py


def test_an_installed_package_adds_an_engine_and_a_method_the_console_script_sees(tmp_path):
    pkg = tmp_path / "plugin"
    (pkg / "my_spec_plugin" / "methods").mkdir(parents=True)
    (pkg / "pyproject.toml").write_text(PYPROJECT)
    (pkg / "my_spec_plugin" / "__init__.py").write_text("")
    (pkg / "my_spec_plugin" / "engines.py").write_text(textwrap.dedent(ENGINES))
    (pkg / "my_spec_plugin" / "methods" / "__init__.py").write_text("")
    (pkg / "my_spec_plugin" / "methods" / "my_lookup.py").write_text(textwrap.dedent(METHOD))
    py = _venv_seeing_the_kit(tmp_path / "venv")
    install = [str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index", str(pkg)]
    done = subprocess.run(install, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]

    env = {**os.environ, "COLUMNS": "400"}  # argparse's help on one line per option
    out = subprocess.run([str(py), "-c", PROBE], capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "'my-server'" in out.stdout and "'my_lookup'" in out.stdout
    assert "drafts from my own table" in out.stdout
    assert "my-server" in out.stdout.split("--backend", 1)[1]  # serve-bench offers the user's server

    # without the package the kit is as before: the entry points are what brought them
    bare = subprocess.run(
        [sys.executable, "-c", "from specstudy.frameworks import DECLARATIONS; print(sorted(DECLARATIONS))"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert "my-server" not in bare.stdout

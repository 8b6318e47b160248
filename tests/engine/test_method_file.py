"""A reference method is one file: its ``HEADER`` is read by the catalogue (no import), so the study's
checks, the plan and the engine all know a method added as a file in a method folder, and nothing
else is edited."""

from __future__ import annotations

import pytest
from support import TinyFactory, run_tiny_study, write_study

from specstudy import frameworks
from specstudy.config import ParamsError, load_study
from specstudy.config.vocab import METHOD_FAMILIES, method_family
from specstudy.frameworks.reference import METHOD_DIRS_ENV, method_headers, read_header
from specstudy.run.plan import check_backends, expand

METHOD = '''"""lookup2: prompt lookup under a name of its own, at most two prompts a batch (a test's method)."""

from __future__ import annotations

from specstudy.engine.methods import EngineMethod, positive_int
from specstudy.engine.methods.ngram import decode

HEADER = {"name": "lookup2", "family": "ngram", "order": 100, "max_batch": 2, "options": ("ngram_max",)}

SPEC = EngineMethod.from_header(HEADER, decode=decode, options={"ngram_max": positive_int})
'''

STUDY = """
study:
  name: one-file
  models:
    - {name: tiny, target: smollm2-135m, dtype: float64}
  methods:
    - {method: ar}
    - {method: lookup2, label: Lookup two, options: {ngram_max: %s}}
  frameworks: [reference]
  tasks: [code]
  gammas: [2]
  batch_sizes: %s
  warmup: {requests: 0}
  max_new_tokens: 4
  prompts_per_task: 2
"""


@pytest.fixture
def lookup2(tmp_path, monkeypatch):
    """``lookup2`` written as one file in a method folder of the test's own."""
    folder = tmp_path / "methods"
    folder.mkdir()
    (folder / "lookup2.py").write_text(METHOD)
    monkeypatch.setenv(METHOD_DIRS_ENV, str(folder))
    frameworks.reload_methods()
    yield folder / "lookup2.py"
    monkeypatch.delenv(METHOD_DIRS_ENV)
    frameworks.reload_methods()


def test_a_method_in_one_file_is_validated_planned_and_run(tmp_path, lookup2):
    decl = frameworks.declaration("reference")
    assert decl.methods[-1] == "lookup2" and decl.method_families["lookup2"] == "ngram"
    assert method_family("lookup2") == "ngram" and "lookup2" not in decl.needs_drafter
    # validated: a bad value and a batch over the header's max_batch are refused before any model loads
    for value, batches, match in (("0", "[1]", "ngram_max=0"), ("2", "[1, 4]", "batch_size=4 > 2")):
        with pytest.raises(ParamsError, match=match):
            check_backends(load_study("cpu", write_study(tmp_path, STUDY % (value, batches), f"bad{value}.yaml")))
    cfg = check_backends(load_study("cpu", write_study(tmp_path, STUDY % ("2", "[1, 2]"))))
    # planned: one AR baseline and one lookup2 cell per batch size
    plans = expand(cfg)
    assert sorted((p.cell.method, p.cell.batch_size) for p in plans) == [
        ("ar", 1),
        ("ar", 2),
        ("lookup2", 1),
        ("lookup2", 2),
    ]
    assert {p.family for p in plans if p.cell.method == "lookup2"} == {"ngram"}
    # run: through the reference backend on the tiny model
    res = run_tiny_study(cfg, plans, tmp_path / "out", TinyFactory())
    assert [r.status for r in res] == ["done"] * 4, [r.message for r in res]


def test_the_catalogue_s_method_facts_are_the_method_files_headers():
    from specstudy.engine.methods import get_method, method_names

    headers = method_headers()
    decl = frameworks.declaration("reference")
    assert list(headers) == list(decl.methods) and decl.methods[0] == "ar"
    assert sorted(headers) == method_names()
    for name, h in headers.items():
        spec = get_method(name)
        assert (spec.name, spec.family, set(spec.options)) == (name, h.family, set(h.options))
        assert (name in decl.needs_drafter) == spec.needs_drafter
    assert METHOD_FAMILIES == ("ar", "draft_target", "ngram", "layer_skip", "heads", "tree")


def test_a_header_that_is_not_a_literal_or_misnamed_is_refused(tmp_path):
    bad = tmp_path / "odd.py"
    bad.write_text('HEADER = {"name": "even", "family": "ngram", "order": 1}\n')
    with pytest.raises(ValueError, match="must be the file's name"):
        read_header(bad)
    bad.write_text('HEADER = {"name": "odd", "family": "ngram", "order": 1, "drafter": True}\n')
    with pytest.raises(ValueError, match=r"\['drafter'\] not allowed"):
        read_header(bad)
    bad.write_text('HEADER = {"name": "odd", "family": "ngram", "order": len("x")}\n')
    with pytest.raises(ValueError):  # not a literal: the catalogue never runs a method file's code
        read_header(bad)


def test_a_spec_that_differs_from_its_header_is_refused(tmp_path, monkeypatch):
    folder = tmp_path / "methods"
    folder.mkdir()
    (folder / "lookup3.py").write_text(
        METHOD.replace("lookup2", "lookup3").replace(
            "SPEC = EngineMethod.from_header(HEADER, ",
            'SPEC = EngineMethod(name="lookup3", family="ngram", max_batch=2, needs_drafter=True, ',
        )
    )
    monkeypatch.setenv(METHOD_DIRS_ENV, str(folder))
    from specstudy.engine.methods import EngineMethod, get_method

    with pytest.raises(TypeError, match="SPEC differs from HEADER"):
        get_method("lookup3")
    with pytest.raises(TypeError, match="option validators"):
        EngineMethod.from_header({"name": "x", "family": "ngram", "order": 1, "options": ("a",)}, decode=len)

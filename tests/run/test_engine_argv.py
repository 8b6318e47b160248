"""§1: the cells of engines with no CPU build are built up to their server argv and, where the engine's
own parser imports here (SGLang's ServerArgs), validated by it; the others say why not.  Never passed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from specstudy.config import load_study
from specstudy.frameworks import DECLARATIONS
from specstudy.run.engine_argv import parse_with_sglang, server_argvs, validate_rows
from specstudy.run.plan import expand
from specstudy.run.rehearsal import rehearsal_study

FIXTURES = Path(__file__).parents[1] / "fixtures" / "model_configs"


@pytest.fixture
def a100(monkeypatch):
    monkeypatch.setenv("SPECSTUDY_MODEL_CONFIGS", str(FIXTURES))
    cfg = load_study("a100", check_tokenizers=False)
    return cfg, expand(cfg)


def test_sglang_argvs_are_the_servers_own_with_the_profiles_options(a100):
    cfg, plans = a100
    argvs = server_argvs(cfg, plans, "sglang")
    assert set(argvs) == {p.cell_id for p in plans if p.cell.framework == "sglang"}
    eagle = next(a for a in argvs.values() if "EAGLE3" in a)
    assert eagle[:2] == ["--model-path", "meta-llama/Llama-3.3-70B-Instruct"]
    assert eagle[eagle.index("--context-length") + 1] == str(cfg.framework_options["sglang"]["max_model_len"])
    assert "{port}" not in " ".join(eagle) and "--tp-size" in eagle


def _rows(cfg):
    from specstudy.config.files import hardware_file, load_yaml

    return rehearsal_study(load_yaml(hardware_file("a100"))["study"])[2]


def test_rows_say_validated_or_refused_by_the_parser_and_never_passed(a100):
    cfg, plans = a100
    rows = _rows(cfg)
    validate_rows(rows, cfg, plans, parse=lambda argvs: dict.fromkeys(argvs))
    sgl = [r for r in rows if r["framework"] == "sglang"]
    assert sgl and all(r["status"].startswith("argv validated by SGLang's parser") for r in sgl)
    assert all("not run: no CPU build" in r["status"] and "(0 cells" not in r["status"] for r in sgl)
    assert any(r["method"] == "ar" for r in sgl)
    others = [r for r in rows if r["framework"] != "sglang"]
    assert all(
        r["status"] == "not rehearsed: no CPU build"
        and r["why"] == DECLARATIONS[r["framework"]].argv_unchecked_why != ""
        for r in others
    )

    def refuse_eagle(argvs):
        return {c: ("unrecognized arguments" if "EAGLE3" in a else None) for c, a in argvs.items()}

    rows = _rows(cfg)
    validate_rows(rows, cfg, plans, parse=refuse_eagle)
    refused = [r for r in rows if r["status"].startswith("argv refused")]
    assert refused and all(r["method"] == "eagle3" for r in refused)
    assert all("cell " in r["status"] and "unrecognized arguments" in r["status"] for r in refused)


def test_without_sglangs_parser_its_rows_stay_not_rehearsed(a100, monkeypatch):
    monkeypatch.delenv("SPECSTUDY_SGLANG_PYTHON", raising=False)
    cfg, plans = a100
    rows = _rows(cfg)
    validate_rows(rows, cfg, plans)
    assert all(r["status"] == "not rehearsed: no CPU build" for r in rows if r["framework"] == "sglang")


@pytest.mark.engines
def test_every_profiles_sglang_argv_parses_with_sglangs_own_parser(monkeypatch):
    """Live: SGLang 0.5.23's ServerArgs parser (SPECSTUDY_SGLANG_PYTHON, SPECSTUDY_SGLANG_PATH: the
    wheel unpacked beside orjson, ipython and traitlets) takes every SGLang cell of every profile,
    and refuses a flag it lacks and an algorithm it does not know."""
    py, path = os.environ.get("SPECSTUDY_SGLANG_PYTHON"), os.environ.get("SPECSTUDY_SGLANG_PATH")
    if not (py and path):
        pytest.skip(
            "SGLang's server_args is not importable here (set SPECSTUDY_SGLANG_PYTHON and SPECSTUDY_SGLANG_PATH)"
        )
    monkeypatch.setenv("SPECSTUDY_MODEL_CONFIGS", str(FIXTURES))
    for gpu in ("a100", "h100", "h200", "rtx4090"):
        cfg = load_study(gpu, check_tokenizers=False)
        argvs = server_argvs(cfg, expand(cfg), "sglang")
        assert argvs and {c: e for c, e in parse_with_sglang(argvs, py, path).items() if e} == {}, gpu
    bad = parse_with_sglang(
        {
            "flag": ["--model-path", "m", "--no-such-flag", "1"],
            "algo": ["--model-path", "m", "--speculative-algorithm", "NOPE"],
        },
        py,
        path,
    )
    assert "unrecognized arguments" in bad["flag"] and "NOPE" in bad["algo"]

"""Shared test set-up: quiet, single-threaded torch on a shared 2-core machine, and shared fixtures."""

import os

import pytest

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture
def study_file(tmp_path):
    """Write a study YAML (the tiny one by default) into the test's folder; returns its path."""
    from support import TINY_STUDY, write_study

    return lambda text=TINY_STUDY, name="tiny.yaml": write_study(tmp_path, text, name)


@pytest.fixture(scope="session")
def report_study(tmp_path_factory):
    """One tiny study run once for every report and notebook test: (outputs/cpu folder, config)."""
    from support import REPORT_STUDY, TinyFactory, run_tiny_study, write_study

    from specstudy.config import load_study
    from specstudy.run.plan import expand

    tmp = tmp_path_factory.mktemp("report")
    cfg = load_study("cpu", write_study(tmp, REPORT_STUDY))
    out = tmp / "outputs" / "cpu"
    res = run_tiny_study(cfg, expand(cfg), out, TinyFactory())
    assert all(r.status == "done" for r in res), [r.message for r in res if r.status != "done"]
    return out


@pytest.fixture
def no_model_work(monkeypatch):
    """Fail the test if it downloads a wheel or loads model weights (validation must do neither)."""
    import transformers

    from specstudy.data import fetch

    def refuse(what):
        def _raise(*args, **kwargs):
            raise AssertionError(f"{what} called during a check that must not load or download anything")

        return _raise

    monkeypatch.setattr(fetch, "pip_download", refuse("pip_download"))
    for cls in (transformers.AutoModelForCausalLM, transformers.AutoModel):
        monkeypatch.setattr(cls, "from_pretrained", refuse(f"{cls.__name__}.from_pretrained"))


@pytest.fixture(autouse=True)
def quiet_machine(request, monkeypatch):
    """Every test reads its records as if measured on a quiet machine: the busy-machine rule and the
    stall rule (both about the machine the tests run on, loaded or not) are out of reach, except in
    tests marked ``validity``, which test those rules themselves."""
    if request.node.get_closest_marker("validity"):
        return
    from specstudy import telemetry
    from specstudy.analysis import validity

    monkeypatch.setattr(validity, "STALL_MIN_EXTRA_S", float("inf"))
    monkeypatch.setattr(validity, "busy_reasons", lambda *a, **k: [])
    monkeypatch.setattr(telemetry, "busy_reasons", lambda *a, **k: [])

"""§1's proof: the h200 rehearsal's reference-engine rows (SpecInfer, Sequoia, the chain, their AR
baselines) run for real on stand-ins of Llama-2-7B and JackFram/llama-68m/-160m, and fail, naming
the cell and the cause, with the N1, N2 or N6 fix reverted one at a time."""

import re
from pathlib import Path

import pytest

from specstudy.config import ParamsProblems, load_study
from specstudy.engine import lean
from specstudy.layout import StudyLayout
from specstudy.run import rehearsal
from specstudy.run.plan import check_backends, expand
from specstudy.run.study_runner import run_study

FIXTURES = Path(__file__).parents[1] / "fixtures" / "model_configs"
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def h200(tmp_path_factory):
    """The h200 rehearsal prepared once: (study file, outputs root); the hub cache restored after."""
    import os

    from huggingface_hub import constants

    saved = {k: os.environ.get(k) for k in ("HF_HUB_CACHE", "HF_HUB_OFFLINE", "SPECSTUDY_MODEL_CONFIGS")}
    cache = constants.HF_HUB_CACHE
    os.environ["SPECSTUDY_MODEL_CONFIGS"] = str(FIXTURES)
    out = tmp_path_factory.mktemp("reh") / "outputs"
    path = rehearsal.prepare("h200", str(out), log=lambda m: None)
    yield path, out
    constants.HF_HUB_CACHE = cache
    for k, v in saved.items():
        os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)


def _run_reference(path, out, name):
    cfg = check_backends(load_study("h200-rehearsal", path, check_tokenizers=False), files=False)
    plans = [p for p in rehearsal.pick(expand(cfg)) if p.cell.framework == "reference"]  # as `run --rehearse`
    assert {p.label for p in plans} >= {"ar", "Sequoia (64-node DP tree; kit's reference engine)"}
    return plans, run_study(cfg, plans, StudyLayout(out / name), progress=False, log=lambda m: None)


def test_the_reference_rows_run_on_stand_ins(h200):
    plans, results = _run_reference(*h200, "ok")
    assert len(results) == len(plans) and all(r.status == "done" for r in results), [r.message for r in results]


def test_a_reference_engine_refusing_hub_ids_fails_naming_cell_and_cause(h200, monkeypatch):
    monkeypatch.setattr("specstudy.config.model.HUB_ID", re.compile(r"(?!)"))  # get_entry refuses hub ids again
    plans, results = _run_reference(*h200, "n1")
    failed = [r for r in results if r.status == "failed"]
    assert failed and len(failed) == len(plans)
    assert all(r.cell_id in {p.cell_id for p in plans} for r in failed)
    assert "model='meta-llama/Llama-2-7b-chat-hf' is not known" in failed[0].message


def test_an_engine_that_holds_its_model_fails_naming_the_engine_and_its_last_cell(h200, monkeypatch):
    init = lean.LeanLlama.__init__

    def holding(self, model, pack=False):
        init(self, model, pack)
        self.model = model  # the value holds its key again

    monkeypatch.setattr(lean.LeanLlama, "__init__", holding)
    plans, results = _run_reference(*h200, "n6")
    leaks = [r for r in results if r.cell_id == "engine_release"]
    assert leaks and all(r.status == "failed" for r in leaks)
    assert re.search(
        r"reference engine of meta-llama/Llama-2-7b-chat-hf \(last cell \S+\): .*still referenced", leaks[0].message
    )


def test_a_context_longer_than_the_model_is_refused_naming_model_and_key(h200):
    path, out = h200
    bad = out / "n2.yaml"
    bad.write_text(Path(path).read_text().replace("max_model_len: 2048", "max_model_len: 4096"))
    with pytest.raises(ParamsProblems) as e:
        check_backends(load_study("h200-rehearsal", bad, check_tokenizers=False), files=False)
    assert (
        "study.framework_options.vllm.max_model_len=4096 is not allowed; allowed: <= 2048 (lmsys/vicuna-33b-v1.3"
        in str(e.value)
    )

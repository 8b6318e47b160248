"""§1: each GPU profile's rehearsal study: the engines with a CPU build keep the profile's rows and
framework options on a small scale, every other row is listed as not rehearsed, every change is
named, and a rehearsal's outputs are marked REHEARSAL on every table and page."""

import json
import os
from pathlib import Path

import pandas as pd
import pytest
import yaml

from specstudy.config import load_study
from specstudy.config.files import hardware_file, load_yaml
from specstudy.layout import REHEARSAL_BANNER, REHEARSAL_MARKER
from specstudy.run.plan import check_backends, expand
from specstudy.run.rehearsal import (
    KEY_FIELDS,
    configuration_key,
    cpu_build,
    hub_ids,
    pick,
    rate_regime,
    rehearsal_study,
    uncovered,
)

FIXTURES = Path(__file__).parents[1] / "fixtures" / "model_configs"


def test_which_engines_have_a_cpu_build():
    assert {f for f in ("reference", "hf", "vllm", "vllm-server", "llamacpp") if cpu_build(f)} == {
        "reference",
        "hf",
        "vllm",
        "vllm-server",
        "llamacpp",
    }
    assert not any(cpu_build(f) for f in ("sglang", "trtllm", "trtllm-engine", "mlc"))


@pytest.mark.parametrize("gpu", ["a100", "h100", "h200", "rtx4090"])
def test_each_profiles_rehearsal_keeps_its_cpu_rows_and_lists_the_rest(gpu, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECSTUDY_MODEL_CONFIGS", str(FIXTURES))
    profile = load_yaml(hardware_file(gpu))["study"]
    small, changes, skipped = rehearsal_study(profile, hardware_file(gpu).parent)
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump({"study": small}))
    cfg = check_backends(load_study(f"{gpu}-rehearsal", path, check_tokenizers=False), files=False)
    plans = expand(cfg)
    full = expand(load_study(gpu, check_tokenizers=False))
    cpu_rows = {(p.cell.framework, p.label, p.target) for p in full if cpu_build(p.cell.framework)}
    assert {(p.cell.framework, p.label, p.target) for p in plans} == cpu_rows  # every CPU row, nothing else
    # the profile's framework options and regimes are the rehearsal's (vLLM's CPU settings added)
    assert cfg.framework_options["vllm"]["max_model_len"] == 2048 and cfg.framework_options["vllm"]["enforce_eager"]
    assert {p.request_rate for p in plans} == {p.request_rate for p in full if cpu_build(p.cell.framework)}
    assert {p.prefix_cache for p in plans} == {p.prefix_cache for p in full if cpu_build(p.cell.framework)}
    assert all(p.tensor_parallel_size == 1 and p.prompts == 2 for p in plans)
    assert {(r["framework"], r["label"]) for r in skipped} >= {(f, "Baseline (AR)") for f in ("sglang", "trtllm")}
    assert all(r["status"] == "not rehearsed: no CPU build" for r in skipped)
    assert any("tensor_parallel_size" in c for c in changes) or gpu == "rtx4090"


def test_rehearsal_tables_and_pages_are_marked(tmp_path):
    from specstudy.report.writer import save_table

    save_table(tmp_path, "plain", pd.DataFrame({"a": [1]}))
    assert "REHEARSAL" not in (tmp_path / "tables" / "plain.md").read_text()
    (tmp_path / REHEARSAL_MARKER).write_text("{}")
    save_table(tmp_path, "t", pd.DataFrame({"a": [1]}))
    assert (tmp_path / "tables" / "t.md").read_text().startswith(f"*{REHEARSAL_BANNER}*")
    assert "REHEARSAL t" in (tmp_path / "tables" / "t.tex").read_text()
    assert list(pd.read_csv(tmp_path / "tables" / "t.csv").columns) == ["a", "rehearsal"]


def _plans(gpu, tmp_path):
    """The profile's cells, and its rehearsal's as `specstudy run --rehearse` picks them."""
    profile = load_yaml(hardware_file(gpu))["study"]
    small, _, _ = rehearsal_study(profile, hardware_file(gpu).parent)
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump({"study": small}))
    rehearsal = expand(check_backends(load_study(f"{gpu}-rehearsal", path, check_tokenizers=False), files=False))
    return expand(load_study(gpu, check_tokenizers=False)), rehearsal


@pytest.mark.parametrize("gpu", ["a100", "h100", "h200", "rtx4090"])
def test_every_distinct_configuration_of_a_profile_is_rehearsed_once(gpu, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECSTUDY_MODEL_CONFIGS", str(FIXTURES))
    full, rehearsal = _plans(gpu, tmp_path)
    picked = pick(rehearsal)
    assert uncovered(full, picked) == []
    keys = [configuration_key(p) for p in picked]
    # one cell per configuration, but for the AR baselines the speculative cells pair with
    spec = [k for p, k in zip(picked, keys, strict=True) if p.baseline_cell_id]
    assert len(spec) == len(set(spec))
    assert {p.baseline_cell_id for p in picked if p.baseline_cell_id} <= {p.cell.cell_id for p in picked}
    assert len(picked) < len(rehearsal)  # the rest are values along axes already rehearsed
    # the profile's real batch sizes, and each configuration at its largest gamma
    assert {p.cell.batch_size for p in picked} == {p.cell.batch_size for p in full if cpu_build(p.cell.framework)}
    for p in picked:
        same = [q.cell.gamma or 0 for q in rehearsal if configuration_key(q) == configuration_key(p)]
        assert (p.cell.gamma or 0) == max(same)
    # a plan that drops one configuration is caught, naming it
    dropped = next(p for p in picked if p.baseline_cell_id)
    assert uncovered(full, [p for p in picked if p is not dropped]) == [configuration_key(dropped)]


def test_the_configuration_key_separates_each_axis(monkeypatch, tmp_path):
    """Each axis of the key alone makes two cells distinct configurations; the task, repeat, exact
    rate and gamma do not."""
    import dataclasses

    monkeypatch.setenv("SPECSTUDY_MODEL_CONFIGS", str(FIXTURES))
    _, rehearsal = _plans("a100", tmp_path)
    p = next(q for q in rehearsal if q.baseline_cell_id and q.request_rate is not None and q.request_rate < 1e9)
    k = configuration_key(p)
    changed = {
        "framework": dataclasses.replace(p, cell=dataclasses.replace(p.cell, framework="hf")),
        "method row": dataclasses.replace(p, label="other"),
        "target": dataclasses.replace(p, target="other/model"),
        "drafter": dataclasses.replace(p, drafter_id="other/head"),
        "method options": dataclasses.replace(p, method_options=(("x", 1),)),
        "batch size": dataclasses.replace(p, cell=dataclasses.replace(p.cell, batch_size=p.cell.batch_size + 1)),
        "rate regime": dataclasses.replace(p, request_rate=None),
        "prefix cache": dataclasses.replace(p, prefix_cache=not p.prefix_cache),
        "sampling": dataclasses.replace(p, sampling=dataclasses.replace(p.sampling, temperature=0.7)),
        "arrivals": dataclasses.replace(p, arrivals="trace"),
        "multi-turn": dataclasses.replace(p, turns=3),
    }
    assert set(changed) == set(KEY_FIELDS)
    assert all(configuration_key(q) != k for q in changed.values())
    same = [
        dataclasses.replace(p, cell=dataclasses.replace(p.cell, task="other", repeat=1, gamma=(p.cell.gamma or 0) + 1)),
        dataclasses.replace(p, request_rate=p.request_rate * 2),
    ]
    assert all(configuration_key(q) == k for q in same)
    assert [rate_regime(r) for r in (None, float("inf"), 0.5)] == ["closed batch", "all at once", "poisson"]


def test_a_rehearsal_without_its_models_configs_is_refused_before_anything_is_built(tmp_path, monkeypatch):
    """A fresh machine with no hub and no configs: every missing model named at once, with both ways to
    get them, and no stand-in written (a head's stand-in used to crash on its target's missing folder)."""
    from specstudy.config.errors import ParamsProblems
    from specstudy.run.rehearsal import hub_ids, missing_configs, prepare

    monkeypatch.setenv("SPECSTUDY_MODEL_CONFIGS", str(tmp_path / "none"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    study = load_yaml(hardware_file("a100"))["study"]
    with pytest.raises(ParamsProblems) as e:
        prepare("a100", str(tmp_path / "out"))
    text = str(e.value)
    assert "meta-llama/Llama-3.3-70B-Instruct" in text and "MODEL_CONFIGS=tests/fixtures/model_configs" in text
    assert "specstudy models configs" in text
    assert not (tmp_path / "out" / "a100-rehearsal" / "standins" / "hub").exists()
    monkeypatch.setenv("SPECSTUDY_MODEL_CONFIGS", str(FIXTURES))
    missing_configs(study)  # with the kit's configs nothing is missing
    assert hub_ids(study)


def test_stand_ins_of_another_recipe_are_rebuilt_with_the_cells_run_on_them(tmp_path, monkeypatch):
    """A rehearsal folder from the 6-layer recipe (whose EAGLE-3 cells died in vLLM) is started again,
    not resumed: its stand-ins and its records are of other models."""
    import huggingface_hub.constants

    from specstudy.run import rehearsal

    monkeypatch.setenv("SPECSTUDY_MODEL_CONFIGS", str(FIXTURES))
    for var in ("HF_HUB_CACHE", "HF_HUB_OFFLINE"):  # prepare() points them at the stand-ins: restored after
        monkeypatch.setenv(var, os.environ.get(var, ""))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", huggingface_hub.constants.HF_HUB_CACHE)
    old = tmp_path / "out" / "rtx4090-rehearsal"
    (old / "standins").mkdir(parents=True)
    (old / "standins" / "built.json").write_text("{}")
    (old / "records").mkdir()
    (old / "records" / "stale.parquet").write_text("")
    built = []
    monkeypatch.setattr(
        rehearsal, "build_standins", lambda study, cache: built.append(cache) or dict.fromkeys(hub_ids(study), [])
    )
    monkeypatch.setattr(rehearsal, "_validate_argvs", lambda gpu, skipped: None)
    rehearsal.prepare("rtx4090", str(tmp_path / "out"), log=lambda m: None)
    assert built and not (old / "records" / "stale.parquet").exists()
    assert (old / "standins" / "recipe.txt").read_text() == rehearsal.STANDIN_RECIPE
    built.clear()
    rehearsal.prepare("rtx4090", str(tmp_path / "out"), log=lambda m: None)  # same recipe: reused
    assert not built


def test_stand_ins_missing_a_model_of_the_profile_are_rebuilt(tmp_path, monkeypatch):
    """Stand-ins built while a drafter's config was missing (its rows then not rehearsed) are built again
    once the config is here, not reused without it (the engine would find no such model in the cache)."""
    import huggingface_hub.constants

    from specstudy.run import rehearsal

    monkeypatch.setenv("SPECSTUDY_MODEL_CONFIGS", str(FIXTURES))
    for var in ("HF_HUB_CACHE", "HF_HUB_OFFLINE"):
        monkeypatch.setenv(var, os.environ.get(var, ""))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", huggingface_hub.constants.HF_HUB_CACHE)
    built: list[list[str]] = []
    monkeypatch.setattr(
        rehearsal, "build_standins", lambda study, cache: built.append(hub_ids(study)) or dict.fromkeys(hub_ids(study))
    )
    monkeypatch.setattr(rehearsal, "_validate_argvs", lambda gpu, skipped: None)
    rehearsal.prepare("h100-1", str(tmp_path / "out"), log=lambda m: None)
    standins = tmp_path / "out" / "h100-1-rehearsal" / "standins" / "built.json"
    every = json.loads(standins.read_text())
    assert "amd/PARD-Llama-3.2-1B" in every
    standins.write_text(json.dumps({k: v for k, v in every.items() if k != "amd/PARD-Llama-3.2-1B"}))
    built.clear()
    said: list[str] = []
    rehearsal.prepare("h100-1", str(tmp_path / "out"), log=said.append)
    assert built == [sorted(every)] and any("amd/PARD-Llama-3.2-1B" in m for m in said)


def test_a_rehearsed_cell_whose_engine_died_fails_the_rehearsal(tmp_path):
    """vLLM's EAGLE-3 cells came back as error records (EngineDeadError) and the rehearsal said
    "0 failed": a rehearsal names every cell with a request that did not come back ok."""
    from types import SimpleNamespace

    from specstudy.commands.run_command import _rehearsal_errors
    from specstudy.layout import StudyLayout
    from specstudy.records import Cell, Request, Sampling

    layout = StudyLayout(tmp_path)
    cells = {ok: Cell("s", "cpu", "vllm", "eagle3", "code", "m", gamma=4, id=f"cell-{ok}") for ok in (True, False)}
    for ok, cell in cells.items():
        recs = [cell.new_record(Request(f"p{i}", "x"), Sampling(), output_tokens=4) for i in range(2)]
        if not ok:
            for r in recs:
                r.status, r.error = "error", "EngineDeadError: EngineCore encountered an issue"
        layout.write_part(cell.id, recs)
    plans = [SimpleNamespace(cell_id=c.id) for c in cells.values()]
    (line,) = _rehearsal_errors(layout, plans)
    assert line.startswith("cell-False: 2 of 2 requests error: EngineDeadError")


def test_suffix_rows_without_arctic_inferences_suffix_tree_are_listed_not_run():
    """vLLM's suffix decoding imports Arctic Inference's suffix tree; where vLLM's Python cannot, the suffix
    rows leave the rehearsal's study (and every sweep naming them) and are listed with why."""
    from specstudy.run.rehearsal import SUFFIX_WHY, without_rows

    study, _, _ = rehearsal_study(load_yaml(hardware_file("h100-1"))["study"])
    assert any(m["method"] == "suffix" for m in study["methods"])
    left, rows = without_rows(study, "suffix", SUFFIX_WHY)
    assert not any(m["method"] == "suffix" for m in left["methods"])
    assert not any("Suffix decoding" in (sw.get("methods") or []) for sw in left["sweeps"].values())
    assert {(r["framework"], r["label"]) for r in rows} == {
        ("vllm", "Suffix decoding"),
        ("vllm-server", "Suffix decoding"),
    }
    assert all("make arctic-inference" in r["status"] for r in rows)
    assert any(m["method"] == "eagle3" for m in left["methods"])  # the other rows stay

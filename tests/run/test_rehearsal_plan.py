"""§1: each GPU profile's rehearsal study: the engines with a CPU build keep the profile's rows and
framework options on a small scale, every other row is listed as not rehearsed, every change is
named, and a rehearsal's outputs are marked REHEARSAL on every table and page."""

from pathlib import Path

import pandas as pd
import pytest
import yaml

from specstudy.config import load_study
from specstudy.config.files import hardware_file, load_yaml
from specstudy.layout import REHEARSAL_BANNER, REHEARSAL_MARKER
from specstudy.run.plan import check_backends, expand
from specstudy.run.rehearsal import cpu_build, rehearsal_study

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

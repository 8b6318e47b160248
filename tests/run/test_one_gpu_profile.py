"""The one-GPU profile (issue 46): its dry run here plans every row with its engine and drafter at
<= 60 predicted minutes on one H100 and prints the cost; `--budget-min` keeps the profile's sweep order
(calibration first) and cuts the rest."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from specstudy.config import load_hardware_profile, load_study
from specstudy.run import dryrun
from specstudy.run.plan import expand

FIXTURES = Path(__file__).parents[1] / "fixtures" / "model_configs"


def _dry(*extra: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SPECSTUDY_MODEL_CONFIGS": str(FIXTURES), "SPECSTUDY_ENGINES_PYTHON": ""}
    cmd = [sys.executable, "-m", "specstudy.cli", "run", "--hardware", "h100-1", "--dry-run", "--json", *extra]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)


@pytest.fixture(scope="module")
def doc():
    r = _dry()
    assert r.returncode == 0, r.stderr[-2000:]
    assert "amd/PARD-Llama-3.2-1B" not in r.stderr  # every drafter checked against its config (PARD's pard_token)
    return json.loads(r.stdout)


def test_the_whole_profile_fits_an_hour_on_one_h100_and_says_its_cost(doc):
    total = doc["duration"][-1]
    assert total["sweep"] == "TOTAL" and 0 < total["predicted_minutes"] <= 60
    assert doc["cost"]["gpus"] == 1
    assert doc["cost"]["usd"] == pytest.approx(total["predicted_minutes"] / 60 * 3.5, abs=0.01)
    assert [r["sweep"] for r in doc["duration"]][0] == "calibration"


def test_every_row_is_planned_with_its_engine_and_drafter(doc):
    rows = {(b["framework"], b["method"], b["drafter"]) for b in doc["breakdown"]}
    for want in [
        ("vllm", "EAGLE-3 (chain)", "RedHatAI/Llama-3.1-8B-Instruct-speculator.eagle3"),
        ("vllm", "EAGLE-3 (chain)", "RedHatAI/Qwen3-8B-speculator.eagle3"),
        ("vllm", "DFlash", "z-lab/Qwen3-8B-DFlash-b16"),
        ("vllm", "PARD", "amd/PARD-Llama-3.2-1B"),
        ("vllm", "MTP", ""),
        ("vllm", "Suffix decoding", ""),
        ("vllm", "Draft model", "meta-llama/Llama-3.2-1B-Instruct"),
        ("hf", "HF assisted (heuristic schedule)", "meta-llama/Llama-3.2-1B-Instruct"),
        ("sglang", "DFlash", "z-lab/Qwen3-8B-DFlash-b16"),
        ("vllm-server", "EAGLE-3 (vLLM γ per batch size)", "RedHatAI/Llama-3.1-8B-Instruct-speculator.eagle3"),
        ("sglang", "EAGLE-3 tree (SGLang top-k 4; 16 tokens)", "RedHatAI/Llama-3.1-8B-Instruct-speculator.eagle3"),
        ("trtllm", "EAGLE-3 (chain)", "RedHatAI/Llama-3.1-8B-Instruct-speculator.eagle3"),
        ("sglang", "EAGLE-3 (SGLang adaptive steps)", "RedHatAI/Llama-3.1-8B-Instruct-speculator.eagle3"),
        ("trtllm", "EAGLE-3 (TensorRT-LLM draft_len_schedule)", "RedHatAI/Llama-3.1-8B-Instruct-speculator.eagle3"),
    ]:
        assert want in rows, want
    assert all(m["fits"] for m in doc["memory_fit"])


def test_each_engine_schedule_has_fixed_gamma_beside_it_at_every_batch_size(doc):
    """The engines' own schedules are measured at batch 1, 4, 16 and 64 beside the same engine's fixed γ (the
    report's table needs both at one load), and vLLM's at request rates too."""
    cells = doc["breakdown"]
    for fw, schedule in [
        ("vllm-server", "EAGLE-3 (vLLM γ per batch size)"),
        ("sglang", "EAGLE-3 (SGLang adaptive steps)"),
        ("trtllm", "EAGLE-3 (TensorRT-LLM draft_len_schedule)"),
    ]:
        for method in (schedule, "EAGLE-3 (chain)"):
            batches = {int(b["batch"]) for b in cells if b["framework"] == fw and b["method"] == method}
            assert {1, 4, 16, 64} <= batches, (fw, method, batches)
    rates = {b["rate"] for b in cells if b["method"] == "EAGLE-3 (vLLM γ per batch size)"} - {None, "—"}
    assert len(rates) == 3


def test_a_budget_keeps_the_calibration_and_cuts_in_order():
    cfg = load_study("h100-1", check_tokenizers=False)
    plans = expand(cfg)
    prof = load_hardware_profile("h100-1", measure=False)
    kept, cut = dryrun.within_budget(cfg, plans, prof, 30)
    names = [s.name for s in cfg.sweeps]
    assert kept[0] == "calibration" and kept + cut == names and cut
    assert dryrun.within_budget(cfg, plans, prof, 60) == (names, [])
    assert dryrun.within_budget(cfg, plans, prof, 0.1) == ([], names)
    r = _dry("--budget-min", "30")
    assert r.returncode == 0 and f"cut (predicted past the budget) {cut}" in r.stderr
    assert json.loads(r.stdout)["duration"][-1]["predicted_minutes"] <= 30

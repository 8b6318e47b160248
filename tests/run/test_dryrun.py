"""`specstudy run --dry-run` for every profile on any machine: no engine, no network, and a plan a user
can size a rental with (cells, predicted minutes, memory fit, what this machine lacks).  How fast it
answers (the promised < 5 s) is measured by bench/dryrun.py (`make bench-dryrun`), not asserted here."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from specstudy import costmodel
from specstudy.config import hardware_names, load_hardware_profile, load_study
from specstudy.config.vocab import cost_dtype
from specstudy.run import dryrun
from specstudy.run.plan import check_backends, expand

GPU_PROFILES = [h for h in hardware_names() if load_hardware_profile(h, measure=False).kind == "gpu"]


@pytest.mark.parametrize("hw", hardware_names())
def test_every_profile_dry_runs_offline_without_engine_environments(hw, tmp_path):
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "",
        "HF_HOME": str(tmp_path / "hf"),
        "PATH": os.environ["PATH"],
        # no engine environments here: the dry run must not need them
        "SPECSTUDY_ENGINES_PYTHON": "",
    }
    r = subprocess.run(
        [sys.executable, "-m", "specstudy.cli", "run", "--hardware", hw, "--dry-run", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads(r.stdout)
    assert doc["validated_in_s"] >= 0 and doc["cells"] > 0  # the validation time is reported (its size: the bench)
    assert {"duration", "breakdown", "memory_fit", "missing_on_this_machine", "prediction_note"} <= set(doc)
    total = doc["duration"][-1]
    assert total["sweep"] == "TOTAL" and total["cells"] == doc["cells"] and total["predicted_minutes"] > 0
    assert "prediction" in doc["prediction_note"]
    assert sum(b["cells"] for b in doc["breakdown"]) == doc["cells"]
    assert all(m["fits"] in (True, False, None) for m in doc["memory_fit"])
    if hw in GPU_PROFILES:  # this machine has no NVIDIA GPU and no engine environments: warnings, not errors
        kinds = {m["kind"] for m in doc["missing_on_this_machine"]}
        assert "gpu" in kinds and "engine" in kinds


def test_markdown_names_each_part(capsys):
    from specstudy.cli import main

    assert main(["run", "--hardware", "h200", "--dry-run"]) == 0
    out = capsys.readouterr().out
    for head in ("## Predicted duration", "## Cells", "## Memory fit per model pair", "## What this machine lacks"):
        assert head in out
    assert "| TOTAL |" in out and "prediction" in out


def test_estimates_follow_the_cost_model():
    cfg = check_backends(load_study("a100"), files=False)
    plans = expand(cfg)
    prof = load_hardware_profile("a100", measure=False)
    base = next(p for p in plans if p.is_baseline and p.cell.batch_size == 1)
    pair = next(m for m in cfg.models if m.target == base.target)
    params, dt = pair.params["target"], cost_dtype(pair.dtype, pair.quantization)
    t1 = costmodel.step_time(params, prof, dt, 1, 1, base.tensor_parallel_size)
    pre = costmodel.step_time(params, prof, dt, 1, dryrun.PROMPT_TOKENS, base.tensor_parallel_size)
    want = base.prompts * (pre + base.sampling.max_new_tokens * t1)
    assert dryrun.estimate_cell(cfg, base, prof).seconds == pytest.approx(want)
    spec = next(p for p in plans if not p.is_baseline and p.cell.batch_size == 1 and p.family == "ngram")
    assert dryrun.estimate_cell(cfg, spec, prof).seconds < dryrun.estimate_cell(cfg, base, prof).seconds * 1.5
    # the 70B pair in bf16 over 4 GPUs fits; the KV estimate grows with batch x length
    fit = [r for r in dryrun.memory_fit(cfg, plans, prof) if r["target"].endswith("70b-chat-hf")]
    assert fit and all(r["fits"] and r["tensor_parallel_size"] == 4 for r in fit)
    assert dryrun.kv_bytes_per_token(7e9, "bf16") == 2 * 32 * 4096 * 2


def test_a_rerun_re_renders_the_notebooks_when_the_plan_changed(tmp_path, study_file):
    """The notebooks' make targets depend on the records stamp: a rerun that changes only the plan
    (here the study's SLO, which the report reads from it) must touch it; an identical rerun not."""
    import os

    from support import TINY_STUDY

    from specstudy.cli import main

    def run(text: str) -> float:
        path = study_file(text)
        assert (
            main(
                [
                    "run",
                    "--hardware",
                    "cpu",
                    "--params",
                    str(path),
                    "--outputs",
                    str(tmp_path),
                    "--max-cells",
                    "0",
                    "--no-progress",
                ]
            )
            == 0
        )
        return (tmp_path / "cpu" / ".records-updated").stat().st_mtime_ns

    first = run(TINY_STUDY)
    os.utime(tmp_path / "cpu" / ".records-updated", ns=(first - 10**9, first - 10**9))
    assert run(TINY_STUDY) == first - 10**9  # the same plan, no new records: nothing to re-render
    assert run(TINY_STUDY + "  slo: {tpot_ms: 250}\n") > first - 10**9


def test_the_h200_profile_plans_the_seeds_specinfer_and_sequoia_rows():
    """On the reference engine (the kit's implementation of each), a 7B target with the papers' small drafts."""
    from specstudy.config import load_study
    from specstudy.run.plan import expand

    plans = [p for p in expand(load_study("h200")) if "tree_shapes" in p.sweeps]
    methods = {(p.cell.framework, p.cell.method) for p in plans}
    assert {("reference", "specinfer"), ("reference", "sequoia"), ("reference", "ar")} <= methods
    assert all(p.target == "meta-llama/Llama-2-7b-chat-hf" for p in plans)
    assert {p.drafter_id for p in plans if p.cell.method == "specinfer"} == {"JackFram/llama-68m+JackFram/llama-160m"}
    assert all("kit's reference engine" in p.label for p in plans if p.cell.method != "ar")


def test_the_dry_run_plans_the_deployment_decisions():
    """Every GPU profile plans capacity probes under its SLO, γ buckets with repeats, the JSON-schema task on an
    engine that combines it with speculation, NVML energy and its dated price;
    the CPU profile plans RAPL and says it has no price."""
    from specstudy.config import load_hardware_profile, load_study
    from specstudy.run.dryrun import deployment_plan

    for hw in ("a100", "h100", "h200", "rtx4090"):
        rows = deployment_plan(load_study(hw, check_tokenizers=False), load_hardware_profile(hw, measure=False), 2)
        by = {(r["decision"], r["sweep"]): r["plan"] for r in rows}
        assert "2 search round(s); SLO p90 TPOT ≤ 50 ms" in by[("capacity under the SLO", "capacity")], hw
        assert "3 repeat(s)" in by[("γ per load", "gamma_load")]
        assert by[("structured outputs", "structured")] == "task json_extract: vllm-server combines it with speculation"
        assert "NVML" in by[("energy per token", "every cell")]
        # every GPU profile carries a dated price (the RTX 4090's a marketplace's own, dated to the day)
        price = "2026-05-25" if hw == "rtx4090" else "2026-05"
        assert price in by[("cost per token", "every cell")], hw
    rows = deployment_plan(load_study("cpu", check_tokenizers=False), load_hardware_profile("cpu", measure=False))
    decisions = {r["decision"] for r in rows}
    assert "capacity under the SLO" not in decisions and "structured outputs" not in decisions  # none planned there
    assert any("RAPL" in r["plan"] for r in rows) and any("no price stated" in r["plan"] for r in rows)

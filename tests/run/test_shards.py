"""Shards: one engine each, every speculative cell beside its baseline, sized by the predicted minutes;
the cluster settings checked all at once; the a100 dry run's shard table."""

from __future__ import annotations

import pytest
from support import TINY_STUDY, write_study

from specstudy.cli import main
from specstudy.config import ParamsProblems, load_hardware_profile, load_study
from specstudy.config.cluster import ClusterSpec, load_cluster, parse_sbatch
from specstudy.run.dryrun import estimate_cell
from specstudy.run.plan import expand
from specstudy.run.shards import engine_of, plan_shards

#: the tiny study with a parameter count, so the cost model predicts every cell (on the cpu profile)
PRICED = TINY_STUDY.replace(
    "{name: tiny, target: smollm2-135m, dtype: float64}",
    "{name: tiny, target: smollm2-135m, dtype: float64, params: {target: 134515008}}",
)


def _check_shards(plans, shards):
    assert sorted(c for s in shards for c in s.cell_ids) == sorted(p.cell_id for p in plans)  # each cell once
    for s in shards:
        assert len({engine_of(p) for p in s.plans}) == 1
        ids = s.cell_ids
        for i, p in enumerate(s.plans):
            if p.baseline_cell_id:  # its baseline in the same shard, before it
                assert p.baseline_cell_id in ids[:i]


def test_shards_keep_pairs_and_engines_together_and_fit_the_time_limit(tmp_path):
    cfg = load_study("cpu", write_study(tmp_path, PRICED))
    plans, prof = expand(cfg), load_hardware_profile("cpu", measure=False)
    secs = [estimate_cell(cfg, p, prof).seconds for p in plans]
    assert all(s and s > 0 for s in secs)
    one = plan_shards(cfg, plans, prof, ClusterSpec(time_limit_min=600))
    assert len(one) == 1
    _check_shards(plans, one)
    # a budget of one pairing group's worth: the study splits, never a pair
    biggest = max(s.predicted_s for s in plan_shards(cfg, plans, prof, ClusterSpec(time_limit_min=600)))
    fill = 0.999 * biggest / 60 / 600 / 3
    tight = plan_shards(cfg, plans, prof, ClusterSpec(time_limit_min=600, shard_fill=fill))
    assert len(tight) >= 3
    _check_shards(plans, tight)
    assert all(s.predicted_s <= 600 * 60 * fill for s in tight)
    assert [s.name for s in tight] == [
        s.name for s in plan_shards(cfg, plans, prof, ClusterSpec(time_limit_min=600, shard_fill=fill))
    ]


def test_a_pairing_group_longer_than_the_time_limit_is_refused_naming_the_limit_needed(tmp_path):
    cfg = load_study("cpu", write_study(tmp_path, PRICED))
    plans, prof = expand(cfg), load_hardware_profile("cpu", measure=False)
    with pytest.raises(ParamsProblems) as e:
        plan_shards(cfg, plans, prof, ClusterSpec(time_limit_min=1, shard_fill=1e-9))
    assert "cluster.time_limit_min=1" in str(e.value) and "cannot be split" in str(e.value)


def test_a_model_needing_more_gpus_than_a_node_has_is_refused(tmp_path):
    cfg = load_study("a100")
    plans = expand(cfg)
    prof = load_hardware_profile("a100", measure=False)
    with pytest.raises(ParamsProblems) as e:
        plan_shards(cfg, plans, prof, ClusterSpec(gpus_per_node=2))
    assert "cluster.gpus_per_node=2" in str(e.value) and "at least 4" in str(e.value)
    shards = plan_shards(cfg, plans, prof, ClusterSpec(gpus_per_node=4))
    assert {s.gpus for s in shards} == {1, 4}
    _check_shards(plans, shards)


def test_cluster_settings_list_every_problem_at_once(tmp_path):
    f = tmp_path / "s.yaml"
    f.write_text(
        TINY_STUDY + "cluster:\n  time_limit_min: 0\n  gpus_per_node: -1\n  sbatch: {time: '10'}\n  colour: red\n"
    )
    sbatch, problems = parse_sbatch(["qos=high", "nonsense"])
    with pytest.raises(ParamsProblems) as e:
        load_cluster(f, {"partition": "", "sbatch": sbatch, "_problems": problems})
    text = str(e.value)
    for bad in (
        "cluster.time_limit_min=0",
        "cluster.gpus_per_node=-1",
        "cluster.sbatch.time",
        "colour",
        "cluster.partition=''",
        "--sbatch='nonsense'",
    ):
        assert bad in text, (bad, text)
    assert text.startswith("6 problems")


def test_command_line_values_override_the_profile(tmp_path):
    f = tmp_path / "s.yaml"
    f.write_text(TINY_STUDY + "cluster: {partition: cpu, time_limit_min: 30, sbatch: {qos: low}}\n")
    spec = load_cluster(f, {"time_limit_min": 90, "account": "lab", "sbatch": {"qos": "high"}})
    params = spec.submitit_parameters()
    assert params["slurm_partition"] == "cpu" and params["timeout_min"] == 90 and params["slurm_account"] == "lab"
    assert params["slurm_additional_parameters"] == {"qos": "high"}


def test_dry_run_prints_the_a100_shards_with_resources_and_predicted_minutes(capsys):
    assert main(["run", "--hardware", "a100", "--dry-run", "--executor", "slurm"]) == 0
    out = capsys.readouterr().out
    table = out.split("## Shards", 1)[1].split("##", 1)[0]
    rows = [r for r in table.splitlines() if r.startswith("| s0")]
    assert len(rows) >= 2
    head = [c.strip() for c in table.splitlines()[2].strip("|").split("|")]
    for col in ("shard", "framework", "model", "cells", "predicted_minutes", "gpus", "cpus", "time_limit_min"):
        assert col in head
    cells = [dict(zip(head, (c.strip() for c in r.strip("|").split("|")))) for r in rows]
    assert all(0 < float(c["predicted_minutes"]) <= 240 * 0.7 for c in cells)
    assert {c["gpus"] for c in cells} == {"1", "4"}
    total = sum(int(c["cells"]) for c in cells)
    assert f"{total} cells" in out
    # a time limit from the command line re-sizes them
    assert main(["run", "--hardware", "a100", "--dry-run", "--executor", "slurm", "--time-limit", "120"]) == 0
    more = [r for r in capsys.readouterr().out.split("## Shards", 1)[1].splitlines() if r.startswith("| s0")]
    assert len(more) > len(rows)

"""Input-length tiers with a random-token control, entropy tiers of the target's own entropy, and
SPEED-Bench's documented schema read from a local file: prompts of exact lengths from any source,
per-tier α, AL and speedup in a study on the reference engine's tiny model."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from support import LLAMACPP, ByteIds, TinyFactory, byte_tokenizer, run_study_file, write_study_file, write_task

from specstudy.analysis import tiers as tier_analysis
from specstudy.analysis.claims import compare
from specstudy.analysis.study_records import load as load_outputs
from specstudy.config import ParamsError
from specstudy.config.task import load_task_config
from specstudy.data.fetch import sha256_file
from specstudy.data.tasks import load_requests
from specstudy.report.workload import tiers_section

FIXTURE = Path(__file__).parents[1] / "fixtures" / "speed_bench" / "qualitative.jsonl"
TEXTS = [
    {"id": f"t{i}", "text": f"Note {i}: the council met on Thursday and voted to open the river path."}
    for i in range(6)
]


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECSTUDY_CACHE", str(tmp_path / "cache"))


def tier_task(folder: Path, tokens=(16, 40), random_control=True) -> Path:
    tiers = {"input_tokens": list(tokens), "random_control": random_control}
    return write_task(folder, TEXTS, {"id": "id", "text": "text"}, name="tiered", category="tiers", tiers=tiers)


def test_tiers_have_exact_lengths_and_a_random_twin_without_special_tokens(tmp_path):
    tok = byte_tokenizer()
    reqs = load_requests(load_task_config(tier_task(tmp_path, (30, 100))), n=8, tokenizer=tok)
    assert [r.input_policy for r in reqs[:4]] == ["tier:30", "tier:30:random", "tier:100", "tier:100:random"]
    assert [len(r.prompt_ids) for r in reqs] == [30, 30, 100, 100] * 2
    real = reqs[2]
    assert real.source == "tiered" and reqs[3].source == "random"
    joined = tok("\n\n".join(t["text"] for t in TEXTS) * 3, add_special_tokens=False)["input_ids"]
    assert all(i in joined for i in real.prompt_ids)  # real text: only ids the sources' text has
    rnd = reqs[3].prompt_ids
    assert not set(rnd) & set(tok.all_special_ids) and len(set(rnd)) > 30  # uniform over the vocabulary
    again = load_requests(load_task_config(tier_task(tmp_path, (30, 100))), n=8, tokenizer=tok)
    assert [r.prompt_ids for r in again] == [r.prompt_ids for r in reqs]  # seeded: the same every run
    assert reqs[0].prompt_id != reqs[4].prompt_id and reqs[0].prompt_ids != reqs[4].prompt_ids


def test_tiers_need_the_targets_tokenizer_and_refuse_a_trace(tmp_path):
    task = load_task_config(tier_task(tmp_path))
    with pytest.raises(ParamsError) as e:
        load_requests(task, n=2)
    assert e.value.key == "tiers" and "tokenizer" in str(e.value.allowed)
    raw = yaml.safe_load((tmp_path / "tiered.yaml").read_text())
    raw["trace"] = {"path": "t.jsonl", "sha256": "0" * 64, "format": "mooncake"}
    (tmp_path / "tiered.yaml").write_text(yaml.safe_dump(raw))
    with pytest.raises(ParamsError) as e:
        load_task_config(tmp_path / "tiered.yaml")
    assert "tiers" in e.value.key


def test_a_tiered_study_reports_alpha_and_speedup_per_tier_beside_random_tokens(tmp_path):
    task = tier_task(tmp_path)
    ngram = {"method": "ngram", "label": "Prompt lookup", "options": {"ngram_min": 1}}
    path = write_study_file(tmp_path, [task], methods=[{"method": "ar"}, ngram], prompts_per_task=20)
    res, recs, out = run_study_file(path, TinyFactory(tokenizer=ByteIds()))
    assert [r.status for r in res] == ["done", "done"], [r.message for r in res]
    assert sorted({(r.input_policy, r.input_tokens) for r in recs}) == [
        ("tier:16", 16),
        ("tier:16:random", 16),
        ("tier:40", 40),
        ("tier:40:random", 40),
    ]
    study_ = load_outputs(out)
    raw = tier_analysis.tier_frame(study_)
    assert sorted(zip(raw["input_tokens"], raw["prompts"])) == [
        (16, "random"),
        (16, "real"),
        (40, "random"),
        (40, "real"),
    ]
    assert set(raw["n_prompts"]) == {5} and raw["speedup"].notna().all()
    over = tier_analysis.random_overstatement(raw)
    assert list(over["input_tokens"]) == [16, 40]
    assert over["ratio"].tolist() == pytest.approx((over["random"] / over["real"]).tolist())
    for _, row in over.iterrows():  # each verdict is the two rows' intervals compared, random expected above
        for what in ("speedup", "alpha"):
            rnd, real = row[f"random_{what}"], row[f"real_{what}"]
            assert row[f"{what}_verdict"] == compare(rnd, real, "above")
            if rnd.ci[0] > real.ci[1]:
                assert row[f"{what}_verdict"] == "observed"
    ent = tier_analysis.entropy_tier_frame(study_)  # thirds of the 20 prompts by the AR output's entropy
    assert list(ent["entropy_tier"]) == ["low", "mixed", "high"] and sum(ent["n_prompts"]) == 20
    means = {}
    for r in recs:
        if r.method == "ar":
            means[r.prompt_id] = sum(r.token_entropy) / len(r.token_entropy)
    tiers_of = tier_analysis.entropy_terciles([r for r in recs if r.method == "ar"])
    low = [means[p] for (_, p), t in tiers_of.items() if t == "low"]
    high = [means[p] for (_, p), t in tiers_of.items() if t == "high"]
    assert max(low) <= min(high)
    sec = tiers_section(study_)
    assert sec is not None and {"input_length_tiers", "random_control", "entropy_tiers"} <= set(sec.tables)


def test_speed_bench_schema_reads_a_local_file_with_its_categories_and_turns(tmp_path):
    cfg = {
        "category": "speed_bench_coding",
        "chat_template": False,
        "turns": "all",
        "sources": [
            {
                "name": "speed",
                "kind": "file",
                "schema": "speed_bench",
                "path": str(FIXTURE),
                "sha256": sha256_file(FIXTURE),
                "licence": "test fixture in SPEED-Bench's schema (written for the kit)",
                "where": {"category": ["coding"]},
                "template": "[{sub_category}/{difficulty}] {text}",
            }
        ],
    }
    p = tmp_path / "speed.yaml"
    p.write_text(yaml.safe_dump(cfg, sort_keys=False))
    reqs = load_requests(load_task_config(p), n="all")
    by = {r.prompt_id: r for r in reqs}
    assert sorted(by) == ["speed:q-code-1", "speed:q-code-2", "speed:q-code-3"]
    assert by["speed:q-code-1"].prompt == "[python/easy] Write a Python function that reverses a list."
    assert by["speed:q-code-1"].later_turns == ("Now make it work on strings too.",)
    assert by["speed:q-code-2"].later_turns == ()


@pytest.mark.slow
def test_llamacpp_decodes_tiers_of_exact_lengths_beside_random_tokens(tmp_path, monkeypatch):
    """The tiers' token ids reach a kit-started llama.cpp server as they are (its own prompt count
    equals the tier), real and random prompts alike, each paired with AR on the same ids."""
    monkeypatch.delenv("SPECSTUDY_CACHE")  # the target's tokenizer from the kit's own cache
    task = tier_task(tmp_path, (64, 256))
    path = write_study_file(
        tmp_path,
        [task],
        gammas=[4],
        max_new_tokens=12,
        prompts_per_task=8,
        **LLAMACPP,
    )
    res, recs, out = run_study_file(path)
    assert [r.status for r in res if r.cell_id != "engine_costs"] == ["done", "done"], [r.message for r in res]
    assert len(recs) == 16 and all(r.status == "ok" for r in recs), [r.error for r in recs]
    for r in recs:
        tier = int(r.input_policy.split(":")[1])
        t = r.extra["llamacpp_timings"]
        assert r.input_tokens == tier == t["prompt_n"] + t["cache_n"], (r.prompt_id, r.input_tokens, t)
    raw = tier_analysis.tier_frame(load_outputs(out))
    assert sorted(zip(raw["input_tokens"], raw["prompts"])) == [
        (64, "random"),
        (64, "real"),
        (256, "random"),
        (256, "real"),
    ]
    assert set(raw["n_prompts"]) == {2} and raw["speedup"].notna().all()

"""Claims computed from the data: the report's sentences say what the intervals show, including the reverse
of the seed's expectation, "cannot tell" and "n too small", on records built so that each case happens."""

from __future__ import annotations

import math

import pytest

from specstudy.analysis import claims, faq, stats
from specstudy.analysis.claims import Estimate
from specstudy.analysis.rows import hardware_rows
from specstudy.analysis.study_records import load
from specstudy.layout import StudyLayout
from specstudy.records import Cell, Request, Sampling
from specstudy.report import fails, sections, summary, wording
from specstudy.report.wording import estimate_text

NAN = math.nan
MB = 1e6
#: a fixed ±3 % wobble per prompt, so every interval is narrow but not degenerate
WOBBLE = (0.02, -0.03, 0.01, 0.03, -0.02, 0.0, -0.01, 0.025, -0.015, 0.005)


# ---------------------------------------------------------------------------------------------
# the pure verdicts


def test_verdict_against_a_threshold():
    up = Estimate(1.3, (1.2, 1.4), 8)
    assert claims.verdict(up, 1.0, "above") == claims.OBSERVED
    assert claims.verdict(up, 1.0, "below") == claims.REVERSED
    assert claims.verdict(Estimate(1.02, (0.97, 1.08), 8), 1.0, "below") == claims.CANNOT_TELL
    assert claims.verdict(Estimate(1.3, (1.2, 1.4), 3), 1.0, "above") == claims.N_TOO_SMALL  # n < 5: no interval
    assert claims.verdict(Estimate(1.3, (NAN, NAN), 8), 1.0, "above") == claims.N_TOO_SMALL


def test_two_rows_are_compared_by_their_intervals():
    short, long = Estimate(1.24, (1.11, 1.35), 8), Estimate(1.04, (0.98, 1.10), 8)
    assert claims.compare(short, long, "below") == claims.REVERSED
    assert claims.compare(long, short, "below") == claims.OBSERVED
    assert claims.compare(short, Estimate(1.2, (1.1, 1.3), 8), "below") == claims.CANNOT_TELL
    assert claims.overlap(short, long) is False and claims.overlap(short, Estimate(1.2, (1.1, 1.3), 8)) is True
    assert claims.compare(short, Estimate(1.0, (0.9, 1.1), 4), "below") == claims.N_TOO_SMALL
    assert "conservative" in wording.phrase(claims.CANNOT_TELL, rows=2)


def test_phrases_name_the_verdict():
    assert wording.phrase(claims.OBSERVED) == "as the seed expects (observed in this study)"
    assert wording.phrase(claims.REVERSED) == "the reverse of the seed's expectation (observed in this study)"
    assert "contains 1×: no difference resolvable" in wording.phrase(claims.CANNOT_TELL)
    assert "n = 3 prompts" in wording.phrase(claims.N_TOO_SMALL, n=3)
    assert wording.versus(Estimate(1.02, (0.97, 1.08), 8)).startswith("no difference from AR resolvable")
    assert wording.versus(Estimate(0.8, (0.7, 0.9), 8)).startswith("slower than AR")
    with pytest.raises(ValueError):
        wording.phrase("maybe")


def test_memory_within_the_noise_is_not_a_signed_number():
    text = wording.memory_text(-12.5 * MB, 16.5 * MB, "RSS")
    assert text == "no difference resolvable: |Δ| ≤ 16.5 MB (RSS)" and "-12.5" not in text
    assert wording.memory_text(500 * MB, 16.5 * MB, "RSS").startswith("+500.0 MB (beyond")
    assert claims.resolved(-40 * MB, 16.5 * MB) == claims.REVERSED


def test_a_memory_difference_that_prints_as_large_as_its_noise_is_a_tie_worded_in_mb():
    """+50.24 MB against ±50.21 MB printed "+50.2 MB (beyond the ±50.2 MB noise)"."""
    assert claims.memory_verdict(50.24 * MB, 50.21 * MB) == claims.CANNOT_TELL
    assert wording.memory_text(50.24 * MB, 50.21 * MB, "RSS") == "no difference resolvable: |Δ| ≤ 50.2 MB (RSS)"
    assert claims.memory_verdict(50.4 * MB, 50.21 * MB) == claims.OBSERVED  # 50.4 > 50.2 as printed
    tie = wording.memory_phrase(claims.CANNOT_TELL, 16.5 * MB)
    assert tie == "no difference beyond the ±16.5 MB noise: this study cannot tell" and "1×" not in tie


def test_divergences_in_words():
    near = {"task": "code", "prompt_id": "code/3", "repeat": 0, "position": 17, "margin": 0.012}
    far = {"task": "chat", "prompt_id": "7", "repeat": 1, "position": 2, "margin": 2.5}
    blind = {"task": "code", "prompt_id": "code/1", "repeat": 0, "position": 5, "margin": NAN}
    text = wording.divergence_text([near, far, blind])
    assert "prompt code/3 (repeat 0) first differs at output position 17 (margin +0.012 nats)" in text
    assert "prompt chat/7" in text and "not a near-tie" in text and "verification needs checking" in text
    assert "a near-tie flip from batched numerics is not a verification bug, but the reader must be told" in text
    assert "the engine gives no log-probabilities" in text
    assert text.index("chat/7") < text.index("code/1") < text.index("code/3")  # the least explicable first


# ---------------------------------------------------------------------------------------------
# synthetic studies: records written so that the seed's expectation is reversed, absent or unresolvable


def _write(lay, cid, method, label, times, *, base=None, fw="reference", batch=1, mnt=32, gamma=2, **kw):
    """One cell: a request per prompt taking ``times[i]`` seconds, α = 0.6, greedy unless ``temperature``."""
    cell = Cell(
        study="s",
        hardware="synthetic",
        framework=fw,
        method=method,
        task="code",
        model="m",
        drafter=kw.pop("drafter", None),
        gamma=None if method == "ar" else gamma,
        batch_size=batch,
        id=cid,
    )
    outputs, logprobs = kw.pop("outputs", {}), kw.pop("logprobs", None)
    peaks, src = kw.pop("peaks", None), kw.pop("memory_source", "rss_peak")
    spec = method != "ar"
    recs = []
    for i, t in enumerate(times):
        recs.append(
            cell.new_record(
                Request(f"code/{i}", ""),
                Sampling(temperature=kw.get("temperature", 0.0), max_new_tokens=mnt),
                output_tokens=mnt,
                first_token_s=0.05,
                end_s=float(t),
                start_epoch=1000.0 + 100 * i,
                output_ids=outputs.get(i, list(range(mnt))),
                target_logprobs=logprobs(i) if logprobs else None,
                drafted_tokens=10 if spec else None,
                accepted_tokens=6 if spec else None,
                draft_steps=5 if spec else None,
                peak_memory_bytes=int(peaks[i]) if peaks is not None else None,
                memory_source=src if peaks is not None else None,
                label=label,
                family=method,
                sweeps=["hardware"],
                baseline_cell_id=base,
            )
        )
    lay.write_part(cid, recs)


def _times(n, speedup, base=1.0, mnt=32):
    """(baseline, speculative) per-prompt seconds with the given speedup and a small per-prompt wobble."""
    b = [base * mnt / 32 * (1 + 0.1 * i) for i in range(n)]
    return b, [x / speedup * (1 + WOBBLE[i % len(WOBBLE)]) for i, x in enumerate(b)]


def _pair(lay, name, label, n, speedup, method="ngram", **kw):
    """An AR cell and a speculative cell on the same prompts."""
    b, s = _times(n, speedup, mnt=kw.get("mnt", 32))
    ar_kw = {k: v for k, v in kw.items() if k in ("fw", "batch", "mnt", "peaks_base", "temperature")}
    peaks_base = ar_kw.pop("peaks_base", None)
    _write(lay, f"{name}_ar", "ar", "AR", b, peaks=peaks_base, **ar_kw)
    kw.pop("peaks_base", None)
    _write(lay, f"{name}_spec", method, label, s, base=f"{name}_ar", **kw)


@pytest.fixture
def lay(tmp_path):
    return StudyLayout(tmp_path / "synthetic")


def _report(study):
    return sections.when_it_fails_section(study).markdown, summary.summary_markdown(study, hardware_rows(study))


def test_short_outputs_faster_than_long_read_as_reversed(lay):
    _pair(lay, "long", "Prompt lookup", 8, 1.04)
    _pair(lay, "long2", "Early exit", 8, 1.5, method="layer_skip")  # 32 stays the headline length
    _pair(lay, "short", "Prompt lookup", 8, 1.24, mnt=8)
    study = load(lay.root)
    (claim,) = [c for c in fails.short_claims(study) if c.startswith("Prompt lookup")]
    es = Estimate.of(stats.pooled(study, ["short_spec"]))
    el = Estimate.of(stats.pooled(study, ["long_spec"]))
    assert es.value > el.value and es.ci[0] > el.ci[1]  # the synthetic data do what the test says
    assert f"here 8 tokens gave {estimate_text(es)} vs {estimate_text(el)} at 32" in claim
    assert claim.endswith("the reverse of the seed's expectation (observed in this study)")
    md, summ = _report(study)
    assert claim[1:] in md and "little decode time" not in md
    assert "Short outputs (FAQ Q4 (3)): Prompt lookup" in summ and "the reverse of the seed's expectation" in summ


def test_batch_speedup_rising_with_batch_reads_as_reversed(lay):
    _pair(lay, "b1", "Prompt lookup", 8, 1.03)
    _pair(lay, "b2", "Prompt lookup", 8, 1.39, batch=2)
    study = load(lay.root)
    (claim,) = fails.batch_claims(study)
    e1, e2 = (Estimate.of(stats.pooled(study, [c])) for c in ("b1_spec", "b2_spec"))
    assert (
        f"batch 2 gave {estimate_text(e2)} vs {estimate_text(e1)} at batch 1: the reverse of the seed's expectation"
        in claim
    )
    assert "At batch 2, the largest measured: faster than AR (interval above 1×)" in claim
    md, summ = _report(study)
    assert "verification turns compute-bound as batch" not in summ  # the hand-written claim is gone
    assert "Batch (FAQ Q4 (1))" in summ and "the reverse of the seed's expectation" in summ
    assert claim[1:] in md


def test_an_interval_crossing_one_cannot_tell(lay):
    _pair(lay, "flat", "Prompt lookup", 8, 1.0)
    _pair(lay, "flat2", "Prompt lookup", 8, 1.0, batch=2)
    study = load(lay.root)
    e = Estimate.of(stats.pooled(study, ["flat_spec"]))
    assert e.ci[0] < 1.0 < e.ci[1]
    (claim,) = fails.batch_claims(study)
    assert "the intervals overlap, so this study cannot tell (overlap is a conservative test" in claim
    assert "no difference from AR resolvable (interval contains 1×)" in claim
    _, summ = _report(study)
    assert f"Prompt lookup (γ=2) at {estimate_text(e)} over its paired AR baseline" in summ
    assert "no difference from AR resolvable (interval contains 1×)" in summ.split("**When")[0]


def test_n_too_small_is_said_and_no_winner_crowned_from_it(lay):
    _pair(lay, "few", "Prompt lookup", 3, 1.5)
    _pair(lay, "few2", "Prompt lookup", 3, 1.2, mnt=8)
    _pair(lay, "few3", "Early exit", 3, 1.1, method="layer_skip")  # 32 stays the headline length
    study = load(lay.root)
    (claim,) = fails.short_claims(study)
    assert "(n too small)" in claim and "n too small for an interval (n = 3 prompts; an interval needs ≥ 5)" in claim
    (best,) = summary.best_per_framework(hardware_rows(study))
    assert "none of its 2 rows at batch 1 has ≥ 5 paired prompts (n too small), so no best method is named" in best


def test_low_alpha_that_does_not_lose_reads_as_reversed(lay):
    _pair(lay, "lo", "Prompt lookup", 8, 1.3)
    study = load(lay.root)
    for r in study.records["lo_spec"]:
        r.accepted_tokens = 2  # α = 0.2 < 0.4, still faster than AR
    pc = faq.per_cell_acceptance(study)
    (claim,) = fails.low_alpha_claims(study, pc)
    e = Estimate.of(stats.pooled(study, ["lo_spec"]))
    assert (
        f"the 1 such cells pooled gave {estimate_text(e)} over 8 prompts: the reverse of the seed's expectation"
        in claim
    )
    assert "1 faster" in claim
    assert fails.low_alpha(study, pc).iloc[0].iloc[4] == "0 / 0 / 1 / 0"


def test_greedy_divergence_is_named_with_prompt_position_and_margin(lay):
    b, s = _times(6, 1.2)
    _write(lay, "ar", "ar", "AR", b, logprobs=lambda i: [-0.5] * 32)
    flipped = list(range(32))
    flipped[4] = 99
    # the target's log p of AR's token at position 4 is -0.5, of the speculative one -0.51: a near-tie
    lp = {i: [-0.5] * 32 for i in range(6)}
    lp[2][4] = -0.51
    _write(lay, "spec", "ngram", "Prompt lookup", s, base="ar", outputs={2: flipped}, logprobs=lambda i: lp[i])
    _write(lay, "cpp_ar", "ar", "AR", b, fw="llamacpp")
    _write(lay, "cpp", "ngram", "Prompt lookup", s, base="cpp_ar", fw="llamacpp", outputs={0: flipped, 3: flipped})
    _write(lay, "same", "layer_skip", "Early exit", s, base="ar")  # matches AR token for token
    study = load(lay.root)
    assert stats.pooled(study, ["spec"]).quality.exact_match == pytest.approx(5 / 6)
    lines = summary.divergences(study)
    ref = next(line for line in lines if line.startswith("- **reference**"))
    assert "1 of 6 paired greedy outputs differ" in ref
    assert "prompt code/2 (repeat 0, batch 1) first differs at output position 4 (margin +0.010 nats)" in ref
    assert "a near-tie flip from batched numerics is not a verification bug, but the reader must be told" in ref
    cpp = next(line for line in lines if line.startswith("- **llamacpp**"))
    assert "2 of 6 paired greedy outputs differ" in cpp and "prompt code/0" in cpp and "prompt code/3" in cpp
    assert "the engine gives no log-probabilities, so whether they were near-ties is unknown" in cpp
    assert lines[-1] == "- The other 6 paired greedy speculative outputs matched their AR baseline token for token."
    assert "**Greedy outputs against their AR baseline**" in summary.summary_markdown(study, hardware_rows(study))


def test_negative_memory_overhead_within_noise_is_unresolvable(lay):
    base = [1000 * MB + x * MB for x in (0, 4, 2, 6, 1, 3)]  # the baseline's own peaks spread 6 MB
    _pair(lay, "hf", "Prompt lookup", 6, 1.1, fw="hf", peaks_base=base, peaks=[p - 16.5 * MB for p in base])
    _pair(
        lay,
        "dt",
        "Draft model",
        6,
        1.1,
        method="draft_target",
        drafter="small",
        peaks_base=base,
        peaks=[p + 500 * MB for p in base],
    )
    study = load(lay.root)
    assert stats.pooled(study, ["hf_spec"]).cost.memory_overhead_bytes == pytest.approx(-16.5 * MB)
    table, _ = fails.memory_overhead(study)
    row = table.set_index("Method").loc["Prompt lookup"]
    assert row["Memory overhead (measured, largest over cells)"] == "no difference resolvable: |Δ| ≤ 16.5 MB (RSS)"
    text = "\n".join(fails.memory_claims(study))
    assert "-16.5" not in text and "−16.5" not in text
    assert "as the seed expects of a method without a draft model (within the noise)" in text
    assert "Draft model (reference): +500.0 MB (beyond the ±16.5 MB noise of RSS)" in text
    assert "expects a draft model or heads to cost memory: as the seed expects (observed in this study)" in text


def test_best_method_among_rows_with_enough_prompts_names_runner_up_and_overlap(lay):
    _pair(lay, "a", "Prompt lookup", 8, 1.5)
    _pair(lay, "b", "Early exit", 8, 1.45, method="layer_skip")
    _pair(lay, "c", "Token tree", 3, 3.0, method="tree")  # fastest, but on 3 prompts: not eligible
    _pair(lay, "t", "Prompt lookup", 8, 2.0, temperature=0.7)  # another sampling: ranked on its own
    study = load(lay.root)
    lines = summary.best_per_framework(hardware_rows(study))
    greedy, sampled = lines
    ea, eb = (Estimate.of(stats.pooled(study, [c])) for c in ("a_spec", "b_spec"))
    assert greedy.startswith("- **reference**, greedy: the fastest of 2 rows at batch 1 with ≥ 5 paired prompts")
    assert f"is Prompt lookup (γ=2) at {estimate_text(ea)}" in greedy and "faster than AR (interval above 1×)" in greedy
    assert f"Runner-up: Early exit (γ=2) at {estimate_text(eb)}; the two intervals overlap" in greedy
    assert "The best of 2 noisy rows is biased upward" in greedy
    assert "1 row with fewer than 5 prompts not considered" in greedy and "Token tree" not in greedy
    assert sampled.startswith("- **reference**, T=0.7: the fastest of 1 row")


def test_loading_results_never_measures_this_machine(lay, monkeypatch):
    """A folder without a saved profile gets the profile file's own figures, not a measurement here."""
    import specstudy.config.hardware as hardware

    def no_measure():
        raise AssertionError("loading a finished study measured the machine")

    monkeypatch.setattr(hardware, "measure_cpu", no_measure)
    _pair(lay, "ngram", "Prompt lookup", 4, 1.5)
    lay.write_plan({"hardware": "cpu"})  # a shipped profile that measures itself when a study runs
    assert not lay.profile_path.exists()
    study = load(lay.root)
    assert study.records and study.profile is not None and study.profile.name == "cpu"


@pytest.mark.validity
def test_a_flagged_baseline_is_named_marked_and_its_rows_left_out_of_the_summary(lay):
    """The issue's case: AR measured while another study ran beside it (load 3.4 on 2 cores) made a
    9.33x speedup; the report names the cell, marks both rows and takes the best method from the rest."""
    _pair(lay, "quiet", "Prompt lookup", 8, 1.2)
    _pair(lay, "busy", "Early exit", 8, 9.33, method="layer_skip")
    recs = lay.read_part("busy_ar")
    for r in recs:
        r.extra.update(tel_cpu_cores=2, tel_load_1m_mean=3.4, tel_cpu_steal_mean_pct=3.0)
    lay.write_part("busy_ar", recs)
    study = load(lay.root)
    assert study.flags == {"busy_ar": (("busy machine", False),), "busy_spec": (("busy machine", True),)}
    secs = {s.title: s for s in sections.report_sections(study)}
    assert list(secs)[:2] == ["Summary", "Measurement validity"]  # the body: the summary, then one line
    line = secs["Measurement validity"].markdown
    assert "**2 of 4 cells are flagged** (baseline busy machine; busy machine)" in line and "(#validity)" in line
    valid = secs["Validity"].markdown
    assert "**2 of 4 cells are flagged** (1 by their own checks, 1 through their AR baseline)" in valid
    assert (
        "busy_ar" in valid
        and "load 3.40 on 2 cores (above 2.5 while the cell ran)" in valid
        and "load 3.40 (max" in valid
    )
    summ = secs["Summary"].markdown
    assert summ.startswith("_2 flagged cells left out of every line below (baseline busy machine; busy machine)")
    assert "Prompt lookup (γ=2)" in summ and "Early exit" not in summ and "9.3" not in summ
    hw = next(s for t, s in secs.items() if t.startswith("Headline table"))
    shown = hw.tables["hardware"][0].set_index("Method")
    assert set(shown.index) == {"Early exit ⚑", "Baseline (AR) ⚑", "Prompt lookup"}  # the AR row pools both baselines


@pytest.mark.validity
def test_a_study_with_no_flag_says_so_and_leaves_nothing_out(lay):
    _pair(lay, "quiet", "Prompt lookup", 8, 1.2)
    study = load(lay.root)
    assert study.flags == {} and study.findings == []
    secs = {s.title: s for s in sections.report_sections(study)}
    assert "No cell of 2 is flagged." in secs["Validity"].markdown
    hw = next(s for t, s in secs.items() if t.startswith("Headline table"))
    assert not secs["Summary"].markdown.startswith("_") and "⚑" not in hw.markdown


def _entropy_study(lay, tasks, prompts):
    """AR and prompt lookup on ``prompts`` prompts of each task, the AR outputs' entropy rising by prompt."""
    for task in tasks:
        for method, cid in (("ar", f"{task}_ar"), ("ngram", f"{task}_spec")):
            cell = Cell("s", "synthetic", "reference", method, task, "m", gamma=None if method == "ar" else 2, id=cid)
            recs = [
                cell.new_record(
                    Request(f"{task}/{i}", ""),
                    Sampling(max_new_tokens=8),
                    output_tokens=8,
                    first_token_s=0.05,
                    end_s=(1.0 if method == "ar" else 0.8) * (1 + WOBBLE[i % len(WOBBLE)]),
                    token_entropy=[0.1 * i] * 8,
                    drafted_tokens=None if method == "ar" else 10,
                    accepted_tokens=None if method == "ar" else 6,
                    draft_steps=None if method == "ar" else 5,
                    label="Prompt lookup" if method != "ar" else "AR",
                    sweeps=["hardware"],
                    baseline_cell_id=None if method == "ar" else f"{task}_ar",
                )
                for i in range(prompts)
            ]
            lay.write_part(cid, recs)
    return load(lay.root)


def test_entropy_tiers_too_small_per_task_are_pooled_over_tasks_or_left_out_with_one_line(lay, tmp_path):
    from specstudy.analysis import tiers
    from specstudy.report.workload import tiers_section

    study = _entropy_study(lay, ["code", "chat", "qa"], 6)  # 2 prompts a tier per task, 6 over the 3 tasks
    assert (tiers.entropy_tier_frame(study)["n_prompts"] < 5).all()
    shown, how = tiers.entropy_tiers_shown(study)
    assert how == "pooled" and set(shown["task"]) == {"all tasks"}
    assert list(shown["n_prompts"]) == [6, 6, 6]
    sec = tiers_section(study)
    assert "pooled over each method's tasks" in sec.markdown and "n too small" not in sec.markdown

    few = _entropy_study(StudyLayout(tmp_path / "few"), ["code"], 6)
    shown, how = tiers.entropy_tiers_shown(few)
    assert shown.empty and how == "left out"
    sec = tiers_section(few)
    assert sec.tables == {} and sec.markdown.strip() == (
        "Entropy tiers left out: every tier, per task and pooled over tasks, holds fewer than 5 prompts "
        "(n too small for an interval)."
    )


def test_entropy_tiers_with_enough_prompts_per_task_stay_per_task(lay):
    from specstudy.analysis import tiers

    shown, how = tiers.entropy_tiers_shown(_entropy_study(lay, ["code", "chat"], 15))
    assert how == "per task" and set(shown["task"]) == {"code", "chat"} and (shown["n_prompts"] == 5).all()


@pytest.mark.validity
def test_a_study_whose_every_row_is_flagged_names_no_best_method_and_keeps_its_caveats(lay):
    _pair(lay, "busy", "Prompt lookup", 8, 9.33)
    recs = lay.read_part("busy_ar")
    for r in recs:
        r.extra.update(tel_cpu_cores=2, tel_load_1m_mean=4.1)
    lay.write_part("busy_ar", recs)
    secs = {s.title: s for s in sections.report_sections(load(lay.root))}
    summ = secs["Summary"].markdown
    assert "- every speculative row is flagged (see Validity): no best method is named" in summ
    assert "no FAQ Q4 case is decided" in summ and "9.3" not in summ.split("**Caveats**")[0]
    assert "- Sampling: greedy, identical" in summ and "n: 8–8 distinct paired prompts" in summ


@pytest.mark.validity
def test_strata_tables_mark_the_rows_that_pool_a_flagged_cell(lay):
    from specstudy.analysis import tiers
    from specstudy.report.strata_tables import entropy_tier_table

    _entropy_study(lay, ["code", "chat"], 15)
    recs = lay.read_part("chat_ar")
    for r in recs:
        r.extra.update(tel_cpu_cores=2, tel_load_1m_mean=4.1)
    lay.write_part("chat_ar", recs)
    table = entropy_tier_table(tiers.entropy_tiers_shown(load(lay.root))[0])
    marked = dict(zip(table["Task"] + " " + table["Entropy tier (AR output terciles)"], table["Method"]))
    assert marked["chat low"] == "Prompt lookup γ=2 ⚑" and marked["code low"] == "Prompt lookup γ=2"

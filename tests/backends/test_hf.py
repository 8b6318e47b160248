"""HF transformers backend: per-step counts from the candidate-generator hook are consistent.

Tiny random Llama models (no download); greedy decoding, so every method must return the AR
tokens, and drafted/accepted/emitted must add up to what generate() returned.
"""

import pytest
import torch

from specstudy import metrics
from specstudy.backends import get_backend
from specstudy.data.model_files import tiny_model
from specstudy.records import Cell, Request, Sampling

torch.set_num_threads(1)

PROMPTS = [
    Request("rep", "", prompt_ids=(3, 7, 8, 9, 10, 7, 8, 9, 10, 7, 8, 9, 11, 12, 7, 8)),
    Request("mix", "", prompt_ids=(5, 6, 5, 6, 20, 21, 5, 6, 22)),
]
SAMPLING = Sampling(max_new_tokens=17)


@pytest.fixture(scope="module")
def backend():
    target = tiny_model(seed=1, dtype="float64", logit_scale=8.0, num_layers=3)
    drafter = tiny_model(seed=2, dtype="float64", logit_scale=8.0)
    return get_backend("hf", model="tiny", model_obj=target, drafter_obj=drafter)


def cell(method, gamma=None, batch=1, **opts):
    return Cell(
        "t", "cpu", "hf", method, "adhoc", "tiny", gamma=gamma, batch_size=batch, options=tuple(sorted(opts.items()))
    )


@pytest.fixture(scope="module")
def ar_outputs(backend):
    return {r.prompt_id: r.output_ids for r in backend.run(PROMPTS, SAMPLING, cell("ar"))}


@pytest.mark.parametrize(
    "method, gamma, opts",
    [("ngram", 3, {"ngram_max": 2}), ("draft_target", 3, {}), ("layer_skip", 2, {"exit_layer": 1}), ("ar", None, {})],
)
def test_counts_consistent_and_lossless(backend, ar_outputs, method, gamma, opts):
    recs = list(backend.run(PROMPTS, SAMPLING, cell(method, gamma, **opts)))
    for r in recs:
        assert r.status == "ok", r.error
        assert r.output_ids == ar_outputs[r.prompt_id]  # greedy: identical to AR
        assert r.output_tokens == 17 == sum(s.emitted for s in r.steps) == sum(r.chunk_tokens)
        assert r.target_forwards == len(r.steps) and r.drafted_tokens == sum(s.drafted for s in r.steps)
        assert r.accepted_tokens == sum(s.accepted for s in r.steps)
        for s in r.steps:
            assert s.drafted <= (gamma or 0) and s.emitted <= s.accepted + 1
            assert s.emitted == s.accepted + 1 or s is r.steps[-1]  # only the last step can be cut
        assert r.first_token_s == r.chunk_times_s[0] <= r.end_s
        assert [s.t_s for s in r.steps] == sorted(s.t_s for s in r.steps)
        assert r.extra["batching"].startswith("sequential")
    s = metrics.acceptance_summary(recs)
    if method == "ar":
        assert s["tokens_per_forward"] == 1.0 and recs[0].drafted_tokens == 0 and s["draft_steps"] == 0
    else:
        assert 1.0 <= s["acceptance_length"] <= gamma + 1
        assert s["tokens_per_forward"] == pytest.approx(
            sum(r.output_tokens for r in recs) / sum(len(r.steps) for r in recs)
        )
        assert recs[0].drafts_per_position is not None


def test_draft_target_drafts_gamma_every_step(backend):
    """The constant schedule (set on the assistant's generation_config) is in force."""
    r = next(backend.run(PROMPTS[:1], SAMPLING, cell("draft_target", 4)))
    done = 0
    for s in r.steps:  # γ per step, fewer only where the max_new_tokens budget caps the draft
        assert s.drafted == min(4, SAMPLING.max_new_tokens - done - 1)
        done += s.emitted
    assert (
        backend.drafter.generation_config.num_assistant_tokens_schedule != "constant"
        or backend.drafter.generation_config.num_assistant_tokens != 4
    )  # restored after the run


def test_prompt_lookup_finds_the_repeated_ngram(backend):
    r = next(backend.run(PROMPTS[:1], SAMPLING, cell("ngram", 3, ngram_max=2)))
    assert r.drafted_tokens > 0 and r.steps[0].drafted > 0  # the prompt repeats 7 8 9: lookup drafts at once


def test_ignore_eos_generates_max_new_tokens():
    target = tiny_model(seed=3, dtype="float64")
    b = get_backend("hf", model="tiny", model_obj=target)
    free = next(b.run(PROMPTS[:1], Sampling(max_new_tokens=6), cell("ar"))).output_ids
    eos = free[2]  # make the third generated token the EOS token
    target.config.eos_token_id = target.generation_config.eos_token_id = eos
    kept = next(b.run(PROMPTS[:1], Sampling(max_new_tokens=6), cell("ar")))
    stopped = next(b.run(PROMPTS[:1], Sampling(max_new_tokens=6, ignore_eos=False), cell("ar")))
    assert kept.output_ids == free and kept.output_tokens == 6
    assert stopped.output_ids == free[: free.index(eos) + 1]


def test_bad_cells_fail_before_decoding(backend):
    with pytest.raises(ValueError, match="batch size 1 only"):
        next(backend.run(PROMPTS, SAMPLING, cell("ngram", 3, batch=2)))
    with pytest.raises(ValueError, match="tree"):
        next(backend.run(PROMPTS, SAMPLING, cell("tree", 3)))
    with pytest.raises(ValueError, match="exit_layer"):
        next(backend.run(PROMPTS, SAMPLING, cell("layer_skip", 2)))
    with pytest.raises(ValueError, match="gamma"):
        next(backend.run(PROMPTS, SAMPLING, cell("ngram", None)))
    with pytest.raises(ValueError, match="dtype"):
        get_backend("hf", model="tiny", model_obj=object(), dtype="float7")


def test_text_prompt_without_tokenizer_is_an_error_record(backend):
    r = next(backend.run([Request("t", "plain text")], SAMPLING, cell("ar")))
    assert r.status == "error" and "tokenizer" in r.error


def test_sampling_runs_and_counts_stay_consistent(backend):
    recs = list(
        backend.run(
            PROMPTS, Sampling(max_new_tokens=12, temperature=0.8, top_p=0.9, top_k=20, seed=3), cell("draft_target", 3)
        )
    )
    for r in recs:
        assert r.output_tokens == 12 == sum(s.emitted for s in r.steps)
        assert all(0 <= s.accepted <= s.drafted for s in r.steps)


@pytest.mark.slow
def test_hf_prompt_lookup_agrees_with_reference_ngram_on_default_model():
    """Same greedy prompts, same n-gram rule (n = 2..1, γ = 4): identical tokens and identical
    per-step (drafted, accepted) except where the engines differ by design — HF already drafts
    from the prompt in its prefill pass (the reference's first step is the plain prefill), and HF
    does not shorten drafts near the max_new_tokens budget (the reference does)."""
    from specstudy.data import model_files, tasks

    tok = model_files.load_tokenizer("smollm2-135m")
    reqs = tasks.load_requests("code", n=2, tokenizer=tok)
    sampling, gamma = Sampling(max_new_tokens=40), 4
    opts = (("ngram_max", 2), ("ngram_min", 1))
    ref = get_backend("reference", model="smollm2-135m")
    ref_recs = list(
        ref.run(
            reqs, sampling, Cell("t", "cpu", "reference", "ngram", "code", "smollm2-135m", gamma=gamma, options=opts)
        )
    )
    ref.close()
    hf = get_backend("hf", model="smollm2-135m")
    hf_recs = list(
        hf.run(reqs, sampling, Cell("t", "cpu", "hf", "ngram", "code", "smollm2-135m", gamma=gamma, options=opts))
    )
    compared = 0
    for a, b in zip(ref_recs, hf_recs):
        assert a.status == b.status == "ok"
        assert a.output_ids == b.output_ids
        assert a.target_forwards == b.target_forwards
        assert (a.steps[0].drafted, a.steps[0].emitted) == (0, 1) and b.steps[0].emitted == 1
        done = 1
        for sa, sb in zip(a.steps[1:], b.steps[1:]):
            if sampling.max_new_tokens - done >= gamma + 1:
                assert (sa.drafted, sa.accepted, sa.emitted) == (sb.drafted, sb.accepted, sb.emitted)
                compared += 1
            done += sa.emitted
    assert compared >= 10

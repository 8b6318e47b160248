"""The reference backend over tiny models: records, batching, statuses, option checks."""

import pytest
import torch

from specstudy import metrics
from specstudy.backends import get_backend
from specstudy.backends.reference.reference_backend import ReferenceBackend
from specstudy.data.model_files import tiny_model
from specstudy.records import Cell, Request, Sampling

torch.set_num_threads(1)

REQS = [
    Request(f"p{i}", "", prompt_ids=tuple(p))
    for i, p in enumerate([[1, 2, 3, 4, 1, 2, 3], [7, 8, 9], [4, 4, 4, 4, 5], [2, 3]])
]
S = Sampling(temperature=0.0, max_new_tokens=10)


def cell(method, gamma=None, batch=1, drafter=None, **options):
    return Cell(
        study="t",
        hardware="cpu",
        framework="reference",
        method=method,
        task="adhoc",
        model="tiny",
        drafter=drafter,
        gamma=gamma,
        batch_size=batch,
        options=tuple(sorted(options.items())),
    )


@pytest.fixture(scope="module")
def backend():
    b = ReferenceBackend(tiny_model(seed=0, num_layers=3, logit_scale=8.0))
    b._drafters[("draft_target", "small")] = tiny_model(seed=1, num_layers=1, logit_scale=8.0)
    return b


def test_registry_builds_the_reference_backend():
    b = get_backend("reference", model=tiny_model(seed=0))
    assert b.framework == "reference" and "ngram" in b.methods


def test_records_for_every_method_and_batch_size(backend):
    base = list(backend.run(REQS, S, cell("ar")))
    assert [r.status for r in base] == ["ok"] * 4
    assert all(r.output_tokens == 10 and r.target_forwards == 10 for r in base)
    for c in [
        cell("ngram", 3, batch=2, ngram_max=2),
        cell("draft_target", 3, batch=3, drafter="small"),
        cell("layer_skip", 2, batch=4, exit_layer=1),
        cell("ar", batch=4),
    ]:
        recs = list(backend.run(REQS, S, c))
        assert metrics.exact_match_rate(base, recs) == 1.0, c
        for r in recs:
            assert r.method == c.method and r.batch_size == c.batch_size and r.cell_id == c.cell_id
            assert r.first_token_s is not None and r.end_s >= r.first_token_s > 0
            assert r.peak_memory_bytes and r.memory_source in ("module_bytes+transient_rss", "rss_peak_lifetime")
            assert r.drafted_tokens == sum(s.drafted for s in r.steps)
            assert len(r.token_entropy) == len(r.target_logprobs) == r.output_tokens
        summ = metrics.acceptance_summary(recs)
        assert summ["tokens_per_forward"] == pytest.approx(
            sum(r.output_tokens for r in recs) / sum(r.target_forwards for r in recs)
        )
        draft_steps = sum(1 for r in recs for s in r.steps if s.drafted > 0)
        if draft_steps:  # AL: the tokens one draft step yields, 1 + accepted / draft steps
            assert summ["acceptance_length"] == pytest.approx(1 + sum(r.accepted_tokens for r in recs) / draft_steps)


def test_bad_method_and_options_fail_before_decoding(backend):
    with pytest.raises(ValueError, match="allowed"):
        list(backend.run(REQS, S, cell("speculative-magic", 3)))
    with pytest.raises(ValueError, match="option 'ngram_size'"):
        list(backend.run(REQS, S, cell("ngram", 3, ngram_size=3)))
    with pytest.raises(ValueError, match="needs a drafter"):
        list(backend.run(REQS, S, cell("draft_target", 3)))


def test_a_failing_batch_becomes_error_records(backend):
    bad = [Request("ok", "", prompt_ids=(1, 2)), Request("bad", "", prompt_ids=(1, 10_000))]  # id > vocab
    recs = list(backend.run(bad, S, cell("ar", batch=2)))
    assert [r.status for r in recs] == ["error", "error"] and "Error" in recs[0].error


def test_constructor_checks_names_before_loading():
    with pytest.raises(ValueError, match="allowed"):
        ReferenceBackend("no-such-model")
    with pytest.raises(ValueError, match="dtype"):
        ReferenceBackend(tiny_model(), dtype="int3")
    with pytest.raises(ValueError, match="option 'flash' is read by no code; reference reads"):
        ReferenceBackend(tiny_model(), flash=True)


def test_drafter_with_another_tokenizer_is_refused_before_loading(monkeypatch):
    import specstudy.data.model_files as models

    def no_load(*a, **k):
        raise AssertionError("must not load a model")

    monkeypatch.setattr(models, "load_model", no_load)
    with pytest.raises(ValueError, match="tokenizer"):
        ReferenceBackend("smollm2-135m", drafter="qwen2.5-coder-0.5b")


def test_int8_draft_changes_the_draft_not_the_output():
    b = ReferenceBackend(tiny_model(seed=0, num_layers=3, logit_scale=8.0, dtype="float32"))
    small = tiny_model(seed=1, num_layers=1, logit_scale=8.0, dtype="float32")
    b._drafters[("draft_target", "small")] = small
    base = list(b.run(REQS, S, cell("ar")))
    fp32 = list(b.run(REQS, S, cell("draft_target", 3, drafter="small")))
    int8 = list(b.run(REQS, S, cell("draft_target", 3, drafter="small", draft_quantization="int8")))
    assert metrics.exact_match_rate(base, int8) == metrics.exact_match_rate(base, fp32) == 1.0
    q = b._drafters[("draft_target", "small", "int8")]
    assert q is not small and "DynamicQuantizedLinear" in repr(q)
    assert all(type(m).__name__ == "Linear" for m in small.modules() if "Linear" in type(m).__name__)
    with pytest.raises(ValueError, match="draft_quantization"):
        list(b.run(REQS, S, cell("draft_target", 3, drafter="small", draft_quantization="int4")))
    from specstudy.data.model_files import quantize_dynamic_int8

    with pytest.raises(ValueError, match="CPU only; device='cuda'"):
        quantize_dynamic_int8(small, "cuda")


def test_memory_overhead_measures_the_speculation_not_the_process():
    """On a CPU the peak is the decoding modules' bytes plus the RSS rise above the batch's start:
    prompt lookup (no drafter) shows about 0 over AR, a draft model about its weights (+ its small
    KV cache), whatever else the process loaded before (here: a cached 40 MB drafter)."""
    from specstudy.engine.trace import module_bytes

    b = ReferenceBackend(tiny_model(seed=0, num_layers=2, logit_scale=8.0, dtype="float32"))
    big = tiny_model(
        seed=1,
        num_layers=4,
        hidden_size=512,
        intermediate_size=1024,
        num_heads=8,
        num_kv_heads=8,
        logit_scale=8.0,
        dtype="float32",
    )
    b._drafters[("draft_target", "big")] = big  # resident in the process for every cell below
    drafter_bytes = module_bytes(big)
    assert drafter_bytes > 40e6
    # a study warms every cell up before measuring it: the process's first lean decode allocates
    # ~10 MB once (without this warm-up the AR cell, run first, reads 10 MB above prompt lookup)
    list(b.run(REQS[:1], S, cell("draft_target", 3, drafter="big")))
    base = list(b.run(REQS, S, cell("ar")))
    ngram = list(b.run(REQS, S, cell("ngram", 3)))
    draft = list(b.run(REQS, S, cell("draft_target", 3, drafter="big")))
    peak = lambda recs: max(r.peak_memory_bytes for r in recs)  # noqa: E731
    assert all(r.memory_source == "module_bytes+transient_rss" for r in base + ngram + draft)
    assert abs(metrics.memory_overhead(peak(ngram), peak(base))) < 8e6
    over = metrics.memory_overhead(peak(draft), peak(base))
    assert drafter_bytes - 8e6 <= over <= drafter_bytes + 16e6

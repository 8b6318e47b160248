"""Unit tests of the shared sampling transform, the verify step and the KV-cache rollback."""

import math

import pytest
import torch

from specstudy.data.model_files import tiny_model
from specstudy.engine.kv import KVState, pad_ragged
from specstudy.engine.sampling import apply_top_k, apply_top_p, logits_to_probs, make_generator
from specstudy.engine.verify import accepted_prefix, verify_greedy, verify_sampling, verify_step
from specstudy.records import Sampling

torch.set_num_threads(1)


def test_top_k_and_top_p_filter_exactly():
    logits = torch.log(torch.tensor([0.5, 0.2, 0.15, 0.1, 0.05], dtype=torch.float64))
    assert torch.isinf(apply_top_k(logits, 2)).tolist() == [False, False, True, True, True]
    # mass before token i: 0, .5, .7, .85, .95 -> top_p=0.7 keeps tokens with mass_before < .7
    assert torch.isinf(apply_top_p(logits, 0.7)).tolist() == [False, False, True, True, True]
    assert torch.isinf(apply_top_p(logits, 0.71)).tolist() == [False, False, False, True, True]
    p = logits_to_probs(logits, 1.0, top_k=3)
    assert torch.allclose(p, torch.tensor([0.5, 0.2, 0.15, 0, 0], dtype=torch.float64) / 0.85)
    hot = logits_to_probs(logits, 0.5)
    assert torch.allclose(hot, torch.softmax(logits / 0.5, -1))


def test_logits_to_probs_rejects_zero_temperature():
    with pytest.raises(ValueError, match="temperature"):
        logits_to_probs(torch.zeros(3), 0.0)


def test_accepted_prefix_stops_at_first_rejection_and_n_draft():
    acc = torch.tensor([[True, True, False, True], [True, True, True, True], [False, True, True, True]])
    n = torch.tensor([4, 2, 4])
    assert accepted_prefix(acc, n).tolist() == [2, 2, 0]


def test_verify_greedy_accepts_matching_prefix_then_argmax():
    V = 5
    target = torch.full((2, 4, V), -5.0)
    best = [[1, 2, 3, 4], [0, 0, 0, 0]]
    for b in range(2):
        for i in range(4):
            target[b, i, best[b][i]] = 5.0
    drafts = torch.tensor([[1, 2, 0], [0, 0, 0]])
    out = verify_greedy(drafts, torch.tensor([3, 2]), target)
    assert out.accepted.tolist() == [2, 2]
    assert out.next_token.tolist() == [3, 0]  # row 0 corrected at pos 3; row 1 bonus after 2 drafts
    assert out.emitted(drafts) == [[1, 2, 3], [0, 0, 0]]


def test_verify_shapes_are_checked():
    with pytest.raises(ValueError, match="does not match"):
        verify_greedy(torch.zeros((1, 3), dtype=torch.long), torch.tensor([3]), torch.zeros((1, 3, 4)))
    with pytest.raises(ValueError, match="n_draft"):
        verify_greedy(torch.zeros((1, 2), dtype=torch.long), torch.tensor([3]), torch.zeros((1, 3, 4)))


def _exact_one_step(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Distribution of the first emitted token for one draft from q verified against p: must be p."""
    accept = torch.minimum(torch.ones_like(p), p / q)
    resid = torch.clamp(p - q, min=0)
    resid = resid / resid.sum()
    reject_mass = (q * (1 - accept)).sum()
    return q * accept + reject_mass * resid


def test_rejection_sampling_first_token_distribution_is_target():
    """Monte Carlo over the verify step alone: the first emitted token follows p (not q)."""
    p = torch.tensor([0.5, 0.3, 0.1, 0.1], dtype=torch.float64)
    q = torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64)
    assert torch.allclose(_exact_one_step(p, q), p)  # the algebra the engine relies on
    n, g = 40000, make_generator(1)
    drafts = torch.multinomial(q.expand(n, 4), 1, replacement=True, generator=g)
    tp = p.expand(n, 2, 4).clone()
    out = verify_sampling(drafts, torch.ones(n, dtype=torch.long), tp, q.expand(n, 1, 4).clone(), g)
    first = torch.where(out.accepted > 0, drafts[:, 0], out.next_token)
    freq = torch.bincount(first, minlength=4).double() / n
    assert (freq - p).abs().max() < 0.015  # 4 sigma of a binomial at n=40000 is < 0.01
    assert (freq - q).abs().max() > 0.2  # and it is clearly not the draft's distribution


def test_verify_step_one_hot_drafts_under_sampling():
    """Deterministic drafts (q one-hot): accept d with probability p(d), else sample p without d."""
    p = torch.tensor([0.6, 0.3, 0.1], dtype=torch.float64)
    n, g = 30000, make_generator(2)
    drafts = torch.zeros((n, 1), dtype=torch.long)
    out = verify_sampling(drafts, torch.ones(n, dtype=torch.long), p.expand(n, 2, 3).clone(), None, g)
    first = torch.where(out.accepted > 0, drafts[:, 0], out.next_token)
    freq = torch.bincount(first, minlength=3).double() / n
    assert (freq - p).abs().max() < 0.015
    assert math.isclose(out.accepted.double().mean().item(), 0.6, abs_tol=0.015)


def test_verify_step_dispatches_on_sampling():
    logits = torch.tensor([[[0.0, 3.0, 0.0], [3.0, 0.0, 0.0]]])
    out = verify_step(torch.tensor([[1]]), torch.tensor([1]), logits, Sampling(temperature=0))
    assert out.accepted.tolist() == [1] and out.next_token.tolist() == [0]


def test_kv_rollback_and_ragged_rows_match_separate_runs():
    model = tiny_model(seed=3)
    a, b = [1, 2, 3, 4, 5], [7, 8]

    def ref(seq):
        with torch.no_grad():
            return model(torch.tensor([seq])).logits[0, -1]

    st = KVState(model, 2)
    ids, valid = pad_ragged([a, b], "left")
    lg = st.forward(ids, valid)
    assert torch.allclose(lg[0, -1], ref(a)) and torch.allclose(lg[1, -1], ref(b))
    ids, valid = pad_ragged([[6, 9, 10], [9]], "right")
    st.forward(ids, valid)
    st.rollback([2, 0])  # row 0 forgets 9, 10
    assert st.lengths.tolist() == [6, 3]
    lg = st.forward(*pad_ragged([[11], [12]], "left"))
    assert torch.allclose(lg[0, -1], ref(a + [6, 11])) and torch.allclose(lg[1, -1], ref(b + [9, 12]))
    st.select_rows([1])
    lg = st.forward(torch.tensor([[3]]))
    assert torch.allclose(lg[0, -1], ref(b + [9, 12, 3]))
    with pytest.raises(ValueError, match="n_remove"):
        st.rollback([99])


def test_kv_single_row_rollback_is_a_crop():
    model = tiny_model(seed=4)
    st = KVState(model, 1)
    st.forward(torch.tensor([[1, 2, 3, 4]]))
    st.rollback(2)
    assert st.cache.get_seq_length() == 2 and not st.has_holes and st.lengths.tolist() == [2]


@pytest.mark.parametrize("pad", [-1, 10**6])
def test_padding_beyond_n_draft_is_ignored_by_both_paths(pad):
    """Padding that is not a vocabulary id (-1, or past V) must neither crash nor change the
    outcome, under greedy and under sampling, with and without draft distributions."""
    g = make_generator(5)
    V, B, G = 6, 3, 3
    target = torch.randn((B, G + 1, V), generator=g, dtype=torch.float64)
    q = torch.softmax(torch.randn((B, G, V), generator=g, dtype=torch.float64), dim=-1)
    n_draft = torch.tensor([3, 1, 0])
    clean = torch.tensor([[1, 2, 3], [4, 0, 0], [0, 0, 0]])
    padded = clean.clone()
    padded[1, 1:] = pad
    padded[2, :] = pad
    p = torch.softmax(target, dim=-1)
    for probs in (None, q):
        a = verify_sampling(clean, n_draft, p, probs, make_generator(7))
        b = verify_sampling(padded, n_draft, p, probs, make_generator(7))
        assert torch.equal(a.accepted, b.accepted) and torch.equal(a.next_token, b.next_token)
        assert b.emitted(padded)[1] == [4][: int(b.accepted[1])] + [int(b.next_token[1])]
        assert all(pad not in row for row in b.emitted(padded))
    a, b = verify_greedy(clean, n_draft, target), verify_greedy(padded, n_draft, target)
    assert torch.equal(a.accepted, b.accepted) and torch.equal(a.next_token, b.next_token)


def test_cache_keyword_follows_the_installed_transformers():
    """transformers 5.17 takes past_key_values=, 5.24 cache=; an unknown keyword would be
    swallowed by **kwargs and the model would decode without its cache."""
    from specstudy.engine.kv import cache_arg

    def old(input_ids=None, past_key_values=None, **kwargs): ...

    def new(input_ids=None, cache=None, **kwargs): ...

    def neither(input_ids=None, **kwargs): ...

    assert cache_arg(old, "c") == {"past_key_values": "c"} and cache_arg(new, "c") == {"cache": "c"}
    with pytest.raises(TypeError, match="neither"):
        cache_arg(neither, "c")
    model = tiny_model(seed=4)
    name = next(iter(cache_arg(model, None)))
    import inspect

    assert name in inspect.signature(type(model).forward).parameters

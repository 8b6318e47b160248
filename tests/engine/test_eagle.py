"""EAGLE-style drafting on tiny random models: lossless, its cache bookkeeping, exact sampling,
training and files."""

import pytest
import torch
from exact_distribution import chi_square_p, exact_joint

from specstudy.data.model_files import tiny_model
from specstudy.engine import drafters as D
from specstudy.engine.drafters import EagleDraft
from specstudy.engine.methods import DecodeJob, get_method
from specstudy.engine.methods import eagle as eagle_method
from specstudy.records import Sampling
from specstudy.train.data import generate_with_features
from specstudy.train.distill import train_drafter
from specstudy.train.loop import TrainSettings

torch.set_num_threads(1)

PROMPTS = [[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 1, 2, 3], [5, 6, 7], [9, 9, 9, 9, 9, 9, 1, 2, 3, 4]]
GREEDY = Sampling(temperature=0.0, max_new_tokens=20)


@pytest.fixture(scope="module")
def target():
    return tiny_model(seed=0, num_layers=4, logit_scale=8.0)


@pytest.fixture(scope="module")
def draft(target):
    torch.manual_seed(5)
    d = EagleDraft.for_target(target.config)
    with torch.no_grad():
        d.fc.weight.add_(0.05 * torch.randn_like(d.fc.weight))
    return d.eval()


def test_greedy_is_lossless_batched_and_single(target, draft):
    ar = [r.output_ids for r in get_method("ar").decode(DecodeJob(target, PROMPTS, GREEDY))]
    rows = get_method("eagle").decode(DecodeJob(target, PROMPTS, GREEDY, drafter=draft, gamma=3))
    assert [r.output_ids for r in rows] == ar
    for p, want in zip(PROMPTS, ar):
        row = get_method("eagle").decode(DecodeJob(target, [p], GREEDY, drafter=draft, gamma=3))[0]
        assert row.output_ids == want
        assert sum(s.accepted + 1 for s in row.steps) == len(row.output_ids)


def test_each_step_drafts_what_the_teacher_forced_drafter_predicts(target, draft, monkeypatch):
    """The incremental drafter (pairs fed step by step, drafted pairs rolled back, ragged rows)
    proposes, as its first draft of every step, the argmax of one teacher-forced pass over the
    final text with the target's own features: its cache holds exactly the true pairs."""
    seen: list[tuple[int, int, int]] = []  # (row's prompt index, context length, first draft)
    real = eagle_method.EagleDrafter.propose

    def spy(self, contexts, max_draft):
        out = real(self, contexts, max_draft)
        for c, tok, n in zip(contexts, out.tokens[:, 0].tolist(), out.n_draft.tolist()):
            if n:
                seen.append((next(i for i, p in enumerate(PROMPTS) if c[: len(p)] == p), len(c), tok))
        return out

    monkeypatch.setattr(eagle_method.EagleDrafter, "propose", spy)
    rows = get_method("eagle").decode(DecodeJob(target, PROMPTS, GREEDY, drafter=draft, gamma=3))
    assert len(seen) >= 3 * 4
    for i, row in enumerate(rows):
        full = torch.tensor([PROMPTS[i] + row.output_ids])
        with torch.no_grad():
            f = target.model(input_ids=full).last_hidden_state[0]
            pred = draft(
                target.get_input_embeddings()(full[:, 1:]),
                f[None, :-1],
                position_ids=torch.arange(full.shape[1] - 1)[None],
            )[0]
            want = target.lm_head(pred).argmax(-1)  # index j predicts token j + 2
        for _, ctx_len, tok in [s for s in seen if s[0] == i]:
            assert tok == int(want[ctx_len - 2]), f"row {i} at context length {ctx_len}"


def test_sampling_is_exact():
    v, k = 5, 4
    target = tiny_model(seed=11, vocab_size=v, num_layers=2, logit_scale=15.0)
    torch.manual_seed(1)
    d = EagleDraft.for_target(target.config)
    with torch.no_grad():
        d.fc.weight.add_(0.5 * torch.randn_like(d.fc.weight))
    s = Sampling(temperature=1.0, seed=9, max_new_tokens=k)
    rows = get_method("eagle").decode(DecodeJob(target, [[0, 3, 1]] * 12000, s, drafter=d, gamma=2))
    idx = torch.tensor([sum(t * v ** (k - 1 - i) for i, t in enumerate(r.output_ids)) for r in rows])
    counts = torch.bincount(idx, minlength=v**k).double()
    assert chi_square_p(counts, 12000 * exact_joint(target, s, v, k, [0, 3, 1])) > 1e-3
    assert 0 < sum(st.accepted for r in rows for st in r.steps) < sum(st.drafted for r in rows for st in r.steps)


def test_training_lowers_the_loss_and_the_file_round_trips(target, tmp_path):
    gen = [list(range(1 + i, 9 + i)) for i in range(6)]
    corpus, feats = generate_with_features(target, gen, 12, "eagle", label_top_k=8, batch_size=3)
    assert len(feats.seq) == sum(len(ids) for ids, _ in corpus)  # every position, prompt included
    settings = TrainSettings(kind="eagle", steps=30, batch_tokens=40, lr=3e-3, eval_fraction=0.34)
    res = train_drafter(target, feats, settings, prompt_lengths=[p for _, p in corpus])
    assert res.log[-1]["loss"] < res.log[0]["loss"]
    assert res.eval["positions"] == "generated" and res.eval["n"][0] > 0
    path = D.save_drafter(res.module, tmp_path / "e", target="tiny")
    back = D.load_drafter(path, kind="eagle", target="tiny")
    x = torch.randn(1, 4, target.config.hidden_size)
    with torch.no_grad():
        assert torch.allclose(back(x, x), res.module.float()(x, x))
    spec = get_method("eagle")
    spec.check(3, 2, str(path), {})
    with pytest.raises(ValueError, match="heads"):
        spec.check(3, 1, "params/drafters/smollm2-135m-heads", {})
    with pytest.raises(ValueError, match="no eagle file"):
        spec.check(3, 1, str(tmp_path / "missing"), {})


def test_a_drafter_of_another_width_is_refused(target):
    other = tiny_model(seed=0, num_layers=2, hidden_size=48)
    d = EagleDraft.for_target(other.config)
    with pytest.raises(ValueError, match="hidden_size"):
        get_method("eagle").decode(DecodeJob(target, PROMPTS[:1], GREEDY, drafter=d, gamma=2))


def test_the_study_knows_the_engine_runs_eagle():
    from specstudy.config.vocab import METHOD_ALIASES
    from specstudy.frameworks.reference import REFERENCE

    assert "eagle" in REFERENCE.methods and "eagle" in REFERENCE.needs_drafter  # from eagle.py's HEADER
    assert METHOD_ALIASES["eagle"] == "heads"  # reported in the heads family (Medusa/EAGLE)


@pytest.mark.slow
def test_the_committed_eagle_drafter_is_lossless_on_the_default_model():
    import json
    from pathlib import Path

    from specstudy.paths import REPO_ROOT

    path = Path(REPO_ROOT) / "params/drafters/smollm2-135m-eagle.safetensors"
    meta = json.loads(path.with_suffix(".json").read_text())
    assert meta["target"] == "smollm2-135m" and meta["command"].startswith("specstudy train-drafter --kind eagle")
    assert path.stat().st_size <= 20e6
    assert_lossless_on_the_default_model("eagle", str(path))


def assert_lossless_on_the_default_model(method: str, drafter: str) -> None:
    """A committed drafter file: greedy outputs equal AR's on SmolLM2, and some drafts accepted."""
    from specstudy.data.model_files import load_model

    model, tok = load_model("smollm2-135m")
    spec = get_method(method)
    spec.check(3, 2, drafter, {})
    d = spec.load_drafter(drafter, model, "cpu", "float32")
    prompts = [
        tok(p)["input_ids"]
        for p in (
            'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n',
            "Summarize: The council met on Tuesday about the new park, opening in May.",
        )
    ]
    s = Sampling(temperature=0.0, max_new_tokens=24)
    want = [r.output_ids for r in get_method("ar").decode(DecodeJob(model, prompts, s))]
    rows = spec.decode(DecodeJob(model, prompts, s, gamma=3, drafter=d))
    assert [r.output_ids for r in rows] == want
    assert sum(st.accepted for r in rows for st in r.steps) > 0  # the trained drafter does draft real tokens

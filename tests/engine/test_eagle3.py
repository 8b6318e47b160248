"""EAGLE-3 drafting on tiny random models: lossless, its training-time test equals drafting, the
checkpoint layout vLLM's and SGLang's loaders read, and the committed head on SmolLM2."""

import json

import pytest
import torch
from safetensors import safe_open

from specstudy.data.model_files import tiny_model
from specstudy.engine.eagle3_drafter import ARCHITECTURE, Eagle3Draft, default_aux_layers, load_eagle3, save_eagle3
from specstudy.engine.kv import cache_arg
from specstudy.engine.methods import DecodeJob, get_method
from specstudy.engine.methods.heads import AuxCapture
from specstudy.records import Sampling
from specstudy.train.data import generate_with_features
from specstudy.train.distill import train_drafter
from specstudy.train.loop import TrainSettings
from specstudy.train.train_eagle3 import unrolled_outputs

torch.set_num_threads(1)

PROMPTS = [[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 1, 2, 3], [5, 6, 7], [9, 9, 9, 9, 9, 9, 1, 2, 3, 4]]
GREEDY = Sampling(temperature=0.0, max_new_tokens=20)


@pytest.fixture(scope="module")
def target():
    return tiny_model(seed=0, num_layers=8, logit_scale=8.0)


def perturbed(target, vocab, seed=5, scale=0.05):
    torch.manual_seed(seed)
    d = Eagle3Draft.for_target(target.config, vocab)
    with torch.no_grad():
        for p in d.parameters():
            p.add_(scale * torch.randn_like(p))
    return d.to(torch.float64).eval()


@pytest.fixture(scope="module")
def draft(target):
    return perturbed(target, torch.arange(0, target.config.vocab_size, 2))


def test_features_are_the_streams_entering_the_default_layers(target):
    assert default_aux_layers(30) == (2, 15, 27)  # vLLM's and SGLang's default for SmolLM2's 30 layers
    x = torch.tensor([[1, 2, 3, 4]])
    with AuxCapture(target, default_aux_layers(8)) as cap, torch.no_grad():
        hs = target.model(input_ids=x, output_hidden_states=True).hidden_states
        assert torch.equal(cap.last, torch.cat([hs[k] for k in (2, 4, 5)], dim=-1))


def test_greedy_is_lossless_batched_and_single(target, draft):
    ar = [r.output_ids for r in get_method("ar").decode(DecodeJob(target, PROMPTS, GREEDY))]
    rows = get_method("eagle3").decode(DecodeJob(target, PROMPTS, GREEDY, drafter=draft, gamma=3))
    assert [r.output_ids for r in rows] == ar
    for p, want in zip(PROMPTS, ar):
        row = get_method("eagle3").decode(DecodeJob(target, [p], GREEDY, drafter=draft, gamma=3))[0]
        assert row.output_ids == want
        assert sum(s.accepted + 1 for s in row.steps) == len(row.output_ids)


def test_every_draft_lies_in_the_draft_vocabulary(target, draft):
    from specstudy.engine.methods import eagle as eagle_method

    seen: list[int] = []
    real = eagle_method.EagleDrafter.propose

    def spy(self, contexts, max_draft):
        out = real(self, contexts, max_draft)
        seen.extend(t for row, n in zip(out.tokens.tolist(), out.n_draft.tolist()) for t in row[:n])
        return out

    mp = pytest.MonkeyPatch()
    mp.setattr(eagle_method.EagleDrafter, "propose", spy)
    try:
        get_method("eagle3").decode(
            DecodeJob(target, PROMPTS, Sampling(temperature=1.0, seed=3, max_new_tokens=20), drafter=draft, gamma=3)
        )
    finally:
        mp.undo()
    assert len(seen) > 20 and all(t % 2 == 0 for t in seen)  # the draft vocabulary holds the even ids


def test_the_training_time_test_is_what_drafting_computes(target, draft):
    """Step 2 of the unrolled training pass, chain c, equals the drafter fed the true pairs 0..c
    through its KV cache and then its own output with token c+2 (inference's second draft)."""
    ids = torch.tensor([3, 1, 4, 1, 5, 9, 2, 6, 5, 3])
    with AuxCapture(target, draft.aux_layers) as cap, torch.no_grad():
        target.model(input_ids=ids[None])
        aux = cap.last[0]
        emb = target.get_input_embeddings()(ids)
        step1, step2 = unrolled_outputs(draft, emb, aux, 2)
        for c in (0, 4, len(ids) - 3):
            cache = None
            from transformers import DynamicCache

            cache = DynamicCache(config=draft.cache_config)
            o = draft(
                emb[None, 1 : c + 2],
                aux[None, : c + 1],
                position_ids=torch.arange(c + 1)[None],
                cache=cache,
                use_cache=True,
            )
            assert torch.allclose(o[0, -1], step1[c], atol=1e-10)
            o2 = draft(
                emb[None, c + 2 : c + 3], o[:, -1:], position_ids=torch.tensor([[c + 1]]), cache=cache, use_cache=True
            )
            assert torch.allclose(o2[0, -1], step2[c], atol=1e-10)
    assert cache_arg(draft.decoder, None)  # the cache keyword this transformers takes


def test_the_checkpoint_is_the_engines_layout_and_round_trips(target, draft, tmp_path):
    folder = save_eagle3(draft, tmp_path / "e3", {"target": "tiny"})
    cfg = json.loads((folder / "config.json").read_text())
    assert cfg["architectures"] == [ARCHITECTURE] and cfg["num_hidden_layers"] == 1
    assert cfg["vocab_size"] == target.config.vocab_size and cfg["draft_vocab_size"] == target.config.vocab_size // 2
    assert cfg["tie_word_embeddings"] is False and "eagle_aux_hidden_state_layer_ids" not in cfg
    with safe_open(str(folder / "model.safetensors"), framework="pt") as f:
        names = set(f.keys())
        d2t, t2d = f.get_tensor("d2t"), f.get_tensor("t2d")
    layer = {f"midlayer.{n}.weight" for n in ("input_layernorm", "hidden_norm", "post_attention_layernorm")}
    layer |= {f"midlayer.self_attn.{p}_proj.weight" for p in "qkvo"}
    layer |= {f"midlayer.mlp.{p}_proj.weight" for p in ("gate", "up", "down")}
    assert names == layer | {"fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d"}
    assert torch.equal(torch.arange(len(d2t)) + d2t, torch.arange(0, target.config.vocab_size, 2))
    assert t2d.dtype == torch.bool and int(t2d.sum()) == len(d2t) and bool(t2d[0]) and not bool(t2d[1])
    back = load_eagle3(folder, target.config).double()
    rounded = perturbed(target, torch.arange(0, target.config.vocab_size, 2))
    with torch.no_grad():
        for p in rounded.parameters():
            p.copy_(p.to(torch.bfloat16).double())  # the file holds bf16, as the engines' heads
        e, x = torch.randn(1, 4, 32, dtype=torch.float64), torch.randn(1, 4, 96, dtype=torch.float64)
        assert torch.allclose(back(e, x), rounded(e, x))
    from specstudy.environments.drafter_preflight import check_drafter

    for engine in ("vllm", "sglang", "trtllm"):  # the kit's preflight of the engines' loaders passes it
        report = check_drafter(engine, "eagle3", folder)
        assert report.architectures == [ARCHITECTURE] and "fc.weight" in (report.keys or [])
    spec = get_method("eagle3")
    spec.check(3, 2, str(folder), {})
    with pytest.raises(ValueError, match="no config.json"):
        spec.check(3, 1, str(tmp_path / "missing"), {})
    (folder / "config.json").write_text(json.dumps({**cfg, "architectures": ["LlamaForCausalLMEagle"]}))
    with pytest.raises(ValueError, match="LlamaForCausalLMEagle3"):
        spec.check(3, 1, str(folder), {})


def test_training_lowers_the_loss_on_both_unrolled_steps(target):
    gen = [list(range(1 + i, 9 + i)) for i in range(6)]
    corpus, feats = generate_with_features(target, gen, 12, "eagle3", label_top_k=8, batch_size=3)
    assert feats.hidden.shape == (sum(len(ids) for ids, _ in corpus), 3 * target.config.hidden_size)
    settings = TrainSettings(kind="eagle3", steps=30, batch_tokens=40, lr=3e-3, eval_fraction=0.34, draft_vocab_size=48)
    res = train_drafter(target, feats, settings, prompt_lengths=[p for _, p in corpus])
    assert res.log[-1]["loss"] < res.log[0]["loss"]
    assert isinstance(res.module, Eagle3Draft) and len(res.module.d2t) == 48
    assert res.eval["n"][0] > 0 and 0 <= res.eval["target_top1_in_draft_vocab"] <= 1


def test_a_drafter_of_another_target_is_refused(target, tmp_path):
    other = tiny_model(seed=0, num_layers=8, hidden_size=48)
    folder = save_eagle3(Eagle3Draft.for_target(other.config, torch.arange(10)), tmp_path / "o")
    with pytest.raises(ValueError, match="target_hidden_size"):
        load_eagle3(folder, target.config)


@pytest.mark.slow
def test_the_committed_eagle3_head_is_lossless_on_the_default_model():
    from pathlib import Path

    from specstudy.paths import REPO_ROOT

    from .test_eagle import assert_lossless_on_the_default_model

    folder = Path(REPO_ROOT) / "params/drafters/smollm2-135m-eagle3"
    record = json.loads((folder / "specstudy.json").read_text())
    assert record["target"] == "smollm2-135m" and record["command"].startswith("specstudy train-drafter --kind eagle3")
    assert (folder / "model.safetensors").stat().st_size <= 20e6
    cfg = json.loads((folder / "config.json").read_text())
    assert cfg["draft_vocab_size"] == record["arguments"]["draft_vocab_size"] == 8192 and cfg["vocab_size"] == 49152
    assert_lossless_on_the_default_model("eagle3", str(folder))


def test_snapshots_hand_over_the_drafter_so_far_at_the_named_steps(target):
    gen = [list(range(1 + i, 9 + i)) for i in range(4)]
    corpus, feats = generate_with_features(target, gen, 8, "eagle3", label_top_k=8, batch_size=2)
    settings = TrainSettings(kind="eagle3", steps=6, batch_tokens=20, draft_vocab_size=32, snapshots=(2, 6))
    seen: list[tuple[int, bool, torch.Tensor]] = []
    res = train_drafter(
        target,
        feats,
        settings,
        prompt_lengths=[p for _, p in corpus],
        snapshot=lambda step, m: seen.append((step, m.training, m.fc.weight.detach().clone())),
    )
    assert [s for s, _, _ in seen] == [2, 6] and not any(t for _, t, _ in seen)
    assert not torch.equal(seen[0][2], seen[1][2]) and torch.equal(seen[1][2], res.module.fc.weight)
    with pytest.raises(ValueError, match=r"snapshots=\[9\]"):
        TrainSettings(kind="eagle3", steps=6, snapshots=(9,))


def test_train_drafter_names_every_bad_argument_at_once(capsys):
    from specstudy.cli import main

    argv = [
        "train-drafter",
        "--kind",
        "eagle3",
        "--steps",
        "5",
        "--snapshot-steps",
        "3,7",
        "--lr",
        "0",
        "--tasks",
        "nope",
    ]
    assert main(argv) != 0
    msg = capsys.readouterr().err
    assert "--snapshot-steps='3,7'" in msg and "--lr=0.0" in msg and "'nope'" in msg


def test_eagle3_verifies_every_step_through_the_lean_forward_at_batch_1():
    """Issue 47: no target forward of a batch-1 EAGLE-3 decode goes through transformers' LlamaModel (each
    did before, costing ~2x T1 per verification on SmolLM2); the outputs and acceptance stay what
    transformers' forward gives."""
    from specstudy.engine.lean import layer_hooks, set_lean_forward

    target = tiny_model(seed=0, num_layers=8, logit_scale=8.0)  # its own: no hook another test left
    assert not layer_hooks(target)
    draft = perturbed(target, torch.arange(target.config.vocab_size))
    calls: list[int] = []
    counter = target.model.register_forward_pre_hook(lambda m, a: calls.append(1))  # LlamaModel: not a layer
    job = DecodeJob(target, [PROMPTS[0]], GREEDY, gamma=4, drafter=draft)
    previous = set_lean_forward(True)
    try:
        lean_row = get_method("eagle3").decode(job)[0]
        assert calls == [] and len(lean_row.steps) > 2
        set_lean_forward(False)
        hf_row = get_method("eagle3").decode(job)[0]
        assert len(calls) == len(hf_row.steps)  # the prompt pass and every verification
    finally:
        set_lean_forward(previous)
        counter.remove()
    assert lean_row.output_ids == hf_row.output_ids
    assert [(s.drafted, s.accepted) for s in lean_row.steps] == [(s.drafted, s.accepted) for s in hf_row.steps]

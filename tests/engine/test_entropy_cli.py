"""Per-token entropy from logits, and the `specstudy generate` command's input checks."""

import math

import pytest
import torch

from specstudy import cli
from specstudy.engine.entropy import entropy_and_logprobs, entropy_from_logits, summarize_entropy, token_logprobs


def test_entropy_of_known_distributions():
    uniform = torch.zeros(2, 8)
    assert torch.allclose(entropy_from_logits(uniform), torch.full((2,), math.log(8)))
    peaked = torch.tensor([0.0, float("-inf"), float("-inf")])
    assert entropy_from_logits(peaked).item() == 0.0  # no nan from 0 * log 0
    p = torch.tensor([0.5, 0.25, 0.25], dtype=torch.float64)
    assert entropy_from_logits(p.log()).item() == pytest.approx(-(p * p.log()).sum().item())


def test_logprobs_and_combined_call_agree():
    logits = torch.randn(3, 4, 11, generator=torch.Generator().manual_seed(0))
    ids = torch.randint(0, 11, (3, 4), generator=torch.Generator().manual_seed(1))
    ent, lp = entropy_and_logprobs(logits, ids)
    assert torch.allclose(lp, token_logprobs(logits, ids))
    assert torch.allclose(lp, torch.log_softmax(logits, -1).gather(-1, ids[..., None]).squeeze(-1))
    assert torch.allclose(ent, entropy_from_logits(logits))
    s = summarize_entropy(ent.flatten().tolist())
    assert s["n"] == 12 and 0 < s["mean"] <= math.log(11)
    assert math.isnan(summarize_entropy([])["mean"])


@pytest.mark.parametrize(
    "argv, message",
    [
        (["generate", "--method", "medusa9", "--prompt", "x"], "allowed"),
        (["generate", "--model", "gpt-17", "--prompt", "x"], "allowed"),
        (["generate", "--method", "ngram", "--option", "ngram_max", "--prompt", "x"], "KEY=VALUE"),
        (["generate", "--method", "ngram", "--option", "window=3", "--prompt", "x"], "not known"),
        (["generate", "--method", "draft_target", "--prompt", "x"], "needs a drafter"),
        (["generate", "--temperature", "-1", "--prompt", "x"], "temperature"),
    ],
)
def test_generate_rejects_bad_input_before_loading_a_model(argv, message, capsys, no_model_work):
    assert cli.main(argv) == 2
    assert message in capsys.readouterr().err


@pytest.mark.slow
def test_generate_json_on_the_default_model(capsys):
    import json

    assert (
        cli.main(
            [
                "generate",
                "--method",
                "ngram",
                "--gamma",
                "3",
                "--max-new-tokens",
                "12",
                "--json",
                "--threads",
                "1",
                "--prompt",
                "Repeat after me: the quick brown fox jumps over the lazy dog.",
            ]
        )
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert (
        len(out["token_ids"]) == 12 and out["acceptance_length"] >= 1 and out["ttft_s"] > 0 and out["tokens_per_s"] > 0
    )
    assert isinstance(out["per_position_conditional"], list) and isinstance(out["per_position_unconditional"], list)

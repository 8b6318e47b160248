"""bench/server_sets.py: its heterogeneity test checked by simulation, and the bench on real llama.cpp servers."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench" / "server_sets.py"


def _bench():
    spec = importlib.util.spec_from_file_location("bench_server_sets", BENCH)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _sets(
    rng: np.random.Generator, k: int, n: int, server_sd: float, df: float | None = None
) -> list[dict[str, float]]:
    """k pairs over the same n prompts: per prompt the log of AR's E2E over the control's, each request
    ±6 % noise (this VM's per-call SD; Student's t on ``df`` degrees of freedom for heavy tails), each
    prompt a fixed offset of its own (a prompt that suits one place in the order), and each pair off by its
    own factor exp(N(0, server_sd))."""
    offset = rng.normal(0, 0.03, n)

    def noise(size: int) -> np.ndarray:
        return rng.normal(0, 0.06, size) if df is None else 0.06 * rng.standard_t(df, size) / np.sqrt(df / (df - 2))

    out = []
    for _ in range(k):
        logs = offset + noise(n) - noise(n) + rng.normal(0, server_sd)
        out.append({f"p/{j}": float(x) for j, x in enumerate(logs)})
    return out


@pytest.mark.parametrize("df", [None, 3.0])
def test_heterogeneity_holds_its_size_with_no_server_effect_and_finds_one_of_five_percent(df):
    """Simulated, 2,000 runs of 5 pairs × 8 prompts (normal noise, and Student's t on 3 df: single requests
    far slower, as on this VM).  No effect of a pair's own: p < 0.05 in 5 % of runs (within 3.5-6.5 %);
    a 5 % SD per pair: found in more than half the runs (5 pairs find a large effect only), its size read
    back within a fifth."""
    mod, rng = _bench(), np.random.default_rng(0)
    null = [mod.heterogeneity(_sets(rng, 5, 8, 0.0, df)) for _ in range(2000)]
    assert 0.035 < np.mean([h["p"] < 0.05 for h in null]) < 0.065
    found = [mod.heterogeneity(_sets(rng, 5, 8, 0.05, df)) for _ in range(2000)]
    assert np.mean([h["p"] < 0.05 for h in found]) > 0.5  # 59 % (normal) and 63 % (t) at seed 0
    assert np.median([h["server_sd"] for h in found]) == pytest.approx(0.05, rel=0.2)


def test_heterogeneity_reads_pairs_over_their_common_prompts_and_refuses_too_few():
    mod = _bench()
    same = [{"a": 0.1, "b": -0.1, "c": 0.0}, {"a": 0.1, "b": -0.1, "c": 0.0, "d": 5.0}]
    h = mod.heterogeneity(same + [{"a": 0.3, "b": 0.1, "c": 0.2}])  # the third pair 0.2 apart on every prompt
    assert h["prompts"] == 3 and h["df"] == [2, 4] and h["p"] < 1e-6
    assert mod.heterogeneity(same)["server_sd"] == 0.0
    with pytest.raises(ValueError, match="1 pair"):
        mod.heterogeneity(same[:1])


def test_bad_arguments_are_named_together_before_any_server_starts():
    mod = _bench()
    with pytest.raises(SystemExit, match=r"--sets 1: .*; --prompts 3: .*; --rounds 0: "):
        mod.main(["--sets", "1", "--prompts", "3", "--rounds", "0"])


@pytest.mark.slow
def test_server_sets_bench_on_real_llamacpp_servers(capsys):
    """Structure only (two fresh pairs of llama.cpp servers, 5 prompts of 4 tokens, 2 rounds): a row per
    pair, the heterogeneity and persistence lines; how the pairs compare is the benchmark's figure, not
    asserted here."""
    mod = _bench()
    assert mod.main(["--sets", "2", "--prompts", "5", "--rounds", "2", "--max-new-tokens", "4", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert len(res["rows"]) == 2 and all(r["n_prompts"] == 5 and r["ci_low"] > 0 for r in res["rows"])
    assert res["heterogeneity"]["df"] == [1, 4] and 0 <= res["heterogeneity"]["p"] <= 1
    assert [len(r) for r in res["log_ratios"]] == [2, 2] and res["persistence"]["df"] == [1, 2]
    mod.show(res)
    out = capsys.readouterr().out
    assert "| 2 |" in out and "pairs × prompts: F" in out and "pairs over their 2 rounds: F" in out


def _rounds(
    rng: np.random.Generator, k: int, rounds: int, n: int, server_sd: float, round_sd: float
) -> list[list[dict[str, float]]]:
    """k pairs × ``rounds`` rounds over the same n prompts: as :func:`_sets`, and each round off by a
    factor of its own, exp(N(0, round_sd)) (the machine slower for a minute), each pair by exp(N(0, server_sd))."""
    offset = rng.normal(0, 0.03, n)
    out = []
    for _ in range(k):
        own = rng.normal(0, server_sd)
        out.append(
            [
                {
                    f"p/{j}": float(x)
                    for j, x in enumerate(offset + rng.normal(0, 0.085, n) + own + rng.normal(0, round_sd))
                }
                for _ in range(rounds)
            ]
        )
    return out


def test_persistence_tells_a_servers_own_effect_from_the_moments():
    """Simulated, 2,000 runs of 8 pairs × 3 rounds × 10 prompts (8.5 % per prompt's ratio).  Rounds off by 3 % each and no effect of a
    pair's own: p < 0.05 in 5 % of runs (within 3.5-6.5 %), where the pairs-by-prompts test of the first
    rounds, blind to time, finds an effect far more often; a 3 % effect of a pair's own with rounds off by
    1 %: found in more than half the runs, its size read back within a fifth."""
    mod, rng = _bench(), np.random.default_rng(1)
    null = [_rounds(rng, 8, 3, 10, 0.0, 0.03) for _ in range(2000)]
    assert 0.035 < np.mean([mod.persistence(x)["p"] < 0.05 for x in null]) < 0.065
    assert np.mean([mod.heterogeneity([r[0] for r in x])["p"] < 0.05 for x in null]) > 0.3
    found = [mod.persistence(_rounds(rng, 8, 3, 10, 0.03, 0.01)) for _ in range(2000)]
    assert np.mean([q["p"] < 0.05 for q in found]) > 0.6  # 75 % at 3 rounds (45 % at 2)
    assert np.median([q["server_sd"] for q in found]) == pytest.approx(0.03, rel=0.2)


def test_persistence_needs_two_pairs_of_two_rounds():
    mod = _bench()
    one_round = [[{"a": 0.1, "b": 0.0}], [{"a": 0.2, "b": 0.1}]]
    with pytest.raises(ValueError, match="1 round"):
        mod.persistence(one_round)
    q = mod.persistence([[{"a": 0.1, "b": 0.0}, {"a": 0.1, "b": 0.0}], [{"a": 0.3, "b": 0.2}, {"a": 0.3, "b": 0.2}]])
    assert q["df"] == [1, 2] and q["f"] == float("inf") and q["rounds"] == 2

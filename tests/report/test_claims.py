"""Claims computed from the data: the report's sentences say what the intervals show, including the reverse
of the seed's expectation, "cannot tell" and "n too small", on records built so that each case happens."""

from __future__ import annotations

import math

import pytest

from specstudy.analysis import claims
from specstudy.analysis.claims import Estimate

NAN = math.nan
MB = 1e6


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
    assert "conservative" in claims.phrase(claims.CANNOT_TELL, rows=2)


def test_phrases_name_the_verdict():
    assert claims.phrase(claims.OBSERVED) == "as the seed expects (observed in this study)"
    assert claims.phrase(claims.REVERSED) == "the reverse of the seed's expectation (observed in this study)"
    assert "contains 1×: no difference resolvable" in claims.phrase(claims.CANNOT_TELL)
    assert "n = 3 prompts" in claims.phrase(claims.N_TOO_SMALL, n=3)
    assert claims.versus(Estimate(1.02, (0.97, 1.08), 8)).startswith("no difference from AR resolvable")
    assert claims.versus(Estimate(0.8, (0.7, 0.9), 8)).startswith("slower than AR")
    with pytest.raises(ValueError):
        claims.phrase("maybe")


def test_memory_within_the_noise_is_not_a_signed_number():
    text = claims.memory_text(-12.5 * MB, 16.5 * MB, "RSS")
    assert text == "no difference resolvable: |Δ| ≤ 16.5 MB (RSS)" and "-12.5" not in text
    assert claims.memory_text(500 * MB, 16.5 * MB, "RSS").startswith("+500.0 MB (beyond")
    assert claims.resolved(-40 * MB, 16.5 * MB) == claims.REVERSED


def test_divergences_in_words():
    near = {"task": "code", "prompt_id": "code/3", "repeat": 0, "position": 17, "margin": 0.012}
    far = {"task": "chat", "prompt_id": "7", "repeat": 1, "position": 2, "margin": 2.5}
    blind = {"task": "code", "prompt_id": "code/1", "repeat": 0, "position": 5, "margin": NAN}
    text = claims.divergence_text([near, far, blind])
    assert "prompt code/3 (repeat 0) first differs at output position 17 (margin +0.012 nats)" in text
    assert "prompt chat/7" in text and "not a near-tie" in text and "verification needs checking" in text
    assert "a near-tie flip from batched numerics is not a verification bug, but the reader must be told" in text
    assert "the engine gives no log-probabilities" in text
    assert text.index("chat/7") < text.index("code/1") < text.index("code/3")  # the least explicable first

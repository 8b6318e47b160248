"""What analysis hands over as data (sampling keys, the cost model's bent assumptions, search limits)
is worded in report/ for every value it can take, and a value it does not know is refused."""

from __future__ import annotations

import pytest

from specstudy.analysis.drafts import BENDS, SEARCH_LIMITS, Bend
from specstudy.analysis.study_records import sampling_key
from specstudy.report.format import sampling_text
from specstudy.report.model_notes import bend_text, limit_text, note_text


@pytest.mark.parametrize(
    ("sampling", "words"),
    [
        ((0.0, 0.9, 40), "greedy"),
        ((0.7, 1.0, 0), "T=0.7"),
        ((0.7, 0.9, 0), "T=0.7, top-p 0.9"),
        ((1.0, 0.95, 40), "T=1, top-p 0.95, top-k 40"),
    ],
)
def test_a_sampling_key_is_an_identifier_worded_as_before(sampling, words):
    key = sampling_key(*sampling)
    assert " " not in key and "," not in key and sampling_text(key) == words


def test_an_unknown_sampling_key_is_refused():
    with pytest.raises(ValueError, match="'x0.7'"):
        sampling_text("x0.7")


def test_every_bent_assumption_and_search_limit_has_words():
    for kind in BENDS:
        assert bend_text(Bend(kind, (0.5, 0.25, 3))).strip()
    for why in SEARCH_LIMITS:
        assert limit_text(why, 4).strip()
    assert limit_text("heads", 4) == "its 4 heads"
    assert limit_text("uncounted_gamma_values", 3).endswith("; the γ values run")
    assert note_text(()) == "—"
    assert note_text((Bend("extrapolated", (3,)), Bend("few_draft_steps", (12,)))) == (
        "α̂ extrapolated past measured depth 3; few draft steps (12)"
    )
    with pytest.raises(ValueError, match="'nope'"):
        bend_text(Bend("nope"))
    with pytest.raises(ValueError, match="'nope'"):
        limit_text("nope", 3)

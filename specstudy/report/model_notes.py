"""The cost model's note on a measured row, in words: which of its assumptions the row's measurement
bends (:func:`specstudy.analysis.drafts.model_bends` finds them, with their numbers), and why a
prediction's γ search stopped where it did (:data:`specstudy.analysis.drafts.SEARCH_LIMITS`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ..analysis.drafts import SEARCH_LIMITS, Bend


def bend_text(b: Bend) -> str:
    """One bent assumption in a few words."""
    v = b.values
    words: dict[str, Callable[[], str]] = {
        "not_counted": lambda: "draft lengths not counted: γ drafted every step assumed (i.i.d. α̂)",
        "no_step_drafted": lambda: "no step drafted: each an AR step and a failed lookup",
        "drafts_vary": lambda: f"drafts vary: {v[0]:.0%} of steps draft, {v[1]:.1f} tokens on average",
        "extrapolated": lambda: f"α̂ extrapolated past measured depth {v[0]}",
        "few_draft_steps": lambda: f"few draft steps ({v[0]})",
        "verify_one_mean": lambda: "verify cost not timed per k: one mean for every k",
        "verify_missing": lambda: f"verify cost not measured at k={','.join(map(str, v))} (nearest k used)",
        "no_draft_cost": lambda: f"a step without a draft costs {v[0]:.2f}×T1",
        "prompt_pass": lambda: f"prompt pass {v[0]:.2f}× AR's (model: {v[1]:.2f}×)",
        "untimed": lambda: f"decode time outside timed steps {v[0]:.0%} (AR {v[1]:.0%})",
        "no_draft_untimed": lambda: "steps without a draft not timed (taken as T1)",
        "outside_band": lambda: f"outside {v[0]}–{v[1]} with no assumption flagged",
    }
    if b.kind not in words:
        raise ValueError(f"model note {b.kind!r}: expected one of {sorted(words)}")
    return words[b.kind]()


def note_text(bends: Sequence[Bend]) -> str:
    """A row's model note: its bent assumptions joined by ``; `` (— when it bends none)."""
    return "; ".join(bend_text(b) for b in bends) or "—"


#: a search limit in words (``heads`` names how many)
LIMIT_WORDS = {
    "measured_depth": "the measured draft depth",
    "search_limit": "the search limit",
    "gamma_values": "the γ values run",
    "gamma_values_uncounted": "the γ values run; draft lengths not counted",
}
UNCOUNTED = "uncounted_"


def limit_text(why: str, max_gamma: int) -> str:
    """Why the γ search stopped at ``max_gamma``, in words."""
    if why not in SEARCH_LIMITS:
        raise ValueError(f"search limit {why!r}: expected one of {list(SEARCH_LIMITS)}")
    if why.startswith(UNCOUNTED):
        return "γ drafted every step assumed (draft lengths not counted); " + _limit(why[len(UNCOUNTED) :], max_gamma)
    return _limit(why, max_gamma)


def _limit(why: str, max_gamma: int) -> str:
    return f"its {max_gamma} heads" if why == "heads" else LIMIT_WORDS[why]

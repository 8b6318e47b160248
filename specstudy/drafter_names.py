"""How a study names a drafter that is not a model id: the target's own first layers (``self``,
``self:K``), prompt lookup (``ngram``) and several drafters merged into one tree (SpecInfer:
names joined by ``+``).  Imports nothing, so validation (no torch) and the reference engine (no
configuration) read the same names."""

from __future__ import annotations

#: the target's own first layers: "self" (half of them) or "self:K"
SELF = "self"
#: prompt lookup's continuation, as one of a merged tree's drafters
LOOKUP = "ngram"
#: joins the drafters of a merged tree: "self:8+self:15+ngram"
MERGE_SEPARATOR = "+"


def is_self(name: str) -> bool:
    """``self`` or ``self:K`` (K an integer)."""
    return name == SELF or (name.startswith(SELF + ":") and name.partition(":")[2].isdigit())


def merged_parts(name: str) -> list[str]:
    """``"self:8+ngram"`` → ``["self:8", "ngram"]``; refuses empty parts and repeats."""
    parts = [p.strip() for p in str(name).split(MERGE_SEPARATOR)]
    if any(not p for p in parts):
        raise ValueError(f"drafter={name!r}: expected drafter names joined by '+', e.g. 'self:8+self:15+ngram'")
    if len(set(parts)) != len(parts):
        raise ValueError(f"drafter={name!r} names a drafter twice; each drafter once")
    return parts

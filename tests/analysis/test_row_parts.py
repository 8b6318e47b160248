"""A pooled row's parts: every interval lives in the part of its estimate, and no field name is in two parts
(the flat CSV line and ``Pooled.value`` read a field by its name)."""

from __future__ import annotations

import dataclasses

import pytest

from specstudy.analysis.stats import Pooled


def _parts() -> dict[str, type]:
    return {f.name: type(getattr(Pooled(), f.name)) for f in dataclasses.fields(Pooled)}


def test_every_interval_sits_beside_its_estimate_in_one_part():
    for name, part in _parts().items():
        names = {f.name for f in dataclasses.fields(part)}
        base = {n: n[: -len("_ci")] for n in names if n.endswith("_ci")}
        stray = [n for n, b in base.items() if b not in names and f"{b}_s" not in names]  # tpot_ci: tpot_s
        assert stray == [], f"{name}: intervals without their estimate: {stray}"


def test_no_field_name_is_in_two_parts():
    seen: dict[str, str] = {}
    for name, part in _parts().items():
        for f in dataclasses.fields(part):
            assert f.name not in seen, f"{f.name} in {seen.get(f.name)} and {name}"
            seen[f.name] = name
    assert list(Pooled().record()) == list(seen)


def test_value_reads_a_field_from_its_part_and_names_an_unknown_one():
    p = Pooled()
    p.paired.speedup = 1.5
    assert p.value("speedup") == 1.5 and p.value("n_prompts") == 0
    with pytest.raises(KeyError, match="no_such_field"):
        p.value("no_such_field")

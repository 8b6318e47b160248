"""The repeated parameter lists are bundles: a cell's check (``CellCheck``), a cell's run (``CellRun``)
and an offer to the load generator (``Offer``); each function takes the bundle, so a new field is
added in one place, and no backend keeps a second check beside ``check_cell``."""

from __future__ import annotations

import inspect

import pytest

from specstudy.backends import backend_class, base, loadgen, server_base
from specstudy.frameworks import frameworks
from specstudy.frameworks.declaration import CellCheck
from specstudy.run import cell, conversation_cells


def _params(fn) -> list[str]:
    return [p for p in inspect.signature(fn).parameters if p not in ("self", "cls")]


@pytest.mark.parametrize("framework", frameworks())
def test_every_backend_checks_a_cell_through_one_bundle(framework):
    cls = backend_class(framework)
    assert _params(cls.check_cell) == ["cell"]
    if framework != "llamacpp":  # llama.cpp's check returns the server plan its run starts from
        assert not hasattr(cls, "check"), f"{cls.__name__}.check beside check_cell"


def test_a_cell_check_names_the_bad_value_for_every_engine_alike():
    bad = CellCheck("draft_target", 0, {}, model="m", drafter="/d", cuda=True)
    for framework in ("vllm", "trtllm", "mlc", "hf"):
        with pytest.raises(ValueError, match="needs gamma >= 1"):
            backend_class(framework).check_cell(bad)


def test_a_cells_run_and_an_offer_are_one_bundle_each():
    for fn in (cell.run_offline, cell.run_at_rate, cell.run_cell):
        assert _params(fn) == ["run"]
    assert _params(conversation_cells.run_turns) == ["run", "history", "tokenizer"]
    assert _params(loadgen.offer) == _params(loadgen.offer_async) == ["sender", "run"]
    assert (
        _params(base.ServingBackend.offer_run)
        == _params(server_base.StreamingServerBackend.offer_run)
        == ["run", "gauges"]
    )

"""Mistakes planted in the kit's own EAGLE-3 export (issue 37) are caught.

Each plant is one plausible slip in :meth:`Eagle3Draft.engine_state_dict` / ``engine_config``:
the ``d2t`` offsets shifted by one position, the feature layers pinned one layer off, the head's
final norm left out.  An exported checkpoint is what every engine reads, so a plant reaches the
reference engine, vLLM and SGLang alike and a comparison *between engines* cannot see it (shown
below: the planted head against itself, as two engines reading one file, is identical prompt by
prompt).  What sees it:

* :func:`~specstudy.engine.eagle3_drafter.check_round_trip` (run by ``train-drafter`` after every export):
  each plant raises, naming what differs; the clean export passes;
* the paired acceptance of the head as trained against the head as exported, in the reference
  engine on the same prompts (:func:`~specstudy.report.across_engines.paired_verdict`): the
  vocabulary-map and feature-layer plants change what is accepted; the norm plant does not load.
"""

from __future__ import annotations

import json

import pytest
import torch

from specstudy.data.model_files import tiny_model
from specstudy.engine.eagle3_drafter import CONFIG_FILE, Eagle3Draft, check_round_trip, load_eagle3, save_eagle3
from specstudy.engine.methods import DecodeJob, get_method
from specstudy.records import Cell, Request, Sampling
from specstudy.report.across_engines import IDENTICAL, paired_verdict
from specstudy.train.data import generate_with_features
from specstudy.train.distill import train_drafter
from specstudy.train.loop import TrainSettings

torch.set_num_threads(1)
PROMPTS = [[1, 2, 3, 4, 5, 6, 7, 8], [5, 6, 7], [9, 9, 9, 1, 2, 3, 4], [11, 3, 11, 3, 40, 41], [20, 21, 22, 23]]
GREEDY = Sampling(temperature=0.0, max_new_tokens=24)


def _shift_d2t(state, config):
    state["d2t"] = torch.cat([state["d2t"][1:], state["d2t"][-1:]])  # draft id i reads offset i + 1


def _move_aux(state, config):
    config["eagle_aux_hidden_state_layer_ids"] = [k + 1 for k in PINNED]  # pinned one layer off


def _skip_norm(state, config):
    del state["norm.weight"]


PLANTS = {"d2t_shifted": _shift_d2t, "aux_layers_moved": _move_aux, "norm_skipped": _skip_norm}
PINNED: tuple[int, ...] = ()


@pytest.fixture(scope="module")
def target():
    return tiny_model(seed=0, num_layers=8, logit_scale=8.0)


@pytest.fixture(scope="module")
def head(target):
    """A head trained on the target's own continuations: it accepts enough for a plant to matter."""
    starts = [list(range(1 + i, 7 + i)) for i in range(0, 60, 3)] + PROMPTS
    _, feats = generate_with_features(target, starts, 24, "eagle3", label_top_k=8, batch_size=8)
    settings = TrainSettings(kind="eagle3", steps=150, batch_tokens=128, lr=3e-3, draft_vocab_size=64, unroll=2)
    module = train_drafter(target, feats, settings).module
    assert isinstance(module, Eagle3Draft)
    return module.double().eval()


def _export(head, folder, plant=None):
    real_state, real_config = Eagle3Draft.engine_state_dict, Eagle3Draft.engine_config
    global PINNED
    PINNED = head.aux_layers
    try:
        if plant is not None:
            state, config = real_state(head), real_config(head)
            plant(state, config)
            Eagle3Draft.engine_state_dict = lambda self: state  # type: ignore[method-assign]
            Eagle3Draft.engine_config = lambda self: config  # type: ignore[method-assign]
        return save_eagle3(head, folder, {"target": "tiny"})
    finally:
        Eagle3Draft.engine_state_dict, Eagle3Draft.engine_config = real_state, real_config  # type: ignore[method-assign]


def _records(target, draft, fw):
    """The reference engine's greedy records of ``draft`` on PROMPTS, labelled as framework ``fw``."""
    rows = []
    cell = Cell("s", "cpu", fw, "eagle3", "code", "m", drafter="h", gamma=4)
    for i, p in enumerate(PROMPTS):
        row = get_method("eagle3").decode(DecodeJob(target, [p], GREEDY, gamma=4, drafter=draft))[0]
        rec = cell.new_record(Request(f"code/{i}", ""), GREEDY, output_ids=list(row.output_ids), steps=row.steps)
        rows.append(rec.fill_acceptance_from_steps())
    return rows


def test_the_clean_export_round_trips_and_the_head_accepts(target, head, tmp_path):
    folder = _export(head, tmp_path / "clean")
    check_round_trip(head, folder, target.config)
    recs = _records(target, load_eagle3(folder, target.config).double(), "exported")
    assert sum(r.accepted_tokens for r in recs) >= 0.15 * sum(r.drafted_tokens for r in recs)  # 53 of 226
    # the export's one change, bf16 weights, accepts what the trained head accepts, prompt by prompt
    assert paired_verdict({"trained": _records(target, head, "trained"), "exported": recs}, 4) == IDENTICAL


@pytest.mark.parametrize("plant", sorted(PLANTS))
def test_each_plant_fails_the_round_trip_naming_it(target, head, tmp_path, plant):
    folder = _export(head, tmp_path / plant, PLANTS[plant])
    words = {"d2t_shifted": "d2t maps", "aux_layers_moved": "engines capture layers", "norm_skipped": "norm.weight"}
    with pytest.raises(ValueError, match=words[plant]):
        check_round_trip(head, folder, target.config)


@pytest.mark.parametrize("plant", ["d2t_shifted", "aux_layers_moved"])
def test_a_plant_changes_acceptance_against_the_trained_head_but_not_between_readers(target, head, tmp_path, plant):
    folder = _export(head, tmp_path / plant, PLANTS[plant])
    assert json.loads((folder / CONFIG_FILE).read_text())  # the plant wrote a loadable checkpoint
    planted = load_eagle3(folder, target.config).double()
    trained = _records(target, head, "trained")
    read = _records(target, planted, "engine A")
    said = paired_verdict({"trained": trained, "engine A": read}, 4)
    assert said.startswith("acceptance differs on"), said
    # two engines reading the same planted file agree exactly: the cross-engine comparison is blind to it
    again = _records(target, load_eagle3(folder, target.config).double(), "engine B")
    assert paired_verdict({"engine A": read, "engine B": again}, 4) == IDENTICAL


def test_the_norm_plant_does_not_load_in_the_kits_reader(target, head, tmp_path):
    folder = _export(head, tmp_path / "norm", PLANTS["norm_skipped"])
    with pytest.raises(ValueError, match="missing \\['norm.weight'\\]"):
        load_eagle3(folder, target.config)


def test_train_drafter_checks_every_eagle3_export(target, head, tmp_path, monkeypatch):
    """The command's save step runs the round trip: a planted export stops the command."""
    from specstudy.commands.train_drafter_command import save

    assert save(head, tmp_path / "ok", "tiny", {}, target).is_dir()
    state = head.engine_state_dict()
    _shift_d2t(state, {})
    monkeypatch.setattr(Eagle3Draft, "engine_state_dict", lambda self: state)
    with pytest.raises(ValueError, match="d2t maps"):
        save(head, tmp_path / "planted", "tiny", {}, target)

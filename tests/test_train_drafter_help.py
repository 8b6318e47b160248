"""``specstudy train-drafter``'s help names every drafter kind it trains (it once left out eagle3)."""

from __future__ import annotations

from specstudy.cli import COMMANDS, build_parser
from specstudy.engine.drafters import KINDS

#: each kind as the subcommand's one-line description names it
PHRASES = {
    "heads": "Medusa heads",
    "layer_skip_adapter": "layer-skip adapter",
    "eagle": "EAGLE-style layer",
    "eagle3": "EAGLE-3 head",
    "mtp": "MTP layer",
    "dflash": "DFlash block drafter",
}


def test_train_drafter_help_names_every_kind():
    assert set(PHRASES) == set(KINDS), "a new drafter kind: name it in train-drafter's help, then here"
    description = COMMANDS["train-drafter"][1]
    assert [k for k, phrase in PHRASES.items() if phrase not in description] == []
    sub = build_parser("train-drafter")._subparsers._group_actions[0].choices["train-drafter"]
    kind_help = next(a.help for a in sub._actions if "--kind" in a.option_strings)
    assert [k for k in KINDS if k not in str(kind_help).split(" | ")] == []

import json
import subprocess
import sys

import pytest

from specstudy.cli import COMMANDS, build_parser, main


def test_predict_json(capsys):
    assert (
        main(
            [
                "predict",
                "--hardware",
                "a100",
                "--target-params",
                "70e9",
                "--draft-params",
                "7e9",
                "--alpha",
                "0.75",
                "--json",
            ]
        )
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    for key in ("baseline_tokens_per_s", "c", "acceptance_length", "gamma", "speedup", "break_even_batch"):
        assert key in out
    assert 1.5 < out["speedup"] < 3.0 and out["n_devices"] == 2


def test_predict_bad_hardware_exits_2_with_named_value(capsys):
    assert main(["predict", "--hardware", "tpu9", "--target-params", "1e9", "--alpha", "0.5"]) == 2
    err = capsys.readouterr().err
    assert "tpu9" in err and "a100" in err


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_subcommand_has_help_and_json(name):
    parser = build_parser()
    sub = parser._subparsers._group_actions[0].choices[name]
    assert sub.description
    assert any("--json" in a.option_strings for a in sub._actions)


def test_console_script_help():
    out = subprocess.run([sys.executable, "-m", "specstudy.cli", "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "predict" in out.stdout

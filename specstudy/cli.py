"""The ``specstudy`` console script: one subcommand per module in :mod:`specstudy.commands`.

Each command module defines ``HELP``, ``add_arguments(parser)`` and ``run(args) -> int``;
every subcommand gets ``--json`` for machine-readable output.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# subcommand -> module under specstudy.commands
COMMANDS = {
    "predict": "predict",
    "generate": "generate",
    "tasks": "tasks",
    "train-drafter": "train_drafter",
    "serve-bench": "serve_bench",
    "run": "run", "report": "report",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specstudy", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, module in COMMANDS.items():
        mod = importlib.import_module(f"specstudy.commands.{module}")
        p = sub.add_parser(name, help=mod.HELP, description=mod.HELP)
        p.add_argument("--json", action="store_true", help="print machine-readable JSON")
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    from .params import ParamsError

    args = build_parser().parse_args(argv)
    try:
        return int(args._run(args) or 0)
    except (ParamsError, ValueError, FileNotFoundError) as e:
        print(f"specstudy {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

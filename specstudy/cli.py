"""The ``specstudy`` console script: one subcommand per module in :mod:`specstudy.commands`.

Each command module defines ``add_arguments(parser)`` and ``run(args) -> int``; every subcommand
gets ``--json`` for machine-readable output.  Only the module of the command being run is
imported, so validation and dry runs start in well under a second of imports.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from .config import ParamsError

# subcommand -> (module under specstudy.commands, one-line help)
COMMANDS = {
    "predict": (
        "predict_command",
        "predict baseline tokens/s, c, acceptance length, optimal gamma and speedup from the roofline cost model",
    ),
    "generate": (
        "generate_command",
        "decode one prompt with the reference engine (any method) and print text, ids, alpha, acceptance length, TTFT, TPOT, tok/s",
    ),
    "tasks": (
        "tasks_command",
        "list task categories with their sources, offline record counts, licences and sha256 status; "
        "'tasks show NAME' prints sample prompts",
    ),
    "train-drafter": (
        "train_drafter_command",
        "distil a small drafter (Medusa heads, a layer-skip adapter, an EAGLE-style layer, an EAGLE-3 head, an "
        "MTP layer or a DFlash block drafter) "
        "from the target on its own generations",
    ),
    "serve-bench": (
        "serve_bench_command",
        "serving benchmark: Poisson/bursty or fixed-concurrency load on a vLLM / SGLang / llama.cpp / "
        "OpenAI-compatible server, paired runs with and without speculation, speedup per rate",
    ),
    "models": (
        "models_command",
        "'models configs --hardware GPU': fetch each hub model's config.json into the HF cache and check the study against them",
    ),
    "study": (
        "study_command",
        "the whole study: run every cell not on disk, execute the notebooks and render the report, check the "
        "acceptance golden; one exit code (0 ok, 2 bad input, 3 cells failed, 4 notebooks failed, 5 golden moved)",
    ),
    "run": ("run_command", "only the cells of params/hardware/<gpu>.yaml (warm-up, paired AR baseline, resume)"),
    "check": (
        "check_command",
        "acceptance regression gate: compare a study's per-position acceptance and AL per row with a golden file "
        "(--golden), or write one (--write-golden)",
    ),
    "report": (
        "report_command",
        "render outputs/<gpu>/report.md (+ HTML) from the records, executing the notebooks; or merge several",
    ),
}


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser; with ``only`` set, just that subcommand's module is imported and its arguments added."""
    parser = argparse.ArgumentParser(prog="specstudy", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.add_argument("--json", action="store_true", help="print machine-readable JSON")
        if only is None or name == only:
            mod = importlib.import_module(f"specstudy.commands.{module}")
            mod.add_arguments(p)
            p.set_defaults(_run=mod.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    chosen = next((a for a in argv if a in COMMANDS), None)
    args = build_parser(chosen).parse_args(argv)
    try:
        return int(args._run(args) or 0)
    except (ParamsError, ValueError, FileNotFoundError) as e:
        print(f"specstudy {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

"""A GPU-only engine's server command lines checked by the engine's own argument parser, on this CPU.

SGLang has no CPU build, but its ``ServerArgs`` (``sglang/srt/server_args.py``) imports without CUDA:
the 0.5.23 wheel unpacked (``pip download sglang==0.5.23 --no-deps``) beside ``orjson``, ``ipython`` and
``traitlets``, on the Python of ``.venv-vllm`` (torch, transformers, msgspec).  A rehearsal hands every
SGLang cell's argv, built exactly as the study would start the server, to ``ServerArgs.add_cli_args``'s
parser, and its speculative algorithm to SGLang's ``SpeculativeAlgorithm``: an unknown flag, a value
outside a choice or of the wrong type, or an unknown algorithm fails the cell, named.  What
``ServerArgs.__post_init__`` checks against the GPU and the model is not run.  Parsing is not running: such
a cell is "argv validated", never "passed".  TensorRT-LLM has no such path (its declaration's ``argv_unchecked_why`` says why).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterable
from typing import Any

from ..backends import get_backend
from ..config import StudyConfig
from ..frameworks import DECLARATIONS
from .plan import CellPlan

#: the program run by the Python that can import SGLang: argvs on stdin, one error (or null) each on stdout
_PARSE = """
import argparse, contextlib, io, json, sys
from sglang.srt.server_args import ServerArgs
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
out = []
for argv in json.load(sys.stdin):
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            ns = parser.parse_args(argv)
        if ns.speculative_algorithm is not None:  # checked by SGLang after parsing, in ServerArgs itself
            SpeculativeAlgorithm.from_string(ns.speculative_algorithm)
        out.append(None)
    except ValueError as e:
        out.append(str(e))
    except SystemExit:
        out.append(err.getvalue().strip().splitlines()[-1] if err.getvalue().strip() else "refused")
print("RESULT" + json.dumps(out))
"""


def server_argvs(cfg: StudyConfig, plans: Iterable[CellPlan], framework: str) -> dict[str, list[str]]:
    """Cell id -> the server's arguments (after ``python -m module``) as the study would start it."""
    from .pool import BackendPool

    pool = BackendPool(cfg, log=lambda m: None, cuda=True)  # the GPU build's options
    out = {}
    for p in plans:
        if p.cell.framework != framework:
            continue
        opts = {k: v for k, v in pool._options(p).items() if k != "python"}
        backend: Any = get_backend(framework, python="python", **opts)  # a server backend: it has server_argv
        argv = backend.server_argv(p.backend_cell())
        out[p.cell_id] = [a.replace("{host}", "127.0.0.1").replace("{port}", "30000") for a in argv[3:]]
    return out


def parse_with_sglang(argvs: dict[str, list[str]], python: str, path: str, timeout_s: float = 300) -> dict[str, Any]:
    """Cell id -> None when SGLang's own parser takes its argv, else the parser's error line.
    ``python`` and ``path`` (its PYTHONPATH): where ``sglang.srt.server_args`` imports."""
    ids = list(argvs)
    done = subprocess.run(
        [python, "-c", _PARSE],
        input=json.dumps([argvs[i] for i in ids]),
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env={"PYTHONPATH": path, "PATH": "/usr/bin:/bin", "HOME": "/tmp"},
    )
    line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT")), None)
    if line is None:
        raise RuntimeError(
            f"SGLang's server_args did not import with {python} (PYTHONPATH={path}): {done.stderr[-600:]}"
        )
    return dict(zip(ids, json.loads(line[len("RESULT") :]), strict=True))


def validate_rows(rows: list[dict[str, Any]], cfg: StudyConfig, plans: list[CellPlan], parse: Any = None) -> None:
    """Each not-rehearsed row's status, in place: SGLang's rows "argv validated" (every cell of the row
    taken by SGLang's parser) or "argv refused" (the first refused cell and the parser's words) where
    ``parse`` (default: :func:`parse_with_sglang` with SPECSTUDY_SGLANG_PYTHON and SPECSTUDY_SGLANG_PATH,
    when both are set) can run; the other engines' rows say why their check does not run."""
    import os

    py, path = os.environ.get("SPECSTUDY_SGLANG_PYTHON"), os.environ.get("SPECSTUDY_SGLANG_PATH")
    if parse is None and py and path:
        parse = lambda argvs: parse_with_sglang(argvs, py, path)  # noqa: E731
    sglang = [p for p in plans if p.cell.framework == "sglang"]
    errors = parse(server_argvs(cfg, sglang, "sglang")) if parse is not None and sglang else None
    for row in rows:
        fw = row["framework"]
        if fw == "sglang" and errors is not None:
            mine = [p.cell_id for p in sglang if (p.is_baseline if row["method"] == "ar" else p.label == row["label"])]
            if not mine:  # nothing of the row was built: it stays not rehearsed
                continue
            bad = next(((c, errors[c]) for c in mine if errors[c]), None)
            row["status"] = (
                f"argv refused by SGLang's parser: cell {bad[0]}: {bad[1]}"
                if bad
                else f"argv validated by SGLang's parser ({len(mine)} cells; not run: no CPU build)"
            )
        elif fw == "sglang":
            row["why"] = "SGLang's parser not here (set SPECSTUDY_SGLANG_PYTHON and SPECSTUDY_SGLANG_PATH)"
        elif DECLARATIONS[fw].argv_unchecked_why:
            row["why"] = DECLARATIONS[fw].argv_unchecked_why

"""SGLang's real ServerArgs argparse (``make test-engines``), where an interpreter with SGLang
0.5.23 importable is given in ``SPECSTUDY_SGLANG_PYTHON`` (the kit's .venv-sglang on a GPU box, or
a ``--no-deps`` install on a CPU box: building the parser needs no GPU).  CI uses the fixture
dumped from the same parser (tests/backends/test_sglang.py)."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

pytestmark = pytest.mark.engines


def test_launch_argv_parses_with_sglangs_real_parser():
    py = os.environ.get("SPECSTUDY_SGLANG_PYTHON")
    if not py:
        from specstudy.environments.install import ENVIRONMENTS, is_installed, python_of

        if not is_installed(ENVIRONMENTS["sglang"]):
            pytest.skip("no SGLang interpreter: set SPECSTUDY_SGLANG_PYTHON or make engine-sglang")
        py = str(python_of(ENVIRONMENTS["sglang"]))
    code = """
import argparse, json, sys
sys.path.insert(0, %r)
from sglang.srt.server_args import ServerArgs
from specstudy.backends.sglang.sglang_server import SglangServerBackend
from specstudy.records import Cell
b = SglangServerBackend("/m", python="py", dtype="bfloat16", max_model_len=4096, prefix_cache=False, tensor_parallel_size=2)
out = {}
for method, opts in (("eagle", ()), ("eagle", (("num_draft_tokens", 16), ("topk", 4))), ("ngram", ())):
    argv = [a.replace("{host}", "127.0.0.1").replace("{port}", "1") for a in
            b.server_argv(Cell("t", "h", "sglang", method, "x", "m", drafter="/d", gamma=4, options=opts))[3:]]
    p = argparse.ArgumentParser(); ServerArgs.add_cli_args(p)
    ns = p.parse_args(argv)
    out[method + str(len(opts))] = [ns.disable_radix_cache, ns.dtype, ns.context_length, ns.tp_size,
        ns.speculative_algorithm, ns.speculative_eagle_topk, ns.speculative_num_draft_tokens,
        ns.speculative_ngram_max_bfs_breadth]
print("RESULT" + json.dumps(out))
""" % os.getcwd()  # noqa: UP031
    proc = subprocess.run([py, "-c", code], capture_output=True, text=True, timeout=300)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT")), None)
    assert line, proc.stderr[-3000:]
    out = json.loads(line[6:])
    assert out["eagle0"] == [True, "bfloat16", 4096, 2, "EAGLE", 1, 5, 10]
    assert out["eagle2"][5:7] == [4, 16]
    assert out["ngram0"][4] == "NGRAM" and out["ngram0"][7] == 1

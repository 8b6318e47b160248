"""Live (``make test-engines``): the kit's EAGLE-3 folder as a llama.cpp study cell (method eagle3):
the backend converts it to the eagle3 GGUF and starts xllamacpp's server with ``draft-eagle3``.

Greedy, 2 prompts x 16 tokens: speculation changes no token against the same server's AR, the
head drafts, and the per-position counters come back (acceptance printed, never asserted against
a number)."""

from __future__ import annotations

import pytest

from specstudy.records import Cell, Request, Sampling

pytestmark = pytest.mark.engines

HEAD = "params/drafters/smollm2-135m-eagle3"
REQS = [Request("c0", "def add(a, b):\n"), Request("c1", "def fibonacci(n):\n    ")]
GREEDY = Sampling(max_new_tokens=16)


def test_the_eagle3_folder_runs_as_a_llamacpp_cell(tmp_path):
    from specstudy.backends.llamacpp.llamacpp_backend import LlamaCppBackend

    def cell(method: str, gamma: int | None = None) -> Cell:
        return Cell(
            "t", "cpu", "llamacpp", method, "code", "smollm2-135m", drafter=HEAD if gamma else None, gamma=gamma
        )

    b = LlamaCppBackend("smollm2-135m", threads=2, log_dir=tmp_path)
    try:
        ar = list(b.run(REQS, GREEDY, cell("ar")))
        spec = list(b.run(REQS, GREEDY, cell("eagle3", 4)))
        draft = b.plan(cell("eagle3", 4)).draft
    finally:
        b.close()
    assert [r.status for r in ar + spec] == ["ok"] * 4, [r.error for r in ar + spec]
    assert [r.output_ids for r in spec] == [r.output_ids for r in ar]  # greedy: speculation changes no token
    assert sum(r.drafted_tokens or 0 for r in spec) > 0
    assert draft is not None and draft.meta["general.architecture"] == "eagle3" and "/gguf/eagle3/" in draft.path
    print({"drafted": [r.drafted_tokens for r in spec], "accepted": [r.accepted_tokens for r in spec]})

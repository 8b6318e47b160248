"""A length-tier cell (study-engines' ``length_tiers``: llama.cpp on 1k/2k/4k-token prompts) is not
flagged as stalled for its own context length, and a real outlier inside a tier is still rerun alone.

The requests carry their tier the way the tier loader writes it (``data.tier_prompts.tier_policy``);
the runner stamps it on each record; a stand-in server decodes each tier at its own speed (the 4k
tier 3.2x the cell's median time per token, past the 3x rule, as the issue's 60 vs 27 ms cell read
against its whole cell) and one 4k request at 3x its tier once.
"""

from __future__ import annotations

import pytest
from support import TINY_STUDY, write_study

from specstudy.analysis import validity
from specstudy.backends.base import ServingBackend
from specstudy.config import load_study
from specstudy.data.rendering import TaskRequest
from specstudy.data.tier_prompts import tier_policy
from specstudy.layout import StudyLayout
from specstudy.records import Request
from specstudy.run.plan import expand
from specstudy.run.study_runner import run_study

TPOT = {1024: 0.020, 2048: 0.025, 4000: 0.080}
OUTLIER = "tier4000/2"

STUDY = (
    TINY_STUDY.replace("frameworks: [reference]", "frameworks: [openai]")
    .replace("    - {method: ngram, label: Prompt lookup, options: {ngram_min: 1, ngram_max: 2}}\n", "")
    .replace("    - {method: layer_skip, label: Early exit, options: {exit_layer: 1}, max_batch_size: 1}\n", "")
    .replace("batch_sizes: [1, 2]", "batch_sizes: [1]")
    .replace("tasks: [code, chat]", "tasks: [code]")
    .replace("prompts_per_task: 2", "prompts_per_task: 15")
)


def tiered_requests(task, n, seed, tokenizer):
    """Five prompts per tier (plus the warm-up), each carrying its tier as the tier loader writes it."""
    out = [
        TaskRequest(prompt_id=f"tier{t}/{i}", prompt="", task=task, prompt_ids=(5, 6, 7), input_policy=tier_policy(t))
        for t in TPOT
        for i in range(5)
    ]
    return [*out, Request(prompt_id="warmup/0", prompt="", task=task, prompt_ids=(5, 6))][:n]


class TierServer(ServingBackend):
    framework = "openai"

    def __init__(self):
        self.tokenizer, self.measured = None, []

    def ensure_server(self, cell):
        pass

    def offer_run(self, run, *, gauges=True):  # pragma: no cover - closed-loop cells only
        raise AssertionError("closed-loop cells only")

    def send(self, request, sampling, cell, timeout_s=None):
        tier = int(request.prompt_id[4:].split("/")[0]) if request.prompt_id.startswith("tier") else 1024
        tpot = TPOT[tier] * (3.1 if request.prompt_id == OUTLIER and self.measured.count(OUTLIER) == 1 else 1.0)
        rec = cell.new_record(request, sampling, output_tokens=24, first_token_s=0.05, start_epoch=1.0)
        rec.chunk_times_s = [0.05 + tpot * i for i in range(24)]
        rec.end_s = rec.chunk_times_s[-1]
        return rec

    def run(self, requests, sampling, cell):
        for r in requests:
            if not r.prompt_id.startswith("warmup"):
                self.measured.append(r.prompt_id)
            yield self.send(r, sampling, cell)

    def close(self):
        pass


@pytest.mark.validity
def test_a_length_tier_cell_is_judged_by_tier_and_only_its_real_outlier_is_rerun(tmp_path):
    cfg = load_study("cpu", write_study(tmp_path, STUDY))
    server = TierServer()
    kw = dict(factory=lambda fw, **o: server, request_loader=tiered_requests, progress=False, log=lambda m: None)
    res = run_study(cfg, expand(cfg), StudyLayout(tmp_path / "out"), **kw)
    (cell,) = res
    assert cell.status == "done", cell.message
    assert "1 stalled request(s), rerun once: clean" in cell.line(1, 1)
    assert server.measured.count(OUTLIER) == 2 and len(server.measured) == 16  # the rerun cost one request
    records = StudyLayout(tmp_path / "out").read_part(cell.cell_id)
    assert {r.input_policy for r in records} == {"tier:1024", "tier:2048", "tier:4000"}
    assert validity.stalls(records) == []  # not flagged for its own context length
    for r in records:  # the same records judged against the whole cell: the 4k tier reads as stalls
        r.input_policy = ""
    assert {f.requests[0] for f in validity.stalls(records)} == {f"tier4000/{i}" for i in range(5)}

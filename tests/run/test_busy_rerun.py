"""A server cell measured on a busy machine is measured again with its baseline, within the budget."""

from __future__ import annotations

import dataclasses

import pytest
from support import TINY_STUDY, run_tiny_study, write_study

from specstudy.analysis import validity
from specstudy.analysis.study_records import load
from specstudy.backends.base import ServingBackend
from specstudy.config import load_study
from specstudy.layout import StudyLayout
from specstudy.report.validity_text import reruns_frame
from specstudy.run.plan import expand

STUDY = (
    TINY_STUDY.replace("frameworks: [reference]", "frameworks: [openai]")
    .replace("    - {method: layer_skip, label: Early exit, options: {exit_layer: 1}, max_batch_size: 1}\n", "")
    .replace("batch_sizes: [1, 2]", "batch_sizes: [1]")
    .replace("tasks: [code, chat]", "tasks: [code]")
)


class Server(ServingBackend):
    """A server stand-in (no process) that makes the machine look busy while it serves its first
    speculative cell: the next telemetry check reads steal."""

    framework = "openai"
    busy_next = False

    def __init__(self, log):
        self.tokenizer, self.log = None, log

    def ensure_server(self, cell):
        pass

    def run(self, requests, sampling, cell):
        if all(r.prompt_id.startswith("warmup") for r in requests):
            yield from (self.send(r, sampling, cell) for r in requests)
            return
        self.log.append(cell.method)
        if cell.method != "ar" and self.log.count(cell.method) == 1:
            Server.busy_next = True
        for r in requests:
            yield cell.new_record(r, sampling, output_tokens=6, first_token_s=0.01, end_s=0.05, start_epoch=1.0)

    def offer_run(self, run, *, gauges=True):  # pragma: no cover - no request-rate cell here
        raise AssertionError("closed-loop cells only")

    def send(self, request, sampling, cell, timeout_s=None):
        return cell.new_record(request, sampling, output_tokens=6, first_token_s=0.01, end_s=0.05, start_epoch=1.0)

    def close(self):
        pass


@pytest.fixture
def busy_once(monkeypatch):
    def busy(summary):
        was, Server.busy_next = Server.busy_next, False
        return ["CPU steal 27 %"] if was else []

    monkeypatch.setattr(validity, "busy_during", busy)
    Server.busy_next = False


def _study(tmp_path, budget):
    cfg = load_study("cpu", write_study(tmp_path, STUDY))
    return dataclasses.replace(cfg, busy_rerun_budget_s=budget), expand(cfg)


def test_a_busy_server_cell_is_measured_again_after_its_baseline(tmp_path, busy_once):
    cfg, plans = _study(tmp_path, 1e9)
    log: list[str] = []
    res = run_tiny_study(cfg, plans, tmp_path / "out", lambda fw, **o: Server(log))
    assert log == ["ar", "ngram", "ar", "ngram"]  # the busy cell's baseline measured again, then the cell
    last = [r for r in res if r.status == "done"][-1]
    assert "busy machine (CPU steal 27 %), measured again with its baseline: quiet" in last.line(1, 2)
    shown = reruns_frame(load(tmp_path / "out"))
    assert set(shown["First attempt"]) == {"busy machine: CPU steal 27 %"}
    assert len(shown) == 2  # the cell and its baseline
    assert len(list((StudyLayout(tmp_path / "out").root / "stalled").glob("*"))) == 2  # first attempts kept


def test_without_a_budget_a_busy_server_cell_is_measured_once_and_stays_flagged(tmp_path, busy_once):
    cfg, plans = _study(tmp_path, 0)
    log: list[str] = []
    run_tiny_study(cfg, plans, tmp_path / "out", lambda fw, **o: Server(log))
    assert log == ["ar", "ngram"] and reruns_frame(load(tmp_path / "out")).empty


def test_a_busy_cell_is_not_rerun_past_the_cells_budget_and_says_so(tmp_path, busy_once):
    """Within the busy-rerun budget but not within what the study's ``cells_budget_s`` has left (a budget
    of a millisecond is spent before the first cell ends): measured once, flagged, and the note names why."""
    cfg, plans = _study(tmp_path, 1e9)
    cfg = dataclasses.replace(cfg, cells_budget_s=0.001)
    log: list[str] = []
    res = run_tiny_study(cfg, plans, tmp_path / "out", lambda fw, **o: Server(log))
    assert log == ["ar", "ngram"] and reruns_frame(load(tmp_path / "out")).empty
    last = [r for r in res if r.status == "done"][-1]
    assert "not rerun (0 s left of the cells' budget), flagged" in last.line(1, 2)

import dataclasses

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from specstudy.records import Cell, Request, RequestRecord, Sampling, StepRecord, read_part, write_part


def _record(cell: Cell, pid: str = "p0", n: int = 5) -> RequestRecord:
    rec = cell.new_record(
        Request(pid, "hello"),
        Sampling(temperature=0.7, top_p=0.9, seed=3, max_new_tokens=n),
        input_tokens=4,
        output_tokens=n,
        first_token_s=0.1,
        end_s=0.5,
        chunk_times_s=[0.1, 0.3, 0.5],
        chunk_tokens=[1, 3, 1],
        output_ids=[1, 2, 3, 4, 5],
        token_entropy=[0.5] * n,
        target_logprobs=[-1.0] * n,
        peak_memory_bytes=123,
        extra={"load_avg": [1.0, 0.5, 0.2]},
    )
    rec.steps = [StepRecord(0, 0, 1, 0.1), StepRecord(4, 2, 3, 0.3, 0.05, 0.1), StepRecord(4, 0, 1, 0.5)]
    return rec.fill_acceptance_from_steps()


def test_cell_identity_and_new_record():
    cell = Cell(
        "s",
        "cpu",
        "reference",
        "draft_target",
        "code",
        "m",
        drafter="d",
        gamma=4,
        batch_size=2,
        options=(("dynamic", True),),
    )
    rec = _record(cell)
    assert rec.cell_id == cell.cell_id and rec.gamma == 4 and rec.batch_size == 2
    assert rec.temperature == 0.7 and rec.top_p == 0.9 and rec.seed == 3 and rec.max_new_tokens == 5
    other = Cell("s", "cpu", "reference", "draft_target", "code", "m", drafter="d", gamma=4, batch_size=2)
    assert other.cell_id != cell.cell_id  # options are part of the identity
    assert "/" not in cell.cell_id


def test_fill_acceptance_from_steps():
    rec = _record(Cell("s", "cpu", "reference", "ngram", "code", "m", gamma=4))
    assert rec.target_forwards == 3
    assert rec.drafted_tokens == 8 and rec.accepted_tokens == 2
    assert rec.drafts_per_position == [2, 2, 2, 2]
    assert rec.accepted_per_position == [1, 1, 0, 0]
    assert sum(s.emitted for s in rec.steps) == rec.output_tokens


def test_step_record_rejects_impossible_counts():
    with pytest.raises(ValueError, match="accepted=5"):
        StepRecord(drafted=4, accepted=5, emitted=6, t_s=0.0)
    with pytest.raises(ValueError, match="emitted=3"):
        StepRecord(drafted=4, accepted=1, emitted=3, t_s=0.0)


def test_bad_status_and_sampling_are_named():
    with pytest.raises(ValueError, match="status='crashed'"):
        RequestRecord("s", "cpu", "f", "m", "t", "p", 0, "c", "model", status="crashed")
    with pytest.raises(ValueError, match="top_p=1.5"):
        Sampling(top_p=1.5)
    with pytest.raises(ValueError, match="temperature=-1"):
        Sampling(temperature=-1)


def test_parquet_round_trip(tmp_path):
    cell = Cell("s", "cpu", "reference", "draft_target", "code", "m", gamma=4)
    recs = [_record(cell, f"p{i}") for i in range(3)]
    recs.append(cell.new_record(Request("p9", "x"), Sampling(), status="error", error="boom"))
    path = write_part(recs, tmp_path / "records" / f"{cell.cell_id}.parquet")
    back = read_part(path)
    assert back == recs
    assert back[-1].first_token_s is None and back[-1].accepted_per_position is None


def test_a_planned_id_survives_the_copy_a_backend_gets():
    cell = Cell("s", "cpu", "reference", "ngram", "code", "m", gamma=4, options=(("prompts", 2), ("ngram_min", 1)))
    planned = dataclasses.replace(cell, id=cell.identity_id())
    handed = dataclasses.replace(planned, options=(("ngram_min", 1),))  # method options only
    assert handed.cell_id == planned.cell_id == cell.cell_id
    assert dataclasses.replace(cell, options=(("ngram_min", 1),)).cell_id != cell.cell_id  # without an id: hashed


def test_parts_written_before_a_rename_read_back(tmp_path):
    cell = Cell("s", "cpu", "reference", "ngram", "code", "m", gamma=4)
    rec = _record(cell)
    path = write_part([rec], tmp_path / "new.parquet")
    table = pq.read_table(path)
    old = table.rename_columns(["verify_steps" if n == "target_forwards" else n for n in table.column_names])
    old = old.drop_columns(["draft_steps", "label", "sweeps"])
    pq.write_table(old, tmp_path / "old.parquet")
    back = read_part(tmp_path / "old.parquet")[0]
    assert back.target_forwards == 3 and not hasattr(back, "verify_steps")
    assert back.draft_steps is None and back.label == "" and back.sweeps == []
    assert isinstance(pa.table({"x": [1]}), pa.Table)

"""One ``outputs/<hw>/`` folder: every path the runner writes and the report reads, in one place.

The runner writes each finished cell as one parquet part (temp name, then rename: the commit
point of the cell), the expanded plan once per run (``study.json``), the hardware profile it
measured (``hardware_profile.json``, so the report predicts with the same figures), telemetry per
cell, a failure file per failed cell and a provenance entry per run.  A part that does not read
back (a disk that filled, a copy that broke) is moved aside with a message naming it, so its cell
runs again instead of breaking every notebook.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import socket
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .costmodel import HardwareProfile
from .records import RequestRecord, read_part, write_part


class BadPartError(RuntimeError):
    """A record part on disk cannot be read back; the message names the file."""


def atomic_write_text(path: Path, text: str) -> None:
    """Write through a temp file in the same folder and rename: readers never see half a file
    (the host in the temp name: shards on several nodes of a shared filesystem may write at once)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{socket.gethostname()}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


#: the sweeps ``specstudy run --budget-min`` kept and cut (JSON); the report's head names the cut ones
BUDGET_FILE = "budget.json"
#: the marker file of a rehearsal's outputs (random-weight stand-ins): every report page and table is
#: marked REHEARSAL, and nothing in the folder is a measurement
REHEARSAL_MARKER = "REHEARSAL.json"
#: the line every page and table of a rehearsal carries
REHEARSAL_BANNER = "REHEARSAL: random-weight stand-ins of the profile's models on a CPU; no number here means anything"


def is_rehearsal(out: str | os.PathLike[str]) -> bool:
    """Whether an outputs folder holds a rehearsal."""
    return (Path(out) / REHEARSAL_MARKER).exists()


@dataclass(frozen=True)
class StudyLayout:
    """The files of one study's output folder (``outputs/<hardware>/``)."""

    root: Path

    @classmethod
    def of(cls, hardware: str, outputs: str | os.PathLike[str] = "outputs") -> StudyLayout:
        return cls(Path(outputs) / hardware)

    # ---- paths ---------------------------------------------------------------------------
    @property
    def records_dir(self) -> Path:
        return self.root / "records"

    @property
    def plan_path(self) -> Path:
        return self.root / "study.json"

    @property
    def profile_path(self) -> Path:
        return self.root / "hardware_profile.json"

    @property
    def provenance_path(self) -> Path:
        return self.root / "provenance.json"

    @property
    def run_log_path(self) -> Path:
        return self.root / "run.log"

    @property
    def tables_dir(self) -> Path:
        return self.root / "tables"

    @property
    def figures_dir(self) -> Path:
        return self.root / "figures"

    @property
    def notebooks_dir(self) -> Path:
        return self.root / "notebooks"

    @property
    def records_stamp(self) -> Path:
        """Touched whenever records change: a notebook executed before it is stale."""
        return self.root / ".records-updated"

    @property
    def report_path(self) -> Path:
        return self.root / "report.md"

    @property
    def servers_dir(self) -> Path:
        """Server and engine-worker logs (the study's own, wherever its outputs folder is)."""
        return self.root / "servers"

    @property
    def jobs_dir(self) -> Path:
        """A sharded study's jobs: submitit's folder (scripts, logs, results) and the index of submissions."""
        return self.root / "jobs"

    @property
    def jobs_index_path(self) -> Path:
        return self.jobs_dir / "jobs.json"

    def run_log_of(self, shard: str | None) -> Path:
        """The run log of a local run (``run.log``) or of one shard's job (``jobs/<shard>.log``)."""
        return self.run_log_path if shard is None else self.jobs_dir / f"{shard}.log"

    def part_path(self, cell_id: str) -> Path:
        return self.records_dir / f"{cell_id}.parquet"

    def telemetry_path(self, cell_id: str) -> Path:
        return self.root / "telemetry" / f"{cell_id}.parquet"

    def failed_path(self, cell_id: str) -> Path:
        return self.root / "failed" / f"{cell_id}.json"

    def failed_rows_path(self, cell_id: str) -> Path:
        """The rows of a cell whose server died (kept to read, never counted as measured)."""
        return self.root / "failed" / f"{cell_id}.parquet"

    # ---- records -------------------------------------------------------------------------
    def part_paths(self) -> list[Path]:
        """Finished parts only: temp files of a killed writer (dot names) are ignored."""
        if not self.records_dir.exists():
            return []
        return sorted(p for p in self.records_dir.glob("*.parquet") if not p.name.startswith("."))

    def is_done(self, cell_id: str) -> bool:
        return self.part_path(cell_id).exists()

    def check_part(self, cell_id: str) -> str | None:
        """None when the cell's part reads back; else move it aside and say where (resume reruns it)."""
        path = self.part_path(cell_id)
        if not path.exists():
            return None
        try:
            read_part(path)
        except Exception as e:  # pyarrow raises several types for a truncated or corrupt file
            bad = self.records_dir / "bad" / f"{path.stem}.{time.strftime('%Y%m%d-%H%M%S')}.parquet"
            bad.parent.mkdir(parents=True, exist_ok=True)
            os.replace(path, bad)
            return (
                f"record part {path} does not read back ({type(e).__name__}: {e}); moved to {bad}, rerunning its cell"
            )
        return None

    def write_part(self, cell_id: str, records: Sequence[RequestRecord]) -> Path:
        path = write_part(records, self.part_path(cell_id))
        for stale in (self.failed_path(cell_id), self.failed_rows_path(cell_id)):
            with contextlib.suppress(FileNotFoundError):
                stale.unlink()
        return path

    def read_part(self, cell_id: str) -> list[RequestRecord]:
        return self._read(self.part_path(cell_id))

    def read_records(self) -> dict[str, list[RequestRecord]]:
        """Every finished part, grouped by cell id; a part that does not read raises naming its file."""
        out: dict[str, list[RequestRecord]] = {}
        for path in self.part_paths():
            recs = self._read(path)
            if recs:
                out.setdefault(recs[0].cell_id, []).extend(recs)
        return out

    def read_all(self) -> list[RequestRecord]:
        """Every record of every finished part, in part order."""
        return [r for recs in self.read_records().values() for r in recs]

    @staticmethod
    def _read(path: Path) -> list[RequestRecord]:
        try:
            return read_part(path)
        except Exception as e:
            raise BadPartError(
                f"record part {path} cannot be read ({type(e).__name__}: {e}); delete it or rerun "
                "`make study` (the runner moves such parts aside and reruns their cells)"
            ) from e

    # ---- telemetry -----------------------------------------------------------------------
    def write_telemetry(self, cell_id: str, samples: Sequence[Mapping[str, Any]]) -> None:
        import pandas as pd

        path = self.telemetry_path(cell_id)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        pd.DataFrame(list(samples)).assign(cell_id=cell_id).to_parquet(tmp)
        os.replace(tmp, path)

    def read_telemetry(self) -> Any:
        """All telemetry samples as one pandas frame, or None when none were written."""
        folder = self.root / "telemetry"
        files = [f for f in sorted(folder.glob("*.parquet")) if not f.name.startswith(".")] if folder.exists() else []
        if not files:
            return None
        import pandas as pd

        return pd.concat([pd.read_parquet(f) for f in files], ignore_index=True)

    # ---- engine cost measurements ----------------------------------------------------------
    @property
    def engine_costs_dir(self) -> Path:
        return self.root / "engine_costs"

    def engine_costs_path(self, framework: str, model: str, drafter: str | None) -> Path:
        name = "_".join(x.replace("/", "--") for x in (framework, model, drafter or "none"))
        return self.engine_costs_dir / f"{name}.json"

    def write_engine_costs(self, framework: str, model: str, drafter: str | None, doc: Mapping[str, Any]) -> Path:
        path = self.engine_costs_path(framework, model, drafter)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps({"framework": framework, **doc}, indent=1, default=str))
        return path

    def read_engine_costs(self) -> list[dict[str, Any]]:
        """Every engine cost measurement of this folder (an unreadable file is named, not skipped)."""
        if not self.engine_costs_dir.exists():
            return []
        out = []
        for f in sorted(self.engine_costs_dir.glob("*.json")):
            try:
                out.append(json.loads(f.read_text()))
            except ValueError as e:
                raise BadPartError(f"engine cost file {f} cannot be read ({e}); delete it and rerun the study") from e
        return out

    # ---- plan, profile, provenance -------------------------------------------------------
    def write_plan(self, doc: Mapping[str, Any]) -> Path:
        atomic_write_text(self.plan_path, json.dumps(doc, indent=1, default=str))
        return self.plan_path

    def read_plan(self) -> dict[str, Any]:
        """The plan snapshot, or {} for a folder written without one."""
        return json.loads(self.plan_path.read_text()) if self.plan_path.exists() else {}

    @property
    def precision_path(self) -> Path:
        """Per targeted row: its precision target, the half-width reached and what stopped it."""
        return self.root / "precision.json"

    def precision_path_of(self, shard: str | None) -> Path:
        """A local run's ``precision.json``, or one shard's (``jobs/<shard>.precision.json``): shards
        run at once and each extends only its own rows."""
        return self.precision_path if shard is None else self.jobs_dir / f"{shard}.precision.json"

    def write_precision(self, doc: Mapping[str, Any], shard: str | None = None) -> Path:
        path = self.precision_path_of(shard)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps(doc, indent=1, default=str))
        return path

    def read_precision(self, shard: str | None = None) -> dict[str, Any]:
        """The precision stops, or {} for a study without targets (or written before they were kept).
        One shard's own (``shard``), or the study's: the local run's and every shard's together (cells
        joined; per sweep the seconds spent summed, the longest last chunk)."""
        if shard is not None:
            path = self.precision_path_of(shard)
            return json.loads(path.read_text()) if path.exists() else {}
        paths = [self.precision_path] if self.precision_path.exists() else []
        paths += sorted(self.jobs_dir.glob("*.precision.json")) if self.jobs_dir.is_dir() else []
        out: dict[str, Any] = {}
        for doc in (json.loads(p.read_text()) for p in paths):
            out.setdefault("cells", {}).update(doc.get("cells", {}))
            for name, sw in doc.get("sweeps", {}).items():
                had = out.setdefault("sweeps", {}).setdefault(name, {**sw, "spent_s": 0.0, "last_chunk_s": 0.0})
                had["spent_s"] = round(had["spent_s"] + float(sw.get("spent_s") or 0.0), 3)
                had["last_chunk_s"] = max(had["last_chunk_s"], float(sw.get("last_chunk_s") or 0.0))
            if doc.get("study_time_left_s") is not None:  # the cells' budget: the least any run had left
                out["study_time_left_s"] = min(out.get("study_time_left_s", math.inf), doc["study_time_left_s"])
        return out

    def save_profile(self, profile: HardwareProfile) -> None:
        atomic_write_text(self.profile_path, json.dumps(dataclasses.asdict(profile), indent=1))

    def load_profile(self) -> HardwareProfile | None:
        """The profile the runner used (measured once, at run time); None if it was not saved."""
        if not self.profile_path.exists():
            return None
        return HardwareProfile(**json.loads(self.profile_path.read_text()))

    def append_provenance(self, entry: Mapping[str, Any]) -> None:
        """One entry more; read, extended and written under a lock (shards of one study append at once)."""
        import fcntl

        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.root / ".provenance.lock", "w") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            runs = self.provenance_runs()
            atomic_write_text(self.provenance_path, json.dumps({"runs": [*runs, dict(entry)]}, indent=1, default=str))

    def provenance_runs(self) -> list[dict[str, Any]]:
        if not self.provenance_path.exists():
            return []
        with contextlib.suppress(ValueError, OSError):
            return list(json.loads(self.provenance_path.read_text()).get("runs", []))
        return []

    # ---- a cell's first attempt, rerun for its stalls -------------------------------------
    def stalled_path(self, cell_id: str) -> Path:
        """The first attempt of a cell rerun because requests stalled (kept to read, never counted)."""
        return self.root / "stalled" / f"{cell_id}.parquet"

    def write_stalled(self, cell_id: str, records: Sequence[RequestRecord]) -> Path:
        return write_part(records, self.stalled_path(cell_id))

    # ---- failures ------------------------------------------------------------------------
    def write_failed_rows(self, cell_id: str, records: Sequence[RequestRecord]) -> Path:
        return write_part(records, self.failed_rows_path(cell_id))

    def record_failure(self, cell_id: str, doc: Mapping[str, Any]) -> None:
        atomic_write_text(self.failed_path(cell_id), json.dumps(dict(doc), indent=1, default=str))

    def failed_cells(self) -> list[dict[str, Any]]:
        """Cells whose last attempt failed and that have no records since."""
        folder = self.root / "failed"
        found = []
        for p in sorted(folder.glob("*.json")) if folder.exists() else []:
            d = json.loads(p.read_text())
            if not self.is_done(d.get("cell_id", p.stem)):
                found.append(d)
        return found

    # ---- one writer at a time ------------------------------------------------------------
    @contextlib.contextmanager
    def lock(self, shard: str | None = None) -> Iterator[None]:
        """One runner per folder: a second (``make -j``, two terminals) fails fast instead of racing.

        A shard's job locks only its shard (``.runner-<shard>.lock``): shards write disjoint cells.
        """
        import fcntl

        self.root.mkdir(parents=True, exist_ok=True)
        path = self.root / (".runner.lock" if shard is None else f".runner-{shard}.lock")
        with open(path, "w") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise RuntimeError(f"another `specstudy run` is writing {self.root} (lock {path})") from None
            f.write(str(os.getpid()))
            f.flush()
            yield

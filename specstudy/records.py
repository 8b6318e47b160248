"""Run records: one dataclass per request and one per verification step, for every backend.

Every backend (reference engine, HF, vLLM, SGLang, any OpenAI-compatible server) yields the
same :class:`RequestRecord`.  Acceptance that a backend cannot see is ``None``, never guessed.
Records are written incrementally, one parquet part per finished cell (temp name, then
``os.replace``), so a killed study loses at most the cell in flight and a rerun skips the
finished ones.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa

#: ``cut``: a capacity probe's request stopped (in flight) or never sent once the probe had broken its SLO
#: whatever its other requests did (:class:`specstudy.backends.loadgen.CutRule`)
STATUSES = ("ok", "oom", "timeout", "error", "cut")


def cut_short(records: Sequence[RequestRecord]) -> bool:
    """Whether a run was a probe cut once broken: it ran only its first prompts, so it pairs for no speedup."""
    return any(r.status == "cut" for r in records)


#: the family and label of an A/A control cell: AR measured against AR through the pairing of a
#: speculative cell (the measurement's own bias and precision)
CONTROL_FAMILY = "control"
CONTROL_LABEL = "A/A control"
#: how a speculative record's pair was timed (its ``extra["pairing"]``): beside its AR twin,
#: prompt by prompt, or after the whole baseline cell
PAIRED_IN_TIME = "in time (ABBA)"
PAIRED_CELL_AFTER_CELL = "cell after cell"


@dataclass(frozen=True)
class Sampling:
    """Sampling parameters, identical for a method and its paired baseline."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int = 0
    max_new_tokens: int = 64
    ignore_eos: bool = True

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature={self.temperature!r}: must be >= 0 (0 means greedy)")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p={self.top_p!r}: must be in (0, 1]")
        if self.top_k < 0:
            raise ValueError(f"top_k={self.top_k!r}: must be >= 0 (0 means no top-k)")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens={self.max_new_tokens!r}: must be >= 1")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass(frozen=True)
class Request:
    """One prompt to decode.  ``prompt`` is text; ``prompt_ids`` is set when already tokenized."""

    prompt_id: str
    prompt: str
    task: str = "adhoc"
    prompt_ids: tuple[int, ...] | None = None
    messages: tuple[tuple[str, str], ...] | None = None  # (role, content) turns, for chat
    #: a trace's own output length for this request (None: the cell's sampling.max_new_tokens)
    max_new_tokens: int | None = None
    #: a trace's recorded arrival, seconds after its first request (time scale applied)
    arrival_s: float | None = None
    #: constrained decoding: a JSON schema (as JSON text) or a grammar the output must follow
    json_schema: str | None = None
    grammar: str | None = None

    def sampling_for(self, sampling: Sampling) -> Sampling:
        """The cell's sampling with this request's own output length, where a trace gives one."""
        if self.max_new_tokens is None or self.max_new_tokens == sampling.max_new_tokens:
            return sampling
        return dataclasses.replace(sampling, max_new_tokens=self.max_new_tokens)


@dataclass
class StepRecord:
    """One verification step: a target forward that checks ``drafted`` tokens.

    ``emitted`` tokens leave the step: the accepted drafts plus the bonus (or corrected) token,
    fewer when the request ends inside the step.  AR steps have drafted = accepted = 0,
    emitted = 1.  ``t_s`` is the step's end, in seconds since the request started.
    """

    drafted: int
    accepted: int
    emitted: int
    t_s: float
    draft_s: float | None = None  # time spent drafting in this step
    verify_s: float | None = None  # time spent in the target's verification forward

    def __post_init__(self) -> None:
        if not 0 <= self.accepted <= self.drafted:
            raise ValueError(f"accepted={self.accepted} must lie in [0, drafted={self.drafted}]")
        if self.emitted < 0 or self.emitted > self.accepted + 1:
            raise ValueError(f"emitted={self.emitted} must lie in [0, accepted+1={self.accepted + 1}]")


@dataclass
class RequestRecord:
    """Everything measured for one request of one cell; the one input of :mod:`specstudy.metrics`.

    Times are seconds since the request was sent (``start_epoch`` holds the wall clock of that
    moment).  ``chunk_times_s[i]`` is when chunk i arrived and ``chunk_tokens[i]`` how many tokens
    it carried (1 each for an engine that emits token by token, more for a streamed chunk or a
    verification step).  Aggregate acceptance counters are ``None`` when the backend does not
    expose them.
    """

    # identity
    study: str
    hardware: str
    framework: str
    method: str
    task: str
    prompt_id: str
    repeat: int
    cell_id: str
    model: str
    drafter: str | None = None
    #: which turn of a conversation (1 = the first or only one; parts written before turns read as 1)
    turn: int = 1
    # the study plan's axes, stamped by the runner (empty for ad-hoc runs and parts written before them)
    label: str = ""
    family: str = ""
    sweeps: list[str] = field(default_factory=list)
    baseline_cell_id: str | None = None
    prefix_cache: bool | None = None  # None: not controlled by the kit (e.g. a server it did not start)
    request_rate: float | None = None  # requests/s offered (inf: all at once); None for offline batches
    dtype: str = ""
    # configuration
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int = 0
    gamma: int | None = None
    batch_size: int = 1
    max_new_tokens: int = 0
    input_policy: str = ""  # how input length was controlled (e.g. "truncate:256")
    # sizes
    input_tokens: int = 0
    output_tokens: int = 0
    # timing
    start_epoch: float = 0.0
    first_token_s: float | None = None
    end_s: float | None = None
    chunk_times_s: list[float] = field(default_factory=list)
    chunk_tokens: list[int] = field(default_factory=list)
    # the load generator's schedule (server backends; None offline): seconds from the start of the
    # run at which the request was due to go out and at which it actually went out, so a sender
    # that starts late (a GIL-bound thread pool did, by up to 449 ms) shows in the records
    scheduled_send_s: float | None = None
    sent_s: float | None = None
    # speculation (None when the backend cannot see it; never guessed)
    steps: list[StepRecord] = field(default_factory=list)
    target_forwards: int | None = None  # every target forward: the prompt pass and steps without drafts included
    draft_steps: int | None = None  # target forwards that verified at least one drafted token
    drafted_tokens: int | None = None
    accepted_tokens: int | None = None
    accepted_per_position: list[int] | None = None  # how many draft steps accepted position k (k=1..)
    drafts_per_position: list[int] | None = None  # how many draft steps drafted position k
    synthetic_acceptance: str | None = None  # e.g. "alpha=0.8": acceptance fixed for timing, not measured
    # quality and entropy
    output_ids: list[int] = field(default_factory=list)
    output_text: str = ""
    target_logprobs: list[float] | None = None  # log p_target(token) of each emitted token
    token_entropy: list[float] | None = None  # entropy (nats) of the target at each emitted token
    # resources
    peak_memory_bytes: int | None = None
    memory_source: str | None = None  # "torch_cuda", "rss", "nvml", ...
    # outcome
    status: str = "ok"
    error: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status={self.status!r}: allowed {STATUSES}")

    def fill_acceptance_from_steps(self) -> RequestRecord:
        """Set the aggregate counters from ``steps`` so every consumer reads one set of counts."""
        if not self.steps:
            return self
        self.target_forwards = len(self.steps)
        self.draft_steps = sum(1 for s in self.steps if s.drafted > 0)
        self.drafted_tokens = sum(s.drafted for s in self.steps)
        self.accepted_tokens = sum(s.accepted for s in self.steps)
        depth = max((s.drafted for s in self.steps), default=0)
        self.drafts_per_position = [sum(1 for s in self.steps if s.drafted >= k) for k in range(1, depth + 1)]
        self.accepted_per_position = [sum(1 for s in self.steps if s.accepted >= k) for k in range(1, depth + 1)]
        return self


@dataclass(frozen=True)
class Cell:
    """One point of the study matrix: everything that identifies the records it produces.

    ``options`` holds method-specific settings (n-gram sizes, layer-skip depth, tree shape, ...)
    and is part of the cell's identity.  ``id`` is set by the study plan (one id per cell, kept
    when the backend is handed a copy with only the method options); ad-hoc cells hash their fields.
    """

    study: str
    hardware: str
    framework: str
    method: str
    task: str
    model: str
    drafter: str | None = None
    gamma: int | None = None
    batch_size: int = 1
    repeat: int = 0
    options: tuple[tuple[str, Any], ...] = ()
    id: str = ""

    @property
    def cell_id(self) -> str:
        """``id`` when the plan set one, else a readable, filesystem-safe id unique per identity."""
        return self.id or self.identity_id()

    def identity_id(self) -> str:
        """A readable id from every field but ``id`` (a short hash covers the options)."""
        fields = {k: v for k, v in dataclasses.asdict(self).items() if k != "id"}
        key = json.dumps(fields, sort_keys=True, default=str)
        h = hashlib.sha256(key.encode()).hexdigest()[:8]
        parts = [
            self.framework,
            self.method,
            self.task,
            f"g{self.gamma}" if self.gamma is not None else "g-",
            f"b{self.batch_size}",
            f"r{self.repeat}",
            h,
        ]
        return "_".join(p.replace("/", "-").replace(" ", "-") for p in parts)

    def option(self, name: str, default: Any = None) -> Any:
        return dict(self.options).get(name, default)

    def new_record(self, request: Request, sampling: Sampling, **fields: Any) -> RequestRecord:
        """A record with this cell's identity and the sampling settings filled in (and the cell's
        synthetic-acceptance rule, so a timing-only cell is marked whichever engine ran it)."""
        rule = self.option("synthetic_acceptance") if self.method != "ar" else None
        if rule is not None and "synthetic_acceptance" not in fields:
            fields["synthetic_acceptance"] = _rule_label(rule)
        return RequestRecord(
            study=self.study,
            hardware=self.hardware,
            framework=self.framework,
            method=self.method,
            task=self.task,
            prompt_id=request.prompt_id,
            repeat=self.repeat,
            cell_id=self.cell_id,
            model=self.model,
            drafter=self.drafter,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k,
            seed=sampling.seed,
            gamma=self.gamma,
            batch_size=self.batch_size,
            max_new_tokens=sampling.max_new_tokens,
            **fields,
        )


def _rule_label(rule: Any) -> str:
    """``"alpha=0.8"`` / ``{"alpha": 0.8}`` → ``"alpha=0.8"``: the label the reference engine writes too."""
    mode, value = next(iter(rule.items())) if isinstance(rule, dict) else str(rule).split("=", 1)
    return f"{str(mode).strip()}={float(value)!r}"


# --------------------------------------------------------------------------------------------
# parquet parts

_JSON_FIELDS = ("steps", "extra")


def _to_row(rec: RequestRecord) -> dict[str, Any]:
    row = dataclasses.asdict(rec)
    row["steps"] = json.dumps(row["steps"])
    row["extra"] = json.dumps(row["extra"], default=str)
    return row


#: columns renamed since records were first written: old name -> new name (parts on disk may
#: still hold the old one; reading maps it)
_RENAMED = {"verify_steps": "target_forwards"}


def _from_row(row: dict[str, Any]) -> RequestRecord:
    names = {f.name for f in dataclasses.fields(RequestRecord)}
    row = {_RENAMED.get(k, k): v for k, v in row.items()}
    kw = {k: v for k, v in row.items() if k in names}
    kw["steps"] = [StepRecord(**s) for s in json.loads(kw.get("steps") or "[]")]
    kw["extra"] = json.loads(kw.get("extra") or "{}")
    for k, v in list(kw.items()):
        if hasattr(v, "tolist"):  # numpy arrays from parquet list columns
            kw[k] = v.tolist()
        elif isinstance(v, float) and v != v and k in _NULLABLE_FLOATS:
            kw[k] = None
    return RequestRecord(**kw)


_NULLABLE_FLOATS = {"first_token_s", "end_s", "scheduled_send_s", "sent_s"}


def _schema() -> pa.Schema:
    import pyarrow as pa

    t = {
        str: pa.string(),
        int: pa.int64(),
        float: pa.float64(),
        bool: pa.bool_(),
    }
    fields = []
    for f in dataclasses.fields(RequestRecord):
        ann = str(f.type)
        if f.name in _JSON_FIELDS:
            typ = pa.string()
        elif ann.startswith("list[int]"):
            typ = pa.list_(pa.int64())
        elif ann.startswith("list[float]"):
            typ = pa.list_(pa.float64())
        elif ann.startswith("list[str]"):
            typ = pa.list_(pa.string())
        else:
            base = ann.split("|")[0].strip()
            typ = t[{"str": str, "int": int, "float": float, "bool": bool}[base]]
        fields.append(pa.field(f.name, typ, nullable=True))
    return pa.schema(fields)


def write_part(records: Sequence[RequestRecord], path: str | os.PathLike[str]) -> Path:
    """Write one cell's records atomically: a temp file in the same folder, then rename."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    table = pa.Table.from_pylist([_to_row(r) for r in records], schema=_schema())
    pq.write_table(table, tmp)
    os.replace(tmp, path)
    return path


def read_part(path: str | os.PathLike[str]) -> list[RequestRecord]:
    import pyarrow.parquet as pq

    return [_from_row(r) for r in pq.read_table(path).to_pylist()]


def part_paths(folder: str | os.PathLike[str]) -> list[Path]:
    """Finished parts only: temp files of a killed writer are ignored."""
    folder = Path(folder)
    if not folder.exists():
        return []
    return sorted(p for p in folder.rglob("*.parquet") if not p.name.startswith("."))


def read_records(folder: str | os.PathLike[str]) -> list[RequestRecord]:
    return [r for p in part_paths(folder) for r in read_part(p)]

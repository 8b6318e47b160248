"""specstudy tasks: list the task categories and their data; ``tasks show NAME`` prints prompts;
``tasks sha256 PATH`` prints the pin of a data file or ``datasets`` folder for a task file."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

from ..config import ParamsError, task_names
from ..data.model_files import load_tokenizer
from ..data.tasks import TaskDataError, load_requests, parse_field_map, sha256_data, task_summary


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "action",
        nargs="?",
        choices=("list", "show", "sha256"),
        default="list",
        help="list (default), show one task's prompts, or sha256: the pin of a data file or datasets folder",
    )
    p.add_argument(
        "name", nargs="?", help="show: a task name (see 'specstudy tasks') or task file; sha256: a file or folder"
    )
    p.add_argument("--no-fetch", action="store_true", help="list: report only what is already cached, download nothing")
    p.add_argument("--n", default="3", help="show: how many prompts (an integer or 'all')")
    p.add_argument("--seed", type=int, default=None, help="show: sampling seed (default: the task's)")
    p.add_argument("--online", action="store_true", help="show: use the task's hub datasets (needs network)")
    p.add_argument("--data-file", default=None, help="show: prompts from this .jsonl/.json/.csv/.parquet file")
    p.add_argument(
        "--field-map",
        default=None,
        help="with --data-file: name=path pairs (text=question,id=qid) or a JSON object, which may also hold "
        "a 'template' such as 'Q: {text}'",
    )
    p.add_argument(
        "--tokenizer",
        default=None,
        help="show: a model name from params/models (e.g. smollm2-135m) or a local tokenizer directory; "
        "applies the chat template and the task's input-length control",
    )
    p.add_argument(
        "--max-chars", type=int, default=800, help="show: cut each printed prompt after this many characters"
    )


def _run_list(args: argparse.Namespace) -> int:
    summaries = [task_summary(name, fetch=not args.no_fetch) for name in task_names()]
    if args.json:
        print(json.dumps(summaries, indent=2, ensure_ascii=False))
        return 0
    for s in summaries:
        verified = "all sha256 verified" if s["all_verified"] else "NOT all verified"
        print(
            f"{s['task']:<17} {s['category']:<17} {s['offline_records']:>4} prompts offline  ({verified}; "
            f"input {s['input_policy']})"
        )
        for src in s["sources"]:
            rec = "-" if src["records"] is None else src["records"]
            print(f"    {src['name']:<18} {src['status']:<16} {rec!s:>4}  {src['location']}  [{src['licence']}]")
            if src.get("error") and src["status"] != "not fetched":
                print(f"        {src['error']}")
        for src in s["online_sources"]:
            print(f"    {src['name']:<18} {'online (hub)':<16} {'':>4}  {src['location']}  [{src['licence']}]")
    return 0


def _load_tokenizer(spec: str) -> Any:  # a transformers tokenizer
    """A local tokenizer directory, or a model name from params/models (its tokenizer only)."""
    if Path(spec).is_dir():
        from transformers import AutoTokenizer  # heavy: only when asked for

        return AutoTokenizer.from_pretrained(spec)
    return load_tokenizer(spec)


def _run_show(args: argparse.Namespace) -> int:
    if not args.name:
        raise ParamsError(None, "name", None, task_names(), "usage: specstudy tasks show NAME")
    field_map = parse_field_map(args.field_map) if args.field_map else None
    tokenizer = _load_tokenizer(args.tokenizer) if args.tokenizer else None
    reqs = load_requests(
        args.name,
        n=args.n,
        seed=args.seed,
        tokenizer=tokenizer,
        online=args.online,
        data_file=args.data_file,
        field_map=field_map,
    )
    if args.json:
        print(json.dumps([dataclasses.asdict(r) for r in reqs], indent=2, ensure_ascii=False))
        return 0
    for r in reqs:
        tokens = f", {len(r.prompt_ids)} tokens" if r.prompt_ids is not None else ""
        print(f"=== {r.prompt_id}  (input {r.input_policy}{tokens}{', truncated' if r.truncated else ''})")
        text = r.prompt if len(r.prompt) <= args.max_chars else r.prompt[: args.max_chars] + " [...]"
        print(text)
        for k, turn in enumerate(r.later_turns, r.turn + 1):
            print(f"--- turn {k} (after the target's own answer): {turn[: args.max_chars]}")
        if r.reference:
            ref = r.reference if len(r.reference) <= 200 else r.reference[:200] + " [...]"
            print(f"--- reference: {ref}")
    return 0


def _run_sha256(args: argparse.Namespace) -> int:
    """The value a ``file`` source's ``sha256:`` pins (a folder's: see data.tasks.sha256_folder)."""
    if not args.name or not Path(args.name).exists():
        raise ParamsError(
            None, "path", args.name, "an existing data file or folder", "usage: specstudy tasks sha256 PATH"
        )
    digest = sha256_data(args.name)
    print(json.dumps({"path": args.name, "sha256": digest}) if args.json else digest)
    return 0


def run(args: argparse.Namespace) -> int:
    if args.action == "sha256":
        return _run_sha256(args)
    if args.action == "show":
        try:
            return _run_show(args)
        except TaskDataError as e:
            print(f"specstudy tasks: error: {e}", file=sys.stderr)
            return 2
    if args.name:
        raise ParamsError(None, "action", args.name, ["list", "show NAME"])
    return _run_list(args)

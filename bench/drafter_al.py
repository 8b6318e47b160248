"""Acceptance length and paired speedup of trained drafters in the reference engine, per task.

Issue 37 measures its EAGLE heads here (EAGLE-3 AL at γ 4 on code and chat, EAGLE-2's dynamic
tree beside the chain) before a study row carries them.  Rows: ``method:gamma:drafter[:k=v,...]``;
every row runs the same prompts at greedy, after the paired AR row; AL, α and speedup come from
:mod:`specstudy.metrics` (one definition), their intervals over prompts from the study's own
(:meth:`specstudy.analysis.row_parts.Acceptance.of`, :func:`specstudy.metrics.paired_speedup`).  Prints the
machine's load average before and after: a shared machine makes the timings, not the AL, noisy.

    PYTHONPATH=. .venv/bin/python bench/drafter_al.py --tasks code,chat --prompts 6 \\
        --rows "eagle3:4:params/drafters/smollm2-135m-eagle3" --max-new-tokens 48
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402
from collections.abc import Sequence  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402

from specstudy import metrics  # noqa: E402
from specstudy.records import Cell, Request, RequestRecord, Sampling  # noqa: E402


def parse_row(text: str) -> tuple[str, int | None, str | None, dict[str, Any]]:
    """``method:gamma:drafter[:k=v,...]`` → (method, γ, drafter, options)."""
    parts = text.split(":")
    method, gamma = parts[0], int(parts[1]) if len(parts) > 1 and parts[1] else None
    drafter = parts[2] if len(parts) > 2 and parts[2] else None
    opts = dict(kv.split("=", 1) for kv in parts[3].split(",")) if len(parts) > 3 and parts[3] else {}
    return method, gamma, drafter, opts


def summary(ar: Sequence[RequestRecord], recs: Sequence[RequestRecord]) -> dict[str, Any]:
    from specstudy.analysis.row_parts import Acceptance

    acc = Acceptance.of(recs)
    sp = metrics.paired_speedup(ar, recs)
    same = all(a.output_ids == r.output_ids for a, r in zip(ar, recs))
    return {
        "alpha": acc.alpha,
        "alpha_ci": list(acc.alpha_ci),
        "AL": acc.acceptance_length,
        "AL_ci": list(acc.acceptance_length_ci),
        # where a chain stops: P(draft i accepted | drafts before it accepted), i = 1..γ
        "per_position_conditional": acc.per_position_conditional,
        "per_prompt_AL": [metrics.acceptance_length(r.accepted_tokens or 0, r.draft_steps or 0) for r in recs],
        "speedup": sp["speedup"],
        "speedup_ci": [sp["ci_low"], sp["ci_high"]],
        "n_prompts": int(sp["n_prompts"]),
        "greedy_equals_ar": same,
    }


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--tasks", default="code,chat")
    ap.add_argument("--prompts", type=int, default=5)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--rows", required=True, help="';'-separated method:gamma:drafter[:k=v,...]")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", default=None, help="also write the figures to this file")
    return ap.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    from specstudy.backends.reference.reference_backend import ReferenceBackend
    from specstudy.data.model_files import load_model
    from specstudy.data.tasks import load_requests

    model, tok = load_model(args.model)
    backend = ReferenceBackend(model, tokenizer=tok)
    sampling = Sampling(temperature=0.0, max_new_tokens=args.max_new_tokens, ignore_eos=True)
    rows: list[tuple[str, int | None, str | None, dict[str, Any]]] = [("ar", None, None, {})]
    rows += [parse_row(r) for r in args.rows.split(";") if r.strip()]
    out: dict[str, Any] = {"load_before": os.getloadavg(), "rows": {}}
    t0 = time.time()
    for task in args.tasks.split(","):
        drawn = load_requests(task, n=args.prompts, tokenizer=tok)
        reqs = [Request(r.prompt_id, r.prompt, task=task, prompt_ids=tuple(backend.encode(r, True))) for r in drawn]
        ar: list[RequestRecord] = []
        for method, gamma, drafter, opts in rows:
            opt = tuple(sorted(opts.items()))
            cell = Cell(
                "bench", "local", "reference", method, task, args.model, drafter=drafter, gamma=gamma, options=opt
            )
            list(backend.run(reqs[:1], Sampling(temperature=0.0, max_new_tokens=4, ignore_eos=True), cell))  # warm-up
            recs = list(backend.run(reqs, sampling, cell))
            if method == "ar":
                ar = recs
                continue
            key = f"{task} {method} γ{gamma} {drafter} {opts}"
            out["rows"][key] = summary(ar, recs)
            print(key, json.dumps(out["rows"][key]), flush=True)
    out["wall_s"] = round(time.time() - t0, 1)
    out["load_after"] = os.getloadavg()
    print(json.dumps({k: out[k] for k in ("wall_s", "load_before", "load_after")}))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

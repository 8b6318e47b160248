"""A planted drift: the machine slows down halfway through, under the old order and the new one.

The reference engine measures an AR cell, its A/A control (AR again) and prompt lookup on the same
prompts twice, each time with CPU burners (busy-loop processes, one per core by default) started
once half of the measured requests are done:

* **cell after cell** (the order before issue 49): every AR request, then every A/A request, then
  every prompt-lookup request; the burners land in the A/A cell, so AR ran on a quiet machine and the
  other arms on a busy one;
* **in time** (:func:`specstudy.run.paired_in_time.measure_in_time`): each prompt through AR, A/A and
  prompt lookup in turn, the order reversed from one prompt to the next; the burners land between two
  prompts and every pair sees the same machine.

Per order it prints the A/A speedup and prompt lookup's speedup over AR with their 95 % intervals over
prompts and the median time between a pair's arms.  Unbiased, the A/A row reads 1x within its
interval; the drift shows as an A/A row below 1x under the old order.

    OMP_WAIT_POLICY=PASSIVE .venv/bin/python bench/planted_drift.py [--prompts 10] [--max-new-tokens 24] [--burners N] [--json]

Timing: the burners are the point, but nothing else should run (its figures are wall-clock).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import argparse  # noqa: E402
import json  # noqa: E402
import random  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import textwrap  # noqa: E402
from collections.abc import Callable, Sequence  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from specstudy import metrics  # noqa: E402
from specstudy.analysis.pairing import arms_apart  # noqa: E402
from specstudy.config import load_study  # noqa: E402
from specstudy.records import CONTROL_FAMILY, Request, RequestRecord  # noqa: E402
from specstudy.run.paired_in_time import measure_in_time  # noqa: E402
from specstudy.run.plan import CellPlan, expand  # noqa: E402

STUDY = """
study:
  name: planted-drift
  models:
    - {{name: smollm2, target: smollm2-135m, dtype: float32}}
  methods:
    - {{method: ar}}
    - {{method: ngram, label: Prompt lookup, options: {{ngram_min: 1, ngram_max: 3}}}}
  frameworks: [reference]
  tasks: [code]
  gammas: [4]
  batch_sizes: [1]
  warmup: {{requests: 1, max_new_tokens: 8}}
  sampling: {{temperature: 0.0, top_p: 1.0, top_k: 0, seed: 0, ignore_eos: true}}
  max_new_tokens: {tokens}
  prompts_per_task: {prompts}
  aa_control: true
"""


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--prompts", type=int, default=10, help="code prompts (each through every arm)")
    p.add_argument("--max-new-tokens", type=int, default=24)
    p.add_argument("--burners", type=int, default=os.cpu_count() or 1, help="busy-loop processes started halfway")
    p.add_argument("--tiny", action="store_true", help="a tiny random model and id prompts (the smoke test)")
    p.add_argument("--json", action="store_true")
    return p.parse_args(argv)


def _plans(args: argparse.Namespace) -> tuple[Any, list[CellPlan]]:
    """(config, [AR, A/A control, prompt lookup]) of the inline study."""
    folder = Path(tempfile.mkdtemp(prefix="planted-drift-"))
    path = folder / "study.yaml"
    path.write_text(textwrap.dedent(STUDY.format(tokens=args.max_new_tokens, prompts=args.prompts)))
    cfg = load_study("cpu", path)
    plans = expand(cfg)
    ar = next(p for p in plans if p.is_baseline)
    aa = next(p for p in plans if p.family == CONTROL_FAMILY)
    spec = next(p for p in plans if p.cell.method == "ngram")
    return cfg, [ar, aa, spec]


def _engine(args: argparse.Namespace, cfg: Any, ar: CellPlan) -> tuple[Any, list[Request]]:
    """The reference engine and the prompts: SmolLM2 and the code task, or (``--tiny``) a tiny model and ids."""
    if args.tiny:
        from specstudy.backends.reference.reference_backend import ReferenceBackend
        from specstudy.data.model_files import tiny_model

        rng = random.Random(0)
        reqs = []
        for i in range(args.prompts):
            phrase = [rng.randrange(3, 90) for _ in range(4)]
            ids = (*[rng.randrange(3, 90) for _ in range(3)], *phrase, rng.randrange(3, 90), *phrase)
            reqs.append(Request(prompt_id=f"code/{i}", prompt="", task="code", prompt_ids=ids))
        return ReferenceBackend(tiny_model(seed=0, logit_scale=4.0, num_layers=2), device="cpu", dtype="float64"), reqs
    from specstudy.run.pool import BackendPool
    from specstudy.run.study_runner import study_request_loader

    backend = BackendPool(cfg, log=lambda m: None).get(ar)
    reqs = study_request_loader(cfg)("code", args.prompts, ar.sampling.seed, getattr(backend, "tokenizer", None))
    return backend, reqs


class Burners:
    """``n`` busy-loop processes, started on the ``at``-th measured record and stopped on exit."""

    def __init__(self, n: int, at: int) -> None:
        self.n, self.at, self.seen = n, at, 0
        self.procs: list[subprocess.Popen[bytes]] = []

    def __call__(self, arm: int) -> None:
        self.seen += 1
        if self.seen == self.at:
            cmd = [sys.executable, "-c", "while True: pass"]
            self.procs = [subprocess.Popen(cmd) for _ in range(self.n)]

    def stop(self) -> None:
        for p in self.procs:
            p.kill()
            p.wait()


def _run_order(
    order: str, plans: list[CellPlan], backend: Any, reqs: list[Request], burners: int
) -> list[list[RequestRecord]]:
    """The three arms' records under ``order``, burners started halfway through the measured requests."""
    warm = [(reqs[:1], 8)] * len(plans)
    drift = Burners(burners, at=len(reqs) * len(plans) // 2)
    try:
        if order == "in time":
            runs, _ = measure_in_time(plans, [backend] * len(plans), reqs, warm, 0.5, on_record=drift)
            return runs
        out = []
        for plan, w in zip(plans, warm):  # one arm after another: the old order
            (recs,), _ = measure_in_time([plan], [backend], reqs, [w], 0.5, on_record=drift)
            out.append(recs)
        return out
    finally:
        drift.stop()


def measure(args: argparse.Namespace) -> dict[str, Any]:
    cfg, plans = _plans(args)
    backend, reqs = _engine(args, cfg, plans[0])
    rows = []
    for order in ("cell after cell", "in time"):
        base, *arms = _run_order(order, plans, backend, reqs, args.burners)
        for plan, recs in zip(plans[1:], arms):
            sp = metrics.paired_speedup(base, recs)
            apart = arms_apart(metrics.paired_records(base, recs))
            rows.append(
                {
                    "order": order,
                    "row": plan.label,
                    "speedup": sp["speedup"],
                    "ci": [sp["ci_low"], sp["ci_high"]],
                    "n_prompts": int(sp["n_prompts"]),
                    "arms_apart_median_s": apart.median_s,
                    "aa_includes_1x": bool(sp["ci_low"] <= 1.0 <= sp["ci_high"])
                    if plan.family == CONTROL_FAMILY
                    else None,
                }
            )
    return {"prompts": args.prompts, "max_new_tokens": args.max_new_tokens, "burners": args.burners, "rows": rows}


def show(res: dict[str, Any], out: Callable[[str], None] = print) -> None:
    out(
        f"planted drift: {res['burners']} burner(s) from halfway, {res['prompts']} prompts, {res['max_new_tokens']} tokens"
    )
    out("| order | row | speedup [95 % CI] | n | arms apart (median) |")
    out("| --- | --- | --- | --- | --- |")
    for r in res["rows"]:
        lo, hi = r["ci"]
        out(
            f"| {r['order']} | {r['row']} | {r['speedup']:.3f}× [{lo:.3f}, {hi:.3f}] | {r['n_prompts']} "
            f"| {r['arms_apart_median_s']:.1f} s |"
        )


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    res = measure(args)
    print(json.dumps(res, indent=2)) if args.json else show(res)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Instrumentation overhead: what timing and records cost against one decode step.

Measured side by side in one run on the default model:

* one decode step: a single-token target forward with KV cache (the thing being timed);
* per-step instrumentation the engine adds: the CUDA-synchronising timer around the forward and
  :meth:`BatchTrace.emit` (timestamps, a StepRecord, per-token log p and entropy from the
  logits the step already has);
* per-request record work, amortised per step: building the RequestRecord, filling the
  acceptance counters, and writing the cell's parquet part.

Prints medians and the ratios; the goal is instrumentation ≤ 1 % of a decode step.

    .venv/bin/python bench/overhead.py [--model smollm2-135m] [--steps 40] [--json]
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable, Sequence  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the kit of this checkout, as the other benches

import torch  # noqa: E402

from specstudy.data.model_files import load_model  # noqa: E402
from specstudy.engine.kv import KVState  # noqa: E402
from specstudy.engine.speculate import prefill  # noqa: E402
from specstudy.engine.trace import BatchTrace, Timer  # noqa: E402
from specstudy.records import Cell, Request, Sampling, write_part  # noqa: E402

#: the goal: instrumentation per step at most this share of a decode step
GOAL = 0.01


def median_s(fn: Callable[[], object], n: int) -> float:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The options, checked before the model loads."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--steps", type=int, default=40, help="decode steps timed")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--timer-repeats", type=int, default=2000, help="timer enter + exit pairs timed")
    ap.add_argument("--emit-repeats", type=int, default=500, help="BatchTrace.emit calls timed")
    ap.add_argument("--record-repeats", type=int, default=20, help="cells of records built and written, timed")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    a = ap.parse_args(argv)
    if min(a.steps, a.threads, a.timer_repeats, a.emit_repeats, a.record_repeats) < 1:
        ap.error("--steps, --threads and the --*-repeats must each be >= 1")
    return a


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Medians of a decode step and of each piece of instrumentation, and their shares of the step."""
    torch.set_num_threads(args.threads)

    model, tok = load_model(args.model)
    prompt = tok('def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n')["input_ids"]
    state = KVState(model, 1)
    logits = prefill(state, [prompt])
    tok_id = torch.argmax(logits, dim=-1)

    def decode_step() -> None:
        nonlocal logits, tok_id
        logits = state.forward(tok_id[:, None])[:, -1]
        tok_id = torch.argmax(logits, dim=-1)

    for _ in range(3):  # warm-up
        decode_step()
    step_s = median_s(decode_step, args.steps)

    # per-step instrumentation: the timer and one emit() on the logits of a real step
    timer_s = median_s(lambda: Timer("cpu").__enter__().__exit__(None, None, None), args.timer_repeats)
    trace = BatchTrace([prompt], max_new_tokens=10**9)
    step_logits = logits[:, None]
    emit_s = median_s(lambda: trace.emit([[int(tok_id[0])]], step_logits, 0, 0, None, 0.01), args.emit_repeats)

    # per-request records, amortised over a request of `tokens` steps and a cell of 8 requests
    tokens, cell_size = 64, 8
    cell = Cell("bench", "cpu", "reference", "ar", "code", args.model)
    rows = trace.rows[0]
    rows.output_ids, rows.steps = rows.output_ids[:tokens], rows.steps[:tokens]

    def build_and_write(folder: Path) -> None:
        recs = []
        for i in range(cell_size):
            r = cell.new_record(
                Request(f"p{i}", ""),
                Sampling(max_new_tokens=tokens),
                output_tokens=tokens,
                steps=list(rows.steps),
                output_ids=list(rows.output_ids),
                token_entropy=rows.token_entropy[:tokens],
                target_logprobs=rows.target_logprobs[:tokens],
                first_token_s=0.1,
                end_s=1.0,
                chunk_times_s=[0.1] * tokens,
                chunk_tokens=[1] * tokens,
            )
            recs.append(r.fill_acceptance_from_steps())
        write_part(recs, folder / "cell.parquet")

    with tempfile.TemporaryDirectory() as d:
        record_s = median_s(lambda: build_and_write(Path(d)), args.record_repeats) / (tokens * cell_size)

    per_step = timer_s + emit_s + record_s
    figures = {
        "decode step (1-token forward, KV cache)": step_s,
        "timer (enter + exit)": timer_s,
        "BatchTrace.emit (StepRecord, log p, entropy)": emit_s,
        "records + parquet, amortised per step": record_s,
        "instrumentation total per step": per_step,
    }
    res: dict[str, Any] = {
        "model": args.model,
        "threads": torch.get_num_threads(),
        "load_1m": os.getloadavg()[0],
        "median_s": figures,
        "share_of_decode_step": {name: v / step_s for name, v in figures.items()},
        "goal": GOAL,
        "meets_goal": per_step / step_s <= GOAL,
    }
    return res


def show(res: dict[str, Any]) -> None:
    """The table: each median in ms and as a share of the decode step, then the verdict on the goal."""
    print(f"model {res['model']}, {res['threads']} thread(s), load average {res['load_1m']:.2f}")
    print(f"{'what':44s} {'median':>12s} {'/ decode step':>14s}")
    for name, v in res["median_s"].items():
        print(f"{name:44s} {v * 1e3:9.4f} ms {res['share_of_decode_step'][name]:13.3%}")
    verdict = "meets" if res["meets_goal"] else "MISSES"
    total = res["share_of_decode_step"]["instrumentation total per step"]
    print(f"instrumentation / decode step = {total:.3%} ({verdict} the <= {res['goal']:.0%} goal)")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    res = measure(args)
    if args.json:
        print(json.dumps(res, indent=1))
    else:
        show(res)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""llama.cpp's decode time per token at 1 vs 2 threads, and with the kit's telemetry sampler on vs off.

    .venv/bin/python bench/llamacpp_threads.py                      # 8 code prompts, 32 tokens, 2 rounds
    .venv/bin/python bench/llamacpp_threads.py --prompts 2 --tokens 4 --rounds 1   # tiny (a smoke run)

Side by side in one run, interleaved: both servers (threads 1 and threads 2) stay up and every prompt
goes to one then the other, the order swapped each round; the telemetry comparison alternates the
sampler on and off the same way on the threads-2 server.  The figure is llama.cpp's own
``timings.predicted_per_token_ms``; the ratio Σ A / Σ B over prompts (rounds averaged per prompt)
and its interval come from :func:`specstudy.intervals.ratio_ci` (the kit's one interval).  The load
average is printed before and after; above the kit's busy limit no verdict is printed.  Run it on
a quiet machine: the study's ``framework_options.llamacpp.threads`` rests on it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specstudy import intervals, metrics  # noqa: E402
from specstudy.backends.llamacpp.llamacpp_backend import LlamaCppBackend  # noqa: E402
from specstudy.data.tasks import load_requests  # noqa: E402
from specstudy.records import Cell, Request, Sampling  # noqa: E402
from specstudy.telemetry import TelemetrySampler, busy_reasons, cpu_cores, load_average  # noqa: E402

MODEL = "smollm2-135m"


def tpot_ms(backend: LlamaCppBackend, ids: Sequence[int], tokens: int) -> float:
    """llama.cpp's own ms per generated token of one greedy AR request."""
    cell = Cell("threads", "local", "llamacpp", "ar", "adhoc", backend.model)
    backend.ensure_server(cell)
    rec = backend.send(
        Request("threads", "", prompt_ids=tuple(ids)), Sampling(max_new_tokens=tokens, ignore_eos=True), cell
    )
    if rec.status != "ok":
        raise RuntimeError(f"llama.cpp request failed: {rec.error}")
    return float(rec.extra["llamacpp_timings"]["predicted_per_token_ms"])


def interleaved(
    prompts: Sequence[Sequence[int]],
    a: Callable[[Sequence[int]], float],
    b: Callable[[Sequence[int]], float],
    rounds: int,
) -> tuple[list[float], list[float]]:
    """Per prompt, the mean over rounds of A's and B's figure, A first in even rounds, B first in odd."""
    mean_a, mean_b = [], []
    for ids in prompts:
        xs, ys = [], []
        for r in range(rounds):
            if r % 2 == 0:
                xs.append(a(ids))
                ys.append(b(ids))
            else:
                ys.append(b(ids))
                xs.append(a(ids))
        mean_a.append(sum(xs) / rounds)
        mean_b.append(sum(ys) / rounds)
    return mean_a, mean_b


def with_telemetry(backend: LlamaCppBackend, tokens: int) -> Callable[[Sequence[int]], float]:
    def run(ids: Sequence[int]) -> float:
        with TelemetrySampler(period_s=0.5, gpus=False):
            return tpot_ms(backend, ids, tokens)

    return run


def summary(name_a: str, a: list[float], name_b: str, b: list[float]) -> dict[str, Any]:
    """B's speedup over A (Σ A / Σ B) with its interval over prompts."""
    lo, hi = intervals.ratio_ci(a, b)
    return {
        "a": name_a,
        "b": name_b,
        "tpot_ms_a": statistics.median(a),
        "tpot_ms_b": statistics.median(b),
        "ratio": metrics.speedup(a, b),  # Σ A / Σ B: the kit's one ratio, as ratio_ci's interval
        "ci": [lo, hi],
        "n_prompts": len(a),
    }


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The options, checked (all at once) before any server starts."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--task", default="code")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--log-dir", default="outputs/servers")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    bad = [f"--{k} {getattr(a, k)}" for k in ("prompts", "tokens", "rounds") if getattr(a, k) < 1]
    if bad:
        ap.error(", ".join(bad) + ": each must be >= 1")
    return a


def main(argv: Sequence[str] | None = None) -> int:
    a = parse_args(argv)
    before = load_average()
    one = LlamaCppBackend(MODEL, threads=1, log_dir=a.log_dir)
    two = LlamaCppBackend(MODEL, threads=2, log_dir=a.log_dir)
    try:
        maybe = [two.prompt_ids(r) for r in load_requests(a.task, n=a.prompts)]
        prompts = [p for p in maybe if p]
        if len(prompts) != len(maybe):
            raise RuntimeError(f"no token ids for {MODEL!r}'s prompts: the bench needs llama.cpp's tokenizer")
        for backend in (one, two):  # untimed warm-up of each server
            tpot_ms(backend, prompts[0], a.tokens)
        t1, t2 = interleaved(
            prompts, lambda p: tpot_ms(one, p, a.tokens), lambda p: tpot_ms(two, p, a.tokens), a.rounds
        )
        off, on = interleaved(prompts, lambda p: tpot_ms(two, p, a.tokens), with_telemetry(two, a.tokens), a.rounds)
    finally:
        one.close()
        two.close()
    after = load_average()
    busy = busy_reasons(max(before[0], after[0]), cpu_cores(), cpu_cores(), during=True)
    out = {
        "threads": summary("threads 1", t1, "threads 2", t2),
        "telemetry": summary("telemetry off", off, "telemetry on", on),
        "load_average": {"before": before, "after": after},
        "busy": busy,
        "tokens": a.tokens,
        "rounds": a.rounds,
    }
    if a.json:
        print(json.dumps(out, indent=2))
        return 0
    print(f"load average before {before[0]:.2f}, after {after[0]:.2f}; {a.prompts} {a.task} prompts, {a.tokens} tokens")
    for s in (out["threads"], out["telemetry"]):
        lo, hi = s["ci"]
        print(
            f"  {s['a']}: {s['tpot_ms_a']:.2f} ms/token   {s['b']}: {s['tpot_ms_b']:.2f} ms/token   "
            f"{s['a']} / {s['b']} = {s['ratio']:.3f} [{lo:.3f}, {hi:.3f}] over {s['n_prompts']} prompts"
        )
    if busy:
        print("  no verdict: the machine was busy (" + "; ".join(busy) + ")")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

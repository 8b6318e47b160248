"""Where a verification step's time goes: torch.profiler per-op shares of a k-token forward of the
reference engine's KV state (:class:`specstudy.engine.kv.KVState`) beside a 1-token one (a profile,
not a test).

Each k is run the way the chain loop runs it: append k tokens after the prompt, then roll them
back (the rejected drafts), ``--repeats`` times under the profiler, on the lean forward with
prepacked weights as the reference backend runs it (``--no-prepack``: unpacked).  Printed per k:
the op count and self-CPU share of the top ops, the step's wall time and T(k)/T(1); then one AR
token split into the matmuls, the rest of the forward and the engine's work outside it.  Op counts and
shares hold on a busy machine; absolute times need a quiet one.

    OMP_WAIT_POLICY=PASSIVE .venv/bin/python bench/profile_step.py [--ks 1,2,5,8] [--top 12]
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import argparse  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections.abc import Sequence  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from specstudy.engine.kv import KVState  # noqa: E402
from specstudy.engine.speculate import prefill  # noqa: E402


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--tiny", action="store_true", help="a tiny random model instead (smoke test)")
    ap.add_argument("--ks", default="1,2,5,8", help="tokens per forward to profile")
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--top", type=int, default=12, help="ops listed per k")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--no-prepack", action="store_true", help="the lean forward on unpacked weights")
    ap.add_argument("--ar-tokens", type=int, default=48, help="tokens of the AR decode timed for the breakdown")
    return ap.parse_args(argv)


def load(args: argparse.Namespace) -> Any:
    if args.tiny:
        from specstudy.data.model_files import tiny_model

        return tiny_model(seed=0, dtype="float32", vocab_size=512, num_layers=2)
    from specstudy.data.model_files import load_model

    return load_model(args.model)[0]


def profile_k(model: Any, prompt: list[int], k: int, repeats: int) -> tuple[float, list[tuple[str, int, float]]]:
    """(mean seconds per k-token forward, [(op, calls per forward, self-CPU share)] by share)."""
    state = KVState(model, 1)
    prefill(state, [prompt])
    ids = torch.tensor([prompt[-k:] if len(prompt) >= k else (prompt * k)[:k]])
    state.forward(ids)  # warm-up
    state.rollback(k)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        for _ in range(repeats):
            state.forward(ids)
            state.rollback(k)
        wall = (time.perf_counter() - t0) / repeats
    events = [e for e in prof.key_averages() if e.self_cpu_time_total > 0]
    total = sum(e.self_cpu_time_total for e in events) or 1.0
    rows = [(e.key, e.count // repeats, e.self_cpu_time_total / total) for e in events]
    return wall, sorted(rows, key=lambda r: -r[2])


def ar_breakdown(model: Any, prompt: list[int], tokens: int, repeats: int, packed: bool) -> dict[str, float]:
    """Where one AR token's time goes, ms: the engine's whole AR decode per token, its 1-token
    forward alone (:class:`KVState`, as the decode runs it), and the model's matmuls alone at M = 1
    (:func:`specstudy.engine.stepcost.matmul_pass_time`, packed as the forward multiplies).  The
    differences are the forward's non-matmul work (attention, norms, RoPE, op dispatch) and the
    engine's work outside the forward (sampling, entropy, the trace): what a faster AR step can cut."""
    from specstudy.engine.methods import DecodeJob, get_method
    from specstudy.engine.stepcost import matmul_pass_time
    from specstudy.records import Sampling

    job = DecodeJob(model, [prompt], Sampling(temperature=0.0, max_new_tokens=tokens, ignore_eos=True))
    best = float("inf")
    for _ in range(3):
        steps = get_method("ar").decode(job)[0].steps  # t_s: each step's end since the request began
        best = min(best, (steps[-1].t_s - steps[0].t_s) / max(1, len(steps) - 1))  # decode steps, prefill excluded
    state = KVState(model, 1)
    prefill(state, [prompt])
    one = torch.tensor([prompt[-1:]])
    fwd = float("inf")
    with torch.inference_mode():
        for _ in range(repeats + 1):
            t0 = time.perf_counter()
            state.forward(one)
            fwd = min(fwd, time.perf_counter() - t0)
            state.rollback(1)
    mm = matmul_pass_time(model, [1], repeats, packed=packed)[1]
    return {"ar_token_ms": best * 1e3, "forward_ms": fwd * 1e3, "matmul_ms": mm * 1e3}


def print_breakdown(b: dict[str, float]) -> None:
    ar, fwd, mm = b["ar_token_ms"], b["forward_ms"], b["matmul_ms"]
    print(f"\nAR token {ar:.2f} ms (best of 3 decodes): matmuls alone {mm:.2f} ms ({mm / ar:.0%}), the rest of the")
    print(
        f"forward {fwd - mm:.2f} ms ({(fwd - mm) / ar:.0%}), outside the forward {ar - fwd:.2f} ms ({(ar - fwd) / ar:.0%})"
    )
    print(
        f"a token at 1/1.2 of this step needs {ar - ar / 1.2:.2f} ms cut: {(ar - ar / 1.2) / (ar - mm):.0%} of the non-matmul time"
    )


def matmul_curve(model: Any, ks: Sequence[int], repeats: int) -> None:
    """The matmul alone at the model's own shapes (an MLP projection and the LM head): µs per
    call, GFLOP/s and weight GB/s by k.  A flat µs in k would mean bandwidth-bound (verification
    nearly free); µs growing with k at a fixed GFLOP/s means the small-M GEMM path is compute-bound."""
    weights = {"mlp up_proj": model.model.layers[0].mlp.up_proj.weight, "lm_head": model.lm_head.weight}
    print(f"\n{'matmul':<12} {'k':>3} {'us/call':>10} {'GFLOP/s':>9} {'weight GB/s':>12} {'vs k=1':>7}")
    for name, w in weights.items():
        base = None
        for k in ks:
            x = torch.randn(k, w.shape[1], dtype=w.dtype)
            torch.nn.functional.linear(x, w)
            t0 = time.perf_counter()
            for _ in range(repeats):
                torch.nn.functional.linear(x, w)
            us = (time.perf_counter() - t0) / repeats * 1e6
            base = base or us
            gflops = 2 * k * w.numel() / us / 1e3
            gbs = w.numel() * w.element_size() / us / 1e3
            print(f"{name:<12} {k:>3} {us:>10.1f} {gflops:>9.1f} {gbs:>12.1f} {us / base:>7.2f}")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    model = load(args)
    if not args.no_prepack:
        from specstudy.engine.lean import prepare

        print("lean forward on prepacked weights:", prepare(model))
    prompt = [(7 * i + 3) % model.config.vocab_size for i in range(args.prompt_tokens)]
    ks = [int(x) for x in args.ks.split(",")]
    walls: dict[int, float] = {}
    for k in ks:
        wall, rows = profile_k(model, prompt, k, args.repeats)
        walls[k] = wall
        n_ops = sum(c for _, c, _ in rows)
        print(f"\n== k={k}: {wall * 1e3:.2f} ms per forward (+rollback), {n_ops} op calls per forward")
        print(f"{'op':<40} {'calls':>6} {'self-CPU share':>15}")
        for name, calls, share in rows[: args.top]:
            print(f"{name[:40]:<40} {calls:>6} {100 * share:>14.1f}%")
    base = walls.get(1)
    if base:
        print("\nT(k)/T(1): " + ", ".join(f"{k}: {walls[k] / base:.2f}" for k in ks))
    print_breakdown(ar_breakdown(model, prompt, args.ar_tokens, args.repeats, packed=not args.no_prepack))
    matmul_curve(model, ks, args.repeats)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""llama.cpp's verification-cost curve T(k)/T(1) and draft cost c, as the report's cost model reads them.

    .venv/bin/python bench/llamacpp_costs.py                 # SmolLM2-135M (Q4_1): the curve
    .venv/bin/python bench/llamacpp_costs.py --pair          # + Qwen2.5-Coder 1.5B target / 0.5B draft: curve and c
    .venv/bin/python bench/llamacpp_costs.py --json
    .venv/bin/python bench/llamacpp_costs.py --kmax 2 --repeats 1 --decode-tokens 4 --step-tokens 8   # tiny

Timings are llama.cpp's own (``timings.prompt_ms`` of a k-token extension of a cached prompt,
``timings.predicted_per_token_ms`` of AR runs); run on a quiet machine: the load average is
printed beside every figure.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specstudy.backends.llamacpp.costs import measure_costs  # noqa: E402

PAIR = ("qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b")


def show(res: dict[str, Any]) -> None:
    load = res["load_average"]
    print(
        f"\n{res['model']} ({res['precision']}, {res['threads']} threads, {res['build']}), "
        f"prompt {res['prompt_tokens']} tokens; load average before {load['before'][0]:.2f}, after {load['after'][0]:.2f}"
    )
    print("  k   T(k) ms   T(k)/T(1)   | verification forwards in an n-gram run: ms  ratio  (count)")
    for k in res["ks"]:
        step = (
            f"{res['step_ms'][k]:8.2f}  {res['step_ratio'].get(k, float('nan')):6.3f}  ({res['step_counts'][k]})"
            if k in res["step_ms"]
            else "   (none drafted at this k)"
        )
        print(f"  {k:<3} {res['verify_ms'][k]:8.2f}   {res['verify_ratio'][k]:6.3f}      | {step}")
    print(f"  target decode {res['target_ms_per_token']:.2f} ms/token")
    if res["c"] is not None:
        print(f"  draft {res['drafter']} decode {res['draft_ms_per_token']:.2f} ms/token  ->  c = {res['c']:.3f}")
    else:
        print("  c: no draft model (n-gram drafting costs no model forward)")
    print(f"  caveat: {res['caveat']}")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The options, checked before any server starts."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--pair", action="store_true", help="also the opt-in Qwen2.5-Coder pair (about 1.6 GB, fetched once)"
    )
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--kmax", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--decode-tokens", type=int, default=32, help="tokens of each AR run timed for c (default 32)")
    ap.add_argument("--step-tokens", type=int, default=96, help="tokens of the n-gram run whose forwards are timed")
    ap.add_argument("--log-dir", default="outputs/servers", help="where the llama.cpp servers' logs go")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    if min(a.threads, a.kmax - 1, a.repeats, a.decode_tokens, a.step_tokens) < 1:
        ap.error(
            f"--threads {a.threads}, --repeats {a.repeats}, --decode-tokens {a.decode_tokens}, --step-tokens "
            f"{a.step_tokens}: each must be >= 1; --kmax {a.kmax} >= 2 (the n-gram run drafts kmax - 1)"
        )
    return a


def main(argv: Sequence[str] | None = None) -> int:
    a = parse_args(argv)
    runs: list[tuple[str, str | None]] = [("smollm2-135m", None)] + ([PAIR] if a.pair else [])
    results = [
        measure_costs(
            m,
            d,
            threads=a.threads,
            ks=range(1, a.kmax + 1),
            repeats=a.repeats,
            decode_tokens=a.decode_tokens,
            step_tokens=a.step_tokens,
            log_dir=a.log_dir,
        )
        for m, d in runs
    ]
    if a.json:
        print(json.dumps(results, indent=1, default=str))
    else:
        for r in results:
            show(r)
    return 0


if __name__ == "__main__":
    sys.exit(main())

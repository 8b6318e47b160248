"""llama.cpp's verification-cost curve T(k)/T(1) and draft cost c, as the report's cost model reads them.

    .venv/bin/python bench/llamacpp_costs.py                 # SmolLM2-135M (Q4_1): the curve
    .venv/bin/python bench/llamacpp_costs.py --pair          # + Qwen2.5-Coder 1.5B target / 0.5B draft: curve and c
    .venv/bin/python bench/llamacpp_costs.py --json

Timings are llama.cpp's own (``timings.prompt_ms`` of a k-token extension of a cached prompt,
``timings.predicted_per_token_ms`` of AR runs); run on a quiet machine: the load average is
printed beside every figure.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specstudy.backends.llamacpp_costs import measure_costs  # noqa: E402

PAIR = ("qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b")


def show(res: dict) -> None:
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--pair", action="store_true", help="also the opt-in Qwen2.5-Coder pair (about 1.6 GB, fetched once)"
    )
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--kmax", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    if a.threads < 1 or a.kmax < 1 or a.repeats < 1:
        ap.error(f"--threads {a.threads}, --kmax {a.kmax}, --repeats {a.repeats}: each must be >= 1")
    runs = [("smollm2-135m", None)] + ([PAIR] if a.pair else [])
    results = [measure_costs(m, d, threads=a.threads, ks=range(1, a.kmax + 1), repeats=a.repeats) for m, d in runs]
    if a.json:
        print(json.dumps(results, indent=1, default=str))
    else:
        for r in results:
            show(r)


if __name__ == "__main__":
    main()

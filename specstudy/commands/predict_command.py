"""specstudy predict: the cost model's baseline tokens/s, c, acceptance length, optimal γ and speedup.

Two forms: one configuration (``--target-params``, ``--alpha``, ...), or ``--from outputs/<hw>``:
the measured acceptance and draft lengths of every method and task of a finished study, predicted
for the profile given with ``--hardware`` (or, without it, with the study's own measured step
costs).  ``--from`` searches γ no deeper than measured unless ``--extrapolate``, which labels it.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd

from ..config import ParamsError, hardware_names, load_hardware_profile
from ..costmodel import break_even_batch, predict


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--hardware", default=None, help=f"a profile in params/hardware: {', '.join(hardware_names())}")
    p.add_argument(
        "--from",
        dest="from_dir",
        default=None,
        metavar="OUTPUTS_DIR",
        help="predict from a finished study's measured acceptance (an outputs/<gpu>/ folder)",
    )
    p.add_argument("--target-params", type=float, default=None, help="target parameter count, e.g. 70e9")
    p.add_argument(
        "--draft-params", type=float, default=None, help="draft parameter count (omit for draft-free methods)"
    )
    p.add_argument("--alpha", type=float, default=None, help="i.i.d. acceptance rate in [0, 1]")
    p.add_argument("--dtype", default="bf16", help="weights dtype: fp32, bf16, fp16, fp8, int8, int4")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--gamma", type=int, default=None, help="speculation length (default: the optimal one)")
    p.add_argument(
        "--devices", type=int, default=None, help="devices the model is split over (default: fewest that fit)"
    )
    p.add_argument("--c", type=float, default=None, help="override the draft/target step-cost ratio")
    p.add_argument(
        "--extrapolate",
        action="store_true",
        help="with --from: search γ past the measured draft depth (up to the drafter's cap, else 16), "
        "assuming α̂ there; rows that do are labelled EXTRAPOLATED",
    )


def _json_rows(df: pd.DataFrame) -> list[dict[str, Any]]:
    return [
        {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in r.items()}
        for r in df.to_dict("records")
    ]


def _run_from(args: argparse.Namespace) -> int:
    # lazy: pandas and the report's formatting load only for --from, not for a plain prediction
    from ..analysis.predict_elsewhere import predict_from_study
    from ..analysis.study_records import load
    from ..report.predict_table import predict_table
    from ..report.section_type import markdown_table

    if not (Path(args.from_dir) / "records").is_dir():
        raise FileNotFoundError(
            f"--from {args.from_dir}: no records folder; give an outputs/<gpu>/ folder of a finished study"
        )
    study = load(args.from_dir)
    profile = load_hardware_profile(args.hardware, measure=True) if args.hardware else None
    df = predict_table(
        predict_from_study(
            study,
            profile,
            target_params=args.target_params,
            draft_params=args.draft_params,
            extrapolate=args.extrapolate,
        )
    )
    if args.json:
        print(
            json.dumps(
                {
                    "prediction": True,
                    "from": str(args.from_dir),
                    "for": args.hardware or study.hardware,
                    "extrapolate": bool(args.extrapolate),
                    "rows": _json_rows(df),
                },
                indent=2,
                default=str,
            )
        )
        return 0
    print(
        f"PREDICTION for {args.hardware or study.hardware} from the acceptance measured in {args.from_dir} "
        f"({'roofline of that profile' if profile else 'the study' + chr(39) + 's own measured step costs'}); "
        + (
            "γ searched past the measured draft depth where a row says EXTRAPOLATED (α̂ assumed there):\n"
            if args.extrapolate
            else "γ searched no deeper than each row's measured draft depth (--extrapolate to go further):\n"
        )
    )
    cols = [
        c
        for c in (
            "framework",
            "method",
            "task",
            "sampling",
            "alpha_hat",
            "gamma",
            "draft_share",
            "predicted_speedup",
            "measured_speedup",
            "optimal_gamma",
            "baseline_tokens_per_s",
            "break_even_batch",
            "costs",
            "note",
        )
        if c in df.columns
    ]
    print(markdown_table(df[cols].round(3) if len(df) else df))
    return 0


def run(args: argparse.Namespace) -> int:
    if args.from_dir:
        return _run_from(args)
    missing = [f"--{k.replace('_', '-')}" for k in ("hardware", "target_params", "alpha") if getattr(args, k) is None]
    if missing:
        raise ParamsError(None, "predict", missing, "--hardware, --target-params and --alpha, or --from OUTPUTS_DIR")
    hw = load_hardware_profile(args.hardware)
    pred = predict(
        hw,
        args.target_params,
        args.draft_params,
        args.alpha,
        args.dtype,
        args.batch,
        args.gamma,
        args.devices,
        c=args.c,
    )
    out = pred.as_dict()
    out["hardware_source"] = hw.source
    out["memory_bandwidth_gbps"] = hw.memory_bandwidth_gbps
    out["break_even_batch"] = break_even_batch(
        hw, args.target_params, args.draft_params, args.alpha, pred.gamma, args.dtype, pred.n_devices
    )
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        print(f"{hw.name} ({hw.device}, {hw.source}): {pred.n_devices} device(s), {pred.regime} at batch {pred.batch}")
        print(
            f"  baseline      {pred.baseline_tokens_per_s:9.2f} tok/s  (target step {pred.target_step_s * 1e3:.2f} ms)"
        )
        print(f"  c             {pred.c:9.4f}")
        print(
            f"  optimal gamma {pred.gamma:9d}   AL {pred.acceptance_length:.3f}   verify cost {pred.verify_ratio:.3f}x"
        )
        print(f"  speedup       {pred.speedup:9.3f}x  (Leviathan formula {pred.leviathan_speedup:.3f}x)")
        print(f"  speculative   {pred.speculative_tokens_per_s:9.2f} tok/s")
        print(f"  break-even batch (speedup < 1): {out['break_even_batch']}")
    return 0

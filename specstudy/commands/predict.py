"""specstudy predict: the cost model's baseline tokens/s, c, acceptance length, optimal γ and speedup."""

from __future__ import annotations

import argparse
import json


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..config import hardware_names

    p.add_argument("--hardware", required=True, help=f"a profile in params/hardware: {', '.join(hardware_names())}")
    p.add_argument("--target-params", type=float, required=True, help="target parameter count, e.g. 70e9")
    p.add_argument("--draft-params", type=float, default=None, help="draft parameter count (omit for draft-free methods)")
    p.add_argument("--alpha", type=float, required=True, help="i.i.d. acceptance rate in [0, 1]")
    p.add_argument("--dtype", default="bf16", help="weights dtype: fp32, bf16, fp16, fp8, int8, int4")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--gamma", type=int, default=None, help="speculation length (default: the optimal one)")
    p.add_argument("--devices", type=int, default=None, help="devices the model is split over (default: fewest that fit)")
    p.add_argument("--c", type=float, default=None, help="override the draft/target step-cost ratio")


def run(args: argparse.Namespace) -> int:
    from ..costmodel import break_even_batch, predict
    from ..config import load_hardware_profile

    hw = load_hardware_profile(args.hardware)
    pred = predict(hw, args.target_params, args.draft_params, args.alpha, args.dtype, args.batch,
                   args.gamma, args.devices, c=args.c)
    out = pred.as_dict()
    out["hardware_source"] = hw.source
    out["memory_bandwidth_gbps"] = hw.memory_bandwidth_gbps
    out["break_even_batch"] = break_even_batch(hw, args.target_params, args.draft_params, args.alpha,
                                               pred.gamma, args.dtype, pred.n_devices)
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        print(f"{hw.name} ({hw.device}, {hw.source}): {pred.n_devices} device(s), {pred.regime} at batch {pred.batch}")
        print(f"  baseline      {pred.baseline_tokens_per_s:9.2f} tok/s  (target step {pred.target_step_s * 1e3:.2f} ms)")
        print(f"  c             {pred.c:9.4f}")
        print(f"  optimal gamma {pred.gamma:9d}   AL {pred.acceptance_length:.3f}   verify cost {pred.verify_ratio:.3f}x")
        print(f"  speedup       {pred.speedup:9.3f}x  (Leviathan formula {pred.leviathan_speedup:.3f}x)")
        print(f"  speculative   {pred.speculative_tokens_per_s:9.2f} tok/s")
        print(f"  break-even batch (speedup < 1): {out['break_even_batch']}")
    return 0

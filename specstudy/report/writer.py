"""The only module that writes a report's files: tables (markdown + CSV), figures (PNG + PDF), report.md/html/pdf.

Everything it writes comes from :mod:`specstudy.report.sections`, which comes from
:mod:`specstudy.analysis`; rendering the same records twice writes the same tables.
"""

from __future__ import annotations

import base64
import os
import re
from collections.abc import Iterable, Sequence
from html import escape as html_escape
from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure

from ..analysis.study_records import Study, load
from ..layout import REHEARSAL_BANNER, is_rehearsal
from . import tables
from .latex import latex_table
from .report_body import APPENDIX_TITLE
from .section_type import Section, markdown_table
from .sections import extra_sections, report_head, report_parts

#: the PNGs' resolution; report.pdf prints each figure at its own size from it (pixels / dpi inches)
FIGURE_DPI = 130


def save_table(out: Path, name: str, display: pd.DataFrame, raw: pd.DataFrame | None = None) -> None:
    """``tables/<name>.md`` and ``.tex`` (what a reader sees, booktabs for a paper) and ``.csv`` (the numbers)."""
    d = out / "tables"
    d.mkdir(parents=True, exist_ok=True)
    mark = is_rehearsal(out)  # random weights: each file says so, the CSV in a column of its own
    caption = ("REHEARSAL " if mark else "") + name.replace("_", " ")
    (d / f"{name}.md").write_text((f"*{REHEARSAL_BANNER}*\n\n" if mark else "") + markdown_table(display))
    (d / f"{name}.tex").write_text(latex_table(display, caption=caption, label=f"tab:{name}"))
    numbers = raw if raw is not None else display
    (numbers.assign(rehearsal=True) if mark else numbers).to_csv(d / f"{name}.csv", index=False)


def save_figure(out: Path, name: str, fig: Figure) -> Path:
    """``figures/<name>.png`` (for markdown/HTML) and ``.pdf`` (for a paper), then close the figure."""
    import matplotlib.pyplot as plt

    path = out / "figures" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    if is_rehearsal(out):
        fig.suptitle("REHEARSAL (random weights: no number here means anything)", color="red")
    fig.tight_layout()
    fig.savefig(path.with_suffix(".png"), dpi=FIGURE_DPI)
    fig.savefig(path.with_suffix(".pdf"))
    plt.close(fig)
    return path


def save_sections(out: Path, sections: Iterable[Section]) -> None:
    for sec in sections:
        for name, (display, raw) in sec.tables.items():
            save_table(out, name, display, raw)
        for name, fig in sec.figures.items():
            save_figure(out, name, fig)


def write_report(
    out: str | os.PathLike[str], html: bool = True, study: Study | None = None, pdf: bool | None = None
) -> Path:
    """Render ``<out>/report.md`` (and ``report.html`` and ``report.pdf``), its tables and figures, from the
    records in ``<out>``; ``pdf`` defaults to ``html`` (the rendered copies go together)."""
    study = study or load(out)
    body, appendix = report_parts(study)
    save_sections(study.out, [*body, *appendix, *extra_sections(study)])
    md = (
        report_head(study)
        + "\n"
        + "\n".join(s.to_markdown() for s in body)
        + f"\n# {APPENDIX_TITLE}\n\n"
        + "\n".join(s.to_markdown() for s in appendix)
    )
    path = study.out / "report.md"
    path.write_text(md)
    if html:
        markdown_to_html(path)
    if html if pdf is None else pdf:
        markdown_to_pdf(path)
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


#: report.pdf's page and type: landscape A4 (the method tables run to 17 columns), DejaVu Sans from
#: matplotlib's own font files (the standard PDF fonts have no α, γ or ×)
PDF_CSS = """
@page {{ size: a4 landscape; margin: 1.2cm; }}
@font-face {{ font-family: body; src: url("{fonts}/DejaVuSans.ttf"); }}
@font-face {{ font-family: body; font-weight: bold; src: url("{fonts}/DejaVuSans-Bold.ttf"); }}
@font-face {{ font-family: mono; src: url("{fonts}/DejaVuSansMono.ttf"); }}
body {{ font-family: body; font-size: 8pt; line-height: 1.3; }}
h1 {{ font-size: 15pt; }} h2 {{ font-size: 12pt; margin-top: 10pt; }} h3 {{ font-size: 10pt; }}
code {{ font-family: mono; font-size: 7pt; }}
table {{ border-top: 0.5pt solid #444; border-bottom: 0.5pt solid #444; margin: 4pt 0; }}
th {{ font-size: 6pt; text-align: left; border-bottom: 0.5pt solid #444; padding: 1pt 2pt; }}
td {{ font-size: 6pt; padding: 1pt 2pt; }}
"""
#: the page's text width and height in inches (A4 landscape less the margins, less a caption line):
#: a larger figure is scaled down to fit them
PDF_TEXT_WIDTH_IN = (29.7 - 2 * 1.2) / 2.54
PDF_TEXT_HEIGHT_IN = (21.0 - 2 * 1.2) / 2.54 - 0.4


def markdown_to_pdf(md_path: Path) -> Path:
    """``report.pdf`` from the same markdown as report.html, by nbconvert's own markdown renderer and
    xhtml2pdf (Apache-2.0, on reportlab): pure wheels, no system libraries.  Figures are the PNGs beside
    the markdown, embedded at their own size (scaled down to the page), tables repeat their header row."""
    import matplotlib
    from nbconvert.filters.markdown_mistune import markdown2html_mistune
    from PIL import Image
    from xhtml2pdf import pisa
    from xhtml2pdf.config.resources import ResourceAccessPolicy

    root = md_path.parent.resolve()
    body = markdown2html_mistune(md_path.read_text())
    body = re.sub(r'<a class="anchor-link"[^>]*>.*?</a>', "", body)  # the ¶ links of the HTML
    body = body.replace("<table>", '<table repeat="1">')
    # xhtml2pdf breaks lines at white space only: a thin space after "/" lets "measured/predicted" wrap
    body = re.sub(r"<th>(.*?)</th>", lambda m: "<th>" + re.sub(r"/(?=\w{5})", "/\u2009", m.group(1)) + "</th>", body)

    def sized(m: re.Match[str]) -> str:
        f = (root / m.group(1)).resolve()
        if not (f.suffix == ".png" and f.is_file() and f.is_relative_to(root)):
            return m.group(0)
        with Image.open(f) as im:
            w, h = (v / FIGURE_DPI for v in im.size)
        scale = min(1.0, PDF_TEXT_WIDTH_IN / w, PDF_TEXT_HEIGHT_IN / h)
        src = html_escape(str(f))
        return f'<img src="{src}" alt="{m.group(2)}" width="{w * scale:.2f}in" height="{h * scale:.2f}in" />'

    body = re.sub(r'<img src="([^"]+)" alt="([^"]*)" />', sized, body)
    fonts = Path(matplotlib.get_data_path()) / "fonts" / "ttf"
    doc = f'<html><head><meta charset="utf-8"/><style>{PDF_CSS.format(fonts=fonts)}</style></head><body>{body}</body></html>'
    out = md_path.with_suffix(".pdf")
    # local reads only: the report's own folder (its figures) and the font folder, nothing remote
    policy = ResourceAccessPolicy(allow_remote=False, base_dir=root, extra_roots=(fonts,))
    with out.open("wb") as dest:
        status = pisa.CreatePDF(doc, dest=dest, encoding="utf-8", resource_policy=policy)
    if status.err:
        raise RuntimeError(f"xhtml2pdf could not render {out} ({status.err} errors)")
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
    markdown_to_pdf(path)
    return path


def render_report(out_dir: str | os.PathLike[str], merge: str | Sequence[str] = "", html: bool = True) -> Path:
    """What report.ipynb runs: the study report of ``out_dir``, or with ``merge`` (comma-separated
    or a list of outputs/<gpu>/ folders) the cross-hardware report written into ``out_dir``."""
    folders = [m for m in (merge.split(",") if isinstance(merge, str) else merge) if m]
    if folders:
        return write_cross_report(folders, dest=out_dir)
    return write_report(out_dir, html=html)

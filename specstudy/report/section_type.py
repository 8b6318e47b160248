"""A report section: its markdown, tables (name → display and raw frames) and figures, and the one
markdown table format; what every section builder returns and the writer saves."""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd
from matplotlib.figure import Figure


def markdown_table(df: pd.DataFrame | None) -> str:
    """A GitHub-flavoured markdown table (no tabulate dependency)."""
    if df is None or len(df) == 0:
        return "_no measured rows_\n"
    cols = [str(c) for c in df.columns]
    lines = ["| " + " | ".join(cols) + " |", "| " + " | ".join("---" for _ in cols) + " |"]
    for _, row in df.iterrows():
        lines.append("| " + " | ".join(str(v).replace("|", "\\|").replace("\n", " ") for v in row.values) + " |")
    return "\n".join(lines) + "\n"


@dataclass
class Section:
    title: str
    markdown: str = ""
    tables: dict[str, tuple[pd.DataFrame, pd.DataFrame | None]] = field(default_factory=dict)
    figures: dict[str, Figure] = field(default_factory=dict)

    def absorb(self, other: Section) -> None:
        """Append another section's text, tables and figures (the telemetry inside the hardware section)."""
        self.markdown += "\n" + other.markdown
        self.tables.update(other.tables)
        self.figures.update(other.figures)

    def add_table(self, name: str, shown: pd.DataFrame, raw: pd.DataFrame | None, text: str) -> None:
        """Append a subsection: ``text`` then the table as markdown, the table kept under ``name``."""
        self.tables[name] = (shown, raw)
        self.markdown += "\n" + text + markdown_table(shown)

    def to_markdown(self, figures_rel: str = "figures", level: int = 2) -> str:
        parts = [f"{'#' * level} {self.title}\n", self.markdown]
        for name in self.figures:
            parts.append(f"\n![{name}]({figures_rel}/{name}.png)\n\n(PDF: `{figures_rel}/{name}.pdf`)\n")
        return "\n".join(parts) + "\n"

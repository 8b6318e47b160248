"""Tables as LaTeX (booktabs), for a report meant to be attached to papers.

The display frame's text is kept as it reads in markdown — values with their CI brackets — with
LaTeX's special characters escaped and the Greek letters and symbols the tables use turned into
math, so the file compiles under pdflatex with ``\\usepackage{booktabs}`` alone.
"""

from __future__ import annotations

import re

import pandas as pd

_SPECIAL = {
    "\\": r"\textbackslash{}",
    "&": r"\&",
    "%": r"\%",
    "$": r"\$",
    "#": r"\#",
    "_": r"\_",
    "{": r"\{",
    "}": r"\}",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
}
_SYMBOLS = {
    "α̂": r"$\hat{\alpha}$",
    "α": r"$\alpha$",
    "γ": r"$\gamma$",
    "τ": r"$\tau$",
    "Δ": r"$\Delta$",
    "×": r"$\times$",
    "≤": r"$\le$",
    "≥": r"$\ge$",
    "−": "-",
    "—": "---",
    "–": "--",
    "…": r"\ldots{}",
    "○": r"$\circ$",
    "·": r"$\cdot$",
    "→": r"$\to$",
    "≈": r"$\approx$",
}
_PATTERN = re.compile("|".join(re.escape(k) for k in sorted({**_SPECIAL, **_SYMBOLS}, key=len, reverse=True)))


def escape(text: object) -> str:
    """One cell's text for LaTeX: specials escaped, the tables' symbols as math; other non-ASCII dropped to '?'."""
    out = _PATTERN.sub(lambda m: {**_SPECIAL, **_SYMBOLS}[m.group(0)], str(text))
    return "".join(c if ord(c) < 128 else "?" for c in out)


def latex_table(df: pd.DataFrame, caption: str = "", label: str = "") -> str:
    """A booktabs ``table`` environment of a display frame (every column left-aligned text)."""
    cols = [escape(c) for c in df.columns]
    lines = [r"\begin{table}[t]", r"\centering", r"\small"]
    if caption:
        lines.append(rf"\caption{{{escape(caption)}}}")
    if label:
        lines.append(rf"\label{{{label}}}")
    lines += [rf"\begin{{tabular}}{{{'l' * len(cols)}}}", r"\toprule", " & ".join(cols) + r" \\", r"\midrule"]
    lines += [" & ".join(escape(v) for v in row) + r" \\" for row in df.itertuples(index=False)]
    lines += [r"\bottomrule", r"\end{tabular}", r"\end{table}"]
    return "\n".join(lines) + "\n"

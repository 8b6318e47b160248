"""papermill's own command line, started without one import it never uses.

``python -m specstudy.report.papermill_cli ARGS`` is ``papermill ARGS``.  papermill imports nbformat,
which imports jsonschema, whose format checker imports ``rfc3987_syntax`` when it is installed
(JupyterLab's jupyter-events pulls it in); that module builds 38 Earley parsers at import, 2.6 of
papermill's 3.5 s start-up on this machine, once per notebook of a study.  Notebook validation
never checks the IRI formats it serves, so the import is blocked here (jsonschema treats a missing
checker as absent) and nowhere else.
"""

from __future__ import annotations

import sys


def main() -> None:
    sys.modules.setdefault("rfc3987_syntax", None)  # type: ignore[arg-type]  # None: "import fails"
    from papermill.cli import papermill

    papermill()


if __name__ == "__main__":
    main()

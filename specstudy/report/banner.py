"""The REHEARSAL banner a rehearsal's pages open with (the report and every notebook), made once here."""

from __future__ import annotations

import os

from ..layout import REHEARSAL_BANNER, REHEARSAL_MARKER, is_rehearsal


def rehearsal_banner(out: str | os.PathLike[str]) -> str:
    """The markdown banner of an outputs folder holding a rehearsal (random-weight stand-ins: a reader
    must see it before any number), or "" for a study's real outputs."""
    return f"> **{REHEARSAL_BANNER}** (see `{REHEARSAL_MARKER}`)\n" if is_rehearsal(out) else ""

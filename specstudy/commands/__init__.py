"""Subcommands of the ``specstudy`` console script (see :mod:`specstudy.cli`)."""

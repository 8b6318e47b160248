"""Backends: every engine is driven through :class:`specstudy.backends.base.Backend`."""

"""Peak resident memory of a server's process tree, sampled in a thread while a run lasts.

A server backend's engine lives in another process, so the client's own RSS says nothing about
it; this sampler sums ``psutil`` RSS over the server process and all its descendants.
"""

from __future__ import annotations

import threading

import psutil


def tree_rss(pid: int) -> int | None:
    """RSS bytes of ``pid`` and its descendants now; None when the process is gone."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return None
    total = 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except psutil.Error:  # a child that exited between listing and reading
            continue
    return total


class TreeRssSampler:
    """``with TreeRssSampler(pid) as s: ...`` then ``s.peak`` (bytes, or None if never readable)."""

    def __init__(self, pid: int, period_s: float = 0.02) -> None:
        if period_s <= 0:
            raise ValueError(f"period_s={period_s!r}: must be > 0")
        self.pid, self.period_s = pid, period_s
        self.peak: int | None = None
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name=f"rss-{pid}")

    def _sample(self) -> None:
        v = tree_rss(self.pid)
        if v is not None:
            self.peak = v if self.peak is None else max(self.peak, v)
            self.samples += 1

    def _loop(self) -> None:
        while not self._stop.wait(self.period_s):
            self._sample()

    def __enter__(self) -> TreeRssSampler:
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()

"""Prometheus text exposition (``/metrics``): counters scoped to a run by the difference of two scrapes."""

from __future__ import annotations

import re
from collections.abc import Mapping

_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{(.*)\})?\s+(\S+)(\s+\S+)?$")
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')

MetricSamples = dict[str, list[tuple[dict[str, str], float]]]


def parse_prometheus(text: str) -> MetricSamples:
    """Prometheus text exposition → {metric name: [(labels, value), ...]} (comments skipped)."""
    out: MetricSamples = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m:
            continue
        name, _, labels, value = m.group(1), m.group(2), m.group(3), m.group(4)
        try:
            v = float(value)
        except ValueError:
            continue
        lab = {k: bytes(val, "utf-8").decode("unicode_escape") for k, val in _LABEL.findall(labels or "")}
        out.setdefault(name, []).append((lab, v))
    return out


def metric_total(samples: MetricSamples, name: str) -> float | None:
    """Sum of a metric over all its label sets; None when the server does not export it."""
    if name not in samples:
        return None
    return float(sum(v for _, v in samples[name]))


def metric_by_label(samples: MetricSamples, name: str, label: str) -> dict[str, float]:
    """{label value: summed value} of a metric, e.g. per ``position`` of a per-position counter."""
    out: dict[str, float] = {}
    for lab, v in samples.get(name, []):
        if label in lab:
            out[lab[label]] = out.get(lab[label], 0.0) + v
    return out


def counter_deltas(before: MetricSamples, after: MetricSamples, names: Mapping[str, str]) -> dict[str, int]:
    """{key: after − before} of counters named by ``names`` ({key: metric name}); absent counts as 0."""
    return {k: round((metric_total(after, n) or 0.0) - (metric_total(before, n) or 0.0)) for k, n in names.items()}


def labelled_deltas(before: MetricSamples, after: MetricSamples, name: str, label: str) -> list[int]:
    """after − before of a counter per value of ``label`` (e.g. ``position``), in its numeric order."""
    a, b = metric_by_label(after, name, label), metric_by_label(before, name, label)
    return [round(a[k] - b.get(k, 0.0)) for k in sorted(a, key=int)]

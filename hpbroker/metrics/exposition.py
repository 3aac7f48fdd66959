"""The Prometheus text exposition format, version 0.0.4, sans I/O: :class:`MetricFamily` and
:func:`render`.

What a scrape gets, for each family once, in the order given::

    # HELP hpbroker_log_high_watermark The offset after the last flushed record.
    # TYPE hpbroker_log_high_watermark gauge
    hpbroker_log_high_watermark{topic="orders",partition="0"} 51234
    # HELP hpbroker_produce_latency_seconds From a produce request's arrival to its acknowledgement.
    # TYPE hpbroker_produce_latency_seconds histogram
    hpbroker_produce_latency_seconds_bucket{worker="0",le="0.0001"} 0
    ...
    hpbroker_produce_latency_seconds_bucket{worker="0",le="+Inf"} 1200
    hpbroker_produce_latency_seconds_sum{worker="0"} 0.84
    hpbroker_produce_latency_seconds_count{worker="0"} 1200

Rules kept here, so that no caller can break them: metric and label names match Prometheus's
patterns (a ``ValueError`` when a family is made, not at scrape time); label values escape
``\\``, ``"`` and newlines, HELP text ``\\`` and newlines; every series of a family has the same
label names; a histogram's buckets are cumulative, end with ``le="+Inf"`` equal to ``_count``, and
are followed by ``_sum`` and ``_count``; a counter's name is given with its ``_total`` suffix (in
0.0.4 the TYPE line names the series as it is exposed).  Numbers: integers as they are, floats
as Python's ``repr`` (which Prometheus parses), ``+Inf``, ``-Inf`` and ``NaN``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from hpbroker.metrics.histogram import Histogram

__all__ = ["CONTENT_TYPE", "COUNTER", "GAUGE", "HISTOGRAM", "MetricFamily", "format_value", "render"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
COUNTER, GAUGE, HISTOGRAM = "counter", "gauge", "histogram"
_TYPES = (COUNTER, GAUGE, HISTOGRAM)
_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")


@dataclass(slots=True)
class MetricFamily:
    """One metric: its name, type, help text, label names, and its series, each a tuple of label
    values (one per label name, any type, shown with ``str``) and a value: a number, or a
    :class:`~hpbroker.metrics.histogram.Histogram` for a histogram family."""

    name: str
    type: str
    help: str
    labels: tuple[str, ...] = ()
    series: list[tuple[tuple[object, ...], float | Histogram]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.labels = tuple(self.labels)
        if not _METRIC_NAME.fullmatch(self.name):
            raise ValueError(f"invalid metric name {self.name!r}")
        if self.type not in _TYPES:
            raise ValueError(f"metric {self.name}: type must be one of {_TYPES}, got {self.type!r}")
        if self.type == COUNTER and not self.name.endswith("_total"):
            raise ValueError(f"counter {self.name} must be named ..._total")
        if self.type == HISTOGRAM and self.name.endswith(_HISTOGRAM_SUFFIXES):
            raise ValueError(f"histogram {self.name} must not end with one of {_HISTOGRAM_SUFFIXES}")
        for label in self.labels:
            if not _LABEL_NAME.fullmatch(label) or label.startswith("__") \
                    or (self.type == HISTOGRAM and label == "le"):
                raise ValueError(f"metric {self.name}: invalid label name {label!r}")
        if len(set(self.labels)) != len(self.labels):
            raise ValueError(f"metric {self.name}: repeated label names {self.labels}")

    def add(self, label_values: Sequence[object], value: float | Histogram) -> None:
        """One series: its label values, in the order of :attr:`labels`, and its value."""
        if len(label_values) != len(self.labels):
            raise ValueError(f"metric {self.name} has labels {self.labels}, got values {tuple(label_values)}")
        if isinstance(value, Histogram) != (self.type == HISTOGRAM):
            raise ValueError(f"metric {self.name} ({self.type}) cannot take {type(value).__name__} {value!r}")
        self.series.append((tuple(label_values), value))


def render(families: Iterable[MetricFamily]) -> str:
    """The exposition of ``families`` (module docstring).  ValueError when a name comes twice."""
    lines: list[str] = []
    seen: set[str] = set()
    for family in families:
        if family.name in seen:
            raise ValueError(f"metric family {family.name} given twice")
        seen.add(family.name)
        lines.append(f"# HELP {family.name} {_escape_help(family.help)}")
        lines.append(f"# TYPE {family.name} {family.type}")
        for values, value in family.series:
            pairs = [f'{name}="{_escape_label(str(v))}"'
                     for name, v in zip(family.labels, values, strict=True)]
            if isinstance(value, Histogram):
                _histogram_lines(lines, family.name, pairs, value)
            else:
                lines.append(f"{family.name}{_labels(pairs)} {format_value(value)}")
    lines.append("")
    return "\n".join(lines)


def _histogram_lines(lines: list[str], name: str, pairs: list[str], histogram: Histogram) -> None:
    total = 0
    for bound, total in histogram.cumulative():
        le = "+Inf" if bound == math.inf else format_value(bound)
        bucket_pairs = [*pairs, f'le="{le}"']
        lines.append(f"{name}_bucket{_labels(bucket_pairs)} {total}")
    lines.append(f"{name}_sum{_labels(pairs)} {format_value(histogram.sum)}")
    lines.append(f"{name}_count{_labels(pairs)} {total}")


def _labels(pairs: list[str]) -> str:
    return "{" + ",".join(pairs) + "}" if pairs else ""


def format_value(value: float) -> str:
    if isinstance(value, int):  # bool included: True is 1
        return str(int(value))
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def _escape_label(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")

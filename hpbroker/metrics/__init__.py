"""Prometheus metrics, with no knowledge of the broker: what a measurement is and how it is served.

- ``hpbroker.metrics.histogram``: :class:`Histogram`, a cumulative latency histogram cheap enough
  for a request path (one ``bisect`` and two additions per observation), and the bucket bounds
  the broker uses;
- ``hpbroker.metrics.exposition``: :class:`MetricFamily` and :func:`render`, the Prometheus text
  exposition format 0.0.4 (HELP and TYPE lines, escaping, histogram buckets), sans I/O;
- ``hpbroker.metrics.server``: :class:`MetricsServer`, ``GET /metrics`` over HTTP on a daemon
  thread, for a process whose own loop must never wait on a scraper.

What the broker measures and where (the workers' counters, the arbiter's view, consumer-group
lag) lives with the broker: ``hpbroker.workers.stats`` and ``hpbroker.workers.exporter``;
docs/METRICS.md lists every metric.  Imports: the standard library only.
"""

from hpbroker.metrics.exposition import CONTENT_TYPE, MetricFamily, render
from hpbroker.metrics.histogram import LATENCY_BUCKETS_S, Histogram
from hpbroker.metrics.server import MetricsServer

__all__ = ["CONTENT_TYPE", "LATENCY_BUCKETS_S", "Histogram", "MetricFamily", "MetricsServer", "render"]

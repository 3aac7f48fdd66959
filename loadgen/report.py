"""The run's figures: collected from the workers' messages, summed into a report, formatted.

:class:`Collector` takes every message the workers send (``loadgen.worker`` lists them): the
per-interval counts and latency histograms go into a timeline keyed by tick (interval ``k`` ends
at ``t0 + k * interval_s``), the final messages into per-worker totals.  :meth:`Collector.report`
builds the report (a plain dict, the ``--json`` output; docs/LOADGEN.md describes every field);
:func:`format_report` renders it as text and :func:`progress_line` renders one tick of the
timeline for the live display.

Rates divide by the time from the common start ``t0``: produce until the last producer's final
flush returned (so records/s counts acknowledged records when nothing failed), consume until the
last record was handed to a consumer.  MB are 10**6 bytes of record values.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from loadgen.config import LoadConfig
from loadgen.histogram import Histogram
from loadgen.tally import merge_tallies

__all__ = ["Collector", "format_report", "progress_line"]

PERCENTILES = (50, 95, 99, 99.9)


@dataclass
class Tick:
    """The counts of one interval, all workers together."""

    produced: int = 0
    produced_bytes: int = 0
    acked: int = 0
    failed: int = 0
    retries: int = 0
    consumed: int = 0
    consumed_bytes: int = 0
    consume_errors: int = 0
    reports: int = 0
    ack_latency: Histogram = field(default_factory=Histogram)
    e2e_latency: Histogram = field(default_factory=Histogram)


class Collector:
    """Everything the runner heard from its workers.  Single thread (the runner's)."""

    def __init__(self, config: LoadConfig, run_id: int) -> None:
        self.config = config
        self.run_id = run_id
        self.t0: float | None = None
        self.ticks: dict[int, Tick] = defaultdict(Tick)
        self.done: dict[tuple[str, int], dict] = {}
        self.failed: dict[tuple[str, int], dict] = {}
        self.run_records: dict[int, int] = {}  # consumer index -> this run's records tallied so far
        self.consumed_records: dict[int, int] = {}

    def add(self, message: dict) -> None:
        role, index, kind = message["role"], message["index"], message["kind"]
        if kind == "progress":
            self._progress(role, index, message)
        elif kind == "done":
            self.done[role, index] = message
        elif kind == "failed":
            self.failed[role, index] = message

    def _progress(self, role: str, index: int, m: dict) -> None:
        tick = self.ticks[max(1, m["tick"])]
        tick.reports += 1
        latency = Histogram.from_sparse(m["latency"])
        if role == "producer":
            tick.produced += m["records"]
            tick.produced_bytes += m["bytes"]
            tick.acked += m["acked"]
            tick.failed += m["failed"]
            tick.retries += m["retries"]
            tick.ack_latency.merge(latency)
        else:
            tick.consumed += m["records"]
            tick.consumed_bytes += m["bytes"]
            tick.consume_errors += m["errors"]
            tick.e2e_latency.merge(latency)
            self.run_records[index] = m["run_records"]
            self.consumed_records[index] = self.consumed_records.get(index, 0) + m["records"]

    def finals(self, role: str) -> list[dict]:
        return [m for (r, _), m in sorted(self.done.items()) if r == role]

    # --- the report ---------------------------------------------------------------------------

    def report(self, *, partitions: int, topic_created: bool, consumers_started: int) -> dict:
        config = self.config
        out: dict = {"tool": "loadgen", "run_id": f"{self.run_id:08x}", "workload": config.workload,
                     "started_at": self.t0, "topic": config.topic, "partitions": partitions,
                     "topic_created": topic_created, "settings": config.to_dict()}
        if config.producing:
            out["produce"] = self._produce_section()
        if config.consuming:
            out["consume"] = self._consume_section(consumers_started)
            if config.check:
                out["check"] = self._check_section()
        # Copies read back beyond the first, per (run, producer, sequence): None when nothing was checked.
        out["duplicates"] = out["check"]["duplicated"] if "check" in out else None
        out["failures"] = [{"role": r, "index": i, "error": m["error"], "traceback": m.get("traceback")}
                           for (r, i), m in sorted(self.failed.items())]
        out["timeline"] = self.timeline()
        return out

    def _produce_section(self) -> dict:
        finals = self.finals("producer")
        records = sum(m["records"] for m in finals)
        nbytes = sum(m["bytes"] for m in finals)
        latency = Histogram()
        for m in finals:
            latency.merge(Histogram.from_sparse(m["ack_latency"]))
        duration = max((m["ended"] for m in finals), default=self.t0 or 0) - (self.t0 or 0)
        send_duration = max((m["send_ended"] for m in finals), default=self.t0 or 0) - (self.t0 or 0)
        per_producer = [{"producer": m["name"], "index": m["index"], "records": m["records"],
                         "bytes": m["bytes"], "failed": m["failed"], "retries": m["retries"],
                         "deduplicated": m.get("deduplicated"),
                         "records_per_s": _rate(m["records"], m["ended"] - (self.t0 or 0)),
                         "max_schedule_lag_ms": round(m["max_lag_s"] * 1000, 3),
                         "first_error": m["first_error"]}
                        for m in finals]
        return {"records": records, "bytes": nbytes, "duration_s": round(duration, 6),
                "send_duration_s": round(send_duration, 6), "records_per_s": _rate(records, duration),
                "mb_per_s": _rate(nbytes / 1e6, duration), "target_records_per_s": self.config.rate,
                "acked": sum(m["acked"] for m in finals), "failed": sum(m["failed"] for m in finals),
                "retries": sum(m["retries"] for m in finals),
                "deduplicated": _total(m.get("deduplicated") for m in finals),
                "max_schedule_lag_ms": max((p["max_schedule_lag_ms"] for p in per_producer), default=0.0),
                "ack_latency_ms": latency.summary(percentiles=PERCENTILES),
                "ack_latency_note": "one sample per chunk: send to acknowledgement of its last record",
                "first_error": next((m["first_error"] for m in finals if m["first_error"]), None),
                "per_producer": per_producer}

    def _consume_section(self, consumers_started: int) -> dict:
        finals = self.finals("consumer")
        records = sum(m["records"] for m in finals)
        nbytes = sum(m["bytes"] for m in finals)
        latency = Histogram()
        for m in finals:
            latency.merge(Histogram.from_sparse(m["e2e_latency"]))
        last = max((m["last_record"] for m in finals if m["last_record"]), default=None)
        duration = 0.0 if last is None else last - (self.t0 or 0)
        out = {"consumers": consumers_started, "records": records, "bytes": nbytes,
               "duration_s": round(duration, 6), "records_per_s": _rate(records, duration),
               "mb_per_s": _rate(nbytes / 1e6, duration), "errors": sum(m["errors"] for m in finals),
               "first_error": next((m["first_error"] for m in finals if m["first_error"]), None),
               "checked": self.config.check}
        if self.config.workload == "e2e":
            out["e2e_latency_ms"] = latency.summary(percentiles=PERCENTILES)
        return out

    def _check_section(self) -> dict:
        exports = [m["tally"] for m in self.finals("consumer")]
        sent = None
        if self.config.workload == "e2e":
            sent = {(m["run_id"], m["index"]): m["records"] for m in self.finals("producer")}
        result = merge_tallies(exports, sent)
        out = result.to_dict()
        out["failed_sends"] = sum(m["failed"] for m in self.finals("producer"))
        if sent is None:
            out["note"] = ("no producers in this run: missing counts the holes below each producer's "
                           "highest number")
        return out

    def timeline(self) -> list[dict]:
        interval = self.config.interval_s
        rows = []
        for k in sorted(self.ticks):
            t = self.ticks[k]
            rows.append({"t_s": round(k * interval, 6), "produced_per_s": round(t.produced / interval, 1),
                         "acked_per_s": round(t.acked / interval, 1),
                         "produced_mb_per_s": round(t.produced_bytes / interval / 1e6, 3),
                         "consumed_per_s": round(t.consumed / interval, 1),
                         "consumed_mb_per_s": round(t.consumed_bytes / interval / 1e6, 3),
                         "failed": t.failed, "retries": t.retries, "consume_errors": t.consume_errors,
                         "ack_p50_ms": _ms(t.ack_latency.percentile(50)),
                         "ack_p99_ms": _ms(t.ack_latency.percentile(99)),
                         "e2e_p50_ms": _ms(t.e2e_latency.percentile(50)),
                         "e2e_p99_ms": _ms(t.e2e_latency.percentile(99))})
        return rows


def _count_or_dash(value: int | None) -> str:
    return "-" if value is None else f"{value:,}"


def _total(values) -> int | None:
    """The sum of the counts known; None when no worker knew its count."""
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def _rate(amount: float, seconds: float) -> float:
    return round(amount / seconds, 3) if seconds > 0 else 0.0


def _ms(ns: int | None) -> float | None:
    return None if ns is None else round(ns / 1e6, 4)


def _fmt_ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def progress_line(row: dict, workload: str, elapsed_s: float) -> str:
    """One line for the live display, from a timeline row."""
    parts = []
    if workload in ("produce", "e2e"):
        parts.append(f"produce {row['produced_per_s']:>12,.0f} rec/s {row['produced_mb_per_s']:>8,.1f} MB/s "
                     f"ack p50 {_fmt_ms(row['ack_p50_ms'])} p99 {_fmt_ms(row['ack_p99_ms'])} ms")
    if workload in ("consume", "e2e"):
        parts.append(f"consume {row['consumed_per_s']:>12,.0f} rec/s {row['consumed_mb_per_s']:>8,.1f} MB/s")
    if workload == "e2e":
        parts.append(f"e2e p50 {_fmt_ms(row['e2e_p50_ms'])} p99 {_fmt_ms(row['e2e_p99_ms'])} ms")
    parts.append(f"errors {row['failed'] + row['consume_errors']} retries {row['retries']}")
    return f"[{elapsed_s:6.1f}s] " + " | ".join(parts)


def _latency_line(name: str, summary: dict) -> str:
    if not summary or not summary.get("count"):
        return f"  {name:<22} no samples"
    return (f"  {name:<22} p50 {_fmt_ms(summary['p50'])}  p95 {_fmt_ms(summary['p95'])}  "
            f"p99 {_fmt_ms(summary['p99'])}  p99.9 {_fmt_ms(summary['p999'])}  "
            f"max {_fmt_ms(summary['max'])} ms  ({summary['count']:,} samples)")


def _setting(value: object, on_off: bool = False) -> str:
    """A producer setting as the header shows it: "default" when loadgen left it to the client."""
    if value is None:
        return "default"
    if on_off:
        return "on" if value else "off"
    return str(value)


def format_report(report: dict) -> str:
    """The report as text, for a person."""
    s = report["settings"]
    lines = [f"loadgen {report['workload']} run {report['run_id']}: topic {report['topic']} "
             f"({report['partitions']} partitions), producers {s['producers']}, consumers {s['consumers']}, "
             f"records {s['record_size']} B {s['payload']}, keys {s['keys']}, acks {s['acks']}, "
             f"compression {s['compression'] or 'none'}, linger {s['linger_ms']:g} ms, "
             f"idempotence {_setting(s.get('enable_idempotence'), on_off=True)}, "
             f"in flight {_setting(s.get('max_in_flight'))}, "
             f"rate {'max' if s['rate'] is None else format(s['rate'], ',.0f') + '/s'}"]
    p = report.get("produce")
    if p:
        lines.append(f"produce: {p['records']:,} records, {p['bytes'] / 1e6:,.1f} MB in "
                     f"{p['duration_s']:.2f} s: {p['records_per_s']:,.0f} records/s, "
                     f"{p['mb_per_s']:,.1f} MB/s; "
                     f"failed {p['failed']:,}, retries {p['retries']:,}, "
                     f"deduplicated {_count_or_dash(p.get('deduplicated'))}, "
                     f"max schedule lag {p['max_schedule_lag_ms']:.1f} ms")
        lines.append(_latency_line("produce-ack latency", p["ack_latency_ms"]))
        if p["first_error"]:
            lines.append(f"  first error: {p['first_error']}")
    c = report.get("consume")
    if c:
        lines.append(f"consume: {c['records']:,} records, {c['bytes'] / 1e6:,.1f} MB in "
                     f"{c['duration_s']:.2f} s: {c['records_per_s']:,.0f} records/s, "
                     f"{c['mb_per_s']:,.1f} MB/s; "
                     f"errors {c['errors']:,}")
        if "e2e_latency_ms" in c:
            lines.append(_latency_line("end-to-end latency", c["e2e_latency_ms"]))
        if c["first_error"]:
            lines.append(f"  first error: {c['first_error']}")
    k = report.get("check")
    if k:
        verdict = "OK" if k["ok"] else "PROBLEMS"
        lines.append(f"check: {verdict}: sent {k['sent']:,}, received {k['received']:,}, "
                     f"distinct {k['distinct']:,}, missing {k['missing']:,}, duplicated {k['duplicated']:,}, "
                     f"out of order {k['out_of_order']:,}, unexpected {k['unexpected']:,}, "
                     f"foreign {k['foreign']:,}")
        lines.append(f"duplicates: {k['duplicated']:,} (records read back more than once: same producer "
                     "and sequence number)")
        for part, counts in k["per_partition"].items():
            if counts["duplicated"] or counts["out_of_order"]:
                lines.append(f"  partition {part}: {counts['records']:,} records, duplicated "
                             f"{counts['duplicated']:,}, out of order {counts['out_of_order']:,}")
    for failure in report["failures"]:
        lines.append(f"FAILED {failure['role']} {failure['index']}: {failure['error']}")
    return "\n".join(lines)

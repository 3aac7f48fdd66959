"""The audit: records counted in the logs against what their producers announced, per window.

Every producer announces, in monitoring events on the audit topic (``hpbroker.audit.events``),
how many of its records of each topic the broker acknowledged per window of record timestamps.
The audit counts the stored records of each (topic, producer, window) from the data itself and
compares:

1. **A snapshot.**  The data topics' and then the audit topic's end offsets are taken once, at the
   start (``snapshot_ms``); both are read up to there.  The data is read from the first record at
   or after ``--from`` (all earlier records are older: ListOffsets, docs/CLIENT.md) and to the
   end, whatever ``--to`` says, since timestamps need not grow with offsets.  The audit topic is
   read whole (its events are few).
2. **Windows.**  A producer's records are windowed with its own events' ``window_ms``:
   ``window_start = timestamp - timestamp mod window_ms``.  A producer that announced several
   window lengths is audited in its longest (its events re-bucketed into it, exact when the
   lengths divide it); one that announced nothing in ``--window-ms`` (default 10 000).
3. **Counts.**  Data: records per (topic, producer, window) (``consumed``, C).  Events: the sum of
   ``record_count`` per (topic, producer, window) (``announced``, A; a window may be announced by
   several events, and an event stored twice, published again after an unknown outcome with the
   same ``instance`` and ``sequence``, is counted once).  The two are joined (full outer).
4. **Duplicates.**  Only when some audited window has C > A, the topics holding such windows are
   read a second time with the records' contents, kept for those windows alone: records equal in
   topic, producer, timestamp, key, value and headers are one record stored several times (a
   retry resends the same bytes), and ``duplicates`` (D) counts the copies beyond the first.
   Then, with ``distinct = C - D``, ``unannounced = max(0, distinct - A)`` and
   ``missing = max(0, A - distinct)``:

   ===============  ============================================================================
   verdict          when
   ===============  ============================================================================
   ``ok``           C = A (not reported unless asked)
   ``duplicate``    C > A and D > 0: a record stored twice (its window may also hold unannounced
                    or missing records: the columns say how many)
   ``missing``      C < A: records announced and not stored (lost, deleted, not yet stored)
   ``unannounced``  C > A and D = 0: records stored once that no event announces (a producer
                    killed before publishing them, one without monitoring, a record whose outcome
                    its producer never learned)
   ===============  ============================================================================

5. **Edges.**  Only windows wholly inside ``[--from, --to)`` are audited.  A window still open at
   the snapshot, whose records or events may still come (a producer publishes a window's last
   event up to ``window_ms`` after acknowledging its last record, and a record may be
   acknowledged up to ``delivery_timeout_ms`` after it was stamped), would be reported wrongly:
   ``--grace-ms G`` skips every window that ends after ``snapshot - G`` (counted as open).  The
   default, no grace, audits everything: right once the producers have closed (closing publishes
   every count) and their last requests are stored; an ``acks=0`` producer's close does not wait
   for that (its connection sends what it queued in the background for up to 5 s).  Records
   deleted by retention are missing from their windows, also those deleted while the audit
   reads: audit ranges well inside the retention period.  Events that do not decode are counted
   and fail the audit.

Exit status (:func:`main`): 0 when every window matches, 1 when one does not (or an event does
not decode), 2 when the audit could not run (bad options, broker unreachable).

pyspark and the client are imported only by the functions that run the job, so the command line
(``hpbroker audit``, :func:`add_arguments`) loads neither.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from hpbroker.audit.events import AUDIT_TOPIC, DEFAULT_WINDOW_MS, decode_event
from hpbroker.timestamps import iso_ms, parse_time_ms

if TYPE_CHECKING:
    from hpbroker.spark.planning import OffsetRange

__all__ = ["AuditConfig", "AuditReport", "add_arguments", "config_from_args", "main", "run_audit"]

VERDICTS = ("missing", "duplicate", "unannounced")
FORMATS = ("parquet", "csv")
#: The report's columns: one row per audited (topic, producer, window).
REPORT_COLUMNS = ("topic", "producer", "window_start", "window_start_ms", "window_ms", "announced",
                  "consumed", "difference", "duplicates", "unannounced", "missing", "verdict")
_EVENT_SCHEMA = ("producer string, topic string, window_start_ms bigint, window_ms bigint, "
                 "record_count bigint, instance bigint, sequence bigint, error string")


@dataclass(frozen=True, slots=True)
class AuditConfig:
    """What to audit and where the report goes; validated on construction."""

    bootstrap: str
    #: the data topics; None: every topic but the audit topic.
    topics: tuple[str, ...] | None = None
    audit_topic: str = AUDIT_TOPIC
    #: audit windows starting at or after this (ms since the epoch); None: from the first record.
    from_ms: int | None = None
    #: audit windows ending at or before this; None: no bound.
    to_ms: int | None = None
    #: skip windows ending after ``snapshot_ms - grace_ms``; None: audit every window.
    grace_ms: int | None = None
    #: window length, ms, for producers that announced nothing.
    default_window_ms: int = DEFAULT_WINDOW_MS
    #: where to write the report (a directory), in ``output_format``; None: not written.
    output: str | None = None
    output_format: str = "parquet"
    #: write every audited window (verdict ``ok`` included), not only the mismatches.
    all_windows: bool = False
    max_records_per_split: int = 2_000_000

    def __post_init__(self) -> None:
        if self.output_format not in FORMATS:
            raise ValueError(f"format {self.output_format!r}: choose {' or '.join(FORMATS)}")
        if self.from_ms is not None and self.to_ms is not None and self.from_ms >= self.to_ms:
            raise ValueError(f"--from {self.from_ms} is not before --to {self.to_ms}")
        if self.grace_ms is not None and self.grace_ms < 0:
            raise ValueError(f"--grace-ms must be >= 0, got {self.grace_ms}")
        if not 1 <= self.default_window_ms <= 0xFFFFFFFF:
            raise ValueError(f"--window-ms must be in [1, {0xFFFFFFFF}], got {self.default_window_ms}")
        if self.topics is not None and self.audit_topic in self.topics:
            raise ValueError(f"the audit topic {self.audit_topic!r} is not a data topic: its records are not "
                             "announced")


@dataclass(slots=True)
class AuditReport:
    """What the audit found."""

    snapshot_ms: int
    topics: list[str]
    windows_checked: int = 0
    matching: int = 0
    records_counted: int = 0
    records_announced: int = 0
    open_windows: int = 0  # skipped: ending after snapshot_ms - grace_ms
    invalid_events: list[str] = field(default_factory=list)  # why undecodable events failed (first 20)
    invalid_event_count: int = 0
    mismatches: list[dict[str, Any]] = field(default_factory=list)  # the first ones, by topic and time
    mismatched: int = 0
    verdicts: dict[str, int] = field(default_factory=dict)  # mismatched windows per verdict
    records_duplicated: int = 0  # copies beyond the first, in windows with a surplus
    records_unannounced: int = 0
    records_missing: int = 0
    output: str | None = None

    @property
    def ok(self) -> bool:
        return self.mismatched == 0 and not self.invalid_event_count

    def summary(self) -> str:
        open_part = f", {self.open_windows} open windows skipped" if self.open_windows else ""
        invalid = f", {self.invalid_event_count} undecodable events" if self.invalid_event_count else ""
        topics = ", ".join(self.topics) or "-"
        kinds = ", ".join(f"{self.verdicts[v]} {v}" for v in VERDICTS if self.verdicts.get(v))
        kinds = f" ({kinds})" if kinds else ""
        split = ""
        if self.mismatched:
            split = (f": {self.records_duplicated} duplicate, {self.records_unannounced} unannounced, "
                     f"{self.records_missing} missing")
        return (f"audit {'OK' if self.ok else 'FAILED'}: {self.windows_checked} windows checked, "
                f"{self.matching} matching, {self.mismatched} mismatched{kinds}; {self.records_counted} "
                f"records counted, {self.records_announced} announced{split}{open_part}{invalid} "
                f"(topics: {topics}; snapshot {iso_ms(self.snapshot_ms)})")


# --- the job ----------------------------------------------------------------------------------


def run_audit(spark: Any, config: AuditConfig, *, show: int = 100) -> AuditReport:
    """Audit with ``spark`` (a session with the hpbroker source registered); the report keeps the
    first ``show`` mismatches, and writes them all to ``config.output`` when set."""
    from pyspark.sql import functions as F

    topics, data_plan, audit_plan, snapshot_ms = _plan(config)
    report = AuditReport(snapshot_ms, topics)
    counts, producer_windows = _counted(spark, config, topics, data_plan, audit_plan, snapshot_ms)
    counts = counts.cache()
    windows = None
    try:
        surplus = (counts.where(~F.col("open") & (F.col("consumed") > F.col("announced")))
                   .select("topic", "producer", "window_start_ms"))
        # Only the topics with a surplus are read again (the windows are few: known to the driver).
        surplus_topics = {row["topic"] for row in surplus.select("topic").distinct().collect()}
        reread = [r for r in data_plan if r.topic in surplus_topics]
        copies = _duplicates(spark, config, reread, surplus, producer_windows) if reread else None
        windows = _judged(counts, copies).cache()
        _tally(report, windows)
        audited = windows.where(~F.col("open")).select(*REPORT_COLUMNS)
        mismatches = audited.where(F.col("verdict") != "ok")
        ordered = mismatches.orderBy("topic", "window_start_ms", "producer")
        if report.mismatched:
            report.mismatches = [row.asDict() for row in ordered.limit(show).collect()]
        if config.output is not None:
            _write(audited if config.all_windows else mismatches, config)
            report.output = config.output
    finally:
        if windows is not None:
            windows.unpersist()
        counts.unpersist()
    report.invalid_event_count, report.invalid_events = _invalid_events(spark, config, audit_plan)
    return report


def _tally(report: AuditReport, windows: Any) -> None:
    """The report's totals: audited windows, records and windows per verdict (open ones apart)."""
    from pyspark.sql import functions as F

    closed = ~F.col("open")

    def total(column: str) -> Any:
        return F.coalesce(F.sum(F.when(closed, F.col(column))), F.lit(0)).alias(column)

    totals = windows.agg(
        F.count(F.when(closed, 1)).alias("checked"), F.count(F.when(F.col("open"), 1)).alias("open"),
        total("consumed"), total("announced"), total("duplicates"), total("unannounced"),
        total("missing")).first()
    report.windows_checked, report.open_windows = totals["checked"], totals["open"]
    report.records_counted, report.records_announced = totals["consumed"], totals["announced"]
    report.records_duplicated, report.records_unannounced = totals["duplicates"], totals["unannounced"]
    report.records_missing = totals["missing"]
    per_verdict = windows.where(closed).groupBy("verdict").count().collect()
    report.verdicts = {row["verdict"]: row["count"] for row in per_verdict if row["verdict"] != "ok"}
    report.matching = report.windows_checked - sum(report.verdicts.values())
    report.mismatched = report.windows_checked - report.matching


def _plan(config: AuditConfig) -> tuple[list[str], list[OffsetRange], list[OffsetRange], int]:
    """The topics, and the ranges of every partition of the data and of the audit topic up to now
    (the snapshot)."""
    from hpbroker.client import Admin
    from hpbroker.spark.planning import OffsetSpec, resolve_ranges

    with Admin(config.bootstrap) as admin:
        existing = admin.list_topics()
    if config.topics is None:
        topics = sorted(t for t in existing if t != config.audit_topic)
    else:
        missing = [t for t in config.topics if t not in existing]
        if missing:
            raise ValueError(f"no such topics on {config.bootstrap}: {', '.join(missing)}")
        topics = list(dict.fromkeys(config.topics))
    snapshot_ms = int(time.time() * 1000)
    starting = OffsetSpec("earliest") if config.from_ms is None else OffsetSpec("timestamp",
                                                                                timestamp_ms=config.from_ms)
    latest = OffsetSpec("latest")
    data_plan = resolve_ranges(config.bootstrap, topics, starting, latest) if topics else []
    audit_plan = (resolve_ranges(config.bootstrap, [config.audit_topic], OffsetSpec("earliest"), latest)
                  if config.audit_topic in existing else [])
    return topics, data_plan, audit_plan, snapshot_ms


def _load(spark: Any, config: AuditConfig, ranges: list[OffsetRange], columns: str) -> Any:
    """The records of ``ranges`` (every partition's offsets pinned: the source reads the snapshot).
    Records that retention deletes while the audit reads are not there: reported missing."""
    from hpbroker.spark.planning import offsets_json

    topics = ",".join(dict.fromkeys(r.topic for r in ranges))
    return (spark.read.format("hpbroker").option("bootstrap", config.bootstrap).option("topic", topics)
            .option("startingOffsets", offsets_json(ranges, end=False))
            .option("endingOffsets", offsets_json(ranges, end=True))
            .option("columns", columns).option("maxRecordsPerSplit", config.max_records_per_split)
            .option("failOnDataLoss", "false").load())


def _events(spark: Any, config: AuditConfig, audit_plan: list[OffsetRange]) -> Any:
    """Every event of the snapshot, decoded: producer, topic, window_start_ms, window_ms,
    record_count, and ``error`` (not null for an event that does not decode)."""

    if not audit_plan:
        return spark.createDataFrame([], _EVENT_SCHEMA)
    return _load(spark, config, audit_plan, "producer,value").mapInArrow(decode_events, _EVENT_SCHEMA)


def decode_events(batches: Iterator[Any]) -> Iterator[Any]:
    """``mapInArrow`` body: audit records (producer, value) to decoded events, with the reference
    decoder (``hpbroker.audit.events.decode_event``: events are few)."""
    import pyarrow as pa

    names = ("producer", "topic", "window_start_ms", "window_ms", "record_count", "instance", "sequence",
             "error")
    for batch in batches:
        columns: dict[str, list] = {name: [] for name in names}
        for producer, value in zip(batch.column("producer").to_pylist(), batch.column("value").to_pylist(),
                                   strict=True):
            try:
                event = decode_event(producer or "", value or b"")
                row = (event.producer, event.topic, event.window_start_ms, event.window_ms,
                       event.record_count, event.instance, event.sequence, None)
            except ValueError as e:
                row = (producer, None, None, None, None, None, None, str(e))
            for name, item in zip(names, row, strict=True):
                columns[name].append(item)
        yield pa.RecordBatch.from_pydict(columns, schema=pa.schema([
            ("producer", pa.string()), ("topic", pa.string()), ("window_start_ms", pa.int64()),
            ("window_ms", pa.int64()), ("record_count", pa.int64()), ("instance", pa.int64()),
            ("sequence", pa.int64()), ("error", pa.string())]))


def _counted(spark: Any, config: AuditConfig, topics: list[str], data_plan: list[OffsetRange],
             audit_plan: list[OffsetRange], snapshot_ms: int) -> tuple[Any, Any]:
    """Every window of the range, records stored against records announced: ``(windows,
    producer_windows)``.  ``windows``: topic, producer, window_start_ms, window_ms, announced,
    consumed (0 where none) and ``open``; ``producer_windows``: producer, producer_window_ms (the
    window each announcing producer is audited in)."""
    from pyspark.sql import functions as F

    events = _events(spark, config, audit_plan).where(F.col("error").isNull())
    events = events.where(F.col("topic").isin(topics) if topics else F.lit(False))
    # An event published again after an unknown outcome may be stored twice: once per number.
    events = events.dropDuplicates(["producer", "instance", "sequence"])
    # Each producer's window: the longest it announced.  A few rows, known to the driver.
    windows = {row["producer"]: row["window_ms"]
               for row in events.groupBy("producer").agg(F.max("window_ms").alias("window_ms")).collect()}
    producer_windows = spark.createDataFrame(list(windows.items()),
                                             "producer string, producer_window_ms bigint")
    announced = (events.join(producer_windows, "producer")
                 .withColumn("window_ms", F.col("producer_window_ms"))
                 .withColumn("window_start_ms",
                             F.col("window_start_ms") - F.pmod("window_start_ms", "window_ms"))
                 .groupBy("topic", "producer", "window_start_ms", "window_ms")
                 .agg(F.sum("record_count").alias("announced")))
    if data_plan:
        # Records are first counted per slot of the greatest common divisor of every window length
        # (a slot lies in one window of each), which costs one hash aggregation per record and no
        # join; then the slots, few, are summed into each producer's windows.
        slot_ms = math.gcd(config.default_window_ms, *windows.values())
        millis = F.unix_millis("timestamp")
        slots = (_load(spark, config, data_plan, "topic,producer,timestamp")
                 .groupBy("topic", "producer", (millis - F.pmod(millis, F.lit(slot_ms))).alias("slot_ms"))
                 .agg(F.count(F.lit(1)).alias("consumed")))
        window = F.coalesce(F.col("producer_window_ms"), F.lit(config.default_window_ms))
        consumed = (slots.join(F.broadcast(producer_windows), "producer", "left")
                    .select("topic", "producer", "consumed", window.alias("window_ms"),
                            (F.col("slot_ms") - F.pmod("slot_ms", window)).alias("window_start_ms"))
                    .groupBy("topic", "producer", "window_start_ms", "window_ms")
                    .agg(F.sum("consumed").alias("consumed")))
    else:
        consumed = spark.createDataFrame([], "topic string, producer string, window_start_ms bigint, "
                                             "window_ms bigint, consumed bigint")
    joined = consumed.join(announced, ["topic", "producer", "window_start_ms", "window_ms"], "full_outer")
    window_end = F.col("window_start_ms") + F.col("window_ms")
    joined = joined.select(
        "topic", "producer", "window_start_ms", "window_ms",
        F.coalesce(F.col("announced"), F.lit(0)).cast("long").alias("announced"),
        F.coalesce(F.col("consumed"), F.lit(0)).cast("long").alias("consumed"),
        (window_end > F.lit(snapshot_ms - config.grace_ms) if config.grace_ms is not None
         else F.lit(False)).alias("open"))
    if config.from_ms is not None:
        joined = joined.where(F.col("window_start_ms") >= config.from_ms)
    if config.to_ms is not None:
        joined = joined.where(window_end <= config.to_ms)
    return joined, producer_windows


def _duplicates(spark: Any, config: AuditConfig, data_plan: list[OffsetRange], surplus: Any,
                producer_windows: Any) -> Any:
    """Copies beyond the first of each record stored more than once, in the ``surplus`` windows
    (topic, producer, window_start_ms: more stored than announced): topic, producer,
    window_start_ms, duplicates.  A record is the same record when topic, producer, timestamp,
    key, value and headers are all equal (a retry sends the same bytes; docs/AUDIT.md).  The data
    is read a second time, with its contents, only when some window has a surplus."""
    from pyspark.sql import functions as F

    millis = F.unix_millis("timestamp")
    window = F.coalesce(F.col("producer_window_ms"), F.lit(config.default_window_ms))
    records = (_load(spark, config, data_plan, "topic,producer,timestamp,key,value,headers")
               .join(F.broadcast(producer_windows), "producer", "left")
               .withColumn("window_start_ms", millis - F.pmod(millis, window))
               .join(F.broadcast(surplus), ["topic", "producer", "window_start_ms"], "left_semi"))
    copies = (records.groupBy("topic", "producer", "window_start_ms", "timestamp", "key", "value", "headers")
              .agg(F.count(F.lit(1)).alias("copies")))
    return (copies.where(F.col("copies") > 1)
            .groupBy("topic", "producer", "window_start_ms")
            .agg(F.sum(F.col("copies") - 1).alias("duplicates")))


def _judged(counts: Any, copies: Any | None) -> Any:
    """``counts`` (from :func:`_counted`) with each window's verdict and the split of its
    difference: duplicates, unannounced, missing (docs/AUDIT.md, "The comparison")."""
    from pyspark.sql import functions as F

    if copies is not None:
        counts = counts.join(copies, ["topic", "producer", "window_start_ms"], "left")
    else:
        counts = counts.withColumn("duplicates", F.lit(None).cast("long"))
    announced, consumed = F.col("announced"), F.col("consumed")
    duplicates = F.coalesce(F.col("duplicates"), F.lit(0)).cast("long")
    distinct = consumed - duplicates
    verdict = (F.when(consumed == announced, "ok")
               .when(duplicates > 0, "duplicate")
               .when(consumed < announced, "missing")
               .otherwise("unannounced"))
    return counts.select(
        "topic", "producer",
        F.date_format(F.timestamp_millis("window_start_ms"),
                      "yyyy-MM-dd'T'HH:mm:ss.SSS'Z'").alias("window_start"),
        "window_start_ms", "window_ms", "announced", "consumed", (consumed - announced).alias("difference"),
        duplicates.alias("duplicates"), F.greatest(distinct - announced, F.lit(0)).alias("unannounced"),
        F.greatest(announced - distinct, F.lit(0)).alias("missing"), verdict.alias("verdict"), "open")


def _invalid_events(spark: Any, config: AuditConfig, audit_plan: list[OffsetRange]) -> tuple[int, list[str]]:
    """How many events of the snapshot do not decode, and why (the first 20)."""
    from pyspark.sql import functions as F

    if not audit_plan:
        return 0, []
    bad = _events(spark, config, audit_plan).where(F.col("error").isNotNull()).cache()
    try:
        count = bad.count()
        first = bad.limit(20).collect() if count else []
    finally:
        bad.unpersist()
    return count, [f"producer {row['producer']!r}: {row['error']}" for row in first]


def _write(report: Any, config: AuditConfig) -> None:
    writer = report.coalesce(1).orderBy("topic", "window_start_ms", "producer").write.mode("overwrite")
    if config.output_format == "csv":
        writer.option("header", "true").csv(config.output)
    else:
        writer.parquet(config.output)


# --- the command line -------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The audit's options (shared by ``hpbroker audit`` and ``spark/audit_job.py``)."""
    parser.add_argument("--bootstrap", "-b", metavar="HOST:PORT",
                        default=os.environ.get("HPBROKER_BOOTSTRAP", "127.0.0.1:9092"),
                        help="the broker's front-end (default $HPBROKER_BOOTSTRAP, else 127.0.0.1:9092)")
    parser.add_argument("--topic", "-t", action="append", metavar="NAME",
                        help="a data topic to audit (repeatable, or comma-separated; default: every "
                             "topic but the audit topic)")
    parser.add_argument("--audit-topic", default=AUDIT_TOPIC, metavar="NAME",
                        help=f"the topic of the monitoring events (default {AUDIT_TOPIC})")
    parser.add_argument("--from", dest="from_time", metavar="TIME",
                        help="audit windows starting at or after TIME (ms since the epoch or ISO 8601, "
                             "UTC unless it says otherwise)")
    parser.add_argument("--to", dest="to_time", metavar="TIME", help="audit windows ending at or before TIME")
    parser.add_argument("--grace-ms", type=int, metavar="MS",
                        help="skip windows ending less than MS before now (still open while producers run); "
                             "default: audit every window")
    parser.add_argument("--window-ms", type=int, default=DEFAULT_WINDOW_MS, metavar="MS",
                        help=f"window of producers that announced nothing (default {DEFAULT_WINDOW_MS})")
    parser.add_argument("--output", "-o", metavar="DIR",
                        help="write the mismatches to DIR (replaced if present)")
    parser.add_argument("--format", choices=FORMATS, default="parquet", help="of --output (default parquet)")
    parser.add_argument("--all-windows", action="store_true",
                        help="write every audited window to --output, matching ones too")
    parser.add_argument("--show", type=int, default=100, metavar="N", help="print at most N mismatches (100)")
    parser.add_argument("--master", metavar="URL",
                        help="Spark master (default: spark-submit's, else local[*])")
    parser.add_argument("--max-records-per-split", type=int, default=2_000_000, metavar="N",
                        help="offsets one Spark task reads at most (default 2000000)")


def config_from_args(args: argparse.Namespace) -> AuditConfig:

    topics = None
    if args.topic:
        topics = tuple(t.strip() for entry in args.topic for t in entry.split(",") if t.strip())
    return AuditConfig(
        bootstrap=args.bootstrap, topics=topics, audit_topic=args.audit_topic,
        from_ms=None if args.from_time is None else parse_time_ms(args.from_time, "--from"),
        to_ms=None if args.to_time is None else parse_time_ms(args.to_time, "--to"),
        grace_ms=args.grace_ms, default_window_ms=args.window_ms, output=args.output,
        output_format=args.format, all_windows=args.all_windows,
        max_records_per_split=args.max_records_per_split)


def format_table(rows: Sequence[dict[str, Any]]) -> str:
    """The mismatches as an aligned text table."""
    headers = ("topic", "producer", "window start", "window ms", "announced", "consumed", "difference",
               "duplicates", "unannounced", "missing", "verdict")
    keys = ("topic", "producer", "window_start", "window_ms", "announced", "consumed", "difference",
            "duplicates", "unannounced", "missing", "verdict")
    cells = [[str(row[key]) for key in keys] for row in rows]
    widths = [max(len(h), *(len(c[i]) for c in cells)) if cells else len(h) for i, h in enumerate(headers)]
    numeric = set(range(3, 10))

    def line(values: Sequence[str]) -> str:
        return "  ".join(v.rjust(w) if i in numeric else v.ljust(w)
                         for i, (v, w) in enumerate(zip(values, widths, strict=True))).rstrip()

    return "\n".join([line(headers), *(line(c) for c in cells)])


def print_report(report: AuditReport, out: Any = None) -> None:
    out = out or sys.stdout
    if report.mismatches:
        print(format_table(report.mismatches), file=out)
        if report.mismatched > len(report.mismatches):
            rest = report.mismatched - len(report.mismatches)
            where = f" (all in {report.output})" if report.output else ""
            print(f"... and {rest} more mismatched windows{where}", file=out)
    for why in report.invalid_events:
        print(f"undecodable event: {why}", file=out)
    print(report.summary(), file=out)


def run(args: argparse.Namespace) -> int:
    """Run the audit the options describe; the exit status (module docstring)."""
    try:
        config = config_from_args(args)
    except ValueError as e:
        print(f"audit: {e}", file=sys.stderr)
        return 2
    from hpbroker.spark import describe_error, session

    try:
        spark = session(args.master, app_name="hpbroker-audit")
        report = run_audit(spark, config, show=max(0, args.show))
    except Exception as e:  # the job's boundary: whatever stopped it is reported, exit status 2
        print(f"audit: {describe_error(e)}", file=sys.stderr)
        return 2
    print_report(report)
    return 0 if report.ok else 1


def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    parser = argparse.ArgumentParser(prog=prog, description="Audit hpbroker topics against the producers' "
                                                            "monitoring events (docs/AUDIT.md).")
    add_arguments(parser)
    return run(parser.parse_args(argv))

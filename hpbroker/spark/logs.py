"""Log processing on Spark: per-minute counts and top keys and paths of access-log topics.

The records hold JSON access-log lines like loadgen's ``--payload log`` values
(``loadgen/payload.py``: a 24-byte binary header, then lines such as
``{"ts":"...","host":"web-03","ip":"10.1.2.3","method":"GET","path":"/api/v1/orders/17",
"status":200,"bytes":5120,...}``).  A record may hold several lines or end in the middle of one;
each record counts once, with the fields of its first line, pulled out with Spark SQL regular
expressions (so a value that is not JSON, or a line cut short, simply lacks fields).

Written under ``--output`` (Parquet, one directory per table, replaced if present):

==============  =================================================================================
``per_minute``  ``topic, minute`` (timestamp, UTC: the records' own timestamps truncated to the
                minute), ``records``, ``value_bytes``, ``status_2xx`` ... ``status_5xx``,
                ``no_status`` (records without a status), ``gets``, ``posts``, ``other_methods``
``top_keys``    ``topic, rank, key, records``: each topic's ``--top`` most frequent record keys
``top_paths``   ``topic, rank, path, records``: the most requested paths (query left out), numbers
                that start a path segment replaced by ``{id}`` (``/api/v1/orders/17`` counts as
                ``/api/v1/orders/{id}``, ``/img/17.jpg`` as ``/img/{id}.jpg``)
==============  =================================================================================

Exit status (:func:`main`): 0 when the tables were written, 2 when the job could not run.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["LogJobConfig", "add_arguments", "main", "parse_access_log", "per_minute", "run_log_job", "top_by"]

TABLES = ("per_minute", "top_keys", "top_paths")


@dataclass(frozen=True, slots=True)
class LogJobConfig:
    bootstrap: str
    topics: tuple[str, ...]
    output: str
    #: read records from this time on / before this time (the source's startingTimestamp /
    #: endingTimestamp); None: from the earliest / to the latest.
    from_time: str | None = None
    to_time: str | None = None
    top: int = 10

    def __post_init__(self) -> None:
        if not self.topics:
            raise ValueError("name at least one topic")
        if self.top < 1:
            raise ValueError(f"--top must be >= 1, got {self.top}")


def parse_access_log(records: Any) -> Any:
    """``records`` (the source's columns) with ``minute``, ``key_text``, ``method``, ``path``
    (digits as ``{id}``), ``status`` (int, null when absent) and ``value_bytes``."""
    from pyspark.sql import functions as F

    text = F.col("value").cast("string")

    def field(pattern: str) -> Any:
        extracted = F.regexp_extract(text, pattern, 1)
        return F.when(extracted != "", extracted)

    return records.select(
        "topic", F.date_trunc("minute", "timestamp").alias("minute"),
        F.col("key").cast("string").alias("key_text"),
        F.coalesce(F.length("value"), F.lit(0)).alias("value_bytes"),
        field(r'"method":"([A-Z]+)"').alias("method"),
        F.regexp_replace(field(r'"path":"([^"?]*)'), r"/[0-9]+", "/{id}").alias("path"),
        field(r'"status":([0-9]{3})[,}]').cast("int").alias("status"))


def per_minute(parsed: Any) -> Any:
    """Records, bytes, status classes and methods per topic and minute."""
    from pyspark.sql import functions as F

    def count_if(condition: Any) -> Any:
        return F.count(F.when(condition, 1))

    status = F.col("status")
    return (parsed.groupBy("topic", "minute")
            .agg(F.count(F.lit(1)).alias("records"), F.sum("value_bytes").alias("value_bytes"),
                 *(count_if((status >= 100 * c) & (status < 100 * (c + 1))).alias(f"status_{c}xx")
                   for c in (2, 3, 4, 5)),
                 count_if(status.isNull()).alias("no_status"),
                 count_if(F.col("method") == "GET").alias("gets"),
                 count_if(F.col("method") == "POST").alias("posts"),
                 count_if(F.col("method").isNotNull()
                          & ~F.col("method").isin("GET", "POST")).alias("other_methods"))
            .orderBy("topic", "minute"))


def top_by(parsed: Any, column: str, name: str, top: int) -> Any:
    """Each topic's ``top`` most frequent non-null values of ``column`` (ties by value), as
    ``topic, rank, <name>, records``."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    counts = (parsed.where(F.col(column).isNotNull()).groupBy("topic", column)
              .agg(F.count(F.lit(1)).alias("records")))
    ranking = Window.partitionBy("topic").orderBy(F.desc("records"), F.asc(column))
    return (counts.withColumn("rank", F.row_number().over(ranking)).where(F.col("rank") <= top)
            .select("topic", "rank", F.col(column).alias(name), "records").orderBy("topic", "rank"))


def run_log_job(spark: Any, config: LogJobConfig) -> dict[str, str]:
    """Read the topics, write the tables; where each table went."""
    reader = (spark.read.format("hpbroker").option("bootstrap", config.bootstrap)
              .option("topic", ",".join(config.topics)).option("columns", "topic,timestamp,key,value"))
    if config.from_time is not None:
        reader = reader.option("startingTimestamp", config.from_time)
    if config.to_time is not None:
        reader = reader.option("endingTimestamp", config.to_time)
    parsed = parse_access_log(reader.load()).cache()
    try:
        tables = {"per_minute": per_minute(parsed),
                  "top_keys": top_by(parsed, "key_text", "key", config.top),
                  "top_paths": top_by(parsed, "path", "path", config.top)}
        written = {}
        for name, table in tables.items():
            written[name] = os.path.join(config.output, name)
            table.coalesce(1).write.mode("overwrite").parquet(written[name])
        return written
    finally:
        parsed.unpersist()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bootstrap", "-b", metavar="HOST:PORT",
                        default=os.environ.get("HPBROKER_BOOTSTRAP", "127.0.0.1:9092"),
                        help="the broker's front-end (default $HPBROKER_BOOTSTRAP, else 127.0.0.1:9092)")
    parser.add_argument("--topic", "-t", action="append", required=True, metavar="NAME",
                        help="an access-log topic (repeatable, or comma-separated)")
    parser.add_argument("--output", "-o", required=True, metavar="DIR",
                        help="where the tables go (DIR/per_minute, DIR/top_keys, DIR/top_paths; Parquet)")
    parser.add_argument("--from", dest="from_time", metavar="TIME",
                        help="records from TIME on (ms since the epoch or ISO 8601)")
    parser.add_argument("--to", dest="to_time", metavar="TIME", help="records before TIME")
    parser.add_argument("--top", type=int, default=10, metavar="N", help="keys and paths per topic (10)")
    parser.add_argument("--master", metavar="URL",
                        help="Spark master (default: spark-submit's, else local[*])")


def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    parser = argparse.ArgumentParser(prog=prog, description="Per-minute counts and top keys and paths of "
                                                            "access-log topics, written as Parquet.")
    add_arguments(parser)
    args = parser.parse_args(argv)
    from hpbroker.spark import describe_error, session

    try:
        topics = tuple(t.strip() for entry in args.topic for t in entry.split(",") if t.strip())
        config = LogJobConfig(args.bootstrap, topics, args.output, args.from_time, args.to_time, args.top)
        written = run_log_job(session(args.master, app_name="hpbroker-logs"), config)
    except Exception as e:  # the job's boundary: whatever stopped it is reported, exit status 2
        print(f"log job: {describe_error(e)}", file=sys.stderr)
        return 2
    print("; ".join(f"{name}: {path}" for name, path in written.items()))
    return 0

"""``hpbroker consume TOPIC``: print records of a topic's partitions, one per line.

Where to start: ``--from-beginning``, ``--offset N`` (an offset outside the log is an error that
names the log's bounds), ``--from-time T`` (ms since the epoch, or an ISO 8601 time, UTC unless it
says otherwise), else the end (only records produced from now on).
It stops after ``--max-records``, or once no record came for ``--timeout-ms``; otherwise it waits
for new records until interrupted.

Formats: ``text`` (default): ``<partition> <offset> <time> key=<key> <value>``, with bytes that are
not UTF-8 escaped; ``value``: the value's bytes alone, one per line; ``json``: one object per line
with every field (key and value as UTF-8 text, escaped where needed).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys

from hpbroker.cli.common import add_bootstrap, reports_errors
from hpbroker.timestamps import parse_time_ms


def register(sub: argparse._SubParsersAction) -> None:
    consume = sub.add_parser("consume", help="print records of a topic")
    consume.add_argument("topic")
    add_bootstrap(consume)
    consume.add_argument("--partition", "-p", type=int, action="append", metavar="N",
                         help="read this partition (repeatable; default: all)")
    start = consume.add_mutually_exclusive_group()
    start.add_argument("--from-beginning", action="store_true", help="start at the oldest record kept")
    start.add_argument("--offset", type=int, metavar="N", help="start at offset N of each partition")
    start.add_argument("--from-time", metavar="TIME",
                       help="start at the first record at or after TIME (ms since the epoch or ISO 8601)")
    consume.add_argument("--max-records", "-n", type=int, metavar="N", help="stop after N records")
    consume.add_argument("--timeout-ms", type=int, metavar="MS", help="stop once no record came for MS ms")
    consume.add_argument("--format", choices=("text", "value", "json"), default="text",
                         help="output format (default text)")
    consume.set_defaults(run=_run)


def _text(data: bytes | None) -> str:
    return "" if data is None else data.decode("utf-8", "backslashreplace")


def _time(timestamp_ms: int) -> str:
    return dt.datetime.fromtimestamp(timestamp_ms / 1000, dt.UTC).isoformat(timespec="milliseconds")


def _printer(fmt: str):
    out = sys.stdout
    if fmt == "value":
        raw = out.buffer

        def write_value(record) -> None:
            raw.write((record.value or b"") + b"\n")

        return write_value
    if fmt == "json":
        def write_json(record) -> None:
            out.write(json.dumps({
                "topic": record.topic, "partition": record.partition, "offset": record.offset,
                "timestamp": record.timestamp, "key": None if record.key is None else _text(record.key),
                "value": None if record.value is None else _text(record.value),
                "headers": {k: _text(v) for k, v in record.headers}, "producer": record.producer,
            }) + "\n")

        return write_json

    def write_text(record) -> None:
        key = "" if record.key is None else f" key={_text(record.key)}"
        value = _text(record.value)
        out.write(f"{record.partition} {record.offset} {_time(record.timestamp)}{key} {value}\n")

    return write_text


@reports_errors("consume")
def _run(args: argparse.Namespace) -> int:
    from hpbroker.client.consumer import Consumer, TopicPartition

    if args.max_records is not None and args.max_records < 0:
        raise ValueError(f"--max-records must be at least 0, got {args.max_records}")
    start_ms = parse_time_ms(args.from_time, "--from-time") if args.from_time is not None else None
    # An explicit --offset outside the log is an error naming the log's bounds, never a silent
    # jump; the other starts fall back to the oldest record kept (retention may move it meanwhile).
    if args.offset is not None:
        reset = "error"
    elif args.from_beginning or start_ms is not None:
        reset = "earliest"
    else:
        reset = "latest"
    with Consumer(args.bootstrap, auto_offset_reset=reset, consumer_timeout_ms=args.timeout_ms,
                  client_id="hpbroker-cli") as consumer:
        partitions = args.partition or sorted(consumer.partitions_for_topic(args.topic))
        assigned = [TopicPartition(args.topic, p) for p in partitions]
        consumer.assign(assigned)
        if args.from_beginning:
            consumer.seek_to_beginning(*assigned)
        elif args.offset is not None:
            for tp in assigned:
                consumer.seek(tp, args.offset)
        elif start_ms is not None:
            for tp, offset in consumer.offsets_for_times(dict.fromkeys(assigned, start_ms)).items():
                if offset is None:
                    consumer.seek_to_end(tp)
                else:
                    consumer.seek(tp, offset)
        else:
            consumer.seek_to_end(*assigned)
        write = _printer(args.format)
        count, limit = 0, args.max_records
        if limit != 0:
            for record in consumer:
                write(record)
                count += 1
                if count == limit:
                    break
        sys.stdout.flush()
    print(f"consumed {count} records", file=sys.stderr)
    return 0

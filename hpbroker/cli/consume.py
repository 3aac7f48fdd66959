r"""``hpbroker consume TOPIC``: print records of a topic's partitions, one per line.

Where to start: ``--from-beginning``, ``--offset N`` (an offset outside the log is an error that
names the log's bounds), ``--from-time T`` (ms since the epoch, or an ISO 8601 time, UTC unless it
says otherwise), else the end (only records produced from now on).
It stops after ``--max-records``, or once no record came for ``--timeout-ms``; otherwise it waits
for new records until interrupted.

Formats (``--format``):

- ``text`` (default): ``<partition> <offset> <time> key=<key> <value>``, one record per line
  whatever its bytes: in the key and the value a backslash is written ``\\``, a newline ``\n``,
  a carriage return ``\r``, a tab ``\t``, and every other character that is not printable, or
  byte that is not UTF-8, ``\xNN`` (``\uNNNN`` above U+00FF), as in a Python string literal;
- ``raw``: the same line with the key's and the value's bytes as they are (what ``text`` wrote
  before it escaped anything): a value holding a newline spans lines;
- ``value``: the value's bytes alone, as they are, one per line;
- ``json``: one object per line with every field (key and value as UTF-8 text, escaped where
  needed).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys

from hpbroker.cli.common import add_bootstrap, client_security, reports_errors
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
    consume.add_argument("--fetch-via", choices=("data_port", "frontend"), default="data_port",
                         help="fetch over the TCP data ports (sendfile, in the clear; default) or through "
                              "the front-end (encrypted when the broker runs security = curve)")
    consume.add_argument("--format", choices=("text", "raw", "value", "json"), default="text",
                         help="text (default: newlines and unprintable bytes escaped), raw (the same "
                              "lines, bytes as they are), value (the value's bytes alone) or json")
    consume.set_defaults(run=_run)


def _text(data: bytes | None) -> str:
    return "" if data is None else data.decode("utf-8", "backslashreplace")


_ESCAPES = {"\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def escaped(data: bytes | None) -> str:
    """``data`` as one line of printable text (module docstring, format ``text``)."""
    if data is None:
        return ""
    text = data.decode("utf-8", "surrogateescape")  # a byte that is not UTF-8 becomes U+DC80..U+DCFF
    if text.isprintable() and "\\" not in text:
        return text
    return "".join(ch if ch.isprintable() and ch != "\\" else _escape(ch) for ch in text)


def _escape(ch: str) -> str:
    if ch in _ESCAPES:
        return _ESCAPES[ch]
    code = ord(ch)
    if 0xDC80 <= code <= 0xDCFF:  # a byte that is not UTF-8
        return f"\\x{code - 0xDC00:02x}"
    if code <= 0xFF:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


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

    if fmt == "raw":
        raw_out = out.buffer

        def write_raw(record) -> None:
            key = b"" if record.key is None else b" key=" + record.key
            raw_out.write(f"{record.partition} {record.offset} {_time(record.timestamp)}".encode() + key
                          + b" " + (record.value or b"") + b"\n")

        return write_raw

    def write_text(record) -> None:
        key = "" if record.key is None else f" key={escaped(record.key)}"
        value = escaped(record.value)
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
                  client_id="hpbroker-cli", security=client_security(args),
                  fetch_via=args.fetch_via) as consumer:
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

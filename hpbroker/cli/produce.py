"""``hpbroker produce TOPIC``: every line of stdin (or ``--file``) becomes one record.

Lines are split at ``--key-separator`` into key and value when it is given (a line without the
separator gets no key).  The trailing newline is not part of the value.  Every record is
acknowledged before the command exits 0; a record that fails makes it exit 1 with the error.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from typing import BinaryIO

from hpbroker.cli.common import add_bootstrap, client_security, reports_errors


def register(sub: argparse._SubParsersAction) -> None:
    produce = sub.add_parser("produce", help="send lines of stdin or a file as records")
    produce.add_argument("topic")
    add_bootstrap(produce)
    produce.add_argument("--file", "-f", metavar="PATH", help="read this file instead of stdin")
    produce.add_argument("--key-separator", "-k", metavar="SEP",
                         help="split each line at the first SEP into key and value")
    produce.add_argument("--partition", type=int, help="send every record to this partition")
    produce.add_argument("--header", action="append", default=[], metavar="KEY=VALUE",
                         help="a header on every record (repeatable)")
    produce.add_argument("--acks", choices=("0", "1", "all", "-1"), default="1",
                         help="1: wait until the partition's leader has flushed each record (default); all: "
                              "until every in-sync replica has (a replicated topic); 0: do not wait")
    produce.add_argument("--compression", choices=("lz4", "none"), default="none",
                         help="codec of each batch (default none)")
    produce.add_argument("--linger-ms", type=float, default=5,
                         help="how long a batch waits to fill (default 5)")
    produce.add_argument("--name", help="the producer's name in every batch (default host-pid-n)")
    produce.add_argument("--no-idempotence", dest="idempotence", action="store_false",
                         help="send without a producer id: a retry may store records twice "
                              "(idempotence is on by default with --acks 1 or all)")
    produce.add_argument("--max-in-flight", type=int, default=5, metavar="N",
                         help="produce requests of one partition in flight at once, 1 to 5, with "
                              "idempotence (default 5)")
    produce.add_argument("--timeout-s", type=float, default=60,
                         help="how long to wait for the last acknowledgements, and again at the most to "
                              "close (default 60)")
    produce.set_defaults(run=_run)


def _lines(stream: BinaryIO) -> Iterator[bytes]:
    for line in stream:
        if line.endswith(b"\n"):
            line = line[:-2] if line.endswith(b"\r\n") else line[:-1]
        yield line


def _headers(pairs: list[str]) -> list[tuple[str, bytes]] | None:
    headers = []
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--header {pair!r}: expected KEY=VALUE")
        headers.append((key, value.encode()))
    return headers or None


@reports_errors("produce")
def _run(args: argparse.Namespace) -> int:
    from hpbroker.client.producer import Producer

    headers = _headers(args.header)
    separator = args.key_separator.encode() if args.key_separator else None
    compression = None if args.compression == "none" else args.compression
    count = 0
    stream: BinaryIO = open(args.file, "rb") if args.file else sys.stdin.buffer  # noqa: SIM115
    try:
        producer = Producer(args.bootstrap, acks=args.acks, linger_ms=args.linger_ms, compression=compression,
                            name=args.name, enable_idempotence=None if args.idempotence else False,
                            max_in_flight_requests_per_partition=args.max_in_flight,
                            security=client_security(args))
        try:
            send = producer.send
            for line in _lines(stream):
                key = None
                if separator is not None:
                    head, found, rest = line.partition(separator)
                    if found:
                        key, line = head, rest
                send(args.topic, line, key, headers, None, args.partition)
                count += 1
            producer.flush(args.timeout_s)
        finally:
            producer.close(args.timeout_s)  # bounded on every path, as --timeout-s says
    finally:
        if args.file:
            stream.close()
    print(f"produced {count} records to {args.topic}", file=sys.stderr)
    return 0

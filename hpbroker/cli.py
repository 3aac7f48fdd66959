"""The ``hpbroker`` command.

Subcommands:

- ``hpbroker version``                     print the version and whether CRC32C is hardware-accelerated
- ``hpbroker dump-log SEGMENT [--records]``  list the batches of a ``.log`` segment file, checking each
  batch's framing, CRC, records and offset continuity (like Kafka's DumpLogSegments); exit status 1 when the
  file holds bytes that are not valid batches.
- ``hpbroker serve [--config FILE] [--port N] ...``  run a broker (``hpbroker.workers.arbiter``) until
  SIGTERM or SIGINT; settings come from the flags, then ``HPBROKER_*`` variables, then the TOML file
  (``hpbroker.broker.config``).  Exit status: the arbiter's (0 after a graceful stop, 1 when it could not
  start or gave up), 2 for an invalid configuration.
"""

from __future__ import annotations

import argparse
import mmap
import os
import sys
from collections.abc import Sequence

from hpbroker import __version__, records

_SEGMENT_SUFFIX = ".log"


def _segment_base_offset(path: str) -> int:
    """The base offset encoded in a segment's file name, or -1 if the name does not encode one."""
    stem = os.path.basename(path)[: -len(_SEGMENT_SUFFIX)] if path.endswith(_SEGMENT_SUFFIX) else ""
    return int(stem) if stem.isdigit() else -1


def dump_log(path: str, *, show_records: bool, out=None) -> int:
    """Print every batch of a segment file; 0 when the whole file is valid, 1 otherwise."""
    out = out if out is not None else sys.stdout
    size = os.path.getsize(path)
    print(f"Dumping {path} ({size} bytes)", file=out)
    if size == 0:
        return 0
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        scan = records.scan_batches(data, expected_offset=_segment_base_offset(path), deep=True)
        view = memoryview(data)
        try:
            for i in range(scan.batch_count):
                position, batch_size = scan.positions[i], scan.sizes[i]
                header = records.read_header(view[position : position + batch_size])
                print(
                    f"baseOffset: {header.base_offset} lastOffset: {header.last_offset} "
                    f"count: {header.record_count} position: {position} size: {batch_size} "
                    f"firstTimestamp: {header.first_timestamp} maxTimestamp: {header.max_timestamp} "
                    f"codec: {header.compression} producer: {header.producer!r} "
                    f"baseSequence: {header.base_sequence} crc: 0x{header.crc:08x} valid: true",
                    file=out,
                )
                if show_records:
                    for record in records.decode_records(view[position : position + batch_size]):
                        print(
                            f"| offset: {record.offset} timestamp: {record.timestamp} "
                            f"key: {record.key!r} headers: {record.headers!r} value: {record.value!r}",
                            file=out,
                        )
        finally:
            view.release()
    if scan.error is not None:
        print(
            f"INVALID at position {scan.valid_bytes}: {scan.error} "
            f"({size - scan.valid_bytes} bytes from there to the end are not valid batches)",
            file=out,
        )
        return 1
    print(f"{scan.batch_count} batches, {scan.record_count} records, all valid", file=out)
    return 0


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hpbroker", description="hpbroker log broker")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("version", help="print the version")
    dump = sub.add_parser("dump-log", help="list and check the batches of a .log segment file")
    dump.add_argument("segment", help="path to a NNNNNNNNNNNNNNNNNNNN.log file")
    dump.add_argument("--records", action="store_true", help="also print every record")
    serve = sub.add_parser("serve", help="run a broker until SIGTERM or SIGINT")
    serve.add_argument("--config", metavar="FILE", help="TOML file with [broker] and [log] sections")
    serve.add_argument("--host", help="address to bind and advertise")
    serve.add_argument("--port", type=int, help="ZeroMQ front-end port")
    serve.add_argument("--fetch-port", type=int, help="first TCP data port (worker s: fetch port + s)")
    serve.add_argument("--workers", type=int, help="I/O worker processes")
    serve.add_argument("--data-dir", metavar="DIR", help="where topics and partitions are kept")
    serve.add_argument("--broker-id", type=int, help="this broker's id")
    serve.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"],
                       help="logging threshold (default INFO); the log goes to stderr")
    return parser


def serve(args: argparse.Namespace) -> int:
    """Load the configuration, run the arbiter, return its exit status."""
    import logging

    from hpbroker.broker.config import BrokerConfig
    from hpbroker.broker.memory import tune_allocator
    from hpbroker.errors import InvalidConfigError
    from hpbroker.workers.arbiter import Arbiter

    overrides = {"host": args.host, "port": args.port, "fetch_port": args.fetch_port, "workers": args.workers,
                 "data_dir": args.data_dir, "broker_id": args.broker_id}
    try:
        config = BrokerConfig.load(args.config, **overrides)
    except InvalidConfigError as e:
        print(f"hpbroker serve: invalid configuration: {e.message}", file=sys.stderr)
        return 2
    logging.basicConfig(level=args.log_level, stream=sys.stderr,
                        format="%(asctime)s %(process)d %(levelname)s %(message)s")
    tune_allocator()  # before the workers are forked: they inherit it
    last_port = config.fetch_port + config.workers - 1
    print(f"hpbroker {__version__}: broker {config.broker_id} on tcp://{config.host}:{config.port} "
          f"(ZeroMQ), data ports {config.fetch_port}..{last_port} (TCP), {config.workers} workers, "
          f"data in {os.path.abspath(config.data_dir)}", flush=True)
    return Arbiter(config).run()


def main(argv: Sequence[str] | None = None) -> int:
    args = _build_parser().parse_args(argv)
    if args.command == "version":
        accel = "hardware" if records.crc32c_hardware_accelerated() else "table"
        print(f"hpbroker {__version__} (CRC32C: {accel})")
        return 0
    if args.command == "dump-log":
        try:
            return dump_log(args.segment, show_records=args.records)
        except OSError as exc:
            print(f"hpbroker dump-log: cannot read {args.segment}: {exc.strerror}", file=sys.stderr)
            return 2
    if args.command == "serve":
        return serve(args)
    return 2  # pragma: no cover - argparse rejects unknown commands first


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

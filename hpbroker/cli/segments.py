"""``hpbroker dump-log SEGMENT [--records]``: list the batches of a ``.log`` segment file, checking
each batch's framing, CRC, records and offset continuity (like Kafka's DumpLogSegments); exit
status 1 when the file holds bytes that are not valid batches, 2 when it cannot be read."""

from __future__ import annotations

import argparse
import mmap
import os
import sys

from hpbroker import records

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


def register(sub: argparse._SubParsersAction) -> None:
    dump = sub.add_parser("dump-log", help="list and check the batches of a .log segment file")
    dump.add_argument("segment", help="path to a NNNNNNNNNNNNNNNNNNNN.log file")
    dump.add_argument("--records", action="store_true", help="also print every record")
    dump.set_defaults(run=_run)


def _run(args: argparse.Namespace) -> int:
    try:
        return dump_log(args.segment, show_records=args.records)
    except OSError as exc:
        print(f"hpbroker dump-log: cannot read {args.segment}: {exc.strerror}", file=sys.stderr)
        return 2

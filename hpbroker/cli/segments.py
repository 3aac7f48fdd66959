"""``hpbroker dump-log SEGMENT [--records]``: list the batches of a ``.log`` segment file, checking
each batch's framing, CRC, records and offset continuity (like Kafka's DumpLogSegments); a batch
that fails a check is listed with the reason (``valid: false (CRC mismatch: stored ...,
computed ...)``) and the listing goes on after it; bytes that cannot be framed as a batch are
listed as one ``DAMAGED`` run up to the next valid batch (found as recovery finds it, by its
header and CRC), and the listing goes on there.  Exit status 1 when the file holds anything
that is not a valid batch, 2 when it cannot be read.  ``hpbroker check`` verifies whole data
directories, indexes included."""

from __future__ import annotations

import argparse
import mmap
import os
import sys

from hpbroker import records
from hpbroker.errors import CorruptRecordError
from hpbroker.io.verify import walk_batches

_SEGMENT_SUFFIX = ".log"


def _segment_base_offset(path: str) -> int:
    """The base offset encoded in a segment's file name, or -1 if the name does not encode one."""
    stem = os.path.basename(path)[: -len(_SEGMENT_SUFFIX)] if path.endswith(_SEGMENT_SUFFIX) else ""
    return int(stem) if stem.isdigit() else -1


def dump_log(path: str, *, show_records: bool, out=None) -> int:
    """Print every batch of a segment file; 0 when the whole file is valid, 1 otherwise.  A batch
    that fails its CRC (or any other check) but can still be framed is printed ``valid: false``
    with the reason, and the listing goes on after it; bytes that cannot be framed are one
    ``DAMAGED`` line up to the next valid batch, or the end when none follows."""
    out = out if out is not None else sys.stdout
    size = os.path.getsize(path)
    print(f"Dumping {path} ({size} bytes)", file=out)
    if size == 0:
        return 0
    batches = invalid = record_count = 0
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        view = memoryview(data)
        try:
            for batch in walk_batches(data, _segment_base_offset(path)):
                if batch.size < 0:
                    print(f"INVALID at position {batch.position}: {batch.error} ({size - batch.position} "
                          f"bytes from there to the end are not valid batches)", file=out)
                    invalid += 1
                    break
                chunk = view[batch.position : batch.position + batch.size]
                try:
                    header = records.read_header(chunk)
                except CorruptRecordError:
                    header = None
                if header is None or header.size != batch.size:  # bytes that do not frame a batch
                    print(f"DAMAGED at position {batch.position}: {batch.error} ({batch.size} bytes that are "
                          f"not a batch)", file=out)
                    invalid += 1
                    chunk.release()
                    continue
                batches += 1
                invalid += batch.error is not None
                record_count += header.record_count
                verdict = "valid: true" if batch.error is None else f"valid: false ({batch.error})"
                print(
                    f"baseOffset: {header.base_offset} lastOffset: {header.last_offset} "
                    f"count: {header.record_count} position: {batch.position} size: {batch.size} "
                    f"firstTimestamp: {header.first_timestamp} maxTimestamp: {header.max_timestamp} "
                    f"codec: {header.compression} producer: {header.producer!r} "
                    f"producerId: {header.producer_id} producerEpoch: {header.producer_epoch} "
                    f"baseSequence: {header.base_sequence} crc: 0x{header.crc:08x} {verdict}",
                    file=out,
                )
                if show_records and batch.error is None:
                    for record in records.decode_records(chunk):
                        print(
                            f"| offset: {record.offset} timestamp: {record.timestamp} "
                            f"key: {record.key!r} headers: {record.headers!r} value: {record.value!r}",
                            file=out,
                        )
                chunk.release()
        finally:
            view.release()
    if invalid:
        print(f"{batches} batches, {record_count} records; NOT VALID: {invalid} of them, or the tail, fail",
              file=out)
        return 1
    print(f"{batches} batches, {record_count} records, all valid", file=out)
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

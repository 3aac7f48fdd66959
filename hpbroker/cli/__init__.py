"""The ``hpbroker`` command: one module per group of subcommands, each adding its parsers.

- ``hpbroker version``: the version, and whether CRC32C is hardware-accelerated
- ``hpbroker up``: the local stack, a ZooKeeper and a broker (``server``, ``hpbroker.stack``)
- ``hpbroker serve``: run a broker (``server``)
- ``hpbroker dump-log SEGMENT``: list and check a segment file (``segments``)
- ``hpbroker check DATA_DIR``: verify a stopped broker's segments and indexes (``check``)
- ``hpbroker topics create|list|describe|alter|delete``: administer topics (``topics``)
- ``hpbroker produce TOPIC``: lines of stdin or a file become records (``produce``)
- ``hpbroker consume TOPIC``: print records, from the start, an offset or a time (``consume``)
- ``hpbroker groups list|describe|reset-offsets``: consumer groups in ZooKeeper (``groups``)
- ``hpbroker audit``: stored records against the producers' monitoring events, on Spark (``audit``)

Exit status: 0 on success, 1 when the operation failed (the message says why), 2 for bad usage.
Client commands find the broker with ``--bootstrap host:port``, else ``$HPBROKER_BOOTSTRAP``, else
``127.0.0.1:9092``.  Imports are deferred to the command that needs them, so ``hpbroker serve``
never loads the client and the client commands never load the broker.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from hpbroker import __version__
from hpbroker.cli import audit, check, consume, groups, produce, segments, server, topics

__all__ = ["main"]


def _version(_args: argparse.Namespace) -> int:
    from hpbroker import records

    accel = "hardware" if records.crc32c_hardware_accelerated() else "table"
    print(f"hpbroker {__version__} (CRC32C: {accel})")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hpbroker", description="hpbroker log broker")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("version", help="print the version").set_defaults(run=_version)
    for module in (server, segments, check, topics, produce, consume, groups, audit):
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["up"]:  # the stack parses its own flags (hpbroker.stack)
        return server.up(argv[1:])
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # e.g. `hpbroker consume ... | head`
        sys.stderr.close()
        return 0

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
- ``hpbroker cluster``: the live brokers and the controller, from ZooKeeper (``cluster``)
- ``hpbroker partitions reassign``: move a replicated topic's replicas (``partitions``)
- ``hpbroker audit``: stored records against the producers' monitoring events, on Spark (``audit``)
- ``hpbroker keys generate|list|allow|revoke``: CurveZMQ key files and allowlists (``keys``)
- ``hpbroker acls add|list|remove``: who may do what, kept in ZooKeeper (``acls``)
- ``hpbroker zookeeper secure``: set the ZooKeeper ACLs of an existing tree (``zookeeper``)

Exit status: 0 on success, 1 when the operation failed (the message says why, naming the error:
``hpbroker consume: unknown topic or partition: ...``), 2 for bad usage (the message and the usage
of the subcommand that was given it, not the top-level one).
Client commands find the broker with ``--bootstrap host:port``, else ``$HPBROKER_BOOTSTRAP``, else
``127.0.0.1:9092``.  Imports are deferred to the command that needs them, so ``hpbroker serve``
never loads the client and the client commands never load the broker.

**A closed standard output** (``hpbroker dump-log SEGMENT | head``) ends the command quietly, as it
ends other Unix tools: killed by SIGPIPE (a shell reports status 141), without a traceback or a
message.  The commands that read only files (:data:`FILE_COMMANDS`) get SIGPIPE's default action
from the start, as a C program has it; the others keep Python's (ignored, so that a write to a
socket whose peer went away is an error, not a silent death) and turn a BrokenPipeError that
reaches :func:`main` into the same end, once standard output is seen to be a broken pipe.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Sequence

from hpbroker import __version__
from hpbroker.cli import (
    acls,
    audit,
    check,
    cluster,
    consume,
    groups,
    keys,
    partitions,
    produce,
    segments,
    server,
    topics,
    zookeeper,
)
from hpbroker.cli.common import stdout_broken

__all__ = ["FILE_COMMANDS", "build_parser", "main"]

#: Subcommands that touch no socket: killed by SIGPIPE on a closed standard output.
FILE_COMMANDS = frozenset({"version", "dump-log", "check", "keys"})


def _version(_args: argparse.Namespace) -> int:
    from hpbroker import records

    accel = "hardware" if records.crc32c_hardware_accelerated() else "table"
    print(f"hpbroker {__version__} (CRC32C: {accel})")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hpbroker", description="hpbroker log broker")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("version", help="print the version").set_defaults(run=_version)
    for module in (server, segments, check, topics, produce, consume, groups, cluster, partitions, audit,
                   keys, acls, zookeeper):
        module.register(sub)
    _remember_parsers(parser)
    return parser


def _remember_parsers(parser: argparse.ArgumentParser) -> None:
    """Give every (sub)parser itself as the default ``usage_parser``: the innermost one that
    parsed a command line wins, and :func:`main` reports unknown arguments with its usage."""
    parser.set_defaults(usage_parser=parser)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                _remember_parsers(child)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["up"]:  # the stack parses its own flags (hpbroker.stack)
        return server.up(argv[1:])
    args, unknown = build_parser().parse_known_args(argv)
    if unknown:  # argparse would show the top-level usage; the subcommand's says more
        args.usage_parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    if args.command in FILE_COMMANDS and hasattr(signal, "SIGPIPE"):
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    try:
        return args.run(args)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # e.g. `hpbroker consume ... | head`
        if not stdout_broken():
            raise  # a socket's, which the command should have reported: a bug worth a traceback
        _die_of_sigpipe()
        return 1  # pragma: no cover - where SIGPIPE does not exist


def _die_of_sigpipe() -> None:
    """End as a Unix tool ends on a closed pipe: killed by SIGPIPE, nothing more written."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)  # the exit's flush of what is buffered goes nowhere
        os.dup2(devnull, sys.__stdout__.fileno())
    except (AttributeError, OSError, ValueError):
        pass
    if hasattr(signal, "SIGPIPE"):
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGPIPE)

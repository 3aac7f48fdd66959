"""``hpbroker acls add|list|remove``: the cluster's ACLs, kept in ZooKeeper (docs/SECURITY.md).

::

    hpbroker acls add --principal alice --operation produce,describe --topic orders
    hpbroker acls add --principal '*' --operation consume --topic-prefix public.
    hpbroker acls add --principal ops --operation admin --cluster
    hpbroker acls list [--principal alice]
    hpbroker acls remove --principal alice --operation produce --topic orders

Each of ``--principal`` (repeatable; ``*``: every authenticated principal) and ``--operation``
(comma-separated) multiplies: ``add`` stores one entry per pair, on the one resource the
selector names (``--topic``, ``--topic-prefix``, ``--group``, ``--group-prefix`` or
``--cluster``; ``--topic '*'`` is every topic).  Brokers watch the node and apply a change
within moments, without a restart.  ``add`` of an entry already there and ``remove`` of one not
there change nothing; ``remove`` exits 1 when none of its entries was there (a typo would
otherwise leave the permission in place unnoticed).

ZooKeeper is ``--zookeeper`` (else ``$HPBROKER_ZOOKEEPER``, else the local stack's).  The ACL node
is readable and writable only with the cluster's credentials: ``--zookeeper-credentials-file``
(else ``$HPBROKER_ZOOKEEPER_CREDENTIALS_FILE``).  ``add`` and ``remove`` refuse to run without
them (a node written without credentials would be open to anyone who reaches ZooKeeper, and
brokers ignore such a node); ``list`` reads with whatever it is given.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from hpbroker.cli.common import (
    add_zookeeper,
    add_zookeeper_credentials,
    reports_errors,
    zookeeper_credentials,
)

__all__ = ["register"]


def register(sub: argparse._SubParsersAction) -> None:
    acls = sub.add_parser("acls", help="add, list or remove ACLs (in ZooKeeper)")
    commands = acls.add_subparsers(dest="acls_command", required=True)
    add = commands.add_parser("add", help="allow principals operations on a resource")
    remove = commands.add_parser("remove", help="remove ACLs that add stored")
    for parser, run in ((add, _add), (remove, _remove)):
        parser.add_argument("--principal", "-p", action="append", required=True, metavar="NAME",
                            help="a key name, or '*' for every authenticated principal (repeatable)")
        parser.add_argument("--operation", "-o", required=True, metavar="OP[,OP]",
                            help="produce, consume, create, delete, alter, describe (topics); consume, "
                                 "describe, delete (groups); cluster_action, admin (the cluster)")
        selector = parser.add_mutually_exclusive_group(required=True)
        selector.add_argument("--topic", metavar="NAME", help="one topic, or '*' for every topic")
        selector.add_argument("--topic-prefix", metavar="PREFIX", help="every topic whose name starts so")
        selector.add_argument("--group", metavar="NAME", help="one consumer group, or '*' for every group")
        selector.add_argument("--group-prefix", metavar="PREFIX", help="every group whose id starts so")
        selector.add_argument("--cluster", action="store_true", help="the cluster")
        _add_connection(parser)
        parser.set_defaults(run=run)
    listing = commands.add_parser("list", help="print the ACLs")
    listing.add_argument("--principal", "-p", metavar="NAME", help="only this principal's (and '*''s)")
    _add_connection(listing)
    listing.set_defaults(run=_list)


def _add_connection(parser: argparse.ArgumentParser) -> None:
    add_zookeeper(parser)
    add_zookeeper_credentials(parser)


def entries_of(args: argparse.Namespace) -> list[Any]:
    """The AclEntry list the command line names (InvalidConfigError naming what is wrong)."""
    from hpbroker.errors import InvalidConfigError
    from hpbroker.security.acls import CLUSTER_NAME, AclEntry

    if args.cluster:
        resource_type, pattern, name = "cluster", "literal", CLUSTER_NAME
    elif args.topic is not None:
        resource_type, pattern, name = "topic", "literal", args.topic
    elif args.topic_prefix is not None:
        resource_type, pattern, name = "topic", "prefixed", args.topic_prefix
    elif args.group is not None:
        resource_type, pattern, name = "group", "literal", args.group
    else:
        resource_type, pattern, name = "group", "prefixed", args.group_prefix
    operations = [o.strip() for o in args.operation.split(",")]
    if not all(operations):
        raise InvalidConfigError(f"--operation {args.operation!r} has an empty operation")
    return [AclEntry(p, o, resource_type, pattern, name) for p in dict.fromkeys(args.principal)
            for o in dict.fromkeys(operations)]


def _session(args: argparse.Namespace, *, writes: bool = False) -> Any:
    from hpbroker.coord.session import connect
    from hpbroker.errors import InvalidConfigError

    credentials = zookeeper_credentials(args)
    if writes and credentials is None:
        raise InvalidConfigError("changing the ACLs needs the cluster's ZooKeeper credentials, so that "
                                 "only the cluster may write them: give --zookeeper-credentials-file FILE "
                                 "(or set HPBROKER_ZOOKEEPER_CREDENTIALS_FILE)")
    return connect(args.zookeeper, session_timeout_s=10.0, name="acls", credentials=credentials)


@reports_errors("acls add")
def _add(args: argparse.Namespace) -> int:
    from hpbroker.coord.acl_store import add_acls

    entries = entries_of(args)
    with _session(args, writes=True) as session:
        added = add_acls(session, entries)
    print(f"added {added} ACL{'' if added == 1 else 's'}"
          + (f" ({len(entries) - added} already there)" if added < len(entries) else "") + ":")
    for entry in entries:
        print(f"  {entry.describe()}")
    return 0


@reports_errors("acls remove")
def _remove(args: argparse.Namespace) -> int:
    from hpbroker.coord.acl_store import remove_acls

    entries = entries_of(args)
    with _session(args, writes=True) as session:
        removed = remove_acls(session, entries)
    if removed == 0:
        print("hpbroker acls remove: no such ACL: " + "; ".join(e.describe() for e in entries),
              file=sys.stderr)
        return 1
    print(f"removed {removed} ACL{'' if removed == 1 else 's'}"
          + (f" ({len(entries) - removed} were not there)" if removed < len(entries) else ""))
    return 0


@reports_errors("acls list")
def _list(args: argparse.Namespace) -> int:
    from hpbroker.coord.acl_store import read_acls
    from hpbroker.security.acls import ANY_PRINCIPAL, check_principal

    if args.principal is not None:
        check_principal(args.principal)
    with _session(args) as session:
        entries = read_acls(session)
    if args.principal is not None:
        entries = [e for e in entries if e.principal in (args.principal, ANY_PRINCIPAL)]
    if not entries:
        print("no ACLs" + (f" for {args.principal!r}" if args.principal else ""))
        return 0
    rows = [(e.principal, e.operation.value, e.resource_type.value, e.pattern_type.value, e.name)
            for e in sorted(entries, key=lambda e: (e.principal, e.resource_type, e.name, e.operation))]
    header = ("principal", "operation", "resource", "pattern", "name")
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(4)]
    for row in [header, *rows]:
        cells = [cell.ljust(width) for cell, width in zip(row[:4], widths, strict=True)]
        print("  ".join([*cells, row[4]]))
    return 0

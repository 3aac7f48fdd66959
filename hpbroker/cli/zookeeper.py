"""``hpbroker zookeeper secure``: set the ACLs of an existing tree, for a cluster turning
ZooKeeper ACLs on, with a fresh token key (``hpbroker.coord.zk_migration``; docs/SECURITY.md,
"ZooKeeper").  Its output ends with ``note:`` lines for the operator (restart the brokers for
the fresh key; review the ACLs when their node was open)."""

from __future__ import annotations

import argparse

from hpbroker.cli.common import (
    add_zookeeper,
    add_zookeeper_credentials,
    reports_errors,
    zookeeper_credentials,
)


def register(sub: argparse._SubParsersAction) -> None:
    zookeeper = sub.add_parser("zookeeper", help="the ACLs of hpbroker's ZooKeeper tree")
    actions = zookeeper.add_subparsers(dest="action", required=True)
    secure = actions.add_parser(
        "secure", help="give every existing node the cluster's, a group's or the private ACL",
        description="Replace the token key by a fresh one (restart the brokers one at a time "
                    "afterwards: outstanding fetch tokens are refused, and every group's ZooKeeper "
                    "credentials change), then walk the cluster's tree and set each node's ACL as "
                    "brokers with zookeeper_credentials_file create them: the cluster ACL (all rights "
                    "to the cluster's user, read to the world), each group's ACL under "
                    "consumers/<group>, the private ACL on the ACLs' node. Needs the cluster's "
                    "credentials.")
    secure.add_argument("--unsecure", action="store_true",
                        help="set ZooKeeper's open ACL everywhere instead (turning ACLs off again) and "
                             "delete the token key")
    secure.add_argument("--dry-run", action="store_true", help="only list the nodes that would change")
    add_zookeeper(secure)
    add_zookeeper_credentials(secure)
    zookeeper.set_defaults(run=_secure)


@reports_errors("zookeeper secure")
def _secure(args: argparse.Namespace) -> int:
    from hpbroker.coord.paths import ZkPaths
    from hpbroker.coord.session import connect
    from hpbroker.coord.zk_migration import secure_tree
    from hpbroker.errors import InvalidConfigError

    credentials = zookeeper_credentials(args)
    if credentials is None:
        raise InvalidConfigError("give the cluster's credentials: --zookeeper-credentials-file FILE "
                                 "(or HPBROKER_ZOOKEEPER_CREDENTIALS_FILE)")
    session = connect(args.zookeeper, session_timeout_s=10.0, name="zookeeper-secure",
                      credentials=credentials)
    try:
        report = secure_tree(session, ZkPaths(), unsecure=args.unsecure, dry_run=args.dry_run,
                             progress=lambda line: print(line, flush=True))
    finally:
        session.close()
    verb = "would change" if args.dry_run else "changed"
    print(f"{report.seen} nodes, {len(report.changed)} {verb}, {len(report.refused)} refused")
    for path, why in sorted(report.refused.items()):
        print(f"refused: {path}: {why}")
    for note in report.notes:
        print(f"note: {note}")
    return 1 if report.refused else 0

"""``hpbroker partitions reassign``: move a replicated topic's replicas to other brokers, with
progress, through ZooKeeper (``hpbroker.coord.reassignment``)::

    $ hpbroker partitions reassign orders --replicas '0=1,2,3;1=2,3,1' -z 127.0.0.1:2181
    orders: replicas 0=1,2,3,0, 1=2,3,1,0
    orders: waiting for the new replicas to join the ISR: partition 0: [3] not in the ISR [0, 1, 2]
    orders: replicas 0=1,2,3, 1=2,3,1
    orders: done; replicas 0=1,2,3, 1=2,3,1

Each partition's target lists its replicas, the preferred leader first.  The new replicas join
first; the old ones leave only once every new one is in the ISR, so nothing acknowledged is lost.
Interrupted (a timeout, ``^C``), it is finished by running it again with the same target.  Exit
status 0 when done, 1 otherwise (the reason on stderr).

ZooKeeper is ``--zookeeper host:port[,...][/chroot]``, else ``$HPBROKER_ZOOKEEPER``, else
``127.0.0.1:2181``, as for ``hpbroker groups``.
"""

from __future__ import annotations

import argparse

from hpbroker.cli.common import (
    add_zookeeper,
    add_zookeeper_credentials,
    reports_errors,
    zookeeper_credentials,
)


def register(sub: argparse._SubParsersAction) -> None:
    partitions = sub.add_parser("partitions", help="move a replicated topic's replicas between brokers")
    actions = partitions.add_subparsers(dest="action", required=True)
    reassign = actions.add_parser("reassign", help="move partitions' replicas to other brokers")
    reassign.add_argument("topic")
    reassign.add_argument("--replicas", required=True, metavar="P=B,B,...[;P=B,...]",
                          help="each partition's target replicas, the preferred leader first")
    reassign.add_argument("--timeout", type=float, default=600.0, metavar="SECONDS",
                          help="give up (exit 1) after this long; run it again to go on (default 600)")
    add_zookeeper(reassign)
    add_zookeeper_credentials(reassign)
    reassign.set_defaults(run=_reassign)


@reports_errors("partitions reassign")
def _reassign(args: argparse.Namespace) -> int:
    from hpbroker.coord.paths import ZkPaths
    from hpbroker.coord.reassignment import Reassignment, parse_targets
    from hpbroker.coord.session import connect

    targets = parse_targets(args.replicas)
    session = connect(args.zookeeper, session_timeout_s=10.0, name="reassign",
                      credentials=zookeeper_credentials(args))
    try:
        Reassignment(session, ZkPaths(), args.topic, targets, progress=lambda line: print(line, flush=True)) \
            .run(args.timeout)
    finally:
        session.close()
    return 0

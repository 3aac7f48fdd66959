"""``hpbroker cluster``: the live brokers and the active controller, read from ZooKeeper.

What ZooKeeper holds (docs/COORDINATION.md), read once, nothing written::

    controller: broker 1 (controller epoch 7)
    3 live brokers
     broker_id  host             port  data ports
             0  10.0.0.11        9092  9093,9094
           * 1  10.0.0.12        9092  9093,9094
             2  10.0.0.13        9092  9093,9094

``*`` marks the controller.  The brokers are the ephemeral registrations under ``brokers/ids``
(``hpbroker.coord.registry``); the controller is the ephemeral ``controller`` znode (its
``broker_id``) and the epoch the persistent ``controller_epoch`` znode (its ``epoch``: how many
controllers were elected).  ``controller: none`` while no broker holds the node (an election in
progress, or a cluster of brokers too old to elect one); an epoch that was never written is
shown as ``-``.

ZooKeeper is ``--zookeeper host:port[,...][/chroot]``, else ``$HPBROKER_ZOOKEEPER``, else
``127.0.0.1:2181`` (the local stack's), as for ``hpbroker groups``.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from hpbroker.cli.common import (
    add_zookeeper,
    add_zookeeper_credentials,
    reports_errors,
    zookeeper_credentials,
)


def register(sub: argparse._SubParsersAction) -> None:
    cluster = sub.add_parser("cluster", help="the live brokers and the controller, from ZooKeeper")
    add_zookeeper(cluster)
    add_zookeeper_credentials(cluster)
    cluster.set_defaults(run=_run)


@reports_errors("cluster")
def _run(args: argparse.Namespace) -> int:
    from hpbroker.coord.paths import ZkPaths
    from hpbroker.coord.registry import BrokerRegistry
    from hpbroker.coord.session import connect

    session = connect(args.zookeeper, session_timeout_s=10.0, name="cluster",
                      credentials=zookeeper_credentials(args))
    try:
        paths = ZkPaths()
        brokers = BrokerRegistry(session, paths).brokers()
        controller, epoch = read_controller(session.client, paths)
    finally:
        session.close()
    epoch_text = "-" if epoch is None else str(epoch)
    print("controller: none" if controller is None
          else f"controller: broker {controller} (controller epoch {epoch_text})")
    print(f"{len(brokers)} live broker{'' if len(brokers) == 1 else 's'}")
    print(f"{'broker_id':>11}  {'host':<15}  {'port':>5}  data ports")
    for broker_id, broker in sorted(brokers.items()):
        mark = "* " if broker_id == controller else ""
        ports = ",".join(str(port) for port in broker.data_ports) or "-"
        print(f"{mark + str(broker_id):>11}  {broker.host:<15}  {broker.port:>5}  {ports}")
    return 0


def read_controller(client: Any, paths: Any) -> tuple[int | None, int | None]:
    """``(broker id of the active controller, controller epoch)`` from the ``controller`` and
    ``controller_epoch`` znodes of ``paths`` (``hpbroker.coord.paths.ZkPaths``), read through the
    kazoo ``client``; None for a node that is absent or does not hold the field."""
    return (_field(client, paths.controller, "broker_id"),
            _field(client, paths.controller_epoch, "epoch"))


def _field(client: Any, path: str, name: str) -> int | None:
    """The integer ``name`` of the JSON object at ``path``; None if the node or field is not there
    or not an integer."""
    from kazoo.exceptions import NoNodeError

    try:
        data, _stat = client.get(path)
    except NoNodeError:
        return None
    try:
        value = json.loads(data).get(name)
    except (ValueError, UnicodeDecodeError, AttributeError):
        return None
    return value if isinstance(value, int) and not isinstance(value, bool) else None

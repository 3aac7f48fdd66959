"""``hpbroker groups list|describe|reset-offsets``: consumer groups, from ZooKeeper's registries
(``hpbroker.coord.groups``) and the broker's offsets.

- ``list``: every group with a node in ZooKeeper.
- ``describe GROUP``: its live members (id, host, pid, topics) and, per partition of the topics
  it subscribes to or has committed offsets for, the owner, the committed offset, the log end
  offset (the high watermark, from the broker) and the lag between them.
- ``reset-offsets GROUP --topic T --to-earliest|--to-latest|--to-offset N|--to-time T``: the new
  committed offsets of a *stopped* group (refused while it has live members), shown as a plan;
  written only with ``--execute``.

ZooKeeper is ``--zookeeper host:port[,...][/chroot]``, else ``$HPBROKER_ZOOKEEPER``, else
``127.0.0.1:2181`` (the local stack's).
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from hpbroker.cli.common import (
    add_bootstrap,
    add_zookeeper,
    add_zookeeper_credentials,
    client_security,
    reports_errors,
    zookeeper_credentials,
)

if TYPE_CHECKING:
    from hpbroker.security.client import ClientSecurity


def register(sub: argparse._SubParsersAction) -> None:
    groups = sub.add_parser("groups", help="list, describe or reset the offsets of consumer groups")
    actions = groups.add_subparsers(dest="action", required=True)
    actions.add_parser("list", help="every consumer group")
    describe = actions.add_parser("describe", help="members, owners, committed offsets and lag")
    describe.add_argument("group")
    reset = actions.add_parser("reset-offsets", help="set a stopped group's committed offsets")
    reset.add_argument("group")
    reset.add_argument("--topic", required=True)
    reset.add_argument("--partition", type=int, action="append", metavar="N",
                       help="only this partition (repeatable; default: all)")
    target = reset.add_mutually_exclusive_group(required=True)
    target.add_argument("--to-earliest", action="store_true", help="the oldest record kept")
    target.add_argument("--to-latest", action="store_true", help="the log end: skip everything so far")
    target.add_argument("--to-offset", type=int, metavar="N", help="this offset in every partition")
    target.add_argument("--to-time", metavar="TIME",
                        help="the first record at or after TIME (ms since the epoch or ISO 8601)")
    reset.add_argument("--execute", action="store_true", help="write the offsets (default: only show them)")
    for action in actions.choices.values():
        add_zookeeper(action)
        add_zookeeper_credentials(action)
        add_bootstrap(action)
    groups.set_defaults(run=_run)


@reports_errors("groups")
def _run(args: argparse.Namespace) -> int:
    from hpbroker.coord.groups import GroupRegistry, list_groups
    from hpbroker.coord.session import connect

    session = connect(args.zookeeper, session_timeout_s=10.0, name="groups",
                      credentials=zookeeper_credentials(args))
    try:
        if args.action == "list":
            for group in list_groups(session):
                print(group)
            return 0
        registry = GroupRegistry(session, args.group)
        if args.action == "describe":
            return _describe(registry, args.bootstrap, client_security(args))
        if args.execute:  # the nodes it creates get the group's ACL, when the cluster has ACLs
            from hpbroker.coord.paths import ZkPaths
            from hpbroker.coord.zk_security import tool_group_acl

            registry.acl = tool_group_acl(session, ZkPaths(), args.group)
        return _reset(registry, args)
    finally:
        session.close()


def _log_ends(bootstrap: str, partitions: list[tuple[str, int]],
              security: ClientSecurity | None = None) -> dict[tuple[str, int], int | None]:
    """The high watermark of each partition, None where the broker could not say."""
    from hpbroker.client.consumer import Consumer, TopicPartition
    from hpbroker.errors import HPBrokerError

    ends: dict[tuple[str, int], int | None] = dict.fromkeys(partitions)
    if not partitions:
        return ends
    with Consumer(bootstrap, client_id="hpbroker-cli", security=security) as consumer:
        for (topic, partition) in partitions:
            try:
                tp = TopicPartition(topic, partition)
                ends[(topic, partition)] = consumer.end_offsets([tp])[tp]
            except HPBrokerError:
                pass
    return ends


def _describe(registry, bootstrap: str, security: ClientSecurity | None = None) -> int:
    members = registry.members()
    committed = registry.committed_offsets()
    topics = sorted({t for m in members.values() for t in m.topics} | {t for t, _ in committed})
    counts = registry.partition_counts(topics)
    partitions = sorted({(t, p) for t in topics for p in range(counts.get(t) or 0)} | set(committed))
    owners = registry.owners(partitions)
    ends = _log_ends(bootstrap, partitions, security)
    print(f"group {registry.group}: {len(members)} live members")
    for consumer_id, member in sorted(members.items()):
        print(f"  {consumer_id}  host={member.host} pid={member.pid} topics={','.join(member.topics)}")
    print(f"{'topic':<24} {'partition':>9}  {'owner':<32} {'committed':>12} {'log end':>12} {'lag':>10}")
    for tp in partitions:
        owner = owners.get(tp)
        offset = committed[tp].offset if tp in committed else None
        end = ends.get(tp)
        lag = end - offset if end is not None and offset is not None else None
        print(f"{tp[0]:<24} {tp[1]:>9}  {owner.consumer_id if owner else '-':<32} "
              f"{'-' if offset is None else offset:>12} {'-' if end is None else end:>12} "
              f"{'-' if lag is None else lag:>10}")
    return 0


def _reset(registry, args: argparse.Namespace) -> int:
    from hpbroker.client.consumer import Consumer, TopicPartition
    from hpbroker.timestamps import parse_time_ms

    with Consumer(args.bootstrap, client_id="hpbroker-cli", security=client_security(args)) as consumer:
        partitions = args.partition or sorted(consumer.partitions_for_topic(args.topic))
        tps = [TopicPartition(args.topic, p) for p in partitions]
        if args.to_earliest:
            plan = consumer.beginning_offsets(tps)
        elif args.to_latest:
            plan = consumer.end_offsets(tps)
        elif args.to_offset is not None:
            if args.to_offset < 0:
                raise ValueError(f"--to-offset must be at least 0, got {args.to_offset}")
            plan = dict.fromkeys(tps, args.to_offset)
        else:
            at = consumer.offsets_for_times(dict.fromkeys(tps, parse_time_ms(args.to_time, "--to-time")))
            ends = consumer.end_offsets([tp for tp, offset in at.items() if offset is None])
            plan = {tp: ends[tp] if offset is None else offset for tp, offset in at.items()}
    current = registry.committed_offsets([(tp.topic, tp.partition) for tp in tps])
    print(f"{'topic':<24} {'partition':>9} {'committed':>12} {'new':>12}")
    for tp in tps:
        old = current.get((tp.topic, tp.partition))
        print(f"{tp.topic:<24} {tp.partition:>9} {'-' if old is None else old.offset:>12} {plan[tp]:>12}")
    if not args.execute:
        print("(a plan only: add --execute to write it)")
        return 0
    registry.write_offsets({(tp.topic, tp.partition): offset for tp, offset in plan.items()})
    print(f"wrote {len(plan)} committed offsets of group {registry.group}")
    return 0

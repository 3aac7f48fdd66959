"""``hpbroker topics create|list|describe|alter|delete``: topic administration over the protocol
(``hpbroker.client.Admin``).

``create TOPIC --partitions N [--replication-factor R] [--config KEY=VALUE ...]``: without
``--replication-factor`` the broker's ``default_replication_factor`` applies.

``describe [TOPIC]`` (every topic when none is named) prints, as ``kafka-topics --describe``
does, a line per topic and then one per partition (indented by a tab), tab-separated
``Name: value`` pairs (shown here with spaces)::

    Topic: orders  PartitionCount: 2  ReplicationFactor: 3  Configs: retention_ms=86400000
        Topic: orders  Partition: 0  Leader: 1  Replicas: 1,2,0  Isr: 1,2,0  LeaderEpoch: 3  ...

then the data port, log start offset, high watermark and status (``serving``, or the error) of
each partition.  ``Leader: none`` is a partition without a live leader.

``alter TOPIC --retention-ms N --flush-ms N ... [--reset SETTING]``: one flag per log setting
(docs/CONFIGURATION.md, ``[log]``); ``--reset`` removes the topic's own value so the broker's
default applies again.  The settings are listed here rather than read from ``hpbroker.io``, which
the client commands never load; a test keeps the two lists equal."""

from __future__ import annotations

import argparse

from hpbroker.cli.common import add_bootstrap, client_security, error_name, reports_errors

# The per-topic settings (LogConfig's fields) and their value types.
TOPIC_SETTINGS: dict[str, type] = {
    "segment_bytes": int,
    "segment_ms": int,
    "retention_ms": int,
    "retention_bytes": int,
    "index_interval_bytes": int,
    "max_message_bytes": int,
    "flush_messages": int,
    "flush_ms": int,
    "flush_fsync": bool,
    "file_delete_delay_ms": int,
    "message_timestamp_after_max_ms": int,
    "producer_id_expiration_ms": int,
    "min_insync_replicas": int,
    "unclean_leader_election": bool,
}


def _bool(text: str) -> bool:
    if text.lower() not in ("true", "false"):
        raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")
    return text.lower() == "true"


def register(sub: argparse._SubParsersAction) -> None:
    topics = sub.add_parser("topics", help="create, list, describe, alter or delete topics")
    actions = topics.add_subparsers(dest="action", required=True)
    create = actions.add_parser("create", help="create a topic")
    create.add_argument("name")
    create.add_argument("--partitions", "-p", type=int, required=True, help="number of partitions")
    create.add_argument("--replication-factor", "-r", type=int, metavar="R",
                        help="brokers keeping a replica of each partition (default: the broker's "
                             "default_replication_factor)")
    create.add_argument("--config", "-c", action="append", default=[], metavar="KEY=VALUE",
                        help="a log setting of this topic (repeatable), e.g. retention_ms=86400000")
    actions.add_parser("list", help="list the topics")
    describe = actions.add_parser("describe", help="partitions (leader, replicas, ISR, offsets) and settings "
                                                   "of a topic, or of every topic")
    describe.add_argument("name", nargs="?", help="the topic (default: every topic)")
    alter = actions.add_parser("alter", help="change a topic's settings (applied to its logs at once)")
    alter.add_argument("name")
    for setting, kind in TOPIC_SETTINGS.items():
        alter.add_argument("--" + setting.replace("_", "-"), dest=setting,
                           type=_bool if kind is bool else int, metavar="true|false" if kind is bool else "N",
                           help=f"the topic's {setting}")
    alter.add_argument("--reset", action="append", default=[], choices=sorted(TOPIC_SETTINGS),
                       metavar="SETTING", help="remove the topic's own value of SETTING, so the broker's "
                                               "default applies (repeatable)")
    delete = actions.add_parser("delete", help="delete a topic and its records")
    delete.add_argument("name")
    for action in actions.choices.values():
        add_bootstrap(action)
    topics.set_defaults(run=_run)


def _parse_configs(pairs: list[str]) -> dict[str, str]:
    configs = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--config {pair!r}: expected KEY=VALUE")
        configs[key.strip()] = value.strip()
    return configs


@reports_errors("topics")
def _run(args: argparse.Namespace) -> int:
    from hpbroker.client.admin import Admin

    with Admin(args.bootstrap, client_id="hpbroker-cli", security=client_security(args)) as admin:
        if args.action == "create":
            admin.create_topic(args.name, args.partitions, _parse_configs(args.config),
                               replication_factor=args.replication_factor)
            factor = args.replication_factor
            replicas = "" if factor is None else f", replication factor {factor}"
            print(f"created topic {args.name} with {args.partitions} partitions{replicas}")
        elif args.action == "list":
            for name in admin.list_topics():
                print(name)
        elif args.action == "describe":
            for description in ([admin.describe_topic(args.name)] if args.name is not None
                                else admin.describe_topics()):
                _describe(description)
        elif args.action == "alter":
            changes = {key: getattr(args, key) for key in TOPIC_SETTINGS if getattr(args, key) is not None}
            overlap = sorted(set(changes) & set(args.reset))
            if overlap or not (changes or args.reset):
                raise ValueError(f"--{overlap[0].replace('_', '-')} and --reset {overlap[0]} contradict each "
                                 f"other" if overlap else "nothing to change: give a setting or --reset")
            admin.alter_topic(args.name, {**changes, **dict.fromkeys(args.reset)})
            print(f"altered topic {args.name}: " + ", ".join(
                [f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in changes.items()]
                + [f"{k}=(broker default)" for k in args.reset]))
            _describe(admin.describe_topic(args.name))
        elif args.action == "delete":
            admin.delete_topic(args.name)
            print(f"deleted topic {args.name}")
    return 0


def _describe(description) -> None:
    """The topic's line, then one line per partition (module docstring)."""
    from hpbroker.errors import error_for_code

    settings = ",".join(f"{k}={v}" for k, v in sorted(description.configs.items()))
    print(f"Topic: {description.name}\tPartitionCount: {len(description.partitions)}\t"
          f"ReplicationFactor: {description.replication_factor}\tConfigs: {settings}")
    for p in description.partitions:
        status = "serving" if p.error_code == 0 else \
            f"{error_name(error_for_code(p.error_code))} (error {p.error_code})"
        leader = p.leader if p.leader >= 0 else "none"
        print(f"\tTopic: {description.name}\tPartition: {p.partition}\tLeader: {leader}\t"
              f"Replicas: {_ids(p.replicas)}\tIsr: {_ids(p.isr)}\tLeaderEpoch: {p.leader_epoch}\t"
              f"DataPort: {p.host}:{p.fetch_port}\tLogStartOffset: {p.log_start_offset}\t"
              f"HighWatermark: {p.high_watermark}\tStatus: {status}")


def _ids(broker_ids) -> str:
    """Broker ids as kafka-topics writes them: ``1,2,0``; ``none`` for none."""
    return ",".join(str(i) for i in broker_ids) or "none"

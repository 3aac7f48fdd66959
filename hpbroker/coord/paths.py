"""Every znode path hpbroker uses, built here and nowhere else, and the ZooKeeper connect string.

The tree, under a root that defaults to ``/hpbroker`` (``docs/COORDINATION.md`` gives each node's
JSON, who creates it and what happens on session expiry)::

    /hpbroker
      controller                                        ephemeral: the active controller
      controller_epoch                                  persistent: how many controllers were elected
      brokers/
        ids/<broker_id>                                 ephemeral: one live broker
        topics/<topic>                                  persistent: a topic's partitions, replicas, settings
          partitions/<partition>/state                  persistent: leader, leader epoch, ISR
      consumers/<group>/
        ids/<consumer_id>                               ephemeral: one live consumer of the group
        owners/<topic>/<partition>                      ephemeral: the consumer that owns a partition
        offsets/<topic>/<partition>                     persistent: the group's committed offset
      producer-id-block                                 persistent: the newest block of producer ids taken
      acls                                              persistent, private: the cluster's ACLs
      security/
        token_key                                       persistent, private: the cluster's token key

Two prefixes may stand in front of it.  The connect string's *chroot*
(``host:2181,host:2182/prod``) is ZooKeeper's own: the client sees ``/`` where the server has
``/prod``, and it is applied by the client library, not here.  The *root* (:attr:`ZkPaths.root`)
lets several hpbroker clusters share one chroot; it may be ``/`` to put ``brokers`` and
``consumers`` at the top.

Names are checked before any path is built, so a bad one fails with the hpbroker error a caller
expects instead of a ZooKeeper error (or, worse, a node somewhere else in the tree): topics by the
topic store's rule (:class:`~hpbroker.errors.InvalidTopicError`); group ids, consumer ids,
broker ids and the root as configuration (:class:`~hpbroker.errors.InvalidConfigError`);
partition numbers as :class:`~hpbroker.errors.InvalidPartitionsError`.

This module imports no ZooKeeper client, so configuration can validate a connect string without
loading kazoo.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from hpbroker.errors import InvalidConfigError, InvalidPartitionsError, InvalidTopicError

__all__ = [
    "DEFAULT_PORT",
    "DEFAULT_ROOT",
    "MAX_NAME_LENGTH",
    "ConnectString",
    "ZkPaths",
    "check_broker_id",
    "check_consumer_id",
    "check_group",
    "check_partition",
    "check_topic",
    "parse_connect_string",
]

DEFAULT_ROOT = "/hpbroker"  # where the tree hangs unless configured otherwise
DEFAULT_PORT = 2181  # ZooKeeper's client port when a connect string names none
MAX_NAME_LENGTH = 249  # characters of a topic, group or consumer id (Kafka's limit for topics)
_MAX_ID = 2**31 - 1  # the largest broker id or partition number
_NAME = re.compile(r"[A-Za-z0-9._-]+")  # one path component
_HOST = re.compile(r"[A-Za-z0-9._-]+|\[[0-9A-Fa-f:.]+\]")  # a host name, IPv4, or [IPv6]
_RESERVED_TOP = "zookeeper"  # ZooKeeper's own subtree: never ours


def _check_name(kind: str, name: object, error: type[Exception]) -> str:
    if not isinstance(name, str) or not name:
        raise error(f"a {kind} must be a non-empty string, got {name!r}")
    if len(name) > MAX_NAME_LENGTH:
        raise error(f"{kind} of {len(name)} characters is longer than {MAX_NAME_LENGTH}: {name[:40]!r}...")
    if not _NAME.fullmatch(name):
        raise error(f"{kind} {name!r} may only hold the characters [A-Za-z0-9._-]")
    if name in (".", ".."):
        raise error(f"{kind} {name!r} is not allowed")
    return name


def _check_number(kind: str, value: object, error: type[Exception]) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= _MAX_ID:
        raise error(f"{kind} must be an integer in [0, {_MAX_ID}], got {value!r}")
    return value


def check_topic(name: object) -> str:
    """``name`` if it is a valid topic name: 1 to 249 characters of ``[A-Za-z0-9._-]``, not ``.``
    or ``..`` (the rule of ``hpbroker.broker.topics``, which the broker applies first)."""
    return _check_name("topic name", name, InvalidTopicError)


def check_group(group: object) -> str:
    """``group`` if it is a valid consumer group id (the topic rule)."""
    return _check_name("consumer group id", group, InvalidConfigError)


def check_consumer_id(consumer_id: object) -> str:
    """``consumer_id`` if it is a valid consumer id (the topic rule)."""
    return _check_name("consumer id", consumer_id, InvalidConfigError)


def check_broker_id(broker_id: object) -> int:
    return _check_number("broker id", broker_id, InvalidConfigError)


def check_partition(partition: object) -> int:
    return _check_number("partition", partition, InvalidPartitionsError)


def _check_root(root: object, what: str) -> str:
    """An absolute path of valid names without a trailing ``/``, or ``/`` itself."""
    if not isinstance(root, str) or not root.startswith("/"):
        raise InvalidConfigError(f"{what} must be an absolute path starting with '/', got {root!r}")
    if root == "/":
        return root
    parts = root[1:].split("/")
    for part in parts:
        if not part:
            raise InvalidConfigError(f"{what} {root!r} has an empty component (a doubled or trailing '/')")
        _check_name(f"component of {what} {root!r}", part, InvalidConfigError)
    if parts[0] == _RESERVED_TOP:
        raise InvalidConfigError(f"{what} {root!r} is inside /zookeeper, which ZooKeeper reserves")
    return root


@dataclass(frozen=True, slots=True)
class ZkPaths:
    """The znode paths of one hpbroker cluster under ``root`` (module docstring for the tree).

    Methods build a path from checked names; properties are the fixed parents.  Children read
    back from ZooKeeper are turned into ids by :meth:`broker_id_of` and :meth:`partition_of`."""

    root: str = DEFAULT_ROOT

    def __post_init__(self) -> None:
        _check_root(self.root, "root")

    def _join(self, *parts: str) -> str:
        return ("" if self.root == "/" else self.root) + "/" + "/".join(parts)

    # --- brokers --------------------------------------------------------------------------------

    @property
    def broker_ids(self) -> str:
        """Parent of the live brokers' ephemeral registrations."""
        return self._join("brokers", "ids")

    def broker(self, broker_id: int) -> str:
        """A live broker's registration (ephemeral)."""
        return self._join("brokers", "ids", str(check_broker_id(broker_id)))

    @property
    def topics(self) -> str:
        """Parent of the topics' metadata nodes."""
        return self._join("brokers", "topics")

    def topic(self, topic: str) -> str:
        """A topic's metadata: partitions and settings (persistent)."""
        return self._join("brokers", "topics", check_topic(topic))

    def topic_partitions(self, topic: str) -> str:
        """Parent of a replicated topic's partitions, one child per partition number."""
        return self._join("brokers", "topics", check_topic(topic), "partitions")

    def topic_partition(self, topic: str, partition: int) -> str:
        """Parent of one partition's nodes (its ``state``)."""
        return self._join("brokers", "topics", check_topic(topic), "partitions",
                          str(check_partition(partition)))

    def partition_state(self, topic: str, partition: int) -> str:
        """A replicated partition's leader, leader epoch and ISR (persistent, replaced by
        conditional sets: ``hpbroker.coord.partition_state``)."""
        return self.topic_partition(topic, partition) + "/state"

    # --- controller -----------------------------------------------------------------------------

    @property
    def controller(self) -> str:
        """The active controller's broker id (ephemeral: it goes with the controller's session)."""
        return self._join("controller")

    @property
    def controller_epoch(self) -> str:
        """The number of controller elections so far (persistent); its znode version guards every
        write of a controller, so a deposed one's writes fail."""
        return self._join("controller_epoch")

    @property
    def producer_id_block(self) -> str:
        """The newest block of producer ids a broker took (persistent, replaced with conditional
        sets: ``hpbroker.coord.producer_ids``)."""
        return self._join("producer-id-block")

    # --- security -------------------------------------------------------------------------------

    @property
    def acls(self) -> str:
        """The cluster's ACLs, one JSON document (persistent; ``hpbroker.coord.acl_store``)."""
        return self._join("acls")

    @property
    def token_key(self) -> str:
        """The cluster's token key, its one secret (persistent; ``hpbroker.coord.zk_security``)."""
        return self._join("security", "token_key")

    # --- consumer groups ------------------------------------------------------------------------

    @property
    def consumers(self) -> str:
        """Parent of every consumer group."""
        return self._join("consumers")

    def group(self, group: str) -> str:
        return self._join("consumers", check_group(group))

    def consumer_ids(self, group: str) -> str:
        """Parent of the group's live consumers."""
        return self._join("consumers", check_group(group), "ids")

    def consumer(self, group: str, consumer_id: str) -> str:
        """A live consumer's registration in its group (ephemeral)."""
        return self._join("consumers", check_group(group), "ids", check_consumer_id(consumer_id))

    def group_owners(self, group: str) -> str:
        """Parent of the group's ownership nodes, one child per topic."""
        return self._join("consumers", check_group(group), "owners")

    def group_offsets(self, group: str) -> str:
        """Parent of the group's committed offsets, one child per topic."""
        return self._join("consumers", check_group(group), "offsets")

    def owners(self, group: str, topic: str) -> str:
        """Parent of the ownership nodes of ``topic``'s partitions in the group."""
        return self._join("consumers", check_group(group), "owners", check_topic(topic))

    def owner(self, group: str, topic: str, partition: int) -> str:
        """Which consumer of the group owns a partition (ephemeral; data: the consumer id)."""
        return self._join("consumers", check_group(group), "owners", check_topic(topic),
                          str(check_partition(partition)))

    def offsets(self, group: str, topic: str) -> str:
        """Parent of the group's committed offsets of ``topic``."""
        return self._join("consumers", check_group(group), "offsets", check_topic(topic))

    def offset(self, group: str, topic: str, partition: int) -> str:
        """The group's committed offset of a partition (persistent)."""
        return self._join("consumers", check_group(group), "offsets", check_topic(topic),
                          str(check_partition(partition)))

    # --- reading children back ------------------------------------------------------------------

    @staticmethod
    def broker_id_of(child: str) -> int:
        """The broker id a child of :attr:`broker_ids` names (InvalidConfigError if none)."""
        if not child.isdigit() or (len(child) > 1 and child[0] == "0"):
            raise InvalidConfigError(f"{child!r} is not a broker id")
        return check_broker_id(int(child))

    @staticmethod
    def partition_of(child: str) -> int:
        """The partition a child of :meth:`owners`, :meth:`offsets` or :meth:`topic_partitions` names."""
        if not child.isdigit() or (len(child) > 1 and child[0] == "0"):
            raise InvalidPartitionsError(f"{child!r} is not a partition number")
        return check_partition(int(child))


@dataclass(frozen=True, slots=True)
class ConnectString:
    """A parsed ``host:port[,host:port...][/chroot]``: the servers, and the chroot or None."""

    servers: tuple[tuple[str, int], ...]
    chroot: str | None = None

    @property
    def hosts(self) -> str:
        """The servers alone, ``host:port,host:port``, as a ZooKeeper client takes them."""
        return ",".join(f"{host}:{port}" for host, port in self.servers)

    def __str__(self) -> str:
        return self.hosts + (self.chroot or "")


def parse_connect_string(text: object) -> ConnectString:
    """Parse and check a connect string; a missing port is :data:`DEFAULT_PORT`.  Raises
    InvalidConfigError naming the part that is wrong."""
    if not isinstance(text, str) or not text.strip():
        raise InvalidConfigError(f"a ZooKeeper connect string must be a non-empty string, got {text!r}")
    text = text.strip()
    slash = text.find("/")
    hosts, chroot = (text, None) if slash < 0 else (text[:slash], text[slash:])
    if chroot is not None:
        chroot = _check_root(chroot, f"chroot of connect string {text!r}")
        if chroot == "/":
            chroot = None
    servers = []
    for entry in hosts.split(","):
        entry = entry.strip()
        host, port_text = entry, ""
        if entry.startswith("["):
            close = entry.find("]")
            host, rest = entry[: close + 1], entry[close + 1:]
            if close < 0 or (rest and not rest.startswith(":")):
                raise InvalidConfigError(f"connect string {text!r}: {entry!r} is not [IPv6]:port")
            port_text = rest[1:]
        elif ":" in entry:
            host, _, port_text = entry.rpartition(":")
        if not _HOST.fullmatch(host):
            raise InvalidConfigError(f"connect string {text!r}: {entry!r} is not host:port")
        if port_text and not port_text.isdigit():
            raise InvalidConfigError(f"connect string {text!r}: port {port_text!r} of {entry!r} "
                                     "is not a number")
        port = int(port_text) if port_text else DEFAULT_PORT
        if not 1 <= port <= 65535:
            raise InvalidConfigError(f"connect string {text!r}: port {port} of {entry!r} "
                                     "is not in [1, 65535]")
        servers.append((host, port))
    return ConnectString(tuple(servers), chroot)

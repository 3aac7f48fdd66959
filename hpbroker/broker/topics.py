"""The topic store: which topics exist, how many partitions each has, and their log settings.

Owned by the arbiter (single writer, one process); workers learn their partitions from it through
the arbiter, never by reading the file.  On disk it is one JSON document,
``<data_dir>/topics.json``, replaced atomically on every change (``hpbroker.io.files.replace_atomically``:
write ``topics.json.tmp``, fsync it, rename it over the old one, fsync the directory), so a crash
leaves either the old or the new store, never a mix::

    {"version": 1,
     "topics": {"orders": {"partitions": 4, "config": {"retention_ms": 86400000},
                           "deleting": false},
                "clicks": {"partitions": 2, "config": {}, "deleting": false,
                           "replicas": {"0": [1, 2, 0], "1": [2, 0, 1]},
                           "topic_id": "9b2f6c1e0d4a4e8f8c3b5a7d6e1f2a3b"}}}

``config`` holds only the topic's overrides of the broker's log defaults, as typed values (ints,
``flush_fsync`` a bool), under :class:`~hpbroker.io.LogConfig` field names.  ``deleting`` marks a
topic whose deletion has begun: its partition directories are removed by the workers that own them
and the store forgets the topic only once every one of them has confirmed, so a crash in between
resumes the deletion at the next start instead of resurrecting a half-deleted topic.  ``replicas``
(only in a replicated topic, docs/REPLICATION.md) is the cluster's assignment: each partition's
replicas, of which this broker stores the ones naming it; the cluster's topic node in ZooKeeper is
that topic's source of truth, and the store its copy, kept in step by the arbiter.  ``topic_id``
(only in a replicated topic whose node has one) is the identity the cluster drew when it created
the topic: a stored copy whose id is not the node's is an older topic of the same name (deleted and
created again while this broker did not look), which the arbiter deletes before storing the new one.

What holds: every topic in the store has a valid name, 1 to :data:`MAX_PARTITIONS` partitions and
overrides that build a valid LogConfig; the file on disk always equals the last successful change.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hpbroker.coord.assignment import check_replica_assignment
from hpbroker.errors import (
    InvalidConfigError,
    InvalidPartitionsError,
    InvalidTopicError,
    StorageError,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
)
from hpbroker.io import LogConfig
from hpbroker.io.files import replace_atomically

__all__ = [
    "MAX_PARTITIONS",
    "MAX_TOPIC_NAME_LENGTH",
    "TOPICS_FILE_NAME",
    "Topic",
    "TopicStore",
    "check_partitions",
    "alter_topic_config",
    "check_topic_name",
    "config_to_strings",
    "parse_topic_config",
]

TOPICS_FILE_NAME = "topics.json"  # the store, in the data directory
_FORMAT_VERSION = 1  # the "version" field of topics.json
MAX_TOPIC_NAME_LENGTH = 249  # Kafka's limit: a partition directory name must stay under 255 bytes
MAX_PARTITIONS = 100_000
_NAME_PATTERN = re.compile(r"[A-Za-z0-9._-]+")
_LOG_FIELDS = {f.name: f.type for f in dataclasses.fields(LogConfig)}


@dataclass(frozen=True, slots=True)
class Topic:
    """One topic: ``config`` maps LogConfig field names to the topic's own (typed) values."""

    name: str
    partitions: int
    config: dict[str, Any] = field(default_factory=dict)
    deleting: bool = False
    #: a replicated topic's assignment, partition -> its replicas' broker ids (the first is the
    #: preferred leader), as the cluster's topic node holds it; empty: an unreplicated topic, every
    #: partition stored here
    replicas: dict[int, tuple[int, ...]] = field(default_factory=dict)
    #: a replicated topic's identity as the cluster's topic node holds it (uuid4 hex); "" for an
    #: unreplicated topic and for one whose node has none
    topic_id: str = ""

    @property
    def replicated(self) -> bool:
        return bool(self.replicas)

    def hosts(self, partition: int, broker_id: int) -> bool:
        """Whether broker ``broker_id`` keeps a replica of ``partition`` (every broker storing an
        unreplicated topic keeps all of it)."""
        return not self.replicas or broker_id in self.replicas.get(partition, ())

    def to_json(self) -> dict[str, Any]:
        document: dict[str, Any] = {"partitions": self.partitions, "config": dict(self.config),
                                    "deleting": self.deleting}
        if self.replicas:
            document["replicas"] = {str(p): list(r) for p, r in sorted(self.replicas.items())}
        if self.topic_id:
            document["topic_id"] = self.topic_id
        return document


def check_topic_name(name: object) -> str:
    """``name`` if it is 1 to 249 characters of ``[A-Za-z0-9._-]`` and not ``.`` or ``..``."""
    if not isinstance(name, str) or not name:
        raise InvalidTopicError(f"a topic name must be a non-empty string, got {name!r}")
    if len(name) > MAX_TOPIC_NAME_LENGTH:
        raise InvalidTopicError(
            f"topic name of {len(name)} characters is longer than {MAX_TOPIC_NAME_LENGTH}"
        )
    if not _NAME_PATTERN.fullmatch(name):
        raise InvalidTopicError(f"topic name {name!r} may only hold the characters [A-Za-z0-9._-]")
    if name in (".", ".."):
        raise InvalidTopicError(f"topic name {name!r} is not allowed")
    return name


def check_partitions(partitions: object) -> int:
    if not isinstance(partitions, int) or isinstance(partitions, bool) \
            or not 1 <= partitions <= MAX_PARTITIONS:
        raise InvalidPartitionsError(f"partitions must be in [1, {MAX_PARTITIONS}], got {partitions!r}")
    return partitions


def parse_topic_config(entries: Mapping[str, Any] | Iterable[Any]) -> dict[str, Any]:
    """Topic overrides from the protocol's ``TopicConfigEntry`` list (or ``(key, value)`` pairs, or
    a mapping): values given as strings are parsed (decimal integers; ``true``/``false`` for
    ``flush_fsync``) and the whole is validated by building a LogConfig.  InvalidConfigError
    names the key that is unknown, repeated or out of range."""
    pairs = entries.items() if isinstance(entries, Mapping) else (_pair(e) for e in entries)
    parsed: dict[str, Any] = {}
    for key, value in pairs:
        if key not in _LOG_FIELDS:
            raise InvalidConfigError(f"unknown topic config {key!r}; known: {sorted(_LOG_FIELDS)}")
        if key in parsed:
            raise InvalidConfigError(f"topic config {key!r} is given twice")
        parsed[key] = _parse_value(key, value) if isinstance(value, str) else value
    try:
        LogConfig(**parsed)
    except InvalidConfigError as e:
        raise InvalidConfigError(f"topic config: {e.message}") from None
    return parsed


def alter_topic_config(config: Mapping[str, Any],
                       changes: Mapping[str, Any] | Iterable[Any]) -> dict[str, Any]:
    """``config`` (a topic's overrides) with ``changes`` applied, in the forms
    :func:`parse_topic_config` takes; a value that is None or an empty string removes the
    override.  The result is validated as a whole; InvalidConfigError names the key at fault."""
    pairs = list(changes.items() if isinstance(changes, Mapping) else (_pair(e) for e in changes))
    keys = [key for key, _ in pairs]
    for key in keys:
        if key not in _LOG_FIELDS:
            raise InvalidConfigError(f"unknown topic config {key!r}; known: {sorted(_LOG_FIELDS)}")
        if keys.count(key) > 1:
            raise InvalidConfigError(f"topic config {key!r} is given twice")
    removed = {key for key, value in pairs if value is None or value == ""}
    merged = {key: value for key, value in config.items() if key not in removed}
    merged.update(parse_topic_config([(key, value) for key, value in pairs if key not in removed]))
    return parse_topic_config(merged)


def config_to_strings(config: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The protocol's form of overrides: ``(key, value)`` in key order, values in decimal or
    ``true``/``false``."""
    return [(key, _format_value(value)) for key, value in sorted(config.items())]


def _pair(entry: Any) -> tuple[str, Any]:
    if hasattr(entry, "key") and hasattr(entry, "value"):
        return entry.key, entry.value
    key, value = entry
    return key, value


def _parse_value(key: str, text: str) -> Any:
    if _LOG_FIELDS[key] == "bool":
        if text.strip().lower() not in ("true", "false"):
            raise InvalidConfigError(f"topic config {key}={text!r} must be true or false")
        return text.strip().lower() == "true"
    try:
        return int(text.strip(), 10)
    except ValueError:
        raise InvalidConfigError(f"topic config {key}={text!r} is not a decimal integer") from None


def _format_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


class TopicStore:
    """The topics of one broker, persisted in ``<data_dir>/topics.json``.

    Single writer: only the arbiter calls the changing methods (:meth:`create`, :meth:`alter`,
    :meth:`mark_deleting`, :meth:`forget`), each of which returns only after the new store is
    durable.  ``version`` counts changes made by this instance (not persisted), so a caller can
    tell whether the store moved on since it last looked.
    """

    def __init__(self, data_dir: str | os.PathLike[str]) -> None:
        self._directory = os.fspath(data_dir)
        self.path = os.path.join(self._directory, TOPICS_FILE_NAME)
        self.version = 0
        self._topics: dict[str, Topic] = self._load()

    def __contains__(self, name: object) -> bool:
        return name in self._topics

    def get(self, name: str) -> Topic | None:
        """The topic, deleting or not; None if the store does not hold it."""
        return self._topics.get(name)

    def topics(self, *, include_deleting: bool = False) -> list[Topic]:
        """Every topic, by name; those being deleted only when asked for."""
        return [t for _, t in sorted(self._topics.items()) if include_deleting or not t.deleting]

    def create(self, name: str, partitions: int, configs: Mapping[str, Any] | Iterable[Any] = (), *,
               admit: Callable[[Topic], None] | None = None,
               replicas: Mapping[int, Sequence[int]] | None = None) -> Topic:
        """Validate and persist a new topic.  Raises InvalidTopicError, InvalidPartitionsError,
        InvalidConfigError or TopicAlreadyExistsError (also while a topic of that name is still
        being deleted).  ``admit``, given the validated topic, may refuse it by raising (the
        broker's file-descriptor budget does so): nothing is persisted then.  ``replicas``: a
        replicated topic's assignment (every partition, as :attr:`Topic.replicas`)."""
        check_topic_name(name)
        check_partitions(partitions)
        config = parse_topic_config(configs)
        assignment = check_replica_assignment(partitions, replicas or {})
        existing = self._topics.get(name)
        if existing is not None:
            being = " and is still being deleted" if existing.deleting else ""
            raise TopicAlreadyExistsError(f"topic {name!r} already exists{being}")
        topic = Topic(name, partitions, config, replicas=assignment)
        if admit is not None:
            admit(topic)
        self._save({**self._topics, name: topic})
        return topic

    def alter(self, name: str, changes: Mapping[str, Any] | Iterable[Any]) -> Topic:
        """Validate and persist new overrides for ``name`` (:func:`alter_topic_config`); the
        topic as it is now.  UnknownTopicOrPartitionError for a topic absent or being deleted;
        InvalidConfigError (nothing persisted) for a change refused."""
        topic = self._topics.get(name)
        if topic is None or topic.deleting:
            raise UnknownTopicOrPartitionError(f"topic {name!r} does not exist")
        config = alter_topic_config(topic.config, changes)
        if config != topic.config:
            topic = dataclasses.replace(topic, config=config)
            self._save({**self._topics, name: topic})
        return topic

    def set_replicas(self, name: str, replicas: Mapping[int, Sequence[int]]) -> Topic:
        """Persist a replicated topic's new assignment (a reassignment moved replicas), as the
        cluster's topic node holds it now."""
        topic = self._topics.get(name)
        if topic is None or topic.deleting or not topic.replicated:
            raise UnknownTopicOrPartitionError(f"replicated topic {name!r} does not exist")
        assignment = check_replica_assignment(topic.partitions, replicas)
        if assignment != topic.replicas:
            topic = dataclasses.replace(topic, replicas=assignment)
            self._save({**self._topics, name: topic})
        return topic

    def set_topic_id(self, name: str, topic_id: str) -> Topic:
        """Persist the identity the cluster gave a replicated topic (its node's ``topic_id``)."""
        topic = self._topics.get(name)
        if topic is None or topic.deleting or not topic.replicated:
            raise UnknownTopicOrPartitionError(f"replicated topic {name!r} does not exist")
        if not isinstance(topic_id, str):
            raise TypeError(f"topic_id must be a string, got {topic_id!r}")
        if topic_id != topic.topic_id:
            topic = dataclasses.replace(topic, topic_id=topic_id)
            self._save({**self._topics, name: topic})
        return topic

    def mark_deleting(self, name: str) -> Topic:
        """Persist that ``name``'s deletion has begun; its partitions are then removed by the
        workers and :meth:`forget` ends it.  Marking a topic twice is harmless."""
        topic = self._topics.get(name)
        if topic is None:
            raise UnknownTopicOrPartitionError(f"topic {name!r} does not exist")
        if not topic.deleting:
            topic = dataclasses.replace(topic, deleting=True)
            self._save({**self._topics, name: topic})
        return topic

    def forget(self, name: str) -> None:
        """Remove a topic whose partitions are gone."""
        if name not in self._topics:
            raise UnknownTopicOrPartitionError(f"topic {name!r} does not exist")
        self._save({k: t for k, t in self._topics.items() if k != name})

    # --- persistence ----------------------------------------------------------------------------

    def _save(self, topics: dict[str, Topic]) -> None:
        document = {"version": _FORMAT_VERSION,
                    "topics": {name: t.to_json() for name, t in sorted(topics.items())}}
        data = json.dumps(document, indent=1, sort_keys=True).encode("utf-8") + b"\n"
        try:
            replace_atomically(self.path, data)
        except OSError as e:
            raise StorageError(f"cannot write the topic store {self.path}: {e}") from e
        self._topics = topics
        self.version += 1

    def _load(self) -> dict[str, Topic]:
        try:
            with open(self.path, "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            return {}
        except OSError as e:
            raise StorageError(f"cannot read the topic store {self.path}: {e}") from e
        try:
            document = json.loads(raw)
            if not isinstance(document, dict) or document.get("version") != _FORMAT_VERSION:
                raise ValueError(f"expected a version {_FORMAT_VERSION} document")
            entries = document["topics"]
            if not isinstance(entries, dict):
                raise ValueError("'topics' is not an object")
            return {name: self._load_topic(name, entry) for name, entry in entries.items()}
        except (ValueError, KeyError, TypeError) as e:  # json.JSONDecodeError is a ValueError
            raise StorageError(f"the topic store {self.path} is malformed: {e}") from None

    @staticmethod
    def _load_topic(name: str, entry: Any) -> Topic:
        if not isinstance(entry, dict) or not isinstance(entry.get("config", {}), dict) \
                or not isinstance(entry.get("deleting", False), bool):
            raise ValueError(f"topic {name!r}: not a topic entry: {entry!r}")
        try:
            check_topic_name(name)
            partitions = check_partitions(entry.get("partitions"))
            config = parse_topic_config(entry.get("config", {}))
            raw = entry.get("replicas", {})
            if not isinstance(raw, dict):
                raise ValueError(f"replicas is not an object: {raw!r}")
            replicas = check_replica_assignment(partitions, {int(p, 10): r for p, r in raw.items()})
            topic_id = entry.get("topic_id", "")
            if not isinstance(topic_id, str):
                raise ValueError(f"topic_id is not a string: {topic_id!r}")
        except (InvalidTopicError, InvalidPartitionsError, InvalidConfigError) as e:
            raise ValueError(f"topic {name!r}: {e.message}") from None
        return Topic(name, partitions, config, entry.get("deleting", False), replicas, topic_id)

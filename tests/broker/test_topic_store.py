"""The topic store: validation, persistence, deletion in two steps."""

from __future__ import annotations

import json
import os

import pytest

from hpbroker.broker.topics import (
    TOPICS_FILE_NAME,
    Topic,
    TopicStore,
    config_to_strings,
    parse_topic_config,
)
from hpbroker.errors import (
    InvalidConfigError,
    InvalidPartitionsError,
    InvalidTopicError,
    StorageError,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
)
from hpbroker.protocol import TopicConfigEntry


def test_created_topics_survive_a_reopen(tmp_path):
    store = TopicStore(tmp_path)
    store.create("orders", 4, [TopicConfigEntry("retention_ms", "86400000"),
                               TopicConfigEntry("flush_fsync", "false")])
    store.create("audit.log-v2", 1)
    reopened = TopicStore(tmp_path)
    assert reopened.topics() == [
        Topic("audit.log-v2", 1, {}),
        Topic("orders", 4, {"retention_ms": 86_400_000, "flush_fsync": False}),
    ]
    assert "orders" in reopened and reopened.get("nope") is None


def test_store_file_is_replaced_atomically_without_leftovers(tmp_path):
    store = TopicStore(tmp_path)
    store.create("orders", 2)
    assert sorted(os.listdir(tmp_path)) == [TOPICS_FILE_NAME]
    document = json.loads((tmp_path / TOPICS_FILE_NAME).read_text())
    assert document == {"version": 1, "topics": {"orders": {"partitions": 2, "config": {},
                                                            "deleting": False}}}
    assert store.version == 1


@pytest.mark.parametrize("name", ["", ".", "..", "a/b", "tab\t", "é", "x" * 250, "a b"])
def test_invalid_names_are_refused(tmp_path, name):
    with pytest.raises(InvalidTopicError):
        TopicStore(tmp_path).create(name, 1)


def test_longest_name_and_dots_inside_names_are_allowed(tmp_path):
    store = TopicStore(tmp_path)
    store.create("x" * 249, 1)
    store.create("...", 1)
    assert len(store.topics()) == 2


@pytest.mark.parametrize("partitions", [0, -1, 100_001, True, "3"])
def test_partition_counts_out_of_range_are_refused(tmp_path, partitions):
    with pytest.raises(InvalidPartitionsError, match=r"\[1, 100000\]"):
        TopicStore(tmp_path).create("orders", partitions)


@pytest.mark.parametrize(
    ("entries", "message"),
    [
        ([("segment_bytes", "12")], "segment_bytes must be in"),
        ([("segment_bytes", "big")], "segment_bytes='big' is not a decimal integer"),
        ([("flush_fsync", "yes")], "flush_fsync='yes' must be true or false"),
        ([("colour", "blue")], "unknown topic config 'colour'"),
        ([("flush_ms", "1"), ("flush_ms", "2")], "'flush_ms' is given twice"),
    ],
)
def test_invalid_topic_configs_name_the_key(tmp_path, entries, message):
    store = TopicStore(tmp_path)
    with pytest.raises(InvalidConfigError, match=message):
        store.create("orders", 1, entries)
    assert store.topics() == [] and not (tmp_path / TOPICS_FILE_NAME).exists()


def test_config_values_round_trip_through_their_wire_form():
    parsed = parse_topic_config({"flush_fsync": "TRUE", "retention_ms": "-1", "segment_bytes": 4096})
    assert parsed == {"flush_fsync": True, "retention_ms": -1, "segment_bytes": 4096}
    assert config_to_strings(parsed) == [("flush_fsync", "true"), ("retention_ms", "-1"),
                                         ("segment_bytes", "4096")]
    assert parse_topic_config(config_to_strings(parsed)) == parsed


def test_existing_topic_cannot_be_created_again(tmp_path):
    store = TopicStore(tmp_path)
    store.create("orders", 1)
    with pytest.raises(TopicAlreadyExistsError, match="'orders' already exists"):
        store.create("orders", 3)


def test_deletion_marks_first_and_forgets_after(tmp_path):
    store = TopicStore(tmp_path)
    store.create("orders", 2)
    store.mark_deleting("orders")
    assert store.topics() == []
    assert TopicStore(tmp_path).get("orders") == Topic("orders", 2, {}, deleting=True)
    with pytest.raises(TopicAlreadyExistsError, match="still being deleted"):
        store.create("orders", 2)
    store.forget("orders")
    assert TopicStore(tmp_path).topics(include_deleting=True) == []
    store.create("orders", 5)
    assert store.get("orders").partitions == 5


def test_deleting_an_unknown_topic_is_an_error(tmp_path):
    store = TopicStore(tmp_path)
    with pytest.raises(UnknownTopicOrPartitionError):
        store.mark_deleting("ghost")
    with pytest.raises(UnknownTopicOrPartitionError):
        store.forget("ghost")


@pytest.mark.parametrize(
    "content",
    [b"{not json", b"[]", b'{"version": 2, "topics": {}}',
     b'{"version": 1, "topics": {"a/b": {"partitions": 1}}}',
     b'{"version": 1, "topics": {"t": {"partitions": 0}}}',
     b'{"version": 1, "topics": {"t": {"partitions": 1, "config": {"flush_ms": "x"}}}}'],
)
def test_malformed_store_refuses_to_load_naming_the_file(tmp_path, content):
    (tmp_path / TOPICS_FILE_NAME).write_bytes(content)
    with pytest.raises(StorageError, match="topics.json is malformed"):
        TopicStore(tmp_path)


def test_leftover_tmp_file_is_ignored_and_overwritten(tmp_path):
    (tmp_path / (TOPICS_FILE_NAME + ".tmp")).write_bytes(b"half a store")
    store = TopicStore(tmp_path)
    assert store.topics() == []
    store.create("orders", 1)
    assert TopicStore(tmp_path).topics() == [Topic("orders", 1, {})]


def test_alter_merges_removes_and_persists_overrides(tmp_path):
    store = TopicStore(tmp_path)
    store.create("orders", 2, {"retention_ms": "1000", "flush_ms": "5"})
    changes = [TopicConfigEntry("segment_bytes", "4096"), TopicConfigEntry("flush_ms", ""),
               TopicConfigEntry("flush_fsync", "false")]
    altered = store.alter("orders", changes)
    assert altered == Topic("orders", 2, {"retention_ms": 1000, "segment_bytes": 4096, "flush_fsync": False})
    assert TopicStore(tmp_path).get("orders") == altered
    version = store.version
    assert store.alter("orders", {"retention_ms": 1000}) == altered and store.version == version, \
        "a change to the same values writes nothing"


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"segment_bytes": "10"}, r"segment_bytes must be in \[512"),
        ({"retention_hours": "1"}, "unknown topic config 'retention_hours'"),
        ({"retention_hours": None}, "unknown topic config 'retention_hours'"),
        ([("flush_ms", "1"), ("flush_ms", "")], "'flush_ms' is given twice"),
        ({"flush_fsync": "yes"}, "must be true or false"),
    ],
)
def test_refused_alters_change_nothing(tmp_path, changes, message):
    store = TopicStore(tmp_path)
    store.create("orders", 1, {"retention_ms": "1000"})
    with pytest.raises(InvalidConfigError, match=message):
        store.alter("orders", changes)
    assert TopicStore(tmp_path).get("orders").config == {"retention_ms": 1000}


def test_altering_an_unknown_or_deleting_topic_is_an_error(tmp_path):
    store = TopicStore(tmp_path)
    with pytest.raises(UnknownTopicOrPartitionError):
        store.alter("nope", {"flush_ms": "1"})
    store.create("orders", 1)
    store.mark_deleting("orders")
    with pytest.raises(UnknownTopicOrPartitionError):
        store.alter("orders", {"flush_ms": "1"})

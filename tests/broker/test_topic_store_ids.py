"""A replicated topic's identity in the topic store: persisted only when there is one (stores
written before topic ids keep their bytes), read back after a restart."""

from __future__ import annotations

import json

import pytest

from hpbroker.broker.topics import TopicStore
from hpbroker.errors import UnknownTopicOrPartitionError


def test_topic_id_is_persisted_and_read_back(tmp_path):
    store = TopicStore(tmp_path)
    store.create("orders", 2, replicas={0: (1, 2), 1: (2, 1)})
    before = store.version
    assert store.set_topic_id("orders", "ab" * 16).topic_id == "ab" * 16
    assert store.version == before + 1
    assert json.loads((tmp_path / "topics.json").read_text())["topics"]["orders"]["topic_id"] == "ab" * 16
    assert TopicStore(tmp_path).get("orders").topic_id == "ab" * 16
    store.set_topic_id("orders", "ab" * 16)
    assert store.version == before + 1  # unchanged: not written again


def test_a_topic_without_id_keeps_its_entry_bytes(tmp_path):
    store = TopicStore(tmp_path)
    store.create("orders", 1, replicas={0: (1, 2)})
    store.create("plain", 1)
    entries = json.loads((tmp_path / "topics.json").read_text())["topics"]
    assert "topic_id" not in entries["orders"] and "topic_id" not in entries["plain"]
    assert TopicStore(tmp_path).get("orders").topic_id == ""


def test_only_a_stored_replicated_topic_takes_an_id(tmp_path):
    store = TopicStore(tmp_path)
    store.create("plain", 1)
    with pytest.raises(UnknownTopicOrPartitionError):
        store.set_topic_id("plain", "ab" * 16)
    with pytest.raises(UnknownTopicOrPartitionError):
        store.set_topic_id("absent", "ab" * 16)

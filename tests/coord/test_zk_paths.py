"""Znode paths and connect strings: the tree, the root prefix, and clear errors for bad names."""

from __future__ import annotations

import pytest

from hpbroker.coord.paths import DEFAULT_PORT, ZkPaths, parse_connect_string
from hpbroker.errors import InvalidConfigError, InvalidPartitionsError, InvalidTopicError


def test_default_tree_matches_the_documented_layout():
    paths = ZkPaths()
    assert paths.broker_ids == "/hpbroker/brokers/ids"
    assert paths.broker(7) == "/hpbroker/brokers/ids/7"
    assert paths.topics == "/hpbroker/brokers/topics"
    assert paths.topic("orders") == "/hpbroker/brokers/topics/orders"
    assert paths.consumers == "/hpbroker/consumers"
    assert paths.group("g1") == "/hpbroker/consumers/g1"
    assert paths.consumer_ids("g1") == "/hpbroker/consumers/g1/ids"
    assert paths.consumer("g1", "c-1") == "/hpbroker/consumers/g1/ids/c-1"
    assert paths.owners("g1", "orders") == "/hpbroker/consumers/g1/owners/orders"
    assert paths.owner("g1", "orders", 3) == "/hpbroker/consumers/g1/owners/orders/3"
    assert paths.offsets("g1", "orders") == "/hpbroker/consumers/g1/offsets/orders"
    assert paths.offset("g1", "orders", 0) == "/hpbroker/consumers/g1/offsets/orders/0"
    assert paths.acls == "/hpbroker/acls"
    assert paths.token_key == "/hpbroker/security/token_key"
    assert ZkPaths("/").token_key == "/security/token_key"


@pytest.mark.parametrize(("root", "expected"), [("/", "/brokers/ids/1"), ("/a/b.c", "/a/b.c/brokers/ids/1")])
def test_root_prefixes_every_path(root, expected):
    assert ZkPaths(root).broker(1) == expected


@pytest.mark.parametrize("root", ["", "hpbroker", "/a/", "/a//b", "/a/..", "/zookeeper", "/zookeeper/x",
                                  "/a b", None])
def test_bad_root_is_a_config_error(root):
    with pytest.raises(InvalidConfigError, match="root"):
        ZkPaths(root)


@pytest.mark.parametrize("name", ["", ".", "..", "a/b", "a b", "x" * 250, "tópico", None, 3])
def test_bad_topic_names_are_refused_before_building_a_path(name):
    with pytest.raises(InvalidTopicError, match="topic name"):
        ZkPaths().topic(name)
    with pytest.raises(InvalidTopicError):
        ZkPaths().offset("g", name, 0)


@pytest.mark.parametrize("name", ["", "..", "a/b", "g*", "x" * 250])
def test_bad_group_and_consumer_ids_are_config_errors(name):
    with pytest.raises(InvalidConfigError, match="consumer group id"):
        ZkPaths().consumer_ids(name)
    with pytest.raises(InvalidConfigError, match="consumer id"):
        ZkPaths().consumer("g", name)


@pytest.mark.parametrize("partition", [-1, 2**31, True, "3", 1.0])
def test_bad_partition_numbers_are_refused(partition):
    with pytest.raises(InvalidPartitionsError, match="partition"):
        ZkPaths().owner("g", "t", partition)


@pytest.mark.parametrize("broker_id", [-1, 2**31, False, "0"])
def test_bad_broker_ids_are_refused(broker_id):
    with pytest.raises(InvalidConfigError, match="broker id"):
        ZkPaths().broker(broker_id)


def test_children_read_back_as_ids():
    assert ZkPaths.broker_id_of("12") == 12
    assert ZkPaths.partition_of("0") == 0
    for child in ("012", "x", "-1", ""):
        with pytest.raises(InvalidConfigError):
            ZkPaths.broker_id_of(child)
        with pytest.raises(InvalidPartitionsError):
            ZkPaths.partition_of(child)


def test_connect_string_with_servers_and_chroot():
    parsed = parse_connect_string(" zk1:2181,zk2:2182,[::1]:2183/prod/hpb ")
    assert parsed.servers == (("zk1", 2181), ("zk2", 2182), ("[::1]", 2183))
    assert parsed.chroot == "/prod/hpb"
    assert parsed.hosts == "zk1:2181,zk2:2182,[::1]:2183"
    assert str(parsed) == "zk1:2181,zk2:2182,[::1]:2183/prod/hpb"


def test_connect_string_defaults_the_port_and_drops_a_bare_slash():
    parsed = parse_connect_string("localhost/")
    assert parsed.servers == (("localhost", DEFAULT_PORT),) and parsed.chroot is None


@pytest.mark.parametrize(("text", "complaint"), [
    ("", "non-empty"),
    ("zk1:port", "not a number"),
    ("zk1:0", r"not in \[1, 65535\]"),
    ("zk1:2181,", "not host:port"),
    ("zk 1:2181", "not host:port"),
    ("[::1:2181", r"\[IPv6\]:port"),
    ("zk1:2181/a//b", "empty component"),
    ("zk1:2181/zookeeper", "reserves"),
])
def test_bad_connect_strings_say_what_is_wrong(text, complaint):
    with pytest.raises(InvalidConfigError, match=complaint):
        parse_connect_string(text)

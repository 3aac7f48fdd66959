"""Consumer-group lag on the metrics endpoint of a broker registered in ZooKeeper: the high watermark
of each partition the broker serves minus the offset the group committed there."""

from __future__ import annotations

import uuid

import pytest
from group_harness import create_topic, produce, unique_name, wait_topic_registered
from harness import free_ports, start_broker, wait_until
from scrape import scrape

from hpbroker import Consumer
from hpbroker.coord.groups import GroupRegistry
from hpbroker.coord.session import connect

pytestmark = pytest.mark.zookeeper
WORKERS = 2


@pytest.fixture
def cluster(zookeeper, tmp_path):
    zk_connect = f"{zookeeper.connect_string}/lag-{uuid.uuid4().hex[:10]}"
    port = free_ports(WORKERS + 2)
    config = tmp_path / "broker.toml"
    config.write_text(f'[broker]\nzookeeper = "{zk_connect}"\nzookeeper_session_timeout_ms = 4000\n'
                      f"metrics_port = {port + WORKERS + 1}\nmetrics_lag_interval_ms = 200\n")
    broker, port = start_broker(tmp_path / "data", tmp_path / "broker.log", config=config, port=port)
    session = connect(zk_connect, session_timeout_s=5.0)
    try:
        yield zk_connect, port, port + WORKERS + 1, session
    finally:
        session.close()
        status = broker.stop()
        assert status == 0, broker.log()


def consume_and_commit(bootstrap: str, zk_connect: str, group: str, topic: str, positions: dict[int, int],
                       total: int) -> None:
    """A group member reads everything, then commits ``positions`` (partition -> next offset)."""
    with Consumer(bootstrap, group=group, topics=[topic], zookeeper=zk_connect, auto_offset_reset="earliest",
                  session_timeout_ms=3000, enable_auto_commit=False) as consumer:
        seen = 0
        for _ in range(200):
            seen += sum(len(batch) for batch in consumer.poll(timeout_ms=100).values())
            if seen >= total:
                break
        assert seen == total
        for tp in consumer.assignment():
            consumer.seek(tp, positions[tp.partition])
        consumer.commit()


def test_lag_is_the_high_watermark_minus_the_committed_offset(cluster):
    zk_connect, port, metrics_port, session = cluster
    bootstrap = f"127.0.0.1:{port}"
    topic, group, other = unique_name("t"), unique_name("g"), unique_name("g")
    create_topic(port, topic, 2)
    wait_topic_registered(GroupRegistry(session, group), topic, 2)
    produce(bootstrap, topic, 2, 10)
    consume_and_commit(bootstrap, zk_connect, group, topic, {0: 6, 1: 3}, 20)
    GroupRegistry(session, other).write_offsets({(topic, 0): 10, (topic, 1): 0})

    def lags():
        metrics = scrape(metrics_port)
        found = {(dict(k)["group"], int(dict(k)["partition"])): v
                 for k, v in metrics.series("hpbroker_consumer_group_lag", topic=topic).items()}
        return (metrics, found) if len(found) == 4 else None

    metrics, found = wait_until(lags, 10, what="the groups' lag on the metrics endpoint")
    assert found == {(group, 0): 4, (group, 1): 7, (other, 0): 0, (other, 1): 10}
    labels = {"group": group, "topic": topic, "partition": 1}
    assert metrics.value("hpbroker_consumer_group_committed_offset", **labels) == 3
    assert 0 <= metrics.value("hpbroker_consumer_group_offsets_age_seconds") < 5

    produce(bootstrap, topic, 2, 5, start=10)  # the lag grows with the log
    wait_until(lambda: scrape(metrics_port).value("hpbroker_consumer_group_lag", group=group, topic=topic,
                                                  partition=0) == 9, 10, what="the lag after more records")

"""The Spark source's reading engine (``hpbroker.spark.reading``, what each Spark task runs) on a
replicated topic whose leader was killed: it asks the metadata again, reads the split from the
new leader, and gets every acknowledged record once, in offset order."""

from __future__ import annotations

import pytest

from hpbroker import protocol
from hpbroker.client import Producer
from hpbroker.spark.columns import RECORD_FIELDS, arrow_schema
from hpbroker.spark.planning import OffsetRange
from hpbroker.spark.reading import ReadConfig, read_range

pytestmark = pytest.mark.zookeeper


def test_a_split_is_read_from_the_new_leader_after_the_old_one_is_killed(cluster):
    for broker_id in (0, 1, 2):
        cluster.start(broker_id)
    min_isr = protocol.TopicConfigEntry("min_insync_replicas", "2")
    create = protocol.CreateTopicRequest("sparked", 1, [min_isr], replication_factor=3)
    header, _ = cluster.client(0).request(create, timeout_s=40)
    assert header.error_code == 0, header.error_message
    leader = cluster.wait_for_leaders("sparked", 1, via=0, isr_size=3).partitions[0].leader
    with Producer(cluster.bootstrap(), acks="all", audit_topic=None, linger_ms=5) as producer:
        futures = [producer.send_future("sparked", b"value %d" % i) for i in range(3000)]
        offsets = [f.result(60).offset for f in futures]
    assert offsets == list(range(3000))
    cluster.kill(leader)
    survivors = [b for b in (0, 1, 2) if b != leader]
    # the old leader still leads until its session expires: the reader must get past that
    schema = arrow_schema([name for name, _ in RECORD_FIELDS])
    config = ReadConfig(timeout_ms=60_000, fetch_max_bytes=64 << 10)
    batches = read_range(cluster.bootstrap(*survivors), OffsetRange("sparked", 0, 0, 3000), schema, config)
    rows = [row for batch in batches for row in batch.to_pylist()]
    assert [row["offset"] for row in rows] == list(range(3000))
    assert [row["value"] for row in rows] == [b"value %d" % i for i in range(3000)]
    new_leader = cluster.metadata(survivors[0], "sparked").partitions[0].leader
    assert new_leader in survivors

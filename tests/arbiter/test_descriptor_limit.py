"""The file-descriptor limit with real brokers: a topic that would not fit is refused before it is
saved, a stored topic that does not fit cannot stop the broker, and the soft limit is raised to
the hard one at start.

Under ``RLIMIT_NOFILE`` 256 a worker keeps half (128) for connections and sockets and gives the
rest to partitions at 4 descriptors each: 32 partitions a worker (hpbroker.broker.descriptors).
"""

from __future__ import annotations

import os
import time

import pytest
from harness import Client, start_broker

from hpbroker import protocol
from hpbroker.broker.descriptors import DescriptorBudget
from hpbroker.broker.topics import TopicStore
from hpbroker.errors import InvalidPartitionsError, PartitionNotAvailableError
from hpbroker.records import build_batch, decode_records

LOW = (256, 256)  # (soft, hard) RLIMIT_NOFILE of the broker
WORKERS = 2
PER_WORKER = DescriptorBudget(LOW[0], 1024).partitions_per_worker


def test_the_budget_at_the_test_limit():
    assert PER_WORKER == 32


def produce_and_fetch(client: Client, topic: str, partition: int, value: bytes, timeout_s: float = 20.0):
    """Produce one record (retrying while the partition's worker starts) and read it back."""
    batch = build_batch([value])
    deadline = time.monotonic() + timeout_s
    while True:
        header, response = client.request(protocol.ProduceRequest(topic, partition, payload=batch))
        if header.error_code == 0:
            break
        assert header.error_code == PartitionNotAvailableError.code and time.monotonic() < deadline, header
        time.sleep(0.05)
    header, fetched = client.request(protocol.FetchRequest(topic, partition, response.base_offset, 1 << 20))
    assert header.error_code == 0, header
    assert [record.value for record in decode_records(bytes(fetched.payload))][-1] == value


def create(client: Client, name: str, partitions: int) -> protocol.ResponseHeader:
    header, _ = client.request(protocol.CreateTopicRequest(name, partitions), timeout_s=60)
    return header


@pytest.fixture
def low_limit_broker(tmp_path):
    started = []

    def start(**options):
        broker, port = start_broker(tmp_path / "data", tmp_path / f"broker-{len(started)}.log",
                                    workers=WORKERS, nofile=LOW, **options)
        client = Client(port)
        started.append((broker, client))
        return broker, client

    yield start
    for broker, client in started:
        client.close()
        assert broker.stop() == 0, broker.log()


def test_creating_more_partitions_than_the_descriptor_limit_allows_is_refused_before_anything_is_saved(
        low_limit_broker, tmp_path):
    broker, client = low_limit_broker()
    data_dir = tmp_path / "data"

    started = time.monotonic()
    header = create(client, "bigp", 1000)
    assert header.error_code == InvalidPartitionsError.code, header
    assert time.monotonic() - started < 10  # refused at once, not after the workers tried
    message = header.error_message
    for words in ("'bigp' with 1000 partitions", "would hold 500 partitions",
                  "needs at least 2128 descriptors", "limit (RLIMIT_NOFILE) is 256",
                  f"at most {PER_WORKER} partitions", "LimitNOFILE=", "deploy/hpbroker.service",
                  "ulimit -n"):
        assert words in message, message
    assert "bigp" not in TopicStore(data_dir)
    assert not [name for name in os.listdir(data_dir) if name.startswith("bigp")]

    # Partitions already stored count: 20 a worker fit, 40 more a worker would not.
    assert create(client, "orders", 2 * 20).error_code == 0
    header = create(client, "second", 2 * 20)
    assert header.error_code == InvalidPartitionsError.code
    assert "would hold 40 partitions" in header.error_message
    assert "second" not in TopicStore(data_dir)

    # The broker kept serving all along.
    assert broker.process.poll() is None
    for partition in (0, 1, 39):
        produce_and_fetch(client, "orders", partition, b"after the refusal %d" % partition)
    assert create(client, "third", 2 * 10).error_code == 0
    produce_and_fetch(client, "third", 19, b"a topic that fits")
    assert "Too many open files" not in broker.log()
    assert "file-descriptor limit (RLIMIT_NOFILE): 256 (hard limit 256)" in broker.log()


def test_a_stored_topic_too_big_for_the_limit_does_not_stop_the_broker(low_limit_broker, tmp_path):
    (tmp_path / "data").mkdir()
    store = TopicStore(tmp_path / "data")  # as an older version, or a higher limit, left it
    store.create("abig", 2000)  # sorts first: it must not take the descriptors of the others
    store.create("orders", 4)
    del store

    broker, client = low_limit_broker()  # every worker serves
    assert "the topics hold up to 1002 partitions per worker" in broker.log()
    assert broker.log().count("970 partitions not opened for lack of file descriptors (abig: 970)") == 2
    for partition in range(4):
        produce_and_fetch(client, "orders", partition, b"served %d" % partition)

    header, _ = client.request(protocol.ProduceRequest("abig", 1999, payload=build_batch([b"x"])))
    assert header.error_code == PartitionNotAvailableError.code, header
    for words in ("abig-1999 is not open on this broker", "file descriptors", "LimitNOFILE=", "ulimit -n"):
        assert words in header.error_message, header.error_message
    header, _ = client.request(protocol.FetchRequest("abig", 1999, 0, 1 << 20))
    assert header.error_code == PartitionNotAvailableError.code, header
    # What fits is served: each worker opened the small topic first, then what was left of the big one.
    produce_and_fetch(client, "abig", 0, b"within the limit")
    assert "Too many open files" not in broker.log()

    # And it starts again the same way.
    client.close()
    assert broker.stop() == 0, broker.log()
    broker, client = low_limit_broker()
    produce_and_fetch(client, "orders", 3, b"after a restart")

    # Deleting the topic deletes what was opened and forgets the rest; then a topic that fits can be made.
    header, _ = client.request(protocol.DeleteTopicRequest("abig"), timeout_s=60)
    assert header.error_code == 0, header
    assert "abig" not in TopicStore(tmp_path / "data")
    assert not [name for name in os.listdir(tmp_path / "data") if name.startswith("abig")]
    assert create(client, "wide", 2 * 25).error_code == 0
    produce_and_fetch(client, "wide", 49, b"room again")


def test_the_soft_limit_is_raised_to_the_hard_one_at_start(tmp_path):
    broker, port = start_broker(tmp_path / "data", tmp_path / "broker.log", workers=WORKERS,
                                nofile=(256, 4096))
    client = Client(port)
    try:
        broker.wait_for_log(r"file-descriptor limit \(RLIMIT_NOFILE\): 4096, raised from 256 "
                            r"\(hard limit 4096\)")
        broker.wait_for_log(r"a worker holds at most 752 partitions")
        # 100 partitions a worker: refused under the soft limit it started with, fine under the raised one.
        assert create(client, "wide", 2 * 100).error_code == 0
        produce_and_fetch(client, "wide", 199, b"fits under the raised limit")
        with open(f"/proc/{broker.process.pid}/limits") as f:
            line = next(line for line in f if line.startswith("Max open files"))
        assert line.split()[3:5] == ["4096", "4096"], line
    finally:
        client.close()
        assert broker.stop() == 0, broker.log()

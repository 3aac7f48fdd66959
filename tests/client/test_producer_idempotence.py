"""The idempotent producer against real brokers: a retry stores one copy (the broker answers a
stored request with its offsets), several requests in flight per partition keep order and one
copy through lost connections and a broker restart, errors 20/21/22 fail the records and the
producer goes on with a new id, and acks=0 or enable_idempotence=False behave as before."""

from __future__ import annotations

import threading
import time
from contextlib import closing

import pytest
from harness import wait_until
from test_producer_faults import OwnBroker, read_partition

from hpbroker import protocol
from hpbroker.client import idempotent_sending
from hpbroker.client.connection import BrokerConnection
from hpbroker.client.idempotence import IN_FLIGHT, UNKNOWN_PRODUCER_ID_RETRY_S
from hpbroker.client.producer import Producer, ProducerConfig, _Sender
from hpbroker.errors import (
    CoordinationError,
    OutOfOrderSequenceError,
    ProducerFencedError,
    UnknownProducerIdError,
)
from hpbroker.records import build_batch, read_header, scan_batches


def create_topic(connection, topic: str, partitions: int = 1, **configs) -> None:
    entries = [protocol.TopicConfigEntry(name, str(value)) for name, value in configs.items()]
    connection.call(protocol.CreateTopicRequest(topic, partitions, entries))


def headers_of(connection, topic: str, partition: int = 0) -> list:
    fetch = protocol.FetchRequest(topic, partition, 0, max_bytes=4 << 20, max_wait_ms=0)
    payload = connection.call(fetch).payload
    return [read_header(payload, position) for position in scan_batches(payload).positions]


@pytest.fixture
def own_broker(tmp_path):
    broker = OwnBroker(tmp_path)
    yield broker
    broker.process.stop()


def test_idempotence_is_on_by_default_with_acks_1_and_off_with_acks_0():
    assert ProducerConfig().idempotent and ProducerConfig().max_in_flight == 5
    assert not ProducerConfig(acks=0).idempotent and ProducerConfig(acks=0).max_in_flight == 1
    assert ProducerConfig(enable_idempotence=False, max_in_flight_requests_per_partition=5).max_in_flight == 1
    assert ProducerConfig(max_in_flight_requests_per_partition=1).max_in_flight == 1
    with pytest.raises(ValueError, match="enable_idempotence=True needs acks=1"):
        ProducerConfig(acks=0, enable_idempotence=True)
    for bad in (0, 6, True, 2.0):
        with pytest.raises(ValueError, match="max_in_flight_requests_per_partition"):
            ProducerConfig(max_in_flight_requests_per_partition=bad)
    with pytest.raises(ValueError, match="enable_idempotence"):
        ProducerConfig(enable_idempotence=1)


def test_batches_carry_the_producer_identity_and_sequences_from_0(bootstrap, connection, topic_name):
    create_topic(connection, topic_name)
    with Producer(bootstrap, linger_ms=0, audit_topic=None) as producer:
        assert producer.producer_id == -1  # asked for with the first records
        first = producer.send_future(topic_name, b"a").result(10)
        producer.send_many(topic_name, [b"b", b"c"])
        producer.flush(10)
        assert producer.producer_id >= 0 and producer.producer_epoch == 0
        assert not first.deduplicated
        headers = headers_of(connection, topic_name)
        assert all(h.idempotent and h.producer_id == producer.producer_id and h.producer_epoch == 0
                   for h in headers)
        assert [h.base_sequence for h in headers] == [0, 1]
        assert producer.metrics["records_acknowledged"] == 3
        assert producer.metrics["records_deduplicated"] == 0


def test_a_retry_after_a_lost_response_stores_one_copy(bootstrap, connection, topic_name):
    """The measured case: a topic that flushes every 3 s and a producer that waits 1 s for an
    answer.  Every request times out at least once and is sent again while its first copy waits
    for the flush; the broker answers the copies with the first one's offsets."""
    create_topic(connection, topic_name, flush_ms=3000)
    with Producer(bootstrap, linger_ms=5, batch_bytes=4096, request_timeout_ms=1000, retry_backoff_ms=50,
                  retry_backoff_max_ms=200, delivery_timeout_ms=60_000, audit_topic=None) as producer:
        futures = [producer.send_future(topic_name, b"%05d" % i) for i in range(500)]
        producer.flush(60)
        metrics = producer.metrics
    results = [future.result(0) for future in futures]
    assert [r.offset for r in results] == list(range(500))
    assert metrics["retries"] > 0 and metrics["records_deduplicated"] > 0
    assert sum(r.deduplicated for r in results) == metrics["records_deduplicated"]
    records = read_partition(connection, topic_name, 0)
    assert [r.value for r in records] == [b"%05d" % i for i in range(500)]


def stream(producer: Producer, topic: str, partitions: int, duration_s: float, fault) -> list:
    """Send keyed records from a thread for ``duration_s`` (bounded), calling ``fault()`` meanwhile."""
    futures = []
    stop = threading.Event()

    def produce():
        i = 0
        while not stop.is_set() and i < 200_000:
            futures.append(producer.send_future(topic, b"%07d" % i, key=b"%d" % (i % partitions)))
            i += 1
            if i % 100 == 0:
                time.sleep(0.001)

    sender = threading.Thread(target=produce)
    sender.start()
    try:
        fault(duration_s)
    finally:
        stop.set()
        sender.join(10)
    producer.flush(60)
    return futures


def check_stored_once_in_order(connection, topic: str, partitions: int, futures: list) -> None:
    acknowledged = {}
    for i, future in enumerate(futures):
        metadata = future.result(0)  # none fails
        acknowledged[metadata.partition, metadata.offset] = b"%07d" % i
    assert len(acknowledged) == len(futures), "two records acknowledged at one offset"
    for partition in range(partitions):
        values = [r.value for r in read_partition(connection, topic, partition)]
        assert len(values) == len(set(values)), "a record is stored twice"
        assert values == sorted(values), "records stored out of send order"
        assert [acknowledged[p, o] for p, o in sorted(acknowledged) if p == partition] == values


@pytest.fixture
def in_flight_peak(monkeypatch):
    """The most requests of one partition seen in flight at once (proof of pipelining)."""
    peak = [0]
    send = _Sender._send

    def counting_send(self, request, now):
        send(self, request, now)
        window = self._windows.get(request.queue)
        if window is not None:
            peak[0] = max(peak[0], sum(r.state == IN_FLIGHT for r in window.requests))

    monkeypatch.setattr(_Sender, "_send", counting_send)
    return peak


def test_pipelined_requests_keep_order_and_one_copy_through_lost_connections(
        bootstrap, connection, topic_name, in_flight_peak):
    """Up to 5 requests per partition in flight; every 100 ms the producer takes its connection for
    lost (its requests are retried while the broker still serves the first attempts, so most
    retries are duplicates and some arrive behind a gap: error 20, retried in order)."""
    partitions = 2
    create_topic(connection, topic_name, partitions)
    producer = Producer(bootstrap, linger_ms=0, batch_bytes=2048, retry_backoff_ms=10,
                        retry_backoff_max_ms=100, delivery_timeout_ms=60_000, audit_topic=None)

    def drop_connections(duration_s):
        deadline = time.monotonic() + duration_s
        while time.monotonic() < deadline:
            time.sleep(0.1)
            producer._sender.call(lambda sender: sender._connection_lost(sender.links.bootstrap), 10)

    try:
        futures = stream(producer, topic_name, partitions, 2.0, drop_connections)
        metrics = producer.metrics
    finally:
        producer.close(10)
    assert in_flight_peak[0] >= 2, "never more than one request in flight per partition"
    assert metrics["retries"] > 0 and metrics["records_failed"] == 0
    assert metrics["records_deduplicated"] > 0
    check_stored_once_in_order(connection, topic_name, partitions, futures)


def test_pipelined_requests_keep_order_and_one_copy_through_a_broker_restart(own_broker, topic_name):
    partitions = 2
    with closing(own_broker.connection()) as connection:
        create_topic(connection, topic_name, partitions)
    producer = Producer(f"127.0.0.1:{own_broker.port}", linger_ms=0, batch_bytes=2048, retry_backoff_ms=50,
                        delivery_timeout_ms=60_000, request_timeout_ms=5000, audit_topic=None)

    def restart(duration_s):
        time.sleep(duration_s / 2)
        own_broker.stop()
        own_broker.start()
        time.sleep(duration_s / 2)

    try:
        futures = stream(producer, topic_name, partitions, 1.0, restart)
        identity = producer.producer_id
    finally:
        producer.close(10)
    assert identity >= 0
    with closing(own_broker.connection()) as connection:
        check_stored_once_in_order(connection, topic_name, partitions, futures)


def wait_for_new_identity(producer: Producer, old_id: int) -> None:
    wait_until(lambda: producer.producer_id not in (-1, old_id), 10, what="a new producer id")


def test_an_unknown_producer_id_fails_the_records_and_a_new_id_follows(bootstrap, connection, topic_name):
    create_topic(connection, topic_name)
    with Producer(bootstrap, linger_ms=0, audit_topic=None) as producer:
        producer.send_future(topic_name, b"first").result(10)
        never_issued = 2**62

        def take_a_bogus_identity(sender):
            sender._producer.set_producer_identity(never_issued, 0)
            sender.identity.producer_id = never_issued
            sender.identity.obtained_s -= UNKNOWN_PRODUCER_ID_RETRY_S  # not fresh: error 22 is final

        producer._sender.call(take_a_bogus_identity, 10)
        with pytest.raises(UnknownProducerIdError):
            producer.send_future(topic_name, b"refused").result(10)
        wait_for_new_identity(producer, never_issued)
        assert producer.send_future(topic_name, b"after").result(10).offset == 1
        assert producer.metrics["producer_id_resets"] == 1
    assert [r.value for r in read_partition(connection, topic_name, 0)] == [b"first", b"after"]


def test_a_fenced_epoch_fails_the_records_and_a_new_id_follows(bootstrap, connection, topic_name):
    """Another incarnation bumps the producer's epoch and writes: the old epoch is fenced (21)."""
    create_topic(connection, topic_name)
    with Producer(bootstrap, linger_ms=0, audit_topic=None) as producer:
        producer.send_future(topic_name, b"first").result(10)
        old_id, old_epoch = producer.producer_id, producer.producer_epoch
        bumped = connection.call(protocol.InitProducerIdRequest(old_id, old_epoch))
        assert (bumped.producer_id, bumped.producer_epoch) == (old_id, old_epoch + 1)
        connection.call(protocol.ProduceRequest(topic_name, 0, 1, 5000, build_batch(
            [b"usurper"], producer="other", base_sequence=0, producer_id=old_id,
            producer_epoch=old_epoch + 1)))
        with pytest.raises(ProducerFencedError):
            producer.send_future(topic_name, b"fenced").result(10)
        wait_for_new_identity(producer, old_id)
        assert producer.send_future(topic_name, b"after").result(10).offset == 2
    assert [r.value for r in read_partition(connection, topic_name, 0)] == [b"first", b"usurper", b"after"]


def test_a_sequence_gap_fails_the_records_and_a_new_id_follows(bootstrap, connection, topic_name):
    """Someone else writes with the producer's identity (sequences 1..2): the producer's next
    batch (sequences 1..3, flushed together) lies inside no stored run (it overlaps the other
    writer's end) and does not follow it: error 20."""
    create_topic(connection, topic_name)
    with Producer(bootstrap, linger_ms=60_000, audit_topic=None) as producer:
        first = producer.send_future(topic_name, b"first")
        producer.flush(10)
        assert first.result(0).offset == 0
        pid, epoch = producer.producer_id, producer.producer_epoch
        connection.call(protocol.ProduceRequest(topic_name, 0, 1, 5000, build_batch(
            [b"x", b"y"], producer="other", base_sequence=1, producer_id=pid, producer_epoch=epoch)))
        refused = [producer.send_future(topic_name, b"out of order %d" % i) for i in range(3)]
        producer.flush(10)  # one batch: linger_ms keeps it open until the flush
        assert all(isinstance(future.exception(0), OutOfOrderSequenceError) for future in refused)
        wait_for_new_identity(producer, pid)
        after = producer.send_future(topic_name, b"after")
        producer.flush(10)
        assert after.result(0).offset == 3
        assert producer.metrics["records_failed"] == 3


@pytest.mark.parametrize("options", [{"enable_idempotence": False}, {"acks": 0}])
def test_without_idempotence_batches_carry_no_identity(bootstrap, connection, topic_name, options):
    create_topic(connection, topic_name)
    with Producer(bootstrap, linger_ms=0, audit_topic=None, **options) as producer:
        producer.send_many(topic_name, [b"a", b"b"])
        producer.flush(10)
        assert producer.producer_id == -1 and not producer.idempotent
    wait_until(lambda: len(read_partition(connection, topic_name, 0)) == 2, 10, what="both records")
    assert not any(h.idempotent for h in headers_of(connection, topic_name))


def test_a_refused_request_is_resent_before_the_ones_behind_it(bootstrap, connection, topic_name, monkeypatch,
                                                                in_flight_peak):
    """Every 7th request goes, on its first attempt, to a partition that does not exist (error 6,
    nothing appended), and its answer is held back until a request sent after it is answered:
    that one arrived with a gap and got error 20, which, behind an unsettled request, is
    retried after it, as sent."""
    from hpbroker.errors import UnknownTopicOrPartitionError

    create_topic(connection, topic_name, 1)
    first_attempts: list[bytes] = []  # payloads sent so far (kept, so that their id()s stay theirs)
    seen: set[int] = set()
    held: list = []  # the answer of a refused request, until an error 20 comes (or 0.5 s passes)
    out_of_order = [0]
    original_send = BrokerConnection.send
    original_response = _Sender._idempotent_response
    original_check = _Sender._check_timeouts

    def refusing_send(self, message, **kwargs):
        if isinstance(message, protocol.ProduceRequest) and id(message.payload) not in seen:
            seen.add(id(message.payload))
            first_attempts.append(message.payload)
            if len(first_attempts) % 7 == 0:
                message = protocol.ProduceRequest(topic_name, 999, message.acks, message.timeout_ms,
                                                  message.payload)
        return original_send(self, message, **kwargs)

    def release(sender, now):
        while held:
            request, response, _since = held.pop()
            original_response(sender, request, response, now)

    def holding_response(self, request, response, now):
        code = response.header.error_code
        if code == UnknownTopicOrPartitionError.code and not held:
            held.append((request, response, now))
            return
        out_of_order[0] += code == OutOfOrderSequenceError.code
        original_response(self, request, response, now)
        if code == OutOfOrderSequenceError.code:
            release(self, now)

    def checking_timeouts(self, now):
        if held and now - held[0][2] > 0.5:  # nothing was sent behind it
            release(self, now)
        original_check(self, now)

    monkeypatch.setattr(BrokerConnection, "send", refusing_send)
    monkeypatch.setattr(_Sender, "_idempotent_response", holding_response)
    monkeypatch.setattr(_Sender, "_check_timeouts", checking_timeouts)
    producer = Producer(bootstrap, linger_ms=0, batch_bytes=2048, retry_backoff_ms=10,
                        retry_backoff_max_ms=50, delivery_timeout_ms=60_000, audit_topic=None)
    try:
        def until_out_of_order(duration_s):
            wait_until(lambda: out_of_order[0] > 0, 10 * duration_s, what="an error 20")
            time.sleep(duration_s)

        futures = stream(producer, topic_name, 1, 1.0, until_out_of_order)
        metrics = producer.metrics
    finally:
        producer.close(10)
    assert out_of_order[0] > 0 and in_flight_peak[0] >= 2
    assert metrics["records_failed"] == 0 and metrics["producer_id_resets"] == 0
    check_stored_once_in_order(connection, topic_name, 1, futures)


def test_records_of_unknown_outcome_fail_and_a_new_id_follows(bootstrap, connection, topic_name):
    """A flush slower than the whole delivery timeout: the request is stored but never answered
    in time, so its records fail saying they may have been stored; the producer takes a new id
    (the old one's next sequence on the partition is unknown) and goes on."""
    create_topic(connection, topic_name, flush_ms=4000)
    with Producer(bootstrap, linger_ms=0, request_timeout_ms=400, delivery_timeout_ms=1200,
                  retry_backoff_ms=50, audit_topic=None) as producer:
        future = producer.send_future(topic_name, b"slow")
        error = future.exception(20)
        assert "not delivered within delivery_timeout_ms 1200" in str(error)
        assert "they may have been stored" in str(error)
        first_id = producer.producer_id
        fast = [protocol.TopicConfigEntry("flush_ms", "1")]
        connection.call(protocol.AlterTopicConfigRequest(topic_name, fast))
        wait_until(lambda: len(read_partition(connection, topic_name, 0)) == 1, 10, what="the first copy")
        assert producer.send_future(topic_name, b"after").result(20).offset == 1
        assert producer.producer_id != first_id and producer.metrics["producer_id_resets"] == 1
    assert [r.value for r in read_partition(connection, topic_name, 0)] == [b"slow", b"after"]


def test_records_waiting_for_a_producer_id_fail_after_the_delivery_timeout(bootstrap, connection, topic_name,
                                                                           held_identity):
    """The broker cannot hand out an id (error 17): the records fail, never sent, after
    delivery_timeout_ms, and once ids are available again the producer sends."""

    create_topic(connection, topic_name)
    refusing = held_identity
    with Producer(bootstrap, linger_ms=0, delivery_timeout_ms=800, retry_backoff_ms=50,
                  retry_backoff_max_ms=100, audit_topic=None) as producer:
        started = time.monotonic()
        error = producer.send_future(topic_name, b"waits").exception(20)
        assert isinstance(error, CoordinationError) and "no producer id" in str(error)
        assert 0.7 < time.monotonic() - started < 10
        assert producer.producer_id == -1
        refusing.clear()
        assert producer.send_future(topic_name, b"sent").result(20).offset == 0
        assert producer.producer_id >= 0
    assert [r.value for r in read_partition(connection, topic_name, 0)] == [b"sent"]


def test_the_first_request_of_a_producer_id_on_a_partition_goes_alone(bootstrap, connection, topic_name,
                                                                       monkeypatch):
    """A leader accepts any first sequence from a producer id it has no state for: had a second
    request gone out beside the first and the first been lost, the second would be stored
    behind a gap.  So each partition has one request in flight until its first is acknowledged
    (a slow flush keeps that one out while many batches fill up), then pipelines."""
    partitions = 2
    create_topic(connection, topic_name, partitions, flush_ms=400)
    in_flight_before: dict[int, int] = {}  # partition -> most in flight before its first acknowledgement
    in_flight_after: dict[int, int] = {}
    acknowledged: set[int] = set()
    send, respond = _Sender._send, _Sender._idempotent_response

    def counting_send(self, request, now):
        send(self, request, now)
        partition = request.queue.partition
        count = sum(r.state == IN_FLIGHT for r in self._windows[request.queue].requests)
        seen = in_flight_after if partition in acknowledged else in_flight_before
        seen[partition] = max(seen.get(partition, 0), count)

    def noting_response(self, request, response, now):
        if response.header.error_code == 0:
            acknowledged.add(request.queue.partition)
        respond(self, request, response, now)

    monkeypatch.setattr(_Sender, "_send", counting_send)
    monkeypatch.setattr(_Sender, "_idempotent_response", noting_response)
    with Producer(bootstrap, linger_ms=0, batch_bytes=1024, audit_topic=None) as producer:
        futures = []
        for i in range(60):  # 20 batches per partition, sent well within the first flush
            value = b"%07d" % i + b"x" * 300
            futures.append(producer.send_future(topic_name, value, partition=i % partitions))
            if i % 6 == 5:
                time.sleep(0.002)  # the I/O thread drains between the sends
        producer.flush(30)
        for i in range(60, 100):  # now acknowledged there: small requests one after another pipeline
            futures.append(producer.send_future(topic_name, b"%07d" % i, partition=i % partitions))
            time.sleep(0.002)
        producer.flush(30)
        assert producer.metrics["records_failed"] == 0
    assert in_flight_before == {0: 1, 1: 1}
    assert max(in_flight_after.values()) >= 2, "no pipelining once the first request was acknowledged"
    for partition in range(partitions):
        values = [r.value[:7] for r in read_partition(connection, topic_name, partition)]
        assert values == [b"%07d" % i for i in range(partition, 100, partitions)]


def test_waiting_for_a_producer_id_fails_only_records_older_than_the_delivery_timeout(
        bootstrap, connection, topic_name, held_identity):
    """While the broker hands out no id, a batch fails once it has waited delivery_timeout_ms
    itself: one opened later waits on and is sent when an id comes."""
    create_topic(connection, topic_name, 2)
    refusing = held_identity
    with Producer(bootstrap, linger_ms=0, batch_bytes=1024, delivery_timeout_ms=3000, retry_backoff_ms=20,
                  retry_backoff_max_ms=50, audit_topic=None) as producer:
        old = [producer.send_future(topic_name, b"o" * 700, partition=0) for _ in range(2)]  # 2 batches
        time.sleep(2.0)
        young = [producer.send_future(topic_name, b"y" * 700, partition=p) for p in (0, 1)]
        for future in old:
            assert isinstance(future.exception(20), CoordinationError)
        assert not any(future.done() for future in young), "a batch failed before its delivery timeout"
        refusing.clear()
        assert [future.result(20).offset for future in young] == [0, 0]
    assert [r.value for r in read_partition(connection, topic_name, 0)] == [b"y" * 700]


def test_an_unknown_producer_id_is_retried_while_the_id_is_fresh(bootstrap, connection, topic_name,
                                                                  monkeypatch):
    """In a cluster, a broker learns of another broker's new id block through a ZooKeeper watch,
    which may come after a producer got an id from that block: the leader answers error 22 for
    a moment.  The producer retries while its id is fresh, and the records are stored once the
    leader knows the id (here: an id handed to the producer before this broker issued it)."""
    create_topic(connection, topic_name)
    call_init = BrokerConnection.call
    ahead = call_init(connection, protocol.InitProducerIdRequest()).producer_id + 3
    unknown = [0]

    def early_id(self, message, timeout_s=30.0):
        if isinstance(message, protocol.InitProducerIdRequest):
            return protocol.InitProducerIdResponse(ahead, 0)
        return call_init(self, message, timeout_s)

    respond = _Sender._idempotent_response

    def counting_response(self, request, response, now):
        unknown[0] += response.header.error_code == UnknownProducerIdError.code
        respond(self, request, response, now)

    monkeypatch.setattr(BrokerConnection, "call", early_id)
    monkeypatch.setattr(_Sender, "_idempotent_response", counting_response)
    with Producer(bootstrap, linger_ms=0, retry_backoff_ms=20, retry_backoff_max_ms=100,
                  audit_topic=None) as producer:
        future = producer.send_future(topic_name, b"early")
        wait_until(lambda: unknown[0] >= 2, 10, what="error 22, retried")
        issued = -1
        while issued < ahead:  # this broker issues ids up to the producer's
            issued = call_init(connection, protocol.InitProducerIdRequest()).producer_id
        metadata = future.result(10)
        assert metadata.offset == 0 and producer.producer_id == ahead
        assert producer.metrics["producer_id_resets"] == 0 and producer.metrics["records_failed"] == 0
    assert [r.value for r in read_partition(connection, topic_name, 0)] == [b"early"]


@pytest.mark.parametrize(("options", "version"), [({}, 1), ({"enable_idempotence": False}, 0),
                                                  ({"acks": 0}, 0)])
def test_produce_requests_are_version_0_unless_idempotent(bootstrap, connection, topic_name, monkeypatch,
                                                          options, version):
    """A producer that is not idempotent sends what it sent before idempotence: Produce version 0
    (and reads version 0 answers); an idempotent one version 1, whose answer says duplicate."""
    create_topic(connection, topic_name)
    encode = protocol.encode_request
    sent = []

    def capturing_encode(message, correlation_id, client_id="", version=None):
        frames = encode(message, correlation_id, client_id, version)
        if isinstance(message, protocol.ProduceRequest):
            sent.append((message, correlation_id, client_id, frames))
        return frames

    monkeypatch.setattr(protocol, "encode_request", capturing_encode)
    with Producer(bootstrap, linger_ms=0, audit_topic=None, **options) as producer:
        futures = [producer.send_future(topic_name, b"v%d" % i) for i in range(3)]
        producer.flush(10)
    assert [f.result(0).offset for f in futures] == ([0, 1, 2] if options.get("acks") != 0 else [-1] * 3)
    assert sent
    for message, _correlation_id, _client_id, frames in sent:
        header, decoded = protocol.decode_request(frames)
        assert header.api_version == version
        assert decoded.payload == message.payload
    wait_until(lambda: len(read_partition(connection, topic_name, 0)) == 3, 10, what="the records")


MANY_BATCHES = 12  # due at once, in one request: more batches than the leader remembers runs


@pytest.fixture
def held_identity(monkeypatch):
    """While set, the broker hands out no producer id (error 17): batches pile up, all due."""
    call = BrokerConnection.call
    refusing = threading.Event()
    refusing.set()

    def refusing_call(self, message, timeout_s=30.0, **options):
        if isinstance(message, protocol.InitProducerIdRequest) and refusing.is_set():
            raise CoordinationError("no producer id block at hand")
        return call(self, message, timeout_s, **options)

    monkeypatch.setattr(BrokerConnection, "call", refusing_call)
    return refusing


@pytest.fixture
def sent_requests(monkeypatch):
    """Every produce request handed to a connection: (request, its batch count, attempt number)."""
    sent = []
    send = _Sender._send

    def noting_send(self, request, now):
        send(self, request, now)
        if request.state == IN_FLIGHT:
            sent.append((request, len(request.batches), request.attempts))

    monkeypatch.setattr(_Sender, "_send", noting_send)
    return sent


def send_many_batches_at_once(producer: Producer, topic: str, held_identity: threading.Event) -> list:
    """MANY_BATCHES records of one batch each (batch_bytes 1024), all due before the producer
    has an id; then the id comes and the partition drains them together."""
    futures = [producer.send_future(topic, b"%04d" % i + b"x" * 600) for i in range(MANY_BATCHES)]
    assert producer.unfinished_batches == MANY_BATCHES and producer.producer_id == -1
    held_identity.clear()
    return futures


def test_batches_due_at_once_go_as_one_request_acknowledged_once(bootstrap, connection, topic_name,
                                                                  held_identity, sent_requests):
    """A partition's due batches go in one request (up to max_request_bytes), as without
    idempotence: the leader remembers runs of batches, and a request lies inside one."""
    create_topic(connection, topic_name)
    with Producer(bootstrap, linger_ms=0, batch_bytes=1024, retry_backoff_ms=20, retry_backoff_max_ms=50,
                  audit_topic=None) as producer:
        futures = send_many_batches_at_once(producer, topic_name, held_identity)
        results = [future.result(20) for future in futures]
        metrics = producer.metrics
    assert [(count, attempt) for _request, count, attempt in sent_requests] == [(MANY_BATCHES, 1)]
    assert [r.offset for r in results] == list(range(MANY_BATCHES))
    assert not any(r.deduplicated for r in results)
    assert (metrics["records_acknowledged"], metrics["retries"]) == (MANY_BATCHES, 0)
    headers = headers_of(connection, topic_name)
    assert [h.base_sequence for h in headers] == list(range(MANY_BATCHES))
    assert len(read_partition(connection, topic_name, 0)) == MANY_BATCHES


def test_a_request_of_many_batches_resent_after_a_lost_connection_is_a_duplicate(
        bootstrap, connection, topic_name, held_identity, sent_requests):
    """The request of MANY_BATCHES batches waits for a slow flush; its connection is taken for
    lost and the same bytes go again: the leader finds the whole request inside the producer's
    run and answers with the first copy's offsets, not appended twice."""
    create_topic(connection, topic_name, flush_ms=1500)
    with Producer(bootstrap, linger_ms=0, batch_bytes=1024, retry_backoff_ms=20, retry_backoff_max_ms=50,
                  delivery_timeout_ms=60_000, audit_topic=None) as producer:
        futures = send_many_batches_at_once(producer, topic_name, held_identity)
        wait_until(lambda: sent_requests, 10, what="the request in flight")
        producer._sender.call(lambda sender: sender._connection_lost(sender.links.bootstrap), 10)
        results = [future.result(20) for future in futures]
        metrics = producer.metrics
    assert [(count, attempt) for _request, count, attempt in sent_requests] == [(MANY_BATCHES, 1),
                                                                               (MANY_BATCHES, 2)]
    assert sent_requests[0][0] is sent_requests[1][0]  # the same request, its same bytes
    assert [r.offset for r in results] == list(range(MANY_BATCHES)) and all(r.deduplicated for r in results)
    assert (metrics["records_acknowledged"], metrics["records_deduplicated"]) == (MANY_BATCHES, MANY_BATCHES)
    assert metrics["records_failed"] == 0 and metrics["producer_id_resets"] == 0
    values = [r.value[:4] for r in read_partition(connection, topic_name, 0)]
    assert values == [b"%04d" % i for i in range(MANY_BATCHES)]


def test_a_final_error_after_an_attempt_of_unknown_outcome_says_records_may_be_stored(
        bootstrap, connection, topic_name, monkeypatch):
    """Someone else has written sequences 1..2 with the producer's identity; the request's first
    attempt is lost on the way (its outcome unknown to the producer): the resend gets error 20,
    final, and the failure says records may have been stored (as a crash that cut the first
    attempt during its flush would leave some)."""
    create_topic(connection, topic_name, partitions=2)
    lost: list[int] = []
    send = BrokerConnection.send

    def losing_send(self, message, **options):
        if isinstance(message, protocol.ProduceRequest) and message.topic == topic_name and not lost:
            lost.append(next(self._ids))  # never sent: no response comes, the attempt times out
            return lost[0]
        return send(self, message, **options)

    with Producer(bootstrap, linger_ms=60_000, request_timeout_ms=1000, retry_backoff_ms=20,
                  audit_topic=None) as producer:
        warm_up = producer.send_future(topic_name, b"takes the producer id", partition=1)
        producer.flush(10)
        warm_up.result(0)
        pid, epoch = producer.producer_id, producer.producer_epoch
        connection.call(protocol.ProduceRequest(topic_name, 0, 1, 5000, build_batch(
            [b"x", b"y"], producer="other", base_sequence=1, producer_id=pid, producer_epoch=epoch)))
        monkeypatch.setattr(BrokerConnection, "send", losing_send)
        futures = [producer.send_future(topic_name, b"r%d" % i, partition=0) for i in range(3)]
        producer.flush(20)
        errors = [future.exception(0) for future in futures]
    assert lost
    assert all(isinstance(e, OutOfOrderSequenceError) for e in errors), errors
    assert all("may have been stored" in str(e) for e in errors), errors


def test_a_partition_idle_for_a_while_sends_its_first_request_alone_again(bootstrap, connection, topic_name,
                                                                          monkeypatch):
    """The leader may forget a quiet producer (producer_id_expiration_ms, retention), and then
    takes any first sequence: after PIPELINE_AFTER_IDLE_S with nothing unsettled, a partition
    sends one request until it is acknowledged again, then pipelines."""
    monkeypatch.setattr(idempotent_sending, "PIPELINE_AFTER_IDLE_S", 0.5)
    create_topic(connection, topic_name, flush_ms=300)
    most = {"before": 0, "after": 0}
    phase = {"acknowledged": True}
    send, respond = _Sender._send, _Sender._idempotent_response

    def counting_send(self, request, now):
        send(self, request, now)
        count = sum(r.state == IN_FLIGHT for r in self._windows[request.queue].requests)
        key = "after" if phase["acknowledged"] else "before"
        most[key] = max(most[key], count)

    def noting_response(self, request, response, now):
        if response.header.error_code == 0:
            phase["acknowledged"] = True
        respond(self, request, response, now)

    monkeypatch.setattr(_Sender, "_send", counting_send)
    monkeypatch.setattr(_Sender, "_idempotent_response", noting_response)

    def burst(producer, start):
        for i in range(start, start + 20):  # small batches, many due while the flush is slow
            producer.send_future(topic_name, b"%07d" % i + b"x" * 300)
            if i % 3 == 2:
                time.sleep(0.002)
        producer.flush(30)

    with Producer(bootstrap, linger_ms=0, batch_bytes=1024, audit_topic=None) as producer:
        first = producer.send_future(topic_name, b"first")
        producer.flush(30)
        first.result(0)
        burst(producer, 0)  # acknowledged just now: pipelines at once
        assert most["after"] >= 2, most
        time.sleep(1.0)  # idle past PIPELINE_AFTER_IDLE_S
        phase["acknowledged"] = False
        most["after"] = 0
        burst(producer, 20)
        assert producer.metrics["records_failed"] == 0
    assert most["before"] == 1, most
    values = [r.value[:7] for r in read_partition(connection, topic_name, 0)]
    assert values == [b"first"[:7]] + [b"%07d" % i for i in range(40)]

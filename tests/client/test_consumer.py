"""The consumer against a real broker: order, seeking, long polls, offsets by time, resets, streams."""

from __future__ import annotations

import threading
import time

import pytest
from harness import create_topic_on, numbered_values, poll_records, produce_values, wait_until

from hpbroker import Consumer, TopicPartition, create_message_streams
from hpbroker.client import fetcher as fetcher_module
from hpbroker.errors import InvalidConfigError, OffsetOutOfRangeError, UnknownTopicOrPartitionError
from hpbroker.records import CODEC_LZ4

# Short long polls keep the tests quick where they wait for nothing to arrive.
FAST = {"fetch_max_wait_ms": 200, "consumer_timeout_ms": 2000}










def test_poll_returns_each_partitions_records_in_offset_order(connection, bootstrap, topic_name):
    create_topic_on(connection, topic_name, 3)
    for round_ in range(3):
        for p in range(3):
            produce_values(connection, topic_name, p, numbered_values(f"p{p}-", 10, round_ * 10))
    with Consumer(bootstrap, auto_offset_reset="earliest", **FAST) as consumer:
        consumer.assign([TopicPartition(topic_name, p) for p in range(3)])
        assert consumer.assignment() == {TopicPartition(topic_name, p) for p in range(3)}
        records = poll_records(consumer, 90)
        for p in range(3):
            mine = [r for r in records if r.partition == p]
            assert [r.offset for r in mine] == list(range(30))
            assert [r.value for r in mine] == numbered_values(f"p{p}-", 30)
            assert all(r.topic == topic_name for r in mine)
            assert consumer.position(TopicPartition(topic_name, p)) == 30
            assert consumer.highwater(TopicPartition(topic_name, p)) == 30
        assert consumer.poll(timeout_ms=0) == {}


def test_records_carry_key_timestamp_headers_and_the_producer_name(connection, bootstrap, topic_name):
    create_topic_on(connection, topic_name, 1)
    produce_values(connection, topic_name, 0, [b"v0", None], keys=[b"k0", None], timestamps=[1_000, 1_005],
            headers=[[("h", b"x"), ("n", None)], None], producer="orders-app", base_sequence=7)
    with Consumer(bootstrap, auto_offset_reset="earliest", **FAST) as consumer:
        consumer.assign([(topic_name, 0)])
        first, second = poll_records(consumer, 2)
    assert (first.topic, first.partition, first.offset, first.timestamp) == (topic_name, 0, 0, 1_000)
    assert (first.key, first.value, first.headers) == (b"k0", b"v0", (("h", b"x"), ("n", None)))
    assert (first.producer, first.sequence) == ("orders-app", 7)
    assert (second.key, second.value, second.headers, second.timestamp) == (None, None, (), 1_005)


def test_compressed_batches_are_decoded_like_plain_ones(connection, bootstrap, topic_name):
    create_topic_on(connection, topic_name, 1)
    produce_values(connection, topic_name, 0, numbered_values("plain", 5))
    produce_values(connection, topic_name, 0, [b"x" * 200] * 50, compression=CODEC_LZ4)
    produce_values(connection, topic_name, 0, numbered_values("plain", 5, 5))
    with Consumer(bootstrap, auto_offset_reset="earliest", **FAST) as consumer:
        consumer.assign([(topic_name, 0)])
        consumer.seek(TopicPartition(topic_name, 0), 20)  # into the middle of the compressed batch
        records = poll_records(consumer, 40)
    assert [r.offset for r in records] == list(range(20, 60))
    assert [r.value for r in records] == [b"x" * 200] * 35 + numbered_values("plain", 5, 5)


def test_iteration_yields_every_record_in_order_and_position_is_exact_mid_list(connection, bootstrap,
                                                                              topic_name):
    create_topic_on(connection, topic_name, 2)
    produce_values(connection, topic_name, 0, numbered_values("a", 50))
    produce_values(connection, topic_name, 1, numbered_values("b", 50))
    tp0, tp1 = TopicPartition(topic_name, 0), TopicPartition(topic_name, 1)
    with Consumer(bootstrap, auto_offset_reset="earliest", **FAST) as consumer:
        consumer.assign([tp0, tp1])
        seen = {tp0: [], tp1: []}
        for record in consumer:
            tp = TopicPartition(record.topic, record.partition)
            seen[tp].append(record.offset)
            assert consumer.position(tp) == record.offset + 1
            if len(seen[tp0]) + len(seen[tp1]) == 100:
                break
        assert seen == {tp0: list(range(50)), tp1: list(range(50))}


def test_breaking_out_of_iteration_and_iterating_again_loses_nothing(connection, bootstrap, topic_name):
    create_topic_on(connection, topic_name, 1)
    produce_values(connection, topic_name, 0, numbered_values("v", 30))
    with Consumer(bootstrap, auto_offset_reset="earliest", **FAST) as consumer:
        consumer.assign([(topic_name, 0)])
        offsets = []
        for record in consumer:
            offsets.append(record.offset)
            if len(offsets) == 10:
                break
        assert consumer.position(TopicPartition(topic_name, 0)) == 10
        assert [r.offset for r in consumer.poll()[TopicPartition(topic_name, 0)]] == list(range(10, 30))
        produce_values(connection, topic_name, 0, numbered_values("v", 5, 30))
        offsets += [next(consumer).offset for _ in range(5)]
        assert offsets == list(range(10)) + list(range(30, 35))


@pytest.fixture
def fetched(monkeypatch) -> dict[TopicPartition, int]:
    """Per partition, the offset after the last record its fetcher has taken in (decoded)."""
    seen: dict[TopicPartition, int] = {}
    real_receive = fetcher_module.PartitionFetcher.receive

    def receive(self):
        completed = real_receive(self)
        if getattr(completed, "records", None):
            seen[TopicPartition(self.topic, self.partition)] = completed.records[-1].offset + 1
        return completed

    monkeypatch.setattr(fetcher_module.PartitionFetcher, "receive", receive)
    return seen


def _break_off_with_the_other_partition_fetched(consumer: Consumer, tps: list[TopicPartition],
                                                fetched: dict[TopicPartition, int]):
    """Iterate (pausing at the first record, so that both partitions' responses come in) until,
    in the middle of one partition's records, the other has records fetched and not handed out;
    break off there.  Returns the offsets handed out per partition and the partition being read."""
    got: dict[TopicPartition, list[int]] = {tp: [] for tp in tps}
    for record in consumer:
        tp = TopicPartition(record.topic, record.partition)
        got[tp].append(record.offset)
        other = next(o for o in tps if o != tp)
        if fetched.get(other, 0) > (got[other][-1] + 1 if got[other] else 0):
            return got, tp
        if sum(map(len, got.values())) == 1:
            time.sleep(0.3)
    raise AssertionError(f"the iteration ended after {got}")


@pytest.fixture
def two_partitions(connection, topic_name):
    """Two partitions of 300 records each, in batches of 10."""
    create_topic_on(connection, topic_name, 2)
    for p in range(2):
        for start in range(0, 300, 10):
            produce_values(connection, topic_name, p, numbered_values(f"p{p}-", 10, start))
    return [TopicPartition(topic_name, 0), TopicPartition(topic_name, 1)]


SMALL_FETCHES = {**FAST, "auto_offset_reset": "earliest", "max_partition_fetch_bytes": 1024}


def test_positions_count_only_the_records_handed_out_when_iterating_several_partitions(
        bootstrap, two_partitions):
    with Consumer(bootstrap, **SMALL_FETCHES) as consumer:
        consumer.assign(two_partitions)
        got = {tp: [] for tp in two_partitions}
        for record in consumer:
            got[TopicPartition(record.topic, record.partition)].append(record.offset)
            if sum(map(len, got.values())) == 1:
                time.sleep(0.3)  # both partitions' responses come in at once
            for tp, offsets in got.items():
                assert consumer.position(tp) == (offsets[-1] + 1 if offsets else 0), f"{tp} after {got}"
            if sum(map(len, got.values())) == 400:
                break
        for tp, offsets in got.items():
            assert consumer.position(tp) == (offsets[-1] + 1 if offsets else 0)


def test_records_fetched_for_a_partition_the_iteration_has_not_reached_are_polled_after_a_break(
        bootstrap, two_partitions, fetched):
    with Consumer(bootstrap, **SMALL_FETCHES) as consumer:
        consumer.assign(two_partitions)
        got, _ = _break_off_with_the_other_partition_fetched(consumer, two_partitions, fetched)
        deadline = time.monotonic() + 10
        while any(len(offsets) < 300 for offsets in got.values()) and time.monotonic() < deadline:
            for tp, records in consumer.poll(timeout_ms=200).items():
                assert consumer.position(tp) == records[-1].offset + 1
                got[tp] += [r.offset for r in records]
    assert got == {tp: list(range(300)) for tp in two_partitions}


def test_a_seek_after_a_break_drops_what_was_fetched_for_the_partition(bootstrap, two_partitions, fetched):
    with Consumer(bootstrap, **SMALL_FETCHES) as consumer:
        consumer.assign(two_partitions)
        got, reading = _break_off_with_the_other_partition_fetched(consumer, two_partitions, fetched)
        other = next(tp for tp in two_partitions if tp != reading)
        consumer.seek(other, 0)
        got[other] = []
        for record in consumer:
            got[TopicPartition(record.topic, record.partition)].append(record.offset)
    assert got == {tp: list(range(300)) for tp in two_partitions}


def test_a_partition_assigned_away_after_a_break_hands_out_nothing_more(bootstrap, two_partitions,
                                                                        fetched):
    with Consumer(bootstrap, **SMALL_FETCHES) as consumer:
        consumer.assign(two_partitions)
        got, reading = _break_off_with_the_other_partition_fetched(consumer, two_partitions, fetched)
        other = next(tp for tp in two_partitions if tp != reading)
        handed_out = len(got[other])
        consumer.assign([reading])
        for record in consumer:
            got[TopicPartition(record.topic, record.partition)].append(record.offset)
    assert got[reading] == list(range(300))
    assert len(got[other]) == handed_out, f"{other} handed out records after it was assigned away"


def test_a_fetch_from_the_middle_of_a_batch_starts_at_the_offset_asked_for(connection, bootstrap, topic_name):
    create_topic_on(connection, topic_name, 1)
    produce_values(connection, topic_name, 0, numbered_values("v", 10))
    produce_values(connection, topic_name, 0, numbered_values("v", 10, 10))
    with Consumer(bootstrap, **FAST) as consumer:
        consumer.assign([(topic_name, 0)])
        consumer.seek(TopicPartition(topic_name, 0), 7)
        assert [r.offset for r in poll_records(consumer, 13)] == list(range(7, 20))


def test_seek_rewinds_and_the_records_are_read_again(connection, bootstrap, topic_name):
    create_topic_on(connection, topic_name, 1)
    produce_values(connection, topic_name, 0, numbered_values("v", 20))
    tp = TopicPartition(topic_name, 0)
    with Consumer(bootstrap, auto_offset_reset="earliest", **FAST) as consumer:
        consumer.assign([tp])
        assert [r.value for r in poll_records(consumer, 20)] == numbered_values("v", 20)
        consumer.seek(tp, 15)
        assert consumer.position(tp) == 15
        assert [r.offset for r in poll_records(consumer, 5)] == list(range(15, 20))
        consumer.seek_to_beginning()
        assert consumer.position(tp) == 0
        assert [r.value for r in poll_records(consumer, 20)] == numbered_values("v", 20)


def test_seek_while_iterating_drops_the_rest_of_the_fetched_records(connection, bootstrap, topic_name):
    create_topic_on(connection, topic_name, 1)
    produce_values(connection, topic_name, 0, numbered_values("v", 40))
    tp = TopicPartition(topic_name, 0)
    with Consumer(bootstrap, auto_offset_reset="earliest", **FAST) as consumer:
        consumer.assign([tp])
        offsets = []
        for record in consumer:
            offsets.append(record.offset)
            if record.offset == 3:
                consumer.seek(tp, 30)
            if len(offsets) == 14:
                break
        assert offsets == [0, 1, 2, 3, *range(30, 40)]


def test_seek_to_end_reads_only_new_records_and_a_long_poll_wakes_for_them(connection, bootstrap, topic_name,
                                                                           monkeypatch):
    create_topic_on(connection, topic_name, 1)
    produce_values(connection, topic_name, 0, numbered_values("old", 10))
    tp = TopicPartition(topic_name, 0)
    fetches = []
    real_fetch = fetcher_module.PartitionFetcher.fetch
    monkeypatch.setattr(fetcher_module.PartitionFetcher, "fetch",
                        lambda self, offset: (fetches.append(offset), real_fetch(self, offset)))
    with Consumer(bootstrap, auto_offset_reset="earliest", fetch_max_wait_ms=300) as consumer:
        consumer.assign([tp])
        consumer.seek_to_end(tp)
        assert consumer.position(tp) == 10
        assert consumer.poll(timeout_ms=1000) == {}
        assert 1 <= len(fetches) <= 8, f"{len(fetches)} fetches in a second of waiting: not a long poll"
        producer = threading.Timer(0.3, produce_values, (connection, topic_name, 0, [b"new"]))
        producer.start()
        try:
            record = next(iter(consumer))  # blocks until the record is flushed
        finally:
            producer.join()
        assert (record.offset, record.value) == (10, b"new")


def test_offsets_for_times_finds_the_first_record_at_or_after_each_time(connection, bootstrap, topic_name):
    create_topic_on(connection, topic_name, 2)
    for stamp in (1_000, 2_000, 3_000):
        produce_values(connection, topic_name, 0, numbered_values("v", 5), timestamps=stamp)
    produce_values(connection, topic_name, 1, numbered_values("w", 3), timestamps=[500, 1_500, 2_500])
    tp0, tp1 = TopicPartition(topic_name, 0), TopicPartition(topic_name, 1)
    with Consumer(bootstrap, **FAST) as consumer:
        consumer.assign([tp0, tp1])
        assert consumer.offsets_for_times({tp0: 1_500, tp1: 1_500}) == {tp0: 5, tp1: 1}
        assert consumer.offsets_for_times({tp0: 0, tp1: 2_500}) == {tp0: 0, tp1: 2}
        assert consumer.offsets_for_times({tp0: 3_001, tp1: 99_999}) == {tp0: None, tp1: None}
        assert consumer.beginning_offsets([tp0, tp1]) == {tp0: 0, tp1: 0}
        assert consumer.end_offsets([tp0, tp1]) == {tp0: 15, tp1: 3}
        consumer.seek(tp0, consumer.offsets_for_times({tp0: 2_000})[tp0])
        stamps = [r.timestamp for r in poll_records(consumer, 10) if r.partition == 0]
        assert stamps[:6] == [2_000] * 5 + [3_000]
        with pytest.raises(ValueError, match="ms since the epoch"):
            consumer.offsets_for_times({tp0: -5})


def test_earliest_starts_at_the_log_start_and_resets_there_when_out_of_range(connection, bootstrap,
                                                                             topic_name):
    create_topic_on(connection, topic_name, 1)
    produce_values(connection, topic_name, 0, numbered_values("v", 10))
    tp = TopicPartition(topic_name, 0)
    with Consumer(bootstrap, auto_offset_reset="earliest", **FAST) as consumer:
        consumer.assign([tp])
        assert consumer.position(tp) == 0
        consumer.seek(tp, 1_000)
        assert [r.offset for r in poll_records(consumer, 10)] == list(range(10))


def test_latest_starts_at_the_high_watermark_and_resets_there_when_out_of_range(connection, bootstrap,
                                                                               topic_name):
    create_topic_on(connection, topic_name, 1)
    produce_values(connection, topic_name, 0, numbered_values("v", 10))
    tp = TopicPartition(topic_name, 0)
    with Consumer(bootstrap, auto_offset_reset="latest", **FAST) as consumer:
        consumer.assign([tp])
        assert consumer.position(tp) == 10
        consumer.seek(tp, 1_000)
        assert consumer.poll(timeout_ms=300) == {}
        wait_until(lambda: consumer.poll(timeout_ms=0) == {} and consumer.position(tp) == 10, 5,
                   what="the position to reset to the high watermark")
        produce_values(connection, topic_name, 0, [b"new"])
        assert [(r.offset, r.value) for r in poll_records(consumer, 1)] == [(10, b"new")]


def test_error_policy_raises_out_of_range_with_the_log_bounds(connection, bootstrap, topic_name):
    create_topic_on(connection, topic_name, 1)
    produce_values(connection, topic_name, 0, numbered_values("v", 10))
    tp = TopicPartition(topic_name, 0)
    with Consumer(bootstrap, auto_offset_reset="error", **FAST) as consumer:
        consumer.assign([tp])
        pattern = r"no position.*seek\(\) it first.*0 up to 10"
        with pytest.raises(OffsetOutOfRangeError, match=pattern) as info:
            consumer.poll(timeout_ms=1000)
        assert (info.value.log_start_offset, info.value.log_end_offset) == (0, 10)
        consumer.seek(tp, 25)
        pattern = rf"{topic_name}-0 from offset 25.*0 up to 10"
        with pytest.raises(OffsetOutOfRangeError, match=pattern) as info:
            consumer.poll(timeout_ms=2000)
        assert (info.value.log_start_offset, info.value.log_end_offset) == (0, 10)
        assert consumer.position(tp) == 25, "the position stays for the application to decide"
        consumer.seek(tp, 4)
        assert [r.offset for r in poll_records(consumer, 6)] == list(range(4, 10))


def test_message_streams_spread_partitions_evenly_and_block_when_nothing_is_new(connection, bootstrap,
                                                                               topic_name):
    create_topic_on(connection, topic_name, 5)
    for p in range(5):
        produce_values(connection, topic_name, p, numbered_values(f"p{p}-", 4))
    streams = create_message_streams(bootstrap, topic_name, 2, auto_offset_reset="earliest",
                                     fetch_max_wait_ms=200)
    try:
        assert [[tp.partition for tp in s.partitions] for s in streams] == [[0, 2, 4], [1, 3]]
        results: dict[int, list] = {0: [], 1: []}
        ended: dict[int, BaseException | None] = {}

        def read(index: int) -> None:
            try:
                for record in streams[index]:
                    results[index].append((record.partition, record.offset))
                ended[index] = None
            except BaseException as e:  # noqa: BLE001 - reported by the main thread
                ended[index] = e

        threads = [threading.Thread(target=read, args=(i,)) for i in range(2)]
        for thread in threads:
            thread.start()
        wait_until(lambda: len(results[0]) == 12 and len(results[1]) == 8, 10, what="every record")
        assert sorted(results[0]) == [(p, o) for p in (0, 2, 4) for o in range(4)]
        assert sorted(results[1]) == [(p, o) for p in (1, 3) for o in range(4)]
        time.sleep(0.3)
        assert not ended, "a stream ended instead of waiting for new records"
        produce_values(connection, topic_name, 3, [b"late"])
        wait_until(lambda: (3, 4) in results[1], 10, what="the late record")
        for stream in streams:
            stream.close()
        for thread in threads:
            thread.join(10)
        assert ended == {0: None, 1: None}
    finally:
        for stream in streams:
            stream.close()


def test_message_streams_take_at_most_one_more_partition_than_another(connection, bootstrap, topic_name):
    create_topic_on(connection, topic_name, 7)
    streams = create_message_streams(bootstrap, topic_name, 3)
    try:
        assert sorted(len(s.partitions) for s in streams) == [2, 2, 3]
        assert sorted(tp.partition for s in streams for tp in s.partitions) == list(range(7))
    finally:
        for stream in streams:
            stream.close()
    streams = create_message_streams(bootstrap, topic_name, 9)
    try:
        assert [len(s.partitions) for s in streams] == [1] * 7 + [0, 0]
    finally:
        for stream in streams:
            stream.close()
    with pytest.raises(UnknownTopicOrPartitionError):
        create_message_streams(bootstrap, "no-such-topic", 2)


def test_wakeup_from_another_thread_ends_a_blocked_iteration(connection, bootstrap, topic_name):
    create_topic_on(connection, topic_name, 1)
    with Consumer(bootstrap, fetch_max_wait_ms=5_000) as consumer:
        consumer.assign([(topic_name, 0)])
        threading.Timer(0.3, consumer.wakeup).start()
        assert list(consumer) == []
        assert consumer.poll(timeout_ms=0) == {}


def test_assignment_changes_keep_the_positions_of_kept_partitions(connection, bootstrap, topic_name):
    create_topic_on(connection, topic_name, 2)
    produce_values(connection, topic_name, 0, numbered_values("a", 5))
    produce_values(connection, topic_name, 1, numbered_values("b", 5))
    tp0, tp1 = TopicPartition(topic_name, 0), TopicPartition(topic_name, 1)
    with Consumer(bootstrap, auto_offset_reset="earliest", **FAST) as consumer:
        consumer.assign([tp0])
        assert len(poll_records(consumer, 5)) == 5
        consumer.assign([tp0, tp1])
        assert [(r.partition, r.offset) for r in poll_records(consumer, 5)] == [(1, o) for o in range(5)]
        assert consumer.position(tp0) == 5
        consumer.assign([tp1])
        with pytest.raises(ValueError, match="is not assigned"):
            consumer.position(tp0)
        assert consumer.partitions_for_topic(topic_name) == {0, 1}


def test_a_closed_consumer_refuses_use_and_closing_twice_is_harmless(bootstrap):
    consumer = Consumer(bootstrap)
    consumer.close()
    consumer.close()
    with pytest.raises(RuntimeError, match="closed"):
        consumer.poll()


@pytest.mark.parametrize(("settings", "field"), [
    ({"auto_offset_reset": "smallest"}, "auto_offset_reset"),
    ({"fetch_max_wait_ms": -1}, "fetch_max_wait_ms"),
    ({"max_partition_fetch_bytes": 0}, "max_partition_fetch_bytes"),
    ({"reconnect_timeout_ms": 0}, "reconnect_timeout_ms"),
    ({"consumer_timeout_ms": -5}, "consumer_timeout_ms"),
    ({"group_id": "g"}, "group_id"),
])
def test_bad_settings_are_refused_by_name(settings, field):
    with pytest.raises(InvalidConfigError, match=field):
        Consumer("127.0.0.1:1", **settings)


def test_bad_arguments_get_clear_errors(bootstrap, topic_name):
    with Consumer(bootstrap) as consumer:
        with pytest.raises(ValueError, match="TopicPartition"):
            consumer.assign([("t", -1)])
        consumer.assign([(topic_name, 0)])
        with pytest.raises(ValueError, match="offset must be"):
            consumer.seek(TopicPartition(topic_name, 0), -1)
        with pytest.raises(ValueError, match="is not assigned"):
            consumer.seek(TopicPartition(topic_name, 1), 0)

"""The compiled accumulator alone (pure logic, no broker): what it builds is a valid batch per
FORMAT.md, batches respect batch_bytes, linger, muting and flushes, and bytes are accounted."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

from hpbroker.client._accumulator import RecordAccumulator
from hpbroker.errors import RecordTooLargeError, UnknownTopicOrPartitionError
from hpbroker.records import CODEC_LZ4, CODEC_NONE, decode_records, read_header, validate_batches


class FixedTopics(RecordAccumulator):
    def __init__(self, count: int = 1, name: str = "acc", **options) -> None:
        super().__init__(name, **options)
        self.count = count

    def _topic_partition_count(self, topic: str) -> int:
        return self.count


def drain_all(accumulator: RecordAccumulator):
    return accumulator.drain(float("inf"), 1 << 30)[0]


@pytest.mark.parametrize("codec", [CODEC_NONE, CODEC_LZ4])
def test_payloads_are_valid_batches_that_decode_to_what_was_sent(codec):
    accumulator = FixedTopics(1, "orders-service", codec=codec, batch_bytes=4096)
    sent = []
    for i in range(500):
        key = None if i % 3 else b"k%d" % i
        headers = [("n", b"%d" % i)] if i % 5 == 0 else None
        value = None if i == 7 else b"value %d " % i * 4
        accumulator.send("t", value, key, headers, 1_700_000_000_000 + i)
        sent.append((key, value, tuple(headers or ()), 1_700_000_000_000 + i))
    [(queue, batches)] = drain_all(accumulator)
    payload = accumulator.build_payload(batches)
    scan = validate_batches(payload, max_batch_bytes=4096 if codec == CODEC_NONE else 1 << 20)
    assert scan.batch_count == len(batches) > 1
    records = decode_records(payload)
    assert [(r.key, r.value, r.headers, r.timestamp) for r in records] == sent
    assert {r.producer for r in records} == {"orders-service"}
    headers = [read_header(payload, p) for p in scan.positions]
    assert [h.base_sequence for h in headers] == [b.base_sequence for b in batches]
    assert headers[0].base_sequence == 0 and headers[1].base_sequence == headers[0].record_count
    assert [h.crc for h in headers] == [b.crc for b in batches]
    assert {h.compression for h in headers} == {codec}


def test_no_batch_exceeds_batch_bytes():
    accumulator = FixedTopics(batch_bytes=2000)
    for i in range(300):
        accumulator.send("t", bytes(i % 250))
    [(_, batches)] = drain_all(accumulator)
    assert all(b.length <= 2000 for b in batches)
    payload = accumulator.build_payload(batches)
    validate_batches(payload, max_batch_bytes=2000)
    assert len(decode_records(payload)) == 300


def test_a_record_too_large_for_any_batch_is_refused_and_nothing_changes():
    accumulator = FixedTopics(batch_bytes=1024)
    with pytest.raises(RecordTooLargeError, match="over batch_bytes 1024"):
        accumulator.send("t", bytes(1000))
    assert accumulator.buffered_bytes == 0 and accumulator.unfinished_batches == 0
    accumulator.send("t", bytes(900))  # fits with the 56 + 3-byte header
    assert accumulator.unfinished_batches == 1


def test_open_batches_wait_for_their_linger_time_or_a_flush():
    accumulator = FixedTopics(linger_ms=1000)
    accumulator.send("t", b"v")
    now = time.monotonic()
    ready, due = accumulator.drain(now, 1 << 20)
    assert ready == [] and now < due <= now + 1.001
    accumulator.mark_flush()
    ready, due = accumulator.drain(now, 1 << 20)
    assert [sum(b.record_count for b in batches) for _, batches in ready] == [1]
    assert due == float("inf")


def test_a_muted_partition_is_not_drained_until_unmuted():
    accumulator = FixedTopics(linger_ms=0)
    accumulator.send("t", b"one")
    [(queue, batches)] = drain_all(accumulator)
    queue.muted = True
    accumulator.send("t", b"two")
    assert drain_all(accumulator) == []
    queue.muted = False
    [(again, later)] = drain_all(accumulator)
    assert again is queue and later[0].base_sequence == 1


def test_one_request_takes_whole_batches_up_to_max_request_bytes():
    accumulator = FixedTopics(batch_bytes=1024)
    for _ in range(50):
        accumulator.send("t", bytes(100))
    now = time.monotonic()
    ready, due = accumulator.drain(now, 2048)
    [(_, batches)] = ready
    assert len(batches) == 2 and due == now  # more is waiting
    assert sum(b.length for b in batches) <= 2048


def test_buffered_bytes_count_records_until_their_batches_finish():
    accumulator = FixedTopics()
    for _ in range(10):
        accumulator.send("t", bytes(100))
    assert accumulator.buffered_bytes == 10 * 106  # FORMAT.md: a 100-byte value costs 106 bytes
    [(_, batches)] = drain_all(accumulator)
    accumulator.build_payload(batches)
    assert accumulator.buffered_bytes == 1060 and accumulator.unfinished_through(batches[0].batch_id)
    accumulator.finish(batches)
    assert accumulator.buffered_bytes == 0 and not accumulator.unfinished_through(batches[0].batch_id)


def test_waiters_are_kept_only_for_records_that_asked():
    accumulator = FixedTopics()
    marker = object()
    accumulator.send("t", b"a")
    accumulator.send("t", b"b", timestamp=5, callback=marker)
    [(_, [batch])] = drain_all(accumulator)
    assert batch.waiters == [(1, 5, marker)]


def test_send_many_with_one_timestamp_and_keys():
    accumulator = FixedTopics(3)
    assert accumulator.send_many("t", [b"a", b"b", b"c"], keys=[b"x", None, b"x"], timestamp=42) == 3
    records = []
    for _, batches in drain_all(accumulator):
        records += decode_records(accumulator.build_payload(batches))
    assert sorted(r.value for r in records) == [b"a", b"b", b"c"] and {r.timestamp for r in records} == {42}
    with pytest.raises(ValueError, match="2 keys for 3 values"):
        accumulator.send_many("t", [b"a", b"b", b"c"], keys=[b"x", b"y"])


def built_records(accumulator: RecordAccumulator) -> dict[int, tuple[list, list, list]]:
    """Per partition: ``(key, value, timestamp, offset)`` of each record the accumulator built, and
    its batches' record counts and base sequences."""
    built = {}
    for queue, batches in drain_all(accumulator):
        records = decode_records(accumulator.build_payload(batches))
        built[queue.partition] = ([(r.key, r.value, r.timestamp, r.offset) for r in records],
                                  [b.record_count for b in batches], [b.base_sequence for b in batches])
    return built


def byte_rows(count: int, size: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (count, size), dtype=np.uint8)


def rows_in_bytearray(rows: np.ndarray) -> tuple[bytearray, memoryview]:
    """The rows copied into a bytearray, and a memoryview of it cast to the rows' shape."""
    data = bytearray(rows.tobytes())
    return data, memoryview(data).cast("B", rows.shape)


def can_resize(data: bytearray) -> bool:
    """Whether no buffer of ``data`` is exported: resizing a bytearray that has one raises BufferError.
    (A memoryview of it is one: release that first.)"""
    try:
        data.append(0)
    except BufferError:
        return False
    del data[-1]
    return True


@pytest.mark.parametrize("kind", ["ndarray", "memoryview"])
@pytest.mark.parametrize("with_keys", [False, True])
@pytest.mark.parametrize("partition", [None, 2])
def test_send_many_of_a_2d_buffer_builds_the_same_batches_as_a_list(monkeypatch, kind, with_keys, partition):
    """Row i is record i: the batches (partitions chosen by the sticky rule or the keys, batch
    boundaries, records, sequences) are those a list of the same values gives."""
    monkeypatch.setattr(os, "urandom", bytes)  # the same first sticky partition for every accumulator
    rows = byte_rows(700, 37)
    if kind == "ndarray":
        given = rows
    else:
        _, given = rows_in_bytearray(rows)
    keys = [None if i % 7 == 0 else b"key-%d" % (i % 13) for i in range(700)] if with_keys else None
    results = []
    for values in (given, [row.tobytes() for row in rows]):
        accumulator = FixedTopics(4, batch_bytes=2048)
        assert accumulator.send_many("t", values, keys, partition=partition, timestamp=1_700_000_000) == 700
        assert accumulator.send_many("t", values[:5], None if keys is None else keys[:5], partition=partition,
                                     timestamp=1_700_000_001) == 5
        results.append((built_records(accumulator), accumulator.buffered_bytes))
    (from_rows, buffered), (from_list, _) = results
    assert from_rows == from_list and buffered > 0
    values = sorted(value for records, _, _ in from_rows.values() for _, value, _, _ in records)
    assert values == sorted([row.tobytes() for row in rows] + [row.tobytes() for row in rows[:5]])
    assert sum(len(counts) for _, counts, _ in from_rows.values()) > 10
    if partition is not None:
        assert set(from_rows) == {partition}
    elif not with_keys:
        assert len(from_rows) == 4  # sticky: full batches move the records on


def test_send_many_of_a_2d_buffer_without_rows_or_with_empty_rows():
    accumulator = FixedTopics()
    assert accumulator.send_many("t", np.zeros((0, 10), np.uint8)) == 0
    assert accumulator.buffered_bytes == 0 and accumulator.unfinished_batches == 0
    assert accumulator.send_many("t", np.zeros((3, 0), np.uint8), timestamp=5) == 3
    [(records, _, _)] = built_records(accumulator).values()
    assert [(value, timestamp) for _, value, timestamp, _ in records] == [(b"", 5)] * 3  # empty, not null


@pytest.mark.parametrize("values", [b"abc", bytearray(b"abc"), memoryview(b"abc"), "abc",
                                    np.arange(3, dtype=np.uint8), np.zeros((), np.uint8)],
                         ids=["bytes", "bytearray", "memoryview", "str", "ndarray-1d", "ndarray-0d"])
def test_send_many_refuses_a_bytes_like_object_itself(values):
    accumulator = FixedTopics()
    name = type(values).__name__
    with pytest.raises(TypeError, match=r"^values must be a sequence of bytes-like objects or a 2-D "
                                        rf"C-contiguous buffer \(rows are values\), not {name}$"):
        accumulator.send_many("t", values)
    assert accumulator.buffered_bytes == 0 and accumulator.unfinished_batches == 0


@pytest.mark.parametrize("values", [
    np.arange(24, dtype=np.uint8).reshape(8, 3)[::2],  # rows each contiguous, not back to back
    np.arange(24, dtype=np.uint8).reshape(4, 6)[:, :3],
    np.arange(8, dtype=np.int16).reshape(4, 2),  # 2-byte items: each row's bytes
    np.array([b"a", b"bc"]),  # fixed-size bytes (format "2s")
    np.array([b"a", b"b"]),  # one-byte strings (format "1s"), not plain bytes
    np.arange(12, dtype=np.uint8).reshape(2, 3, 2),  # 3-D: each 2-D item is one value
], ids=["every-other-row", "column-slice", "int16", "fixed-bytes", "one-byte-strings", "3-d"])
def test_send_many_reads_any_other_buffer_as_a_sequence_as_before(values):
    """Only a 2-D C-contiguous buffer of bytes takes the row path; the rest are sequences whose
    items are the values, as when ``send_many`` made a list of them."""
    accumulator, expected = FixedTopics(), FixedTopics()
    assert accumulator.send_many("t", values, timestamp=1) == len(values)
    items = [item.tobytes() if isinstance(item, np.ndarray) else bytes(item) for item in values]
    expected.send_many("t", items, timestamp=1)
    got = [value for records, _, _ in built_records(accumulator).values() for _, value, _, _ in records]
    want = [value for records, _, _ in built_records(expected).values() for _, value, _, _ in records]
    assert got == want and len(got) == len(values)


def test_send_many_still_reads_an_array_of_objects_as_a_sequence():
    accumulator = FixedTopics()
    assert accumulator.send_many("t", np.array([b"ab", None, b"c"], dtype=object), timestamp=1) == 3
    [(records, _, _)] = built_records(accumulator).values()
    assert [value for _, value, _, _ in records] == [b"ab", None, b"c"]


def test_send_many_of_a_2d_buffer_refuses_what_a_list_refuses_and_releases_it():
    data, rows = rows_in_bytearray(byte_rows(3, 1000))
    accumulator = FixedTopics(batch_bytes=1024)
    with pytest.raises(ValueError, match="2 keys for 3 values"):
        accumulator.send_many("t", rows, keys=[b"x", b"y"])
    with pytest.raises(RecordTooLargeError, match="a 1000-byte value .* over batch_bytes 1024"):
        accumulator.send_many("t", rows)
    with pytest.raises(TypeError, match="timestamp must be an int"):
        accumulator.send_many("t", rows, timestamp=1.5)
    with pytest.raises(UnknownTopicOrPartitionError):
        accumulator.send_many("t", rows, partition=1)
    assert accumulator.buffered_bytes == 0 and accumulator.unfinished_batches == 0
    accumulator.close_for_sends()
    with pytest.raises(RuntimeError, match="closed"):
        accumulator.send_many("t", rows)
    rows.release()  # would raise BufferError if send_many still held a view of it
    assert can_resize(data)


def test_a_2d_buffer_is_released_when_a_key_fails_midway():
    """Rows before the bad key are appended (as from a list); the buffer is let go all the same."""
    source = byte_rows(10, 20)
    data, rows = rows_in_bytearray(source)
    keys = [b"k%d" % i for i in range(10)]
    keys[4] = "k4"
    accumulator = FixedTopics()
    with pytest.raises(TypeError, match="record keys must be bytes-like or None, not str"):
        accumulator.send_many("t", rows, keys, timestamp=1)
    [(records, _, _)] = built_records(accumulator).values()
    assert [(k, v) for k, v, _, _ in records] == [(keys[i], source[i].tobytes()) for i in range(4)]
    rows.release()
    assert can_resize(data)


def test_a_2d_buffer_stays_held_while_send_many_waits_for_room():
    """The producer's wait for room lets the GIL go: meanwhile the buffer must stay exported (a
    bytearray under it cannot be resized), then be released, also when the wait gives up."""
    data, rows = rows_in_bytearray(byte_rows(200, 100))
    seen = []

    def exported(view: memoryview) -> bool:
        try:
            view.release()
        except BufferError:  # "memoryview has 1 exported buffer"
            return True
        return False

    class Waiting(FixedTopics):
        give_up_after = None

        def _wait_for_room(self) -> None:
            seen.append(exported(rows))
            if len(seen) == self.give_up_after:
                raise TimeoutError("no room")
            for _, batches in drain_all(self):
                self.finish(batches)

    accumulator = Waiting(batch_bytes=1024, buffer_bytes=1024, linger_ms=0)
    assert accumulator.send_many("t", rows) == 200
    assert len(seen) > 10 and all(seen)
    accumulator.give_up_after = len(seen) + 2
    with pytest.raises(TimeoutError):
        accumulator.send_many("t", rows)
    rows.release()
    assert can_resize(data)


def test_send_takes_one_row_of_a_2d_array():
    rows = byte_rows(3, 50)
    accumulator = FixedTopics()
    accumulator.send("t", rows[2], timestamp=1)
    accumulator.send("t", memoryview(rows[1]), timestamp=1)
    [(records, _, _)] = built_records(accumulator).values()
    assert [value for _, value, _, _ in records] == [rows[2].tobytes(), rows[1].tobytes()]


def test_threads_sending_first_to_one_topic_share_one_topic_state(monkeypatch):
    """Drawing a new topic's random first partition lets the GIL go (os.urandom); slowed down
    here so that every thread is inside it at once: each record must still be in a batch the
    accumulator drains."""
    import os
    import threading

    real_urandom = os.urandom

    def slow_urandom(n: int) -> bytes:
        time.sleep(0.02)
        return real_urandom(n)

    monkeypatch.setattr(os, "urandom", slow_urandom)
    accumulator = FixedTopics(4)
    barrier = threading.Barrier(8)

    def first_send(i: int) -> None:
        barrier.wait()
        accumulator.send("t", b"thread %d" % i)

    threads = [threading.Thread(target=first_send, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    ready = drain_all(accumulator)
    assert sum(b.record_count for _, batches in ready for b in batches) == 8
    assert accumulator.unfinished_batches == sum(len(batches) for _, batches in ready)


def test_take_all_returns_every_unfinished_batch_also_one_no_queue_holds():
    """A batch that left its queue (drained) but was never finished, such as one whose request
    could not be built, is still returned when the producer gives up: nothing unfinished can
    outlive the producer's I/O thread."""
    accumulator = FixedTopics(2, linger_ms=0)
    accumulator.send("t", b"drained", partition=0)
    [(queue, [lost])] = drain_all(accumulator)
    accumulator.send("t", b"open", partition=1)
    taken = {q.partition: batches for q, batches in accumulator.take_all()}
    assert set(taken) == {0, 1}
    assert taken[0] == [lost] and lost.queue is queue
    assert [b.record_count for b in taken[1]] == [1]
    for batches in taken.values():
        accumulator.finish(batches)
    assert accumulator.unfinished_batches == 0 and accumulator.buffered_bytes == 0


def test_a_collection_during_send_never_splits_a_record_from_its_batch():
    """Allocating a Python object can start a garbage collection whose finalizers run Python code,
    during which the I/O thread may take the GIL and drain the batches.  Here a gc callback does
    that drain (and settles what it took) at each allocation of one send() in turn: the record
    and its waiter are always delivered together, once, and every byte is accounted for."""
    import gc

    for nth in range(1, 7):
        accumulator = FixedTopics(1, linger_ms=0)
        delivered = []  # (record values, waiters) of every batch drained and finished

        def settle_everything(accumulator=accumulator, delivered=delivered):
            for _, batches in drain_all(accumulator):
                payload = accumulator.build_payload(batches)
                delivered.append(([r.value for r in decode_records(payload)],
                                  [w for b in batches for _, _, w in (b.waiters or ())]))
                accumulator.finish(batches)

        armed = []

        def on_gc(phase, info, armed=armed, settle_everything=settle_everything):
            if armed and phase == "start":
                armed.clear()
                settle_everything()

        accumulator.send("t", b"first")  # an open batch the collection can take
        marker = object()
        threshold = gc.get_threshold()
        gc.callbacks.append(on_gc)
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            keep = [[] for _ in range(200)]  # empties the list free list: a new list is a GC allocation
            gc.set_threshold(gc.get_count()[0] + nth - 1)  # a collection at the nth allocation from now
            armed.append(True)
            gc.enable()
            accumulator.send("t", b"second", callback=marker)
        finally:
            gc.disable()
            armed.clear()
            gc.callbacks.remove(on_gc)
            gc.set_threshold(*threshold)
            if was_enabled:
                gc.enable()
            del keep
        settle_everything()
        values = [v for vs, _ in delivered for v in vs]
        assert values == [b"first", b"second"], (nth, delivered)
        [(_, waiters)] = [(vs, ws) for vs, ws in delivered if b"second" in vs]
        assert waiters == [marker], nth
        assert accumulator.buffered_bytes == 0 and accumulator.unfinished_batches == 0, nth


@pytest.mark.parametrize("value", [5, 300_000_000, 1.5, [1, 2], "text"])
def test_a_header_value_that_is_not_bytes_like_is_refused(value):
    accumulator = FixedTopics()
    with pytest.raises(TypeError, match="header 'count': values must be bytes-like or None, not "):
        accumulator.send("t", b"v", headers=[("count", value)])
    assert accumulator.buffered_bytes == 0 and accumulator.unfinished_batches == 0


@pytest.mark.parametrize("timestamp", [1.7e12, 1_700_000_000_000.0, True, "1700000000000"])
def test_a_timestamp_that_is_not_an_int_is_refused(timestamp):
    accumulator = FixedTopics()
    with pytest.raises(TypeError, match="timestamp must be an int"):
        accumulator.send("t", b"v", timestamp=timestamp)
    with pytest.raises(TypeError, match="timestamp must be an int"):
        accumulator.send_many("t", [b"v"], timestamp=timestamp)
    assert accumulator.buffered_bytes == 0


def test_an_integer_like_timestamp_is_taken():
    class Millis:
        def __index__(self) -> int:
            return 1_700_000_000_123

    accumulator = FixedTopics()
    accumulator.send("t", b"v", timestamp=Millis())
    [(_, batches)] = drain_all(accumulator)
    assert [r.timestamp for r in decode_records(accumulator.build_payload(batches))] == [1_700_000_000_123]


@pytest.mark.parametrize("count", [0, -1, 2**31, 2**32])
def test_a_partition_count_out_of_range_is_refused(count):
    accumulator = FixedTopics(count)
    with pytest.raises(ValueError, match=r"partition count .* must be in \[1, 2147483647\]"):
        accumulator.send("t", b"v")
    with pytest.raises(ValueError, match=r"must be in \[1, 2147483647\]"):
        accumulator.set_partition_count("t", count)

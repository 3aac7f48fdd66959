"""Producer id blocks and the allocator: ids never handed out twice (across allocators sharing
one ZooKeeper, across restarts, with the file store too), the issued-ceiling file written before
an id goes out, InitProducerId's rules, and a refill that never makes the caller wait."""

from __future__ import annotations

import json
import threading
import time

import pytest
from harness import wait_until

from hpbroker.coord.paths import ZkPaths
from hpbroker.coord.producer_ids import (
    BLOCK_FILE_NAME,
    ISSUED_CEILING_FILE_NAME,
    FileBlockStore,
    ProducerIdAllocator,
    ProducerIdBlock,
    ZkBlockStore,
)
from hpbroker.errors import CoordinationError, InvalidRequestError, StorageError
from hpbroker.protocol import MAX_PRODUCER_EPOCH

PATH = ZkPaths().producer_id_block


def ceiling_file(data_dir) -> bytes:
    return (data_dir / ISSUED_CEILING_FILE_NAME).read_bytes()


def started(data_dir, store, broker_id: int = 0, **options) -> ProducerIdAllocator:
    allocator = ProducerIdAllocator(str(data_dir), broker_id, store, **options)
    allocator.start()
    return allocator


# --- the file store --------------------------------------------------------------------------------


def test_the_file_store_takes_consecutive_blocks_from_0_and_keeps_the_newest(tmp_path):
    store = FileBlockStore(str(tmp_path))
    assert store.allocate(4, 1000) == (ProducerIdBlock(4, 0, 1000), None)
    assert store.allocate(4, 1000) == (ProducerIdBlock(4, 1000, 2000), ProducerIdBlock(4, 0, 1000))
    assert json.loads((tmp_path / BLOCK_FILE_NAME).read_bytes()) == {
        "version": 1, "broker": 4, "block_start": 1000, "block_end": 2000}
    assert not list(tmp_path.glob("*.tmp"))


@pytest.mark.parametrize("content", [b"", b"{", b'{"version": 1}', b'{"version": 2, "broker": 0, '
                                     b'"block_start": 0, "block_end": 10}',
                                     b'{"version": 1, "broker": 0, "block_start": 10, "block_end": 10}'])
def test_a_block_file_that_does_not_parse_refuses_every_id(tmp_path, content):
    (tmp_path / BLOCK_FILE_NAME).write_bytes(content)
    with pytest.raises(StorageError, match="producer-id-block"):
        FileBlockStore(str(tmp_path)).allocate(0, 1000)
    allocator = started(tmp_path, FileBlockStore(str(tmp_path)), retry_s=60)
    try:
        with pytest.raises(CoordinationError, match="producer-id-block"):
            allocator.next_id()
    finally:
        allocator.close()


# --- the allocator ---------------------------------------------------------------------------------


def test_ids_are_unique_and_the_ceiling_file_covers_each_before_it_is_returned(tmp_path):
    allocator = started(tmp_path, FileBlockStore(str(tmp_path)), block_size=10)
    try:
        assert ceiling_file(tmp_path) == b"0\n0\n"  # at start: the first block's start
        ids = []
        for _ in range(35):
            ids.append(wait_until(lambda: _try_next(allocator), 10, what="an id") - 1)
            assert ceiling_file(tmp_path) == f"0\n{ids[-1] + 1}\n".encode()
        assert ids == list(range(35))
    finally:
        allocator.close()


def _try_next(allocator: ProducerIdAllocator) -> int | None:
    try:
        return allocator.next_id() + 1  # + 1: wait_until wants a true value
    except CoordinationError:
        return None


def test_a_restarted_allocator_takes_a_fresh_block_and_never_reuses_an_id(tmp_path):
    first = started(tmp_path, FileBlockStore(str(tmp_path)))
    handed = {first.next_id() for _ in range(3)}
    first.close()
    second = started(tmp_path, FileBlockStore(str(tmp_path)))
    try:
        assert ceiling_file(tmp_path) == b"0\n1000\n"  # the rest of the old block is never handed out
        assert second.next_id() == 1000 and handed == {0, 1, 2}
        assert second.is_issued(2) and second.is_issued(999) and not second.is_issued(1001)
    finally:
        second.close()


def test_init_producer_id_gives_new_ids_and_bumps_epochs_of_issued_ones(tmp_path):
    allocator = started(tmp_path, FileBlockStore(str(tmp_path)))
    try:
        assert allocator.init_producer_id(-1, -1) == (0, 0)
        assert allocator.init_producer_id(-1, -1) == (1, 0)
        assert allocator.init_producer_id(0, 0) == (0, 1)
        assert allocator.init_producer_id(0, 7) == (0, 8)
        assert allocator.init_producer_id(1, MAX_PRODUCER_EPOCH) == (2, 0)  # no epoch left: a new id
        assert allocator.init_producer_id(5000, 0) == (3, 0)  # never issued: a new id
        assert ceiling_file(tmp_path) == b"0\n4\n"
        for producer_id, producer_epoch in ((-1, 5), (-1, 0), (-2, -1), (0, -1), (3, -2), (-5, 3)):
            with pytest.raises(InvalidRequestError, match=f"producer id {producer_id} with epoch"):
                allocator.init_producer_id(producer_id, producer_epoch)
        assert allocator.init_producer_id(-1, -1) == (4, 0)  # nothing was used up by the refusals
    finally:
        allocator.close()


class GatedStore:
    """A file store whose allocations after the first wait for ``gate`` (a slow ZooKeeper)."""

    def __init__(self, data_dir: str) -> None:
        self.inner = FileBlockStore(data_dir)
        self.gate = threading.Event()
        self.calls = 0
        self.waiting = threading.Event()

    def allocate(self, broker_id: int, size: int, floor: int = 0):
        self.calls += 1
        if self.calls > 1:
            self.waiting.set()
            assert self.gate.wait(30)
        return self.inner.allocate(broker_id, size, floor)


def test_the_refill_runs_on_its_own_thread_and_an_empty_allocator_refuses_at_once(tmp_path):
    store = GatedStore(str(tmp_path))
    allocator = started(tmp_path, store, block_size=10, prefetch_fraction=0.2)
    try:
        assert [allocator.next_id() for _ in range(8)] == list(range(8))  # 2 left: the refill starts
        assert store.waiting.wait(10)
        assert [allocator.next_id() for _ in range(2)] == [8, 9]
        started_at = time.monotonic()
        with pytest.raises(CoordinationError, match="taking a new block"):
            allocator.next_id()
        assert time.monotonic() - started_at < 1, "the caller must not wait for the store"
        store.gate.set()
        assert wait_until(lambda: _try_next(allocator), 10, what="the next block") - 1 == 10
        assert ceiling_file(tmp_path) == b"0\n11\n"
    finally:
        store.gate.set()
        allocator.close()


def test_a_block_prefetched_in_time_keeps_ids_flowing_without_a_refusal(tmp_path):
    allocator = started(tmp_path, FileBlockStore(str(tmp_path)), block_size=10)
    try:
        ids = []
        for _ in range(9):
            ids.append(allocator.next_id())
        wait_until(lambda: allocator._spare is not None, 10, what="the prefetched block")
        ids += [allocator.next_id() for _ in range(11)]
        assert ids == list(range(20))
    finally:
        allocator.close()


# --- ZooKeeper -------------------------------------------------------------------------------------


def test_the_block_path_hangs_under_the_root():
    assert ZkPaths().producer_id_block == "/hpbroker/producer-id-block"
    assert ZkPaths("/").producer_id_block == "/producer-id-block"


@pytest.mark.zookeeper
def test_racing_brokers_get_blocks_that_never_overlap(sessions, zk):
    """Eight threads on four sessions take 5 blocks each at once: conditional sets make the
    losers read again, so the 40 blocks are distinct and tile 0 .. 40 * size."""
    stores = [ZkBlockStore(sessions().client, PATH) for _ in range(4)]
    taken: list[ProducerIdBlock] = []
    lock = threading.Lock()
    go = threading.Barrier(8)

    def take(broker_id: int) -> None:
        go.wait(10)
        for _ in range(5):
            block, _ = stores[broker_id % 4].allocate(broker_id, 100)
            with lock:
                taken.append(block)

    threads = [threading.Thread(target=take, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not any(t.is_alive() for t in threads)
    spans = sorted((b.block_start, b.block_end) for b in taken)
    assert spans == [(i * 100, (i + 1) * 100) for i in range(40)]
    assert sorted(b.broker_id for b in taken) == sorted(list(range(8)) * 5)
    newest = ProducerIdBlock.from_json(zk.client.get(PATH)[0], PATH)
    assert newest.block_end == 4000


@pytest.mark.zookeeper
def test_two_brokers_on_one_zookeeper_never_hand_out_the_same_id(tmp_path, sessions):
    dirs = [tmp_path / "a", tmp_path / "b"]
    for d in dirs:
        d.mkdir()
    allocators = [started(d, ZkBlockStore(sessions().client, PATH), broker_id=i, block_size=10)
                  for i, d in enumerate(dirs)]
    try:
        ids: list[int] = []
        for _ in range(40):
            for allocator in allocators:
                ids.append(wait_until(lambda a=allocator: _try_next(a), 10, what="an id") - 1)
        assert len(set(ids)) == len(ids) == 80
    finally:
        for allocator in allocators:
            allocator.close()


@pytest.mark.zookeeper
def test_a_broker_restarted_on_zookeeper_takes_a_block_after_every_one_taken(tmp_path, sessions):
    first = started(tmp_path, ZkBlockStore(sessions().client, PATH))
    assert [first.next_id(), first.next_id()] == [0, 1]
    first.close()
    (tmp_path / ISSUED_CEILING_FILE_NAME).unlink()  # not needed: the durable block is in ZooKeeper
    second = started(tmp_path, ZkBlockStore(sessions().client, PATH))
    try:
        assert ceiling_file(tmp_path) == b"0\n1000\n"
        assert second.next_id() == 1000
        assert second.init_producer_id(1, 0) == (1, 1)  # issued before the restart: its epoch bumped
    finally:
        second.close()


@pytest.mark.zookeeper
def test_ids_another_broker_took_count_as_issued_here(tmp_path, sessions):
    """Broker 1's producers may write to broker 0's partitions: broker 0's ceiling file covers
    every block broker 1 takes, as the watch sees it, and broker 0 bumps their epochs."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    zero = started(tmp_path / "a", ZkBlockStore(sessions().client, PATH), broker_id=0, block_size=10)
    one = started(tmp_path / "b", ZkBlockStore(sessions().client, PATH), broker_id=1, block_size=10)
    try:
        assert one.next_id() == 10
        wait_until(lambda: ceiling_file(tmp_path / "a") == b"0\n20\n", 10, what="broker 1's block seen")
        assert zero.init_producer_id(10, 0) == (10, 1)
        assert zero.next_id() == 0  # its own block is still its own
        for _ in range(9):  # broker 1 uses up its block: the next one is seen too
            one.next_id()
        wait_until(lambda: ceiling_file(tmp_path / "a") == b"0\n30\n", 10, what="broker 1's next block")
        assert ceiling_file(tmp_path / "b") == b"0\n20\n"  # its own spare is not issued yet
    finally:
        zero.close()
        one.close()


@pytest.mark.zookeeper
def test_zookeeper_unreachable_is_a_retriable_refusal(tmp_path, sessions):
    session = sessions()
    session.close()
    allocator = started(tmp_path, ZkBlockStore(session.client, PATH), retry_s=60)
    try:
        with pytest.raises(CoordinationError) as info:
            allocator.next_id()
        assert info.value.code == 17 and info.value.retriable
        assert not (tmp_path / ISSUED_CEILING_FILE_NAME).exists()
    finally:
        allocator.close()


@pytest.mark.zookeeper
def test_a_data_directory_moved_between_stores_never_hands_out_an_id_again(tmp_path, sessions):
    """Standalone, then with ZooKeeper (whose blocks start at 0), then standalone again."""
    standalone = started(tmp_path, FileBlockStore(str(tmp_path)))
    assert [standalone.next_id() for _ in range(3)] == [0, 1, 2]
    standalone.close()
    clustered = started(tmp_path, ZkBlockStore(sessions().client, PATH))
    assert clustered.next_id() == 1000  # the block file and the ceiling are the floor
    for _ in range(1500):
        wait_until(lambda: _try_next(clustered), 10, what="an id")
    clustered.close()
    assert ceiling_file(tmp_path) == b"0\n2501\n"
    again = started(tmp_path, FileBlockStore(str(tmp_path)))
    try:
        assert again.next_id() == 2501  # above every id handed out with ZooKeeper
    finally:
        again.close()

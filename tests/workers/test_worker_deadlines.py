"""The deadline queue of waiting requests, in process."""

from __future__ import annotations

from hpbroker.workers.partitions import DeadlineQueue, ProduceWaiter


class _Partition:
    def __init__(self) -> None:
        self.expired: list[ProduceWaiter] = []

    def expire(self, waiter: ProduceWaiter) -> None:
        self.expired.append(waiter)


def test_deadlines_expire_soonest_first_and_skip_answered_waiters():
    queue, partition = DeadlineQueue(), _Partition()
    waiters = [ProduceWaiter(i, print) for i in range(4)]
    for waiter, deadline in zip(waiters, (3.0, 1.0, 2.0, 4.0), strict=True):
        queue.push(deadline, partition, waiter)
    waiters[2].finished = True
    assert queue.next_deadline() == 1.0
    queue.expire(3.5)
    assert [w.correlation_id for w in partition.expired] == [1, 0]
    assert queue.next_deadline() == 4.0


def test_a_stream_of_answered_waiters_does_not_grow_the_queue():
    queue, partition = DeadlineQueue(), _Partition()
    live = ProduceWaiter(-1, print)
    queue.push(10.0, partition, live)
    for i in range(100_000):  # acknowledged long before their 30 s deadline
        waiter = ProduceWaiter(i, print)
        queue.push(30.0 + i, partition, waiter)
        waiter.finished = True
    assert len(queue) <= 2 * DeadlineQueue._MIN_SWEEP + 1
    queue.expire(1e9)
    assert partition.expired == [live]

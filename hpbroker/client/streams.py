"""Message streams, as in the Kafka paper: a topic's partitions spread over ``n`` iterators.

:func:`create_message_streams` gives each stream a :class:`~hpbroker.client.consumer.Consumer` of
its own, with its own connections, so each stream may be iterated by its own thread without
locks or hand-offs; closing a stream closes its consumer, which ends an iteration blocked in
another thread.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from types import TracebackType

from hpbroker.client.consumer import Consumer, TopicPartition
from hpbroker.errors import InvalidConfigError
from hpbroker.records import Record

__all__ = ["MessageStream", "create_message_streams"]


class MessageStream:
    """One of :func:`create_message_streams`' iterators: the records of its partitions, forever
    (blocking while nothing is new) until :meth:`close`.  It owns its consumer."""

    def __init__(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self.consumer = consumer
        self.partitions = partitions

    def __repr__(self) -> str:
        return f"MessageStream({', '.join(map(str, self.partitions)) or 'no partitions'})"

    def __iter__(self) -> Iterator[Record]:
        return iter(self.consumer)

    def __next__(self) -> Record:
        return next(iter(self.consumer))

    def close(self) -> None:
        """Close the stream's consumer; an iteration blocked in another thread ends."""
        self.consumer.close()

    def __enter__(self) -> MessageStream:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()


def create_message_streams(bootstrap: str | Sequence[str], topic: str, n: int,
                           **settings: object) -> list[MessageStream]:
    """``n`` streams over which ``topic``'s partitions are spread evenly (partition ``p`` goes to
    stream ``p % n``), as in the Kafka paper.  Each stream has its own consumer and connections,
    so each may be iterated by its own thread; a stream without partitions blocks forever.
    ``settings`` are the Consumer's (``auto_offset_reset="earliest"`` to read from the start)."""
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be an integer >= 1, got {n!r}")
    if settings.get("columns") is not None:
        raise InvalidConfigError("message streams are iterated record by record; columns= is for a "
                                 "Consumer read with poll()")
    streams: list[MessageStream] = []
    try:
        for index in range(n):
            stream = MessageStream(Consumer(bootstrap, **settings), [])
            streams.append(stream)
            if index == 0:
                partition_count = len(stream.consumer.partitions_for_topic(topic))
            stream.partitions = [TopicPartition(topic, p) for p in range(index, partition_count, n)]
            stream.consumer.assign(stream.partitions)
    except BaseException:
        for stream in streams:
            stream.close()
        raise
    return streams

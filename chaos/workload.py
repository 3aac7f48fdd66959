"""The clients that drive a chaos campaign and write its histories (``chaos.history``'s format).

Three kinds of client, each named as it appears in the history files:

- **producers** ``p-all-<i>`` / ``p-one-<i>``: one process each (multiprocessing's *spawn*
  context, so no ZeroMQ context or kazoo client crosses a fork; the producer is created in the
  child), sending ``<client>-<seq>`` values at a paced rate, partition by partition in turn.
  Each record writes ``invoke`` before ``send`` and ``ack`` or ``fail`` from its callback, which
  runs on the producer's I/O thread and only appends a line.  A partition holds at most
  ``window`` unsettled records: a partition without a leader stops taking records while the
  others go on, so its unavailability shows in its own acknowledgements only.
- **group consumers** ``c-<topic>-<i>``: one process each, members of the group
  ``chaos-<topic>``, writing ``assign`` (the partitions owned) when the consumer starts and at
  every call of its rebalance listener (``on_assign``, ``on_revoke``, which also stands for
  ``on_lost``; inside ``poll``, before the records that poll returns), and ``poll`` per record
  handed out.  The listener is told wherever a partition's position may jump: a partition
  dropped and taken again, also inside one ``poll``, is told as revoked then assigned, and
  restarts from the group's committed offset, which at-least-once delivery allows; between
  two such lines the checker expects each partition's polls to move forward.
- **the drain** ``drain`` (:func:`drain`): after the faults, one consumer assigned every
  partition, reading from the log start to the end offsets; its reads settle what was lost.

Who may call what: the runner makes one :class:`Workload`, calls :meth:`Workload.start`, then
:meth:`Workload.stop_producers` (which returns once every producer settled what it sent, or
was killed at the deadline), :meth:`Workload.stop_consumers`, then :func:`drain`.
:meth:`Workload.close` kills whatever still runs, by PID, and may be called at any time.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import multiprocessing
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chaos.history import HistoryWriter

__all__ = ["DrainResult", "WorkloadConfig", "Workload", "drain", "producer_names", "consumer_names"]

logger = logging.getLogger(__name__)

_POLL_MS = 200  # one consumer poll at most; the stop event is checked between polls
_FLUSH_INTERVAL_S = 0.5  # histories reach the disk at least this often (a killed client loses less)


@dataclass(frozen=True)
class WorkloadConfig:
    """What the clients need; picklable, given to every client process."""

    #: the brokers' front-ends, ``"addr:9092,addr:9092,..."``.
    bootstrap: str
    #: ZooKeeper's connect string (the consumer group's coordination).
    zookeeper: str
    #: ``{name: {"acks": "all" | "1", "partitions": n}}``.
    topics: dict[str, dict[str, Any]]
    #: where the history files go (one per client).
    history_dir: Path
    #: producer processes per topic.
    producers_per_topic: int = 1
    #: records a second each producer sends at most.
    rate_per_producer: float = 300.0
    #: records of one partition unsettled at once, per producer.
    window: int = 500
    #: consumer group members per topic.
    consumers_per_topic: int = 2
    #: the group members' ZooKeeper session timeout (ms).
    session_timeout_ms: int = 6000
    #: a record's delivery timeout (ms): after it the record fails (indeterminate).
    delivery_timeout_ms: int = 60_000
    #: a client stops by itself after this many seconds even if nobody tells it.
    max_duration_s: float = 4 * 3600.0
    #: producer settings added to (or overriding) the defaults, e.g. ``{"linger_ms": 2}``.
    producer_settings: dict[str, Any] = field(default_factory=dict)


def producer_names(config: WorkloadConfig) -> list[tuple[str, str]]:
    """``[(client, topic)]`` of the producers: ``p-all-<i>`` for an acks=all topic, ``p-one-<i>``
    for acks=1 (a topic's name follows when two topics share an acks level)."""
    names, seen = [], set()
    for topic, spec in config.topics.items():
        level = "all" if str(spec["acks"]) in ("all", "-1") else "one"
        prefix = f"p-{level}" if level not in seen else f"p-{level}-{topic}"
        seen.add(level)
        names += [(f"{prefix}-{i}", topic) for i in range(config.producers_per_topic)]
    return names


def consumer_names(config: WorkloadConfig) -> list[tuple[str, str]]:
    """``[(client, topic)]`` of the group members: ``c-<topic>-<i>``."""
    return [(f"c-{topic}-{i}", topic) for topic in config.topics for i in range(config.consumers_per_topic)]


class Workload:
    """The producer and consumer processes of one campaign."""

    def __init__(self, config: WorkloadConfig) -> None:
        self.config = config
        self._context = multiprocessing.get_context("spawn")
        self._stop_producing = self._context.Event()
        self._stop_consuming = self._context.Event()
        self.producers: dict[str, multiprocessing.process.BaseProcess] = {}
        self.consumers: dict[str, multiprocessing.process.BaseProcess] = {}

    def start(self) -> None:
        """Start every client process (returns at once; they connect by themselves)."""
        self.config.history_dir.mkdir(parents=True, exist_ok=True)
        for client, topic in producer_names(self.config):
            self.producers[client] = self._spawn(_produce, client, topic, self._stop_producing)
        for client, topic in consumer_names(self.config):
            self.consumers[client] = self._spawn(_consume, client, topic, self._stop_consuming)

    def _spawn(self, target: Any, client: str, topic: str, stop: Any) -> multiprocessing.process.BaseProcess:
        process = self._context.Process(target=target, args=(self.config, client, topic, stop),
                                        name=client, daemon=True)
        process.start()
        logger.info("client %s (pid %s) started on %s", client, process.pid, topic)
        return process

    def pids(self) -> dict[str, int]:
        """The running clients' PIDs by name."""
        return {name: p.pid for name, p in {**self.producers, **self.consumers}.items()
                if p.pid is not None and p.is_alive()}

    def stop_producers(self, timeout_s: float | None = None) -> list[str]:
        """Tell the producers to stop sending and wait for them to settle what they sent (at most
        ``timeout_s``, by default the delivery timeout plus a margin); killed past it.  Returns the
        clients that had to be killed (their unsettled records stay indeterminate)."""
        self._stop_producing.set()
        bound = timeout_s if timeout_s is not None else self.config.delivery_timeout_ms / 1000 + 30
        return _join_or_kill(self.producers, bound)

    def stop_consumers(self, timeout_s: float = 30.0) -> list[str]:
        """Tell the group members to leave (committing) and wait at most ``timeout_s``."""
        self._stop_consuming.set()
        return _join_or_kill(self.consumers, timeout_s)

    def close(self) -> None:
        """Kill every client still running, by PID (safe at any time, idempotent)."""
        self._stop_producing.set()
        self._stop_consuming.set()
        for process in [*self.producers.values(), *self.consumers.values()]:
            if process.pid is not None and process.is_alive():
                _kill(process.pid)
        for process in [*self.producers.values(), *self.consumers.values()]:
            if process.pid is not None:
                process.join(10)


def _join_or_kill(processes: dict[str, multiprocessing.process.BaseProcess], timeout_s: float) -> list[str]:
    deadline = time.monotonic() + timeout_s
    killed = []
    for name, process in processes.items():
        process.join(max(0.0, deadline - time.monotonic()))
        if process.is_alive():
            logger.warning("client %s (pid %s) did not stop within %.0f s: killed", name, process.pid,
                           timeout_s)
            _kill(process.pid)
            process.join(10)
            killed.append(name)
        elif process.exitcode:
            logger.warning("client %s exited %s", name, process.exitcode)
    return killed


def _kill(pid: int | None) -> None:
    if pid is None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def _client_logging(config: WorkloadConfig, client: str) -> None:
    """A client process logs WARNING and above to ``<history_dir>/../clients/<client>.log``."""
    directory = config.history_dir.parent / "clients"
    directory.mkdir(parents=True, exist_ok=True)
    logging.basicConfig(filename=directory / f"{client}.log", level=logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def _flusher(writer: HistoryWriter, stop: threading.Event) -> threading.Thread:
    def run() -> None:
        while not stop.wait(_FLUSH_INTERVAL_S):
            writer.flush()
    thread = threading.Thread(target=run, name="history-flush", daemon=True)
    thread.start()
    return thread


# --- producers ---------------------------------------------------------------------------------

def _produce(config: WorkloadConfig, client: str, topic: str, stop: Any) -> None:
    """A producer process: paced sends until ``stop`` (or ``max_duration_s``), then settles."""
    from hpbroker.client import Producer

    _client_logging(config, client)
    spec = config.topics[topic]
    acks = "all" if str(spec["acks"]) in ("all", "-1") else 1
    partitions = int(spec["partitions"])
    writer = HistoryWriter(config.history_dir / f"{client}.history")
    flushing = threading.Event()
    _flusher(writer, flushing)
    unsettled = [0] * partitions
    lock = threading.Lock()
    settings = {"acks": acks, "name": client, "linger_ms": 5, "request_timeout_ms": 3000,
                "delivery_timeout_ms": config.delivery_timeout_ms, "audit_topic": None,
                "max_block_ms": 10_000, **config.producer_settings}
    producer = _retrying(lambda bootstrap: Producer(bootstrap, **settings), config.bootstrap, stop,
                         f"{client}: producer")
    try:
        if producer is not None:
            _send_paced(config, producer, writer, client, topic, partitions, unsettled, lock, stop)
            producer.flush(timeout_s=config.delivery_timeout_ms / 1000 + 10)
    except Exception:  # the records it sent are settled in the history, or stay indeterminate
        logger.exception("%s stopped sending", client)
    finally:
        try:
            if producer is not None:
                producer.close(timeout_s=10)
        except Exception as e:  # its failed records are in the history already
            logger.warning("%s: closing the producer: %r", client, e)
        flushing.set()
        writer.close()


def _send_paced(config: WorkloadConfig, producer: Any, writer: HistoryWriter, client: str, topic: str,
                partitions: int, unsettled: list[int], lock: threading.Lock, stop: Any) -> None:
    """Send ``<client>-<seq>`` round-robin over the partitions with room, at most
    ``rate_per_producer`` a second, until ``stop`` or ``max_duration_s``."""
    started = time.monotonic()
    seq, turn = 0, 0

    def settled(partition: int, value: str) -> Any:
        def callback(metadata: Any, error: BaseException | None) -> None:
            if error is None:
                writer.ack(client, topic, metadata.partition, metadata.offset, value)
            else:
                writer.fail(client, topic, value, f"{type(error).__name__}: {error}")
            with lock:
                unsettled[partition] -= 1
        return callback

    while not stop.is_set() and time.monotonic() - started < config.max_duration_s:
        ahead_s = seq / config.rate_per_producer - (time.monotonic() - started)
        if ahead_s > 0:
            time.sleep(min(ahead_s, 0.05))
            continue
        with lock:
            room = [p for p in range(partitions) if unsettled[p] < config.window]
        if not room:
            time.sleep(0.02)
            continue
        partition = room[turn % len(room)]
        turn += 1
        value = f"{client}-{seq}"
        writer.invoke(client, topic, value)
        with lock:
            unsettled[partition] += 1
        try:
            producer.send(topic, value.encode(), partition=partition, callback=settled(partition, value))
        except Exception as e:  # refused before it was queued: it failed, definitely not written
            with lock:
                unsettled[partition] -= 1
            writer.fail(client, topic, value, f"{type(e).__name__}: {e}")
            time.sleep(0.1)
        seq += 1


def _retrying(make: Any, bootstrap: str, stop: Any, what: str) -> Any:
    """``make(bootstrap)`` until it succeeds or ``stop`` is set (a cluster mid-fault may refuse a
    client).  Each try puts the next broker first: a client asks the next bootstrap address when
    the first does not answer, but only after that one's connection timeout."""
    brokers = [b for b in bootstrap.split(",") if b]
    attempt = 0
    while not stop.is_set():
        turn = attempt % len(brokers)
        try:
            return make(",".join(brokers[turn:] + brokers[:turn]))
        except Exception as e:
            logger.warning("%s could not start: %r; trying again", what, e)
            stop.wait(1.0)
        attempt += 1
    return None


# --- group consumers ---------------------------------------------------------------------------

def _consume(config: WorkloadConfig, client: str, topic: str, stop: Any) -> None:
    """A group member process: poll until ``stop``, writing ``assign`` and ``poll`` lines."""
    from hpbroker.client import Consumer

    _client_logging(config, client)
    writer = HistoryWriter(config.history_dir / f"{client}.history")
    flushing = threading.Event()
    _flusher(writer, flushing)
    started = time.monotonic()
    settings = {"group": f"chaos-{topic}", "topics": [topic], "zookeeper": config.zookeeper,
                "consumer_id": client, "session_timeout_ms": config.session_timeout_ms,
                "auto_offset_reset": "earliest", "reconnect_timeout_ms": 60_000,
                "request_timeout_ms": 5000, "client_id": client, "auto_commit_interval_ms": 2000}
    try:
        while not stop.is_set() and time.monotonic() - started < config.max_duration_s:
            member = functools.partial(Consumer, **settings, **_Ownership(writer, client).listener())
            consumer = _retrying(member, config.bootstrap, stop, f"{client}: consumer")
            if consumer is None:
                break
            writer.assign(client, [])  # a new member owns nothing yet: its polls start afresh
            try:
                _poll_until(consumer, writer, client, topic, stop, started + config.max_duration_s)
            except Exception as e:  # a new member takes over from the group's committed offsets
                logger.warning("%s: the consumer failed (%r); joining again", client, e)
            finally:
                writer.assign(client, [])
                try:
                    consumer.close()
                except Exception as e:
                    logger.warning("%s: closing the consumer: %r", client, e)
    finally:
        flushing.set()
        writer.close()


class _Ownership:
    """A member's owned partitions as its rebalance listener tells them, each change written
    as an ``assign`` line (runs on the consumer's thread, inside ``poll``)."""

    def __init__(self, writer: HistoryWriter, client: str) -> None:
        self._writer = writer
        self._client = client
        self.owned: set[Any] = set()

    def listener(self) -> dict[str, Any]:
        """The consumer settings that install it (``on_lost`` is left to ``on_revoke``)."""
        return {"on_assign": self._assigned, "on_revoke": self._revoked}

    def _assigned(self, partitions: set[Any]) -> None:
        self.owned |= partitions
        self._writer.assign(self._client, sorted(self.owned))

    def _revoked(self, partitions: set[Any]) -> None:
        self.owned -= partitions
        self._writer.assign(self._client, sorted(self.owned))


def _poll_until(consumer: Any, writer: HistoryWriter, client: str, topic: str, stop: Any,
                deadline: float) -> None:
    failures = 0
    while not stop.is_set() and time.monotonic() < deadline:
        try:
            batches = consumer.poll(_POLL_MS)
            failures = 0
        except Exception as e:  # a partition failed for reconnect_timeout_ms, ZooKeeper refused...
            failures += 1
            logger.warning("%s: poll failed (%r)", client, e)
            if failures >= 20:
                raise
            stop.wait(0.5)
            continue
        for tp, records in batches.items():
            for record in records:
                writer.poll(client, tp.topic, tp.partition, record.offset, _text(record.value))


def _text(value: bytes | None) -> str:
    return "" if value is None else bytes(value).decode("utf-8", "replace")


# --- the drain ---------------------------------------------------------------------------------

class DrainResult(dict):
    """What :func:`drain` read: as a dict, ``{"<topic>-<p>": records read}``; and per partition
    (keyed by ``TopicPartition``) the end offset asked (``ends``, None when never answered), the
    offset the drain read up to (``positions``: the next offset it would read, None when it read
    nothing), and whether it read from the log start to that end (``complete``)."""

    def __init__(self, counts: dict[str, int], ends: dict[Any, int | None], positions: dict[Any, int | None],
                 complete: set[Any]) -> None:
        super().__init__(counts)
        self.ends = ends
        self.positions = positions
        self.complete = complete

    def complete_partitions(self) -> dict[str, list[int]]:
        """topic -> the partitions read to their end (the checker's ``drained``)."""
        out: dict[str, list[int]] = {}
        for tp in self.ends:
            out.setdefault(tp.topic, [])
            if tp in self.complete:
                out[tp.topic].append(tp.partition)
        return {topic: sorted(parts) for topic, parts in out.items()}

    def incomplete(self) -> list[str]:
        """One sentence per partition not read to its end."""
        return [f"{tp.topic}-{tp.partition}: end offset "
                f"{'never answered' if self.ends[tp] is None else self.ends[tp]}, "
                f"read up to {self.positions.get(tp)}" for tp in sorted(self.ends) if tp not in self.complete]


def drain(bootstrap: str, topics: dict[str, dict[str, Any]], history_dir: Path, *,
          timeout_s: float = 120.0) -> DrainResult:
    """Read every partition of ``topics`` from its log start up to its end offset (its high
    watermark, asked once the partition answers), writing the ``drain`` history; returns a
    :class:`DrainResult`.  A partition is complete once its end is known and the consumer's
    position has reached it (whether the records came before or after the end was known).
    Never raises for a partition that does not answer: it is retried until ``timeout_s`` (the
    asking included), then left incomplete, and the result says so: a partition not read to its
    end proves nothing about its records."""
    from hpbroker.client import Consumer, TopicPartition

    history_dir.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + timeout_s
    tps = [TopicPartition(topic, p) for topic, spec in topics.items() for p in range(int(spec["partitions"]))]
    counts = {str(tp): 0 for tp in tps}
    ends: dict[Any, int | None] = dict.fromkeys(tps)
    positions: dict[Any, int | None] = dict.fromkeys(tps)
    left = set(tps)
    writer = HistoryWriter(history_dir / "drain.history")
    try:
        with Consumer(bootstrap, client_id="drain", auto_offset_reset="earliest", reconnect_timeout_ms=10_000,
                      request_timeout_ms=5000) as consumer:
            consumer.assign(tps)
            for tp in tps:
                consumer.seek(tp, 0)  # below the log start: auto_offset_reset moves it there
            writer.assign("drain", tps)
            asked_at = -1e9
            while left and time.monotonic() < deadline:
                if time.monotonic() - asked_at > 5.0:  # high watermarks not known yet, at most every 5 s
                    asked_at = time.monotonic()
                    _ask_ends(consumer, ends, left, deadline)
                left -= _reached(consumer, ends, positions, left)
                if not left:
                    break
                try:
                    batches = consumer.poll(500)
                except Exception as e:  # a partition still moving: try again until the deadline
                    logger.warning("drain: poll failed (%r)", e)
                    time.sleep(0.5)
                    continue
                for tp, records in batches.items():
                    for record in records:
                        writer.poll("drain", tp.topic, tp.partition, record.offset, _text(record.value))
                    counts[str(tp)] += len(records)
                    if records:
                        positions[tp] = max(positions[tp] or 0, records[-1].offset + 1)
                left -= _reached(consumer, ends, positions, left)
    except Exception:  # the consumer itself failed: what was read is in the history
        logger.exception("drain: the consumer failed")
    finally:
        writer.close()
    result = DrainResult(counts, ends, positions, set(tps) - left)
    if left:
        logger.warning("drain: %d partitions not read to their end within %.0f s: %s", len(left), timeout_s,
                       "; ".join(result.incomplete()))
    return result


def _reached(consumer: Any, ends: dict[Any, int | None], positions: dict[Any, int | None],
             left: set[Any]) -> set[Any]:
    """The partitions of ``left`` whose end is known and whose position has reached it (the
    position also counts records fetched before the end was known); ``positions`` updated."""
    done = set()
    for tp in left:
        end = ends[tp]
        if end is None:
            continue
        position = positions[tp] or 0
        try:
            position = max(position, consumer.position(tp))
        except Exception as e:  # not settled yet: the records read decide
            logger.debug("drain: position of %s: %r", tp, e)
        positions[tp] = position
        if position >= end:
            done.add(tp)
    return done


def _ask_ends(consumer: Any, ends: dict[Any, int | None], left: set[Any], deadline: float) -> None:
    """Fill in the end offsets of the partitions in ``left`` not known yet, one partition at a
    time (one that does not answer costs its own timeout, not the others' ends), none once
    ``deadline`` (monotonic) has passed."""
    for tp in sorted(tp for tp in left if ends[tp] is None):
        if time.monotonic() >= deadline:
            return
        try:
            ends[tp] = consumer.end_offsets([tp])[tp]
        except Exception as e:  # asked again later
            logger.warning("drain: end offset of %s: %r", tp, e)

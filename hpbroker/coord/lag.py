"""Consumer groups' committed offsets, read for the broker's lag metrics: :class:`GroupOffsetsPoller`.

The lag of a group on a partition is the partition's high watermark minus the group's committed
offset there (``consumers/<group>/offsets/<topic>/<partition>``, docs/COORDINATION.md).  The
broker knows its high watermarks; this module reads the other half, for the topics the broker
stores, on a daemon thread of its own every ``interval_s``, so a scrape reads a snapshot and
never waits for ZooKeeper (nor does the arbiter's loop).

One round is four pipelined steps whatever the number of groups: list the groups; list each
group's topics with offsets (kept: the topics wanted); list each such topic's partitions; read
every offset node.  Each step sends every request before waiting for the first answer, and the
whole round must finish within ``timeout_s``; a round that fails (no connection, a timeout)
keeps the previous snapshot (its ``read_at`` says how old it is), logs a warning the first time
and is retried at the next interval.  A node that vanishes between two steps, or whose data is
not an offset, is left out.

The snapshot is an immutable :class:`GroupOffsets`, swapped in with one assignment; the wanted
topics are handed over the same way (:attr:`GroupOffsetsPoller.topics`, a frozenset).  The thread
uses the caller's :class:`~hpbroker.coord.session.Session` (kazoo is thread-safe) and is started
by :meth:`~GroupOffsetsPoller.start`, with whatever signal mask the caller holds.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kazoo.exceptions import KazooException, NoNodeError

from hpbroker.coord.groups import decode_offset, list_groups
from hpbroker.coord.paths import ZkPaths
from hpbroker.coord.session import Session
from hpbroker.errors import CoordinationError, HPBrokerError

__all__ = ["GroupOffsets", "GroupOffsetsPoller"]

logger = logging.getLogger(__name__)

_JOIN_TIMEOUT_S = 2.0


@dataclass(frozen=True, slots=True)
class GroupOffsets:
    """Committed offsets read in one round: ``(group, topic, partition) -> offset``, and when the
    round began (``time.monotonic()`` seconds of this process, the reader's too: an age taken
    from it never moves with a step of the wall clock; not a date)."""

    read_at: float
    offsets: Mapping[tuple[str, str, int], int]


class GroupOffsetsPoller:
    """Reads the committed offsets of every group for :attr:`topics`, every ``interval_s``
    (module docstring).  ``snapshot`` is None until the first round succeeds."""

    def __init__(self, session: Session, *, interval_s: float, timeout_s: float | None = None,
                 paths: ZkPaths | None = None) -> None:
        self._session = session
        self._paths = paths or ZkPaths()
        self.interval_s = interval_s
        self.timeout_s = timeout_s if timeout_s is not None else min(max(interval_s, 1.0), 10.0)
        self.topics: frozenset[str] = frozenset()
        self.snapshot: GroupOffsets | None = None
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None
        self._failures = 0

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="hpbroker-group-offsets", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop the thread (a round under way ends at its next answer or timeout).  Idempotent."""
        self._closed.set()
        if self._thread is not None:
            self._thread.join(_JOIN_TIMEOUT_S)
            self._thread = None

    def _run(self) -> None:
        while not self._closed.is_set():
            started = time.monotonic()
            try:
                self.snapshot = GroupOffsets(started, self.read(self.topics))
                if self._failures:
                    logger.info("[zookeeper] reading the groups' committed offsets works again")
                self._failures = 0
            except (KazooException, HPBrokerError) as e:
                self._failures += 1
                logger.log(logging.WARNING if self._failures == 1 else logging.DEBUG,
                           "[zookeeper] cannot read the groups' committed offsets (retrying every %g s): %r",
                           self.interval_s, e)
            except Exception:
                logger.exception("[zookeeper] unexpected failure reading the groups' committed offsets")
            self._closed.wait(self.interval_s)

    def read(self, topics: frozenset[str]) -> dict[tuple[str, str, int], int]:
        """One round (module docstring): ``(group, topic, partition) -> committed offset`` of every
        group that committed offsets of ``topics``.  Raises CoordinationError or kazoo's errors."""
        if not topics:
            return {}
        deadline = time.monotonic() + self.timeout_s
        client, paths = self._session.client, self._paths
        groups = list_groups(self._session, paths, timeout_s=_left(deadline))
        offset_topics = self._gather({g: (client.get_children_async, paths.group_offsets(g)) for g in groups
                                      if _valid(paths.group_offsets, g)}, deadline)
        group_topics = [(g, t) for g, children in offset_topics.items() for t in children if t in topics]
        partitions = self._gather({(g, t): (client.get_children_async, paths.offsets(g, t))
                                   for g, t in group_topics}, deadline)
        wanted = {}
        for (group, topic), children in partitions.items():
            for child in children:
                try:
                    wanted[group, topic, paths.partition_of(child)] = None
                except HPBrokerError:
                    continue
        data = self._gather({key: (client.get_async, paths.offset(*key)) for key in wanted}, deadline)
        offsets = {}
        for key, (value, _stat) in data.items():
            try:
                offsets[key] = decode_offset(value).offset
            except CoordinationError as e:
                logger.debug("[zookeeper] ignoring the offset of %s: %s", key, e)
        return offsets

    def _gather(self, calls: Mapping[Any, tuple[Any, str]], deadline: float) -> dict[Any, Any]:
        """Send every ``(async method, path)`` call, then collect the answers; nodes that do not
        exist are left out."""
        pending = {key: method(path) for key, (method, path) in calls.items()}
        answers = {}
        timeout = self._session.client.handler.timeout_exception
        for key, result in pending.items():
            try:
                answers[key] = result.get(timeout=_left(deadline))
            except NoNodeError:
                continue
            except timeout:
                raise CoordinationError(f"no answer from ZooKeeper within {self.timeout_s:g} s reading "
                                        f"the groups' committed offsets") from None
        return answers


def _left(deadline: float) -> float:
    """Seconds left before ``deadline`` (``time.monotonic()``), never below 0: every step of a
    round waits only for what is left of the round's time."""
    return max(0.0, deadline - time.monotonic())


def _valid(make_path: Any, *names: Any) -> bool:
    """Whether ``make_path(*names)`` accepts the names (a group node named against the rules is
    skipped, not fatal)."""
    try:
        make_path(*names)
    except HPBrokerError:
        return False
    return True

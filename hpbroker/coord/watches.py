"""Watches that re-arm: a callback with a node's children, or its data, now and after every change.

ZooKeeper's own watches fire once; kazoo's :class:`~kazoo.recipe.watchers.ChildrenWatch` and
:class:`~kazoo.recipe.watchers.DataWatch` set them again after each event, after a reconnection
and after a session expiry (with the state read again, so nothing that happened in between is
missed, though intermediate states may be skipped: a callback always gets the *current* state,
never a history).  This module wraps them with what hpbroker needs:

- a :class:`Watch` handle whose :meth:`~Watch.cancel` stops further callbacks (ZooKeeper has no
  way to remove a watch, so the next event is swallowed and the watch not set again);
- a callback that raises is logged and the watch goes on (kazoo would retry the call with
  fewer arguments on a ``TypeError`` raised inside it);
- :func:`watch_children` creates the parent when it is missing, since a children watch on an
  absent node stops at once.

Threads: the first call runs on the caller's thread, before the function returns; every later
call on kazoo's callback thread, one at a time.  A callback must be quick and must not wait for
ZooKeeper (it would block every other watch): a process with its own loop hands the news over
to it (a queue and a wake-up descriptor) and does the work there.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from kazoo.client import KazooClient
from kazoo.protocol.states import ZnodeStat
from kazoo.recipe.watchers import ChildrenWatch, DataWatch

__all__ = ["ChildrenCallback", "DataCallback", "Watch", "watch_children", "watch_data"]

logger = logging.getLogger(__name__)

ChildrenCallback = Callable[[list[str]], None]
# (data, stat): both None while the node does not exist.
DataCallback = Callable[[bytes | None, ZnodeStat | None], None]


class Watch:
    """A re-arming watch on ``path``; :meth:`cancel` ends it."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._cancelled = threading.Event()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def cancel(self) -> None:
        """No callback starts after this returns (one already running finishes)."""
        self._cancelled.set()

    def _deliver(self, callback: Callable[..., None], *args: object) -> bool:
        """Run the callback unless cancelled; False tells kazoo to stop re-arming."""
        if self._cancelled.is_set():
            return False
        try:
            callback(*args)
        except Exception:
            logger.exception("[zookeeper] a watch callback on %s failed; the watch goes on", self.path)
        return not self._cancelled.is_set()


def watch_children(client: KazooClient, path: str, callback: ChildrenCallback) -> Watch:
    """Call ``callback(sorted children of path)`` now and whenever they change.  ``path`` is
    created (persistent, with its parents) if it does not exist."""
    client.ensure_path(path)
    watch = Watch(path)
    ChildrenWatch(client, path, lambda children: watch._deliver(callback, sorted(children)))
    return watch


def watch_data(client: KazooClient, path: str, callback: DataCallback) -> Watch:
    """Call ``callback(data, stat)`` now and whenever the node is created, changed or deleted
    (``None, None`` while it does not exist)."""
    watch = Watch(path)

    def deliver(data: bytes | None, stat: ZnodeStat | None, event: object = None) -> bool:
        return watch._deliver(callback, data, stat)

    DataWatch(client, path, deliver)
    return watch

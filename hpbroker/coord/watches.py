"""Watches that re-arm: a callback with a node's children, or its data, now and after every change.

ZooKeeper's watches fire once; a watch here sets itself again after each event, after a
reconnection and after a session expiry, with the state read again, so nothing that happened in
between is missed, though intermediate states may be skipped: a callback always gets the
*current* state, never a history, and only when it differs from what it last delivered (the
data node's ``mzxid``, or the list of children).

- :class:`Watch` is the handle; :meth:`~Watch.cancel` stops further callbacks (ZooKeeper has no
  way to remove a watch, so the next event is swallowed and the watch not set again);
- a callback that raises is logged and the watch goes on;
- :func:`watch_children` creates the parent when it is missing; should it be deleted later, the
  callback gets ``[]`` and the watch waits for it to come back.

**Threads, and why not kazoo's recipes.**  kazoo's ``DataWatch`` reads the node again on kazoo's
single callback thread, retrying without bound (with back-off up to a minute) while reads fail
with a connection loss: after an outage, or on a connection that keeps dropping, the events of
every other watch of the client (a partition's new leader, a broker gone) queue behind it.  Here
kazoo's thread only *queues* a watch that fired; the reads and the callbacks run on one thread
of our own per client (the *re-arm thread*), and:

- a read is attempted only while the client is connected, and waits at most
  ``_READ_TIMEOUT_S``; a failed read is tried again after a back-off (0.1 s doubling to 2 s) that
  is a deadline, never a sleep, so the thread goes on with other watches meanwhile;
- a watch whose reads keep failing while the client stays connected (a slow ZooKeeper whose
  answers come after ``_READ_TIMEOUT_S``, an error answered for the node) never gives up: after
  ``_READ_ATTEMPTS`` failed reads in a row it is logged once (a warning) and tried again with a
  back-off that keeps doubling up to ``_STREAK_MAX_DELAY_S``, until a read succeeds.  Giving up
  would leave its node's last change undelivered for as long as the connection holds (a
  broker keeping an old role for a partition);
- a watch due while the client is disconnected waits for the next ``CONNECTED``; every
  ``CONNECTED`` (a reconnection or a new session) reads every watch again, since the watches set
  in the old connection may be gone (one in a long streak of failures keeps its back-off).

The first call runs on the caller's thread before :func:`watch_data` / :func:`watch_children`
return (one read, waiting at most ``_FIRST_READ_TIMEOUT_S``).  When ZooKeeper cannot be reached
then (connection lost, session expired, a timeout), the watch is handed to the re-arm thread and
its first call comes from there once a read succeeds; any other error (no access, a bad path) is raised and no
watch is left behind.  Later calls of all the watches of one client come from its re-arm thread,
one at a time.  A callback must be quick and must not wait for ZooKeeper (it would hold up every
other watch of the client): a process with its own loop hands the news over to it (a queue and
a wake-up descriptor) and does the work there.  A callback may start or cancel watches.  The
re-arm thread ends when the client is stopped or its last watch is cancelled; it is started with
every signal blocked, so that signals reach the process's own loop.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import signal
import threading
import time
from collections.abc import Callable

from kazoo.client import KazooClient
from kazoo.exceptions import (
    ConnectionClosedError,
    ConnectionLoss,
    NoNodeError,
    OperationTimeoutError,
    SessionExpiredError,
)
from kazoo.protocol.states import KazooState, KeeperState, WatchedEvent, ZnodeStat
from kazoo.retry import RetryFailedError

__all__ = ["ChildrenCallback", "DataCallback", "Watch", "watch_children", "watch_data"]

logger = logging.getLogger(__name__)

ChildrenCallback = Callable[[list[str]], None]
# (data, stat): both None while the node does not exist.
DataCallback = Callable[[bytes | None, ZnodeStat | None], None]

_READ_TIMEOUT_S = 3.0  # longest wait for one read on the re-arm thread
_FIRST_READ_TIMEOUT_S = 10.0  # longest wait for the first read, on the caller's thread
_READ_ATTEMPTS = 8  # failed reads in a row before the back-off may grow past _MAX_DELAY_S (and a warning)
_FIRST_DELAY_S = 0.1  # back-off after a first failed read
_MAX_DELAY_S = 2.0  # longest back-off between two reads of one watch, for its first _READ_ATTEMPTS
_STREAK_MAX_DELAY_S = 10.0  # longest back-off once its reads failed _READ_ATTEMPTS times in a row
_IDLE_CHECK_S = 1.0  # how often an idle re-arm thread looks whether its client was stopped

# Failures that mean "ZooKeeper cannot be reached now": retried; anything else is logged.
_UNREACHABLE = (ConnectionLoss, SessionExpiredError, OperationTimeoutError, RetryFailedError)


class Watch:
    """A re-arming watch on ``path``; :meth:`cancel` ends it.  Made by :func:`watch_data` and
    :func:`watch_children` only."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._cancelled = threading.Event()
        self._run_lock = threading.Lock()  # one read-and-deliver of this watch at a time
        self._delivered = False
        self._last: object = None  # what was last delivered: an mzxid (or None), or the children
        self._attempts = 0  # failed reads in a row
        self._delay_s = _FIRST_DELAY_S
        self._rearm: _Rearm | None = None
        self._watcher: Callable[[WatchedEvent], None] = lambda event: None  # set when adopted

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def cancel(self) -> None:
        """No callback starts after this returns (one already running finishes)."""
        self._cancelled.set()
        rearm = self._rearm
        if rearm is not None:
            rearm.forget(self)

    # --- what the two kinds do --------------------------------------------------------------------

    def _read(self, watcher: Callable[[WatchedEvent], None], timeout_s: float | None) -> tuple[object, tuple]:
        """(the value compared between deliveries, the callback's arguments); sets ``watcher``."""
        raise NotImplementedError

    def _call(self, *args: object) -> None:
        raise NotImplementedError

    # --- one read and delivery --------------------------------------------------------------------

    def _refresh(self, client: KazooClient, watcher: Callable[[WatchedEvent], None],
                 timeout_s: float | None) -> None:
        """Read the node (setting ``watcher``) and call back if it changed.  Raises what the read
        raises; a callback's exception is logged."""
        with self._run_lock:
            if self._cancelled.is_set():
                return
            key, args = self._read(watcher, timeout_s)
            if self._delivered and key == self._last:
                return
            self._delivered, self._last = True, key
            if self._cancelled.is_set():
                return
            try:
                self._call(*args)
            except Exception:
                logger.exception("[zookeeper] a watch callback on %s failed; the watch goes on", self.path)


def _wait(async_result, timeout_s: float | None):  # noqa: ANN001, ANN202 - kazoo's IAsyncResult
    """The result of a kazoo request, waiting at most ``timeout_s`` (None: kazoo's own bound)."""
    return async_result.get(timeout=timeout_s)


class _DataWatch(Watch):
    def __init__(self, client: KazooClient, path: str, callback: DataCallback) -> None:
        super().__init__(path)
        self._client, self._callback = client, callback

    def _read(self, watcher: Callable[[WatchedEvent], None], timeout_s: float | None) -> tuple[object, tuple]:
        client = self._client
        for _ in range(3):  # created or deleted between the two reads: look again
            try:
                data, stat = _wait(client.get_async(self.path, watch=watcher), timeout_s)
                return stat.mzxid, (data, stat)
            except NoNodeError:
                pass
            stat = _wait(client.exists_async(self.path, watch=watcher), timeout_s)
            if stat is None:
                return None, (None, None)
        raise OperationTimeoutError(f"{self.path} kept appearing and disappearing")

    def _call(self, *args: object) -> None:
        self._callback(*args)


class _ChildrenWatch(Watch):
    def __init__(self, client: KazooClient, path: str, callback: ChildrenCallback) -> None:
        super().__init__(path)
        self._client, self._callback = client, callback

    def _read(self, watcher: Callable[[WatchedEvent], None], timeout_s: float | None) -> tuple[object, tuple]:
        client = self._client
        for _ in range(3):
            try:
                children = sorted(_wait(client.get_children_async(self.path, watch=watcher), timeout_s))
                return children, (children,)
            except NoNodeError:
                pass
            if _wait(client.exists_async(self.path, watch=watcher), timeout_s) is None:
                return [], ([],)
        raise OperationTimeoutError(f"{self.path} kept appearing and disappearing")

    def _call(self, *args: object) -> None:
        self._callback(*args)


class _Rearm:
    """The re-arm thread of one kazoo client (module docstring).  ``due`` is a heap of
    (deadline, sequence, watch); a watch is in it at most once (``_queued``), or parked in
    ``_parked`` (it came due while the client was disconnected) until the next CONNECTED."""

    _by_client: dict[int, _Rearm] = {}
    _registry_lock = threading.Lock()

    def __init__(self, client: KazooClient) -> None:
        self.client = client
        self._cond = threading.Condition()
        self._watches: set[Watch] = set()
        self._due: list[tuple[float, int, Watch]] = []
        self._queued: dict[Watch, float] = {}
        self._parked: set[Watch] = set()
        self._sequence = itertools.count()
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="zk-watch-rearm", daemon=True)

    @classmethod
    def adopt(cls, client: KazooClient, watch: Watch) -> _Rearm:
        """Give ``watch`` to the re-arm thread of ``client``, started if there is none."""
        while True:
            with cls._registry_lock:
                rearm = cls._by_client.get(id(client))
                fresh = rearm is None or rearm.client is not client  # an id reused by a new client
                if fresh:
                    rearm = cls._by_client[id(client)] = _Rearm(client)
            with rearm._cond:
                adopted = not rearm._stopped
                if adopted:
                    rearm._watches.add(watch)
                    watch._rearm = rearm
                    watch._watcher = rearm._watcher_for(watch)
            if fresh:
                client.add_listener(rearm._on_state)
                # Started with every signal blocked: signals are for the process's main thread.
                mask = signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
                try:
                    rearm._thread.start()
                finally:
                    signal.pthread_sigmask(signal.SIG_SETMASK, mask)
            if adopted:
                return rearm
            with cls._registry_lock:  # it ended meanwhile: start another
                if cls._by_client.get(id(client)) is rearm:
                    del cls._by_client[id(client)]

    # --- called from any thread -----------------------------------------------------------------

    def forget(self, watch: Watch) -> None:
        with self._cond:
            self._watches.discard(watch)
            self._parked.discard(watch)
            self._cond.notify()

    def schedule(self, watch: Watch, delay_s: float = 0.0) -> None:
        """Read ``watch`` again after ``delay_s`` (sooner if it is already due sooner)."""
        deadline = time.monotonic() + delay_s
        with self._cond:
            if watch not in self._watches or watch.cancelled:
                return
            self._parked.discard(watch)
            queued = self._queued.get(watch)
            if queued is not None and queued <= deadline:
                return
            self._queued[watch] = deadline
            heapq.heappush(self._due, (deadline, next(self._sequence), watch))
            self._cond.notify()

    def _watcher_for(self, watch: Watch) -> Callable[[WatchedEvent], None]:
        """The function given to ZooKeeper as the watch (one per watch: kazoo keeps a set of
        them per path).  It runs on kazoo's callback thread and only queues the read; an event
        of type NONE (the connection dropped, the session ended) too: the read then waits until
        the client is connected again."""
        def fired(event: WatchedEvent) -> None:
            self.schedule(watch)
        return fired

    def _on_state(self, state: str) -> None:
        """kazoo's state listener (its connection thread): read every watch again on CONNECTED."""
        if state == KazooState.CONNECTED:
            with self._cond:
                watches = list(self._watches)
            for watch in watches:  # one in a long streak of failures keeps its back-off, in a new streak
                streak = watch._attempts >= _READ_ATTEMPTS
                if streak:
                    watch._attempts = 0
                self.schedule(watch, watch._delay_s if streak else 0.0)
        else:
            with self._cond:
                self._cond.notify()  # a stopped client ends the thread

    # --- the thread -------------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while True:
                watch = self._next()
                if watch is None:
                    return
                self._read(watch)
        finally:
            with _Rearm._registry_lock:
                if _Rearm._by_client.get(id(self.client)) is self:
                    del _Rearm._by_client[id(self.client)]
            self.client.remove_listener(self._on_state)

    def _next(self) -> Watch | None:
        """The next watch due and readable now; None when the thread should end."""
        with self._cond:
            while True:
                if self.client.client_state == KeeperState.CLOSED or not self._watches:
                    self._stopped = True
                    for watch in self._watches:
                        watch._rearm = None
                    return None
                now = time.monotonic()
                if self._due and self._due[0][0] <= now:
                    deadline, _, watch = heapq.heappop(self._due)
                    if self._queued.get(watch) != deadline:
                        continue  # rescheduled sooner meanwhile, or forgotten
                    del self._queued[watch]
                    if watch not in self._watches or watch.cancelled:
                        continue
                    if not self.client.connected:
                        self._parked.add(watch)  # read again on CONNECTED
                        continue
                    return watch
                wait_s = _IDLE_CHECK_S if not self._due else min(_IDLE_CHECK_S, self._due[0][0] - now)
                self._cond.wait(max(wait_s, 0.0))

    def _read(self, watch: Watch) -> None:
        try:
            watch._refresh(self.client, watch._watcher, _READ_TIMEOUT_S)
        except (*_UNREACHABLE, self.client.handler.timeout_exception) as e:
            self._failed(watch, e)
        except ConnectionClosedError:
            return  # the client was stopped: the thread ends at its next turn
        except Exception as e:
            logger.exception("[zookeeper] reading %s for its watch failed", watch.path)
            self._failed(watch, e)
        else:
            if watch._attempts >= _READ_ATTEMPTS:
                logger.warning("[zookeeper] the watch on %s is set again, after %d failed reads",
                               watch.path, watch._attempts)
            watch._attempts, watch._delay_s = 0, _FIRST_DELAY_S

    def _failed(self, watch: Watch, error: BaseException) -> None:
        """A read failed: try again after the watch's back-off, without end (module docstring);
        one that comes due while the client is disconnected waits for CONNECTED (``_next``)."""
        watch._attempts += 1
        if watch._attempts < _READ_ATTEMPTS:
            logger.info("[zookeeper] the watch on %s could not be set again (%r); retrying in %.1f s",
                        watch.path, error, watch._delay_s)
        elif watch._attempts == _READ_ATTEMPTS:
            logger.warning("[zookeeper] the watch on %s could not be set again in %d reads (%r); retrying "
                           "every %.0f s at most until it is", watch.path, watch._attempts, error,
                           _STREAK_MAX_DELAY_S)
        self.schedule(watch, watch._delay_s)
        cap = _MAX_DELAY_S if watch._attempts < _READ_ATTEMPTS else _STREAK_MAX_DELAY_S
        watch._delay_s = min(watch._delay_s * 2, cap)


def _start(client: KazooClient, watch: Watch) -> Watch:
    """Run the first read and call on this thread, then hand the watch to the re-arm thread."""
    rearm = _Rearm.adopt(client, watch)
    try:
        if not client.connected:
            raise ConnectionLoss("not connected")
        watch._refresh(client, watch._watcher, _FIRST_READ_TIMEOUT_S)
    except (*_UNREACHABLE, client.handler.timeout_exception) as e:
        logger.warning("[zookeeper] cannot read %s now (%r); its watch starts once ZooKeeper answers",
                       watch.path, e)
        rearm.schedule(watch, _FIRST_DELAY_S)
    except BaseException:
        watch.cancel()
        raise
    return watch


def watch_children(client: KazooClient, path: str, callback: ChildrenCallback) -> Watch:
    """Call ``callback(sorted children of path)`` now and whenever they change.  ``path`` is
    created (persistent, with its parents) if it does not exist."""
    client.ensure_path(path)
    return _start(client, _ChildrenWatch(client, path, callback))


def watch_data(client: KazooClient, path: str, callback: DataCallback) -> Watch:
    """Call ``callback(data, stat)`` now and whenever the node is created, changed or deleted
    (``None, None`` while it does not exist)."""
    return _start(client, _DataWatch(client, path, callback))

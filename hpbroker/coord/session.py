"""One ZooKeeper session: a started kazoo client, its state logged, its ephemeral nodes kept.

:func:`connect` (or ``Session(...).start()``) makes a :class:`kazoo.client.KazooClient` from a
connect string (``host:port,host:port[/chroot]``, ``hpbroker.coord.paths``), creates the chroot
if it is missing, and waits for the first session at most ``connect_timeout_s``: a server that
cannot be reached in that time is a :class:`~hpbroker.errors.CoordinationError` naming the
servers, and nothing is left running.

**States.**  kazoo reports ``CONNECTED``, ``SUSPENDED`` (the connection dropped; the session lives
on in the server for up to the session timeout, and so do its ephemeral nodes) and ``LOST`` (the
session expired or was closed: its ephemeral nodes are gone).  kazoo reconnects on its own,
forever, with a new session after ``LOST``.  Each transition is logged, with the session id.

**Ephemeral registrations.**  :meth:`Session.register_ephemeral` creates an ephemeral node, or
updates it, and remembers its latest data; whenever a *new* session is established after an
expiry, every remembered node is created again, on a kazoo worker thread, retried with back-off
until it succeeds, the session changes again, or the session is closed.  A node already held by
another session is a conflict (CoordinationError), unless the caller's ``takeover`` predicate
recognises its data as its own previous incarnation's (a process restarted before ZooKeeper
expired its old session), in which case the stale node is deleted and replaced.

**Credentials.**  ``Session(..., credentials=ZkCredentials)`` (``hpbroker.coord.zk_security``)
adds the digest auth to every connection (kazoo's ``auth_data``, sent again after each
reconnection) and makes the cluster's ACL (all rights to that user, read to the world) kazoo's
``default_acl``, which covers every ``create`` (sync, async, ``makepath`` parents, transactions)
and ``ensure_path``; the chroot, when created here, carries the cluster's ACL too.  ``acl=``
overrides the default ACL (a group member's: ``zk_security.member_acl``), ``auth=`` adds other
digest credentials (a group's).  Without any, nodes are world-writable, as before.

**Threads.**  kazoo runs a connection thread and a callback thread; state listeners, watches and
the re-registration run on them, never on the caller's thread.  Every write of an ephemeral node
holds one lock, so a re-registration and a caller's update cannot interleave and the newest data
wins.  A kazoo client must not be used across ``fork``: make the session in the process that
uses it.
"""

from __future__ import annotations

import logging
import threading
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import BadVersionError, KazooException, NodeExistsError, NoNodeError
from kazoo.security import ACL

from hpbroker.coord.paths import ConnectString, parse_connect_string
from hpbroker.coord.zk_security import ZkCredentials, cluster_acl
from hpbroker.errors import CoordinationError

__all__ = ["DEFAULT_SESSION_TIMEOUT_S", "Session", "connect"]

logger = logging.getLogger(__name__)

DEFAULT_SESSION_TIMEOUT_S = 6.0  # what the broker asks for unless configured (Kafka's old default)
_RECONNECT_MAX_DELAY_S = 1.0  # longest pause between connection attempts: well inside a session timeout
_RESTORE_FIRST_DELAY_S = 0.5  # first pause before retrying a failed re-registration
_RESTORE_MAX_DELAY_S = 30.0  # longest pause between re-registration attempts
_WRITE_ATTEMPTS = 3  # create / inspect / replace rounds for one ephemeral node before giving up

# takeover(existing data) -> whether a node held by another session may be replaced.
Takeover = Callable[[bytes], bool]


@dataclass(slots=True)
class _Ephemeral:
    data: bytes
    takeover: Takeover | None
    session_id: int | None = None  # the session that last wrote it; None: not written in any
    acl: list[ACL] | None = None  # None: the session's default ACL


class Session:
    """A ZooKeeper session (module docstring).  ``client`` is the kazoo client, for reads and
    persistent writes; ephemeral nodes go through :meth:`register_ephemeral`."""

    def __init__(self, connect_string: str, *, session_timeout_s: float = DEFAULT_SESSION_TIMEOUT_S,
                 connect_timeout_s: float | None = None, name: str = "zookeeper",
                 client_id: tuple[int, bytes] | None = None, credentials: ZkCredentials | None = None,
                 auth: Sequence[ZkCredentials] = (), acl: Sequence[ACL] | None = None) -> None:
        self.connect_string: ConnectString = parse_connect_string(connect_string)
        self.credentials = credentials
        self.auth = tuple(dict.fromkeys(([credentials] if credentials else []) + list(auth)))
        #: what every node this session creates carries; None: world-writable (no credentials)
        self.default_acl: list[ACL] | None = (list(acl) if acl is not None
                                              else cluster_acl(credentials) if credentials else None)
        if not session_timeout_s > 0:
            raise CoordinationError(f"session_timeout_s must be positive, got {session_timeout_s!r}")
        self.session_timeout_s = float(session_timeout_s)
        self.connect_timeout_s = float(session_timeout_s if connect_timeout_s is None else connect_timeout_s)
        self.name = name
        retry = {"max_tries": -1, "delay": 0.05, "backoff": 2, "max_delay": _RECONNECT_MAX_DELAY_S}
        self.client = KazooClient(hosts=str(self.connect_string), timeout=self.session_timeout_s,
                                  client_id=client_id, connection_retry=retry,
                                  command_retry={"max_tries": 3, "delay": 0.05, "max_delay": 1.0},
                                  auth_data=[c.auth_data for c in self.auth] or None,
                                  default_acl=self.default_acl)
        self._lock = threading.RLock()  # held by every ephemeral write
        self._ephemerals: dict[str, _Ephemeral] = {}
        self._session_id: int | None = None  # the session of the last CONNECTED
        self._closed = threading.Event()
        self.client.add_listener(self._on_state)

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- life cycle -----------------------------------------------------------------------------

    def start(self) -> Session:
        """Connect, waiting at most ``connect_timeout_s``, and make sure the chroot exists."""
        try:
            with warnings.catch_warnings():  # kazoo warns of a missing chroot; it is created below
                warnings.filterwarnings("ignore", message="No chroot path exists")
                self.client.start(timeout=self.connect_timeout_s)
        except self.client.handler.timeout_exception:
            self.close()
            raise CoordinationError(
                f"[{self.name}] cannot reach ZooKeeper at {self.connect_string.hosts} within "
                f"{self.connect_timeout_s:g} s (is a server running there?)") from None
        try:
            if self.connect_string.chroot is not None and self.client.exists("/") is None:
                self._create_chroot()
        except (KazooException, self.client.handler.timeout_exception) as e:
            self.close()
            raise CoordinationError(f"[{self.name}] cannot create the chroot "
                                    f"{self.connect_string.chroot}: {e!r}") from None
        return self

    def _create_chroot(self) -> None:
        """A chrooted client cannot create its chroot's parents: a short-lived plain one does."""
        # The chroot is the cluster's: its ACL (never a group member's), or none without credentials.
        acl = cluster_acl(self.credentials) if self.credentials is not None else None
        plain = KazooClient(hosts=self.connect_string.hosts, timeout=self.session_timeout_s,
                            auth_data=[c.auth_data for c in self.auth] or None, default_acl=acl)
        try:
            plain.start(timeout=self.connect_timeout_s)
            plain.ensure_path(self.connect_string.chroot)
            logger.info("[%s] created the chroot %s", self.name, self.connect_string.chroot)
        finally:
            plain.stop()
            plain.close()

    def close(self) -> None:
        """Close the session: ZooKeeper deletes its ephemeral nodes at once.  Idempotent."""
        if self._closed.is_set():
            return
        self._closed.set()
        try:
            self.client.stop()  # bounded by kazoo: max(10 s, the session timeout)
        except Exception as e:  # the connection thread did not stop in time: nothing more to do
            logger.warning("[%s] closing the session: %r", self.name, e)
        finally:
            self.client.close()

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    @property
    def session_id(self) -> int | None:
        """The id of the current session; None before the first one."""
        return self._session_id

    # --- ephemeral nodes ------------------------------------------------------------------------

    def register_ephemeral(self, path: str, data: bytes, *, takeover: Takeover | None = None,
                           acl: Sequence[ACL] | None = None) -> None:
        """Create the ephemeral node ``path`` holding ``data``, or update it; re-created with its
        latest data after every session expiry until :meth:`unregister_ephemeral`; ``acl``: the
        node's (and missing parents'), else the session's default ACL.  Raises
        CoordinationError on a conflict, and kazoo's errors when ZooKeeper cannot be reached (the
        node is then written when the next session is established)."""
        with self._lock:
            entry = self._ephemerals.get(path)
            if entry is None:
                entry = self._ephemerals[path] = _Ephemeral(data, takeover)
            entry.data, entry.takeover = data, takeover
            entry.acl = None if acl is None else list(acl)
            try:
                self._write(path, entry)
            except BaseException:
                entry.session_id = None  # not written: the next connection writes it
                raise

    def unregister_ephemeral(self, path: str) -> None:
        """Forget ``path`` and delete it if this session holds it."""
        with self._lock:
            entry = self._ephemerals.pop(path, None)
            if entry is None or self._closed.is_set():
                return
            try:
                _, stat = self.client.get(path)
                if stat.ephemeralOwner == self._live_session_id():
                    self.client.delete(path, version=stat.version)
            except (NoNodeError, BadVersionError):
                pass

    def _write(self, path: str, entry: _Ephemeral) -> None:
        """Make ``path`` hold ``entry.data`` in this session.  Called with the lock held."""
        client = self.client
        for _ in range(_WRITE_ATTEMPTS):
            try:
                client.create(path, entry.data, acl=entry.acl, ephemeral=True, makepath=True)
                entry.session_id = self._live_session_id()
                return
            except NodeExistsError:
                pass
            try:
                existing, stat = client.get(path)
                if stat.ephemeralOwner == self._live_session_id():
                    client.set(path, entry.data, version=stat.version)
                    entry.session_id = stat.ephemeralOwner
                    return
                if not (stat.ephemeralOwner and entry.takeover is not None and entry.takeover(existing)):
                    holder = (f"session 0x{stat.ephemeralOwner:x}" if stat.ephemeralOwner
                              else "a persistent node")
                    raise CoordinationError(f"[{self.name}] {path} is held by {holder}: "
                                            f"{existing[:300].decode('utf-8', 'replace')}")
                logger.warning("[%s] replacing %s, left by session 0x%x of a previous incarnation",
                               self.name, path, stat.ephemeralOwner)
                client.delete(path, version=stat.version)
            except (NoNodeError, BadVersionError):
                continue  # deleted or changed in between: look again
        raise CoordinationError(f"[{self.name}] {path} kept changing under us; not registered")

    def _live_session_id(self) -> int | None:
        client_id = self.client.client_id
        return None if client_id is None else client_id[0]

    # --- session events -------------------------------------------------------------------------

    def _on_state(self, state: str) -> None:
        """kazoo's state listener: runs on kazoo's connection thread, so it only logs and hands
        the re-registration to a worker thread."""
        if state == KazooState.CONNECTED:
            session_id = self._live_session_id() or 0
            previous, self._session_id = self._session_id, session_id
            if previous is None:
                logger.info("[%s] connected to %s, session 0x%x (timeout %g s)", self.name,
                            self.connect_string, session_id, self.session_timeout_s)
            elif previous == session_id:
                logger.info("[%s] reconnected to %s, session 0x%x kept", self.name, self.connect_string,
                            session_id)
            else:
                logger.warning("[%s] connected to %s with a new session 0x%x (0x%x expired): "
                               "re-creating %d ephemeral nodes", self.name, self.connect_string,
                               session_id, previous, len(self._ephemerals))
            # Nodes not written in this session: all of them after an expiry, or those whose
            # write failed while the connection was down.
            if any(e.session_id != session_id for e in list(self._ephemerals.values())):
                self.client.handler.spawn(self._restore, session_id)
        elif state == KazooState.SUSPENDED:
            if not self._closed.is_set():
                logger.warning("[%s] connection to ZooKeeper lost; session 0x%x holds for up to %g s "
                               "while reconnecting", self.name, self._session_id or 0, self.session_timeout_s)
        elif not self._closed.is_set():  # LOST
            logger.warning("[%s] session 0x%x expired: its ephemeral nodes are gone; reconnecting",
                           self.name, self._session_id or 0)

    def _restore(self, session_id: int) -> None:
        """Re-create every remembered ephemeral node in ``session_id``, retrying with back-off."""
        delay_s = _RESTORE_FIRST_DELAY_S
        while True:
            failures = []
            with self._lock:
                if self._closed.is_set() or self._live_session_id() != session_id:
                    return
                for path, entry in list(self._ephemerals.items()):
                    if entry.session_id == session_id:
                        continue  # already written in this session
                    try:
                        self._write(path, entry)
                        logger.info("[%s] re-created %s in session 0x%x", self.name, path, session_id)
                    except (KazooException, CoordinationError) as e:
                        failures.append(f"{path}: {e!r}")
            if not failures:
                return
            logger.error("[%s] could not re-create %d ephemeral nodes (retrying in %g s): %s", self.name,
                         len(failures), delay_s, "; ".join(failures))
            if self._closed.wait(delay_s):
                return
            delay_s = min(delay_s * 2, _RESTORE_MAX_DELAY_S)


def connect(connect_string: str, *, session_timeout_s: float = DEFAULT_SESSION_TIMEOUT_S,
            connect_timeout_s: float | None = None, name: str = "zookeeper",
            credentials: ZkCredentials | None = None) -> Session:
    """A started :class:`Session` (CoordinationError if no server answers within
    ``connect_timeout_s``, by default the session timeout); ``credentials``: the cluster's."""
    return Session(connect_string, session_timeout_s=session_timeout_s, connect_timeout_s=connect_timeout_s,
                   name=name, credentials=credentials).start()

"""The arbiter's security wiring: what ``security = "curve"`` adds to the arbiter's loop.

:class:`SecurityState` holds the broker's :class:`~hpbroker.security.broker.BrokerSecurity`
(made in the broker's start, before any fork) and connects it to the rest of the broker:

- **ZooKeeper** (:meth:`SecurityState.join`, at start with the loop's signals blocked; blocking):
  the cluster's token key is read (``hpbroker.coord.zk_security``) and handed to the security
  object as bytes, with the function that issues a group's credentials; then the ACL node is
  watched (``hpbroker.coord.acl_store``).  The watch's first read is applied before
  :meth:`join` returns, so that the requests queued while the broker joined are judged by the
  real ACLs; until the ACLs are known (the first read failed) requests are answered 17
  (retriable, ``BrokerSecurity.acls_pending``), never refused.  Later the watch's callback runs
  on a kazoo thread: it only puts the entries in a one-slot deque and wakes the loop, whose
  :meth:`SecurityState.turn` applies them.  ``hpbroker.security`` itself never imports ``hpbroker.coord``.
- **every turn of the loop** (:meth:`SecurityState.turn`): False when the ZAP handler's thread
  has died (fatal: the arbiter halts); ACL changes taken; the workers told.
- **SIGHUP** (:meth:`SecurityState.reload`): the allowlist read again.
- **the workers** get the security state (the ``security`` control,
  ``BrokerSecurity.worker_state``) when they report ready (:meth:`SecurityState.slot_ready`,
  before their data port is told to serve anything) and whenever the allowlist, the ACLs or the
  token key change.  The state is versioned (:attr:`SecurityState.version`, one higher after
  every change); each control's id is ``security-<pid>-<version>`` and the worker's ack without
  an error records that its process holds that version.  A control can be lost (the backend
  send does not block: a worker not keeping up, or not connected yet), so every turn a serving
  slot whose process has not acknowledged the current version is sent it again, at most every
  :data:`RESEND_AFTER_S`.

With security off every method is a no-op.  Only the arbiter's loop thread calls it (and
:meth:`join` before the loop runs).
"""

from __future__ import annotations

import collections
import contextlib
import ipaddress
import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from hpbroker.broker.config import BrokerConfig
from hpbroker.security.broker import BrokerSecurity
from hpbroker.workers.slots import Slot

if TYPE_CHECKING:  # kazoo is loaded only by a broker configured with ZooKeeper
    from hpbroker.coord.member import BrokerMember
    from hpbroker.coord.zk_security import ZkCredentials
    from hpbroker.security.acls import AclEntry

__all__ = ["RESEND_AFTER_S", "SecurityState", "data_port_host"]

logger = logging.getLogger(__name__)

# Hands a control to a slot's process: (slot index, op, body) -> False when it cannot now.
SendControl = Callable[[int, str, dict[str, Any]], bool]
RESEND_AFTER_S = 1.0  # a slot behind on the security state is sent it again at most this often
RESEND_LOG_INTERVAL_S = 60.0  # one INFO line per slot per this long while it stays behind
_ID_PREFIX = "security-"  # a security control's id: security-<pid>-<version>


def data_port_host(config: BrokerConfig) -> str:
    """The address the data ports bind: ``host``, or 127.0.0.1 with security on and
    ``data_port_auth = "loopback"`` -- then, when ``host`` is not a loopback address, a WARNING:
    the broker advertises ``host`` with its data ports, so consumers and followers on other
    hosts are refused there."""
    if config.security != "curve" or config.data_port_auth != "loopback":
        return config.host
    if not _is_loopback(config.host):
        logger.warning("[arbiter] data_port_auth = 'loopback': the data ports listen on 127.0.0.1 only, "
                       "while the broker is reached at %s: consumers on other hosts cannot fetch from it "
                       "and followers on other hosts cannot replicate from it (connection refused); use "
                       "data_port_auth = 'token' for a broker served to other hosts", config.host)
    return "127.0.0.1"


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: what it resolves to is not looked up here
        return False


class SecurityState:
    """The arbiter's security wiring (module docstring).  ``send_control`` is the front-end's;
    ``wake`` wakes the loop from another thread."""

    def __init__(self, security: BrokerSecurity, slots: Sequence[Slot], send_control: SendControl,
                 wake: Callable[[], None], *, clock: Callable[[], float] = time.monotonic) -> None:
        self.security = security
        self._slots = slots
        self._send_control = send_control
        self._wake = wake
        self._clock = clock
        self.version = 1  # of the workers' security state: one higher after every change
        self._acked: dict[int, tuple[int, int]] = {}  # slot -> (pid, version) its process acknowledged
        self._sent_at: dict[int, float] = {}  # slot -> when it was last sent the state
        self._resend_logged_at: dict[int, float] = {}  # slot -> when a resend to it was last logged
        # ACLs as a kazoo thread last saw them, for the loop to take (a deque: append and pop are atomic)
        self._acl_updates: collections.deque[list[AclEntry]] = collections.deque(maxlen=1)
        self._acl_watch: Any = None  # the ACL node's watch (hpbroker.coord.acl_store), once joined

    @property
    def enabled(self) -> bool:
        return self.security.enabled

    # --- ZooKeeper ----------------------------------------------------------------------------

    def join(self, member: BrokerMember, credentials: ZkCredentials | None) -> None:
        """With security on: take the cluster's token key and watch the ACLs (called with the
        loop's signals blocked: kazoo's threads inherit them).  HPBrokerError when ZooKeeper
        refuses or fails (the broker halts)."""
        if not self.enabled:
            return
        from hpbroker.coord.acl_store import watch_acls

        if credentials is not None:
            from hpbroker.coord.zk_security import get_or_create_token_key, issue_group_credentials

            session, paths = member.session, member.paths
            self.security.set_token_key(get_or_create_token_key(session, paths, credentials=credentials))
            self.security.set_group_issuer(lambda token_key, group: issue_group_credentials(
                session, paths, token_key, group, credentials))

        def acls_changed(entries: list[AclEntry]) -> None:
            self._acl_updates.append(list(entries))
            self._wake()

        self._acl_watch = watch_acls(member.session, acls_changed, member.paths)
        # The watch read the ACLs once already: in force before the loop judges the first request
        # (those queued while the broker joined included).  A first read that failed leaves them
        # unknown (requests get 17, retriable) until the watch reads them.
        if not self._take_acls() and not self.security.acls_known:
            logger.warning("[arbiter] the ACLs could not be read from ZooKeeper yet: requests are answered "
                           "17 (retriable) until they are")
        self.push()  # the cluster's token key and the ACLs, to any worker already told others

    def leave(self) -> None:
        """Stop watching the ACLs and issuing group credentials (the session is closing)."""
        if self._acl_watch is not None:
            with contextlib.suppress(Exception):  # the session may be gone already
                self._acl_watch.cancel()
            self._acl_watch = None
        self.security.set_group_issuer(None)

    # --- the loop -----------------------------------------------------------------------------

    def turn(self) -> bool:
        """False when the ZAP handler has died (the arbiter halts); else take ACL changes and
        hand the workers the new state."""
        security = self.security
        if not security.enabled:
            return True
        if not security.check_alive():
            logger.critical("[arbiter] the ZAP authenticator's thread has died: no connection can be "
                            "authenticated; stopping")
            return False
        if self._take_acls():
            self.push()
        else:
            self._resend()
        return True

    def _take_acls(self) -> bool:
        """Apply the ACLs the watch handed over; True when they changed."""
        changed = False
        while self._acl_updates:
            entries = self._acl_updates.popleft()
            if self.security.set_acls(entries):
                changed = True
                logger.info("[arbiter] ACLs changed: %d entries", len(entries))
        return changed

    def reload(self) -> None:
        """SIGHUP: read the allowlist again (security on); nothing else is reloaded."""
        security = self.security
        if not security.enabled:
            logger.info("[arbiter] SIGHUP: security is off, nothing to reload (the configuration is read "
                        "only at start)")
            return
        added, removed = security.reload()
        logger.info("[arbiter] SIGHUP: allowlist reloaded: %d keys%s%s", len(security.principals()),
                    f"; added {', '.join(sorted(added))}" if added else "",
                    f"; removed {', '.join(sorted(removed))} (refused from their next request)"
                    if removed else "")
        if added or removed:
            self.push()

    # --- the workers --------------------------------------------------------------------------

    def slot_ready(self, slot: Slot) -> None:
        """A worker reported ready: its state, before its data port is told to serve anything."""
        if not self.enabled:
            return
        self._acked.pop(slot.index, None)
        self._send(slot, self.security.worker_state())

    def push(self) -> None:
        """The state changed: a new version, sent to every serving slot."""
        if not self.enabled:
            return
        self.version += 1
        state = self.security.worker_state()
        for slot in self._slots:
            if slot.serving:
                self._send(slot, state)

    def _resend(self) -> None:
        """Send the state again to every serving slot whose process has not acknowledged this
        version, at most every :data:`RESEND_AFTER_S` (a send refused or a control lost)."""
        now, state = self._clock(), None
        for slot in self._slots:
            if slot.serving and self._acked.get(slot.index) != (slot.pid, self.version) \
                    and now - self._sent_at.get(slot.index, -float("inf")) >= RESEND_AFTER_S:
                if state is None:
                    state = self.security.worker_state()
                if now - self._resend_logged_at.get(slot.index, -float("inf")) >= RESEND_LOG_INTERVAL_S:
                    self._resend_logged_at[slot.index] = now
                    logger.info("[arbiter] worker slot=%d has not acknowledged security state %d: sent "
                                "again (said at most every %.0f s)", slot.index, self.version,
                                RESEND_LOG_INTERVAL_S)
                self._send(slot, state)

    def _send(self, slot: Slot, state: dict[str, Any]) -> None:
        self._sent_at[slot.index] = self._clock()
        self._send_control(slot.index, "security", {**state, "id": f"{_ID_PREFIX}{slot.pid}-{self.version}"})

    @staticmethod
    def owns(control_id: object) -> bool:
        """Whether a worker's ack is of a ``security`` control."""
        return isinstance(control_id, str) and control_id.startswith(_ID_PREFIX)

    def acked(self, slot: Slot, control_id: str, error: object) -> None:
        """A worker's ack of a ``security`` control: without an error, its process has the
        version the id names; with one, it is sent again (logged)."""
        if error:
            logger.error("[arbiter] worker slot=%d could not take the security state: %s", slot.index, error)
            return
        try:
            pid, version = (int(part) for part in control_id[len(_ID_PREFIX):].split("-"))
        except ValueError:
            logger.warning("[arbiter] worker slot=%d acknowledged a security control %r of no version",
                           slot.index, control_id)
            return
        if pid == slot.pid:
            before = self._acked.get(slot.index)
            if before is None or before[0] != pid or before[1] < version:
                self._acked[slot.index] = (pid, version)

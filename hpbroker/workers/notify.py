"""Telling the service manager how the broker is doing: systemd's ``sd_notify`` protocol, in Python.

Under systemd with ``Type=notify`` the service manager passes ``$NOTIFY_SOCKET``, the address of a
Unix datagram socket (a path, or an abstract name written with a leading ``@``).  Each datagram
is newline-separated ``KEY=VALUE`` assignments; the ones the broker sends:

- ``READY=1`` once every worker has recovered its partitions and serves, or, while some slot is
  crash-looping, once every slot serves or is held back (the unit then counts as started, and
  ``systemctl start`` returns);
- ``STATUS=<text>``, shown by ``systemctl status``: recovering, serving, a worker respawned,
  ``degraded: worker slot N is crash-looping ...`` (``unavailable: ...`` when no slot serves),
  stopping;
- ``STOPPING=1`` when a graceful stop begins;
- ``WATCHDOG=1`` every half ``$WATCHDOG_USEC`` when systemd set it (``WatchdogSec=``), from the
  arbiter's loop, so a loop that hangs gets the broker restarted;
- ``EXTEND_TIMEOUT_USEC`` every ``EXTEND_INTERVAL_S`` from the loop until ``READY=1``: recovery
  may outlast the unit's ``TimeoutStartSec`` (the arbiter's own boot timeouts bound it), while a
  start whose loop hangs still times out ``EXTEND_TIMEOUT_S`` later.

Without ``$NOTIFY_SOCKET`` every call does nothing, and nothing raises: the first failure is
logged, the next ones only at debug level.  ``READY=1`` and ``STOPPING=1`` are sent as libsystemd
sends them, blocking up to ``BLOCKING_SEND_S`` when the manager's queue is full; a ``READY=1``
that still could not be sent is sent again from the loop until it is, since the unit would
otherwise never count as started.  The rest never block (``MSG_DONTWAIT``): a lost status line or
ping is followed by the next.  No libsystemd.

Only the arbiter notifies (``NotifyAccess=main``): it calls this from its loop, never from a
signal handler.  A notifier reading the process's own environment removes ``$NOTIFY_SOCKET`` and
``$WATCHDOG_*`` from it (as ``sd_notify``'s ``unset_environment`` does), so that no process
started later inherits them: they are meant for this one.  The socket is opened close-on-exec,
and the workers forked later close every inherited socket, this one included.
"""

from __future__ import annotations

import logging
import os
import socket
import struct
from collections.abc import Mapping, MutableMapping

__all__ = ["SERVICE_MANAGER_VARIABLES", "ServiceNotifier", "withhold_service_manager"]

logger = logging.getLogger(__name__)

NOTIFY_SOCKET_VARIABLE = "NOTIFY_SOCKET"  # where to send: a path, or @name for an abstract socket
WATCHDOG_USEC_VARIABLE = "WATCHDOG_USEC"  # the watchdog timeout in µs, when one is set
WATCHDOG_PID_VARIABLE = "WATCHDOG_PID"  # the process the watchdog is meant for, when given
# What the service manager tells its main process alone.
SERVICE_MANAGER_VARIABLES = (NOTIFY_SOCKET_VARIABLE, WATCHDOG_USEC_VARIABLE, WATCHDOG_PID_VARIABLE)
BLOCKING_SEND_S = 2.0  # the longest READY=1 or STOPPING=1 waits for room in the manager's queue
RETRY_READY_S = 1.0  # between two attempts at a READY=1 that could not be sent
EXTEND_INTERVAL_S = 30.0  # between two EXTEND_TIMEOUT_USEC while starting
EXTEND_TIMEOUT_S = 90.0  # what each one grants


def withhold_service_manager(environ: MutableMapping[str, str] | None = None) -> None:
    """Remove the service manager's variables from ``environ`` (default: this process's
    environment), so that the processes started from now on do not take its messages for theirs."""
    environ = os.environ if environ is None else environ
    for name in SERVICE_MANAGER_VARIABLES:
        environ.pop(name, None)


class ServiceNotifier:
    """Sends sd_notify datagrams to ``$NOTIFY_SOCKET`` (module docstring).  Single-threaded."""

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        """``environ`` None: this process's environment, from which the variables are then
        removed (module docstring)."""
        own = environ is None
        environ = os.environ if environ is None else environ
        self._address = _socket_address(environ.get(NOTIFY_SOCKET_VARIABLE, ""))
        self._socket: socket.socket | None = None
        self._failed = False
        self.watchdog_interval_s = _watchdog_interval_s(environ)
        self._next_ping = 0.0
        self._starting = True  # until READY=1 is sent
        self._unsent_ready: dict[str, str] | None = None  # a READY=1 to send again
        self._next_ready = 0.0
        self._next_extend = 0.0
        if own:
            withhold_service_manager()

    @property
    def enabled(self) -> bool:
        """Whether a service manager listens (``$NOTIFY_SOCKET`` is set)."""
        return self._address is not None

    def ready(self, status: str) -> bool:
        """``READY=1``; when it cannot be sent, :meth:`ping_if_due` sends it again."""
        assignments = {"READY": "1", "STATUS": status}
        sent = self.send(blocking=True, **assignments)
        self._unsent_ready = None if sent or not self.enabled else assignments
        self._starting = self._unsent_ready is not None  # still extending the start until it is sent
        return sent

    def status(self, status: str) -> None:
        if self._unsent_ready is not None:  # the READY=1 still to come would show an older one
            self._unsent_ready["STATUS"] = status
        self.send(STATUS=status)

    def stopping(self, status: str) -> None:
        self._unsent_ready = None
        self._starting = False
        self.send(blocking=True, STOPPING="1", STATUS=status)

    def ping_if_due(self, now: float) -> None:
        """Called from the loop, ``now`` being ``time.monotonic()``: ``WATCHDOG=1`` when a
        watchdog is set and half its timeout has passed since the last ping; while starting,
        ``EXTEND_TIMEOUT_USEC`` every ``EXTEND_INTERVAL_S``; a ``READY=1`` not sent yet, again."""
        if self._address is None:
            return
        if self._starting and now >= self._next_extend:
            self._next_extend = now + EXTEND_INTERVAL_S
            self.send(EXTEND_TIMEOUT_USEC=str(int(EXTEND_TIMEOUT_S * 1_000_000)))
        if self._unsent_ready is not None and now >= self._next_ready:
            self._next_ready = now + RETRY_READY_S
            if self.send(**self._unsent_ready):  # the first, blocking try was ready(): never stall the loop
                self._unsent_ready = None
                self._starting = False
        if self.watchdog_interval_s is None or now < self._next_ping:
            return
        self._next_ping = now + self.watchdog_interval_s
        self.send(WATCHDOG="1")

    def send(self, *, blocking: bool = False, **assignments: str) -> bool:
        """One datagram of ``KEY=VALUE`` lines; True when it was sent.  Values lose their
        newlines (one assignment per line).  ``blocking``: wait up to ``BLOCKING_SEND_S`` for
        room in the manager's queue; else give up at once when it is full."""
        if self._address is None:
            return False
        text = "\n".join(f"{key}={' '.join(str(value).splitlines())}" for key, value in assignments.items())
        try:
            if self._socket is None:
                self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
                # A blocking socket whose sends give up after BLOCKING_SEND_S (EAGAIN), as libsystemd's.
                seconds = int(BLOCKING_SEND_S)
                timeout = struct.pack("ll", seconds, int((BLOCKING_SEND_S - seconds) * 1_000_000))
                self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, timeout)
            self._socket.sendto(text.encode("utf-8"), 0 if blocking else socket.MSG_DONTWAIT, self._address)
        except OSError as e:
            logger.log(logging.DEBUG if self._failed else logging.WARNING,
                       "[arbiter] cannot notify the service manager at %s: %s", self._address, e)
            self._failed = True
            return False
        return True

    def close(self) -> None:
        if self._socket is not None:
            self._socket.close()
            self._socket = None


def _socket_address(value: str) -> str | bytes | None:
    """The ``sendto`` address of ``$NOTIFY_SOCKET``: a path, or ``@name`` as the abstract name
    ``\\0name``; None when unset or not a Unix socket address."""
    if value.startswith("@"):
        return b"\0" + value[1:].encode()
    if value.startswith("/"):
        return value
    if value:
        logger.warning("[arbiter] ignoring %s=%r: neither a path nor an @abstract name",
                       NOTIFY_SOCKET_VARIABLE, value)
    return None


def _watchdog_interval_s(environ: Mapping[str, str]) -> float | None:
    """Half the watchdog timeout, in seconds, when one is set for this process."""
    raw = environ.get(WATCHDOG_USEC_VARIABLE, "")
    pid = environ.get(WATCHDOG_PID_VARIABLE, "")
    if not raw or (pid and pid != str(os.getpid())):
        return None
    try:
        usec = int(raw)
    except ValueError:
        usec = 0
    if usec <= 0:
        logger.warning("[arbiter] ignoring %s=%r: not a positive integer", WATCHDOG_USEC_VARIABLE, raw)
        return None
    return usec / 2_000_000

"""Telling the service manager how the broker is doing: systemd's ``sd_notify`` protocol, in Python.

Under systemd with ``Type=notify`` the service manager passes ``$NOTIFY_SOCKET``, the address of a
Unix datagram socket (a path, or an abstract name written with a leading ``@``).  Each datagram
is newline-separated ``KEY=VALUE`` assignments; the ones the broker sends:

- ``READY=1`` once every worker has recovered its partitions and serves (the unit then counts as
  started, and ``systemctl start`` returns);
- ``STATUS=<text>``, shown by ``systemctl status``: recovering, serving, a worker respawned,
  stopping;
- ``STOPPING=1`` when a graceful stop begins;
- ``WATCHDOG=1`` every half ``$WATCHDOG_USEC`` when systemd set it (``WatchdogSec=``), from the
  arbiter's loop, so a loop that hangs gets the broker restarted.

Without ``$NOTIFY_SOCKET`` every call does nothing.  A send never blocks (``MSG_DONTWAIT``) and
never raises: the first failure is logged, the next ones only at debug level.  No libsystemd.

Only the arbiter notifies (``NotifyAccess=main``): it calls this from its loop, never from a
signal handler.  The socket is opened close-on-exec, and the workers forked later close every
inherited socket, this one included.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Mapping

__all__ = ["ServiceNotifier"]

logger = logging.getLogger(__name__)

NOTIFY_SOCKET_VARIABLE = "NOTIFY_SOCKET"  # where to send: a path, or @name for an abstract socket
WATCHDOG_USEC_VARIABLE = "WATCHDOG_USEC"  # the watchdog timeout in µs, when one is set
WATCHDOG_PID_VARIABLE = "WATCHDOG_PID"  # the process the watchdog is meant for, when given


class ServiceNotifier:
    """Sends sd_notify datagrams to ``$NOTIFY_SOCKET`` (module docstring).  Single-threaded."""

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        environ = os.environ if environ is None else environ
        self._address = _socket_address(environ.get(NOTIFY_SOCKET_VARIABLE, ""))
        self._socket: socket.socket | None = None
        self._failed = False
        self.watchdog_interval_s = _watchdog_interval_s(environ)
        self._next_ping = 0.0

    @property
    def enabled(self) -> bool:
        """Whether a service manager listens (``$NOTIFY_SOCKET`` is set)."""
        return self._address is not None

    def ready(self, status: str) -> None:
        self.send(READY="1", STATUS=status)

    def status(self, status: str) -> None:
        self.send(STATUS=status)

    def stopping(self, status: str) -> None:
        self.send(STOPPING="1", STATUS=status)

    def ping_if_due(self, now: float) -> None:
        """``WATCHDOG=1`` when a watchdog is set and half its timeout has passed since the last
        ping; ``now`` is ``time.monotonic()``."""
        if self.watchdog_interval_s is None or now < self._next_ping:
            return
        self._next_ping = now + self.watchdog_interval_s
        self.send(WATCHDOG="1")

    def send(self, **assignments: str) -> bool:
        """One datagram of ``KEY=VALUE`` lines; True when it was sent.  Values lose their
        newlines (one assignment per line)."""
        if self._address is None:
            return False
        text = "\n".join(f"{key}={' '.join(str(value).splitlines())}" for key, value in assignments.items())
        try:
            if self._socket is None:
                self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
            self._socket.sendto(text.encode("utf-8"), socket.MSG_DONTWAIT, self._address)
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

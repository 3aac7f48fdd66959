"""Probes for the chaos tests: can one namespace open a TCP connection to an address."""

from __future__ import annotations

import subprocess
import sys

from chaos.netns import Host

_CONNECT = ("import socket, sys\n"
            "try:\n"
            "    address = (sys.argv[1], int(sys.argv[2]))\n"
            "    socket.create_connection(address, timeout=float(sys.argv[3])).close()\n"
            "except OSError as exc:\n"
            "    sys.exit(f'{type(exc).__name__}: {exc}')\n")
_LISTEN = ("import socket, sys\n"
           "s = socket.create_server((sys.argv[1], int(sys.argv[2])))\n"
           "print('listening', flush=True)\n"
           "while True:\n"
           "    s.accept()[0].close()\n")


def can_connect(source: Host | None, address: str, port: int, timeout_s: float = 2.0) -> bool:
    """Whether a TCP connection from ``source``'s namespace (None: the root namespace) to
    ``address:port`` is accepted within ``timeout_s``."""
    return connect_error(source, address, port, timeout_s) is None


def connect_error(source: Host | None, address: str, port: int, timeout_s: float = 2.0) -> str | None:
    """Why that connection failed (``"TimeoutError: timed out"``, ``"OSError: [Errno 22] ..."``),
    or None when it was accepted."""
    argv = [sys.executable, "-c", _CONNECT, address, str(port), str(timeout_s)]
    if source is not None:
        argv = source.argv(*argv)
    run = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s + 30)
    return None if run.returncode == 0 else (run.stderr.strip().splitlines() or ["failed"])[-1]


def listen(host: Host, port: int) -> subprocess.Popen[bytes]:
    """A process in ``host``'s namespace accepting (and closing) connections on its address;
    returns once it listens.  The caller kills it (by its pid)."""
    process = subprocess.Popen(host.argv(sys.executable, "-c", _LISTEN, host.address, str(port)),
                               stdout=subprocess.PIPE)
    assert process.stdout is not None
    if process.stdout.readline() != b"listening\n":
        process.kill()
        process.wait()
        raise RuntimeError(f"no listener on {host.address}:{port}")
    return process

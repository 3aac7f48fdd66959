"""A loopback TCP proxy between ZooKeeper clients and the server that can force connection losses.

``ZkProxy(server_port)`` listens on a free 127.0.0.1 port and forwards every connection to the
server.  It reads the client's side as ZooKeeper frames (a 4-byte big-endian length, then the
frame: the first one a connect request, every later one a request header of ``xid`` and ``type``,
both int32, followed for path requests by the path as an int32 length and UTF-8 bytes).  A
request that reads a *poisoned* path (``getData``, ``exists``, ``getChildren``) is not forwarded:
the connection is cut instead, so the client sees a connection loss for that request, exactly as
when a network drops at the wrong moment, and reconnects; every other request passes.  ``cuts``
counts the connections cut that way.  A read of a *stalled* path (``stall(path, delay_s)``) is
forwarded only ``delay_s`` after it arrived, holding up the requests behind it: the client waits
for the answer (its read may time out) while its connection stays up, as with a slow server.
``stalls`` counts the reads stalled."""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time

GET_DATA, EXISTS, GET_CHILDREN, GET_CHILDREN2 = 4, 3, 8, 12  # ZooKeeper's OpCode values
_READS = {GET_DATA, EXISTS, GET_CHILDREN, GET_CHILDREN2}


class ZkProxy:
    def __init__(self, server_port: int) -> None:
        self._target = ("127.0.0.1", server_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._poisoned: set[str] = set()
        self._stalled: dict[str, float] = {}  # path -> delay_s
        self.stalls = 0
        self._sockets: list[socket.socket] = []
        self.cuts = 0
        self._closed = False
        threading.Thread(target=self._accept, name="zk-proxy", daemon=True).start()

    def poison(self, path: str) -> None:
        with self._lock:
            self._poisoned.add(path)

    def cure(self, path: str) -> None:
        with self._lock:
            self._poisoned.discard(path)
            self._stalled.pop(path, None)

    def stall(self, path: str, delay_s: float) -> None:
        with self._lock:
            self._stalled[path] = delay_s

    def close(self) -> None:
        self._closed = True
        self._listener.close()
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            _shut(sock)

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
                server = socket.create_connection(self._target, timeout=5)
            except OSError:
                continue
            server.settimeout(None)
            with self._lock:
                self._sockets += [client, server]
            threading.Thread(target=self._requests, args=(client, server), daemon=True).start()
            threading.Thread(target=self._answers, args=(server, client), daemon=True).start()

    def _answers(self, server: socket.socket, client: socket.socket) -> None:
        try:
            while data := server.recv(65536):
                client.sendall(data)
        except OSError:
            pass
        _shut(client)
        _shut(server)

    def _requests(self, client: socket.socket, server: socket.socket) -> None:
        buffer, first = b"", True
        try:
            while data := client.recv(65536):
                buffer += data
                while len(buffer) >= 4:
                    (length,) = struct.unpack_from(">i", buffer)
                    if len(buffer) < 4 + length:
                        break
                    frame, buffer = buffer[:4 + length], buffer[4 + length:]
                    path = None if first else _path_read(frame[4:])
                    with self._lock:
                        poisoned = path in self._poisoned
                        delay_s = self._stalled.get(path) if path is not None else None
                        self.cuts += poisoned
                        self.stalls += delay_s is not None
                    if poisoned:
                        raise OSError("cut")
                    if delay_s is not None:
                        time.sleep(delay_s)
                    first = False
                    server.sendall(frame)
        except OSError:
            pass
        _shut(client)
        _shut(server)


def _path_read(body: bytes) -> str | None:
    """The path a request frame's body reads (None: not a read)."""
    if len(body) < 12:
        return None
    _xid, op, path_length = struct.unpack_from(">iii", body)
    if op not in _READS or path_length < 0:
        return None
    return body[12:12 + path_length].decode("utf-8", "replace")


def _shut(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()

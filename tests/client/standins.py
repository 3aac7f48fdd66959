"""Stand-in brokers for pure client logic: a real ZeroMQ front-end (ROUTER) and a real TCP data
port on loopback, each answering requests with a function the test gives.  They speak the
protocol through ``hpbroker.protocol`` and answer in the version asked, as a broker does; what a
test wants to see of a replicated cluster (a leader moving, an old broker) is in its function."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable

import zmq

from hpbroker import protocol

# handler(header, request) -> (response body, error code, error message[, version to answer in]),
# or None for no answer at all
Handler = Callable[[protocol.RequestHeader, protocol.Message], tuple]


def _copy(message: protocol.Message) -> protocol.Message:
    message.payload = bytes(message.payload)  # the frame it views is reused
    return message


class StandInFrontEnd:
    """A ZeroMQ ROUTER on a free loopback port, answering on a thread of its own."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.requests: list[tuple[protocol.RequestHeader, protocol.Message]] = []
        self._socket = zmq.Context.instance().socket(zmq.ROUTER)
        self._socket.setsockopt(zmq.LINGER, 0)
        self.port = self._socket.bind_to_random_port("tcp://127.0.0.1")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            if not self._socket.poll(50):
                continue
            identity, *frames = self._socket.recv_multipart()
            header, request = protocol.decode_request(frames)
            self.requests.append((header, _copy(request)))
            answered = self.handler(header, request)
            if answered is None:  # a broker that took the request and never answers it
                continue
            body, code, text, *version = answered
            answer = protocol.encode_response(body, header.correlation_id, code, text,
                                              version=version[0] if version else header.api_version)
            self._socket.send_multipart([identity, *answer])

    def of_type(self, cls: type) -> list[tuple[protocol.RequestHeader, protocol.Message]]:
        return [(header, request) for header, request in self.requests if isinstance(request, cls)]

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._socket.close()


class StandInDataPort:
    """A TCP data port on a free loopback port: one thread, one connection at a time."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.requests: list[tuple[protocol.RequestHeader, protocol.Message]] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.05)
        self.port = self._listener.getsockname()[1]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(0.05)
                decoder = protocol.TcpFrameDecoder()
                while not self._stop.is_set():
                    try:
                        data = conn.recv(65536)
                    except TimeoutError:
                        continue
                    except OSError:
                        break
                    if not data:
                        break
                    for frames in decoder.feed(data):
                        header, request = protocol.decode_request(frames)
                        self.requests.append((header, _copy(request)))
                        body, code, text = self.handler(header, request)
                        answer = protocol.encode_response(body, header.correlation_id, code, text,
                                                          version=header.api_version)
                        conn.sendall(b"".join(bytes(f) for f in protocol.frame_tcp(answer)))

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._listener.close()

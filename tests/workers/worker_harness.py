"""A fake arbiter and real worker processes for the worker tests.

:class:`FakeArbiter` binds the backend ROUTER (``ROUTER_HANDOVER`` on, as the arbiter does) on an
``ipc://`` path in a short temporary directory, relays requests to a worker slot and reads what
comes back.  :class:`WorkerProcess` creates the slot's TCP data listener and forks a child that
calls :func:`~hpbroker.workers.worker.run_worker` and ``os._exit``\\s with its status, exactly as
the arbiter will; the child creates its own ZeroMQ context.  :class:`TcpClient` speaks the data
port's framing.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import sys
import time
import traceback
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import zmq

from hpbroker import protocol, records
from hpbroker.broker.config import BrokerConfig
from hpbroker.io import LogConfig, PartitionLog
from hpbroker.workers import backend
from hpbroker.workers.backend import PartitionSpec
from hpbroker.workers.worker import run_worker

REPO_ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 10.0  # the longest any single expected event may take before a test fails
CLIENT = b"\x00client-1"  # a front-end routing id, as the arbiter would relay it

# Flush on every append (no waiting for flush_ms), fsync off: fast tests; tests of flush timing
# and durability override these.
FAST_LOG = {"flush_messages": 1, "flush_ms": 0, "flush_fsync": False}


class FakeArbiter:
    """The backend ROUTER side of the arbiter, for one test."""

    def __init__(self, run_dir: str) -> None:
        self.run_dir = run_dir
        self.address = f"ipc://{run_dir}/backend.sock"
        self.context = zmq.Context()
        self.router = self.context.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.ROUTER_HANDOVER, 1)
        self.router.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.router.setsockopt(zmq.LINGER, 0)
        self.router.bind(self.address)
        self._inbox: deque[tuple[bytes, backend.Relay | backend.Control]] = deque()
        self._correlation_ids = iter(range(1, 2**31))

    def close(self) -> None:
        self.router.close(linger=0)
        self.context.term()

    def next_correlation_id(self) -> int:
        return next(self._correlation_ids)

    # --- sending ---------------------------------------------------------------------------------

    def send_frames(self, slot: int, frames: list[Any]) -> None:
        self.router.send_multipart([backend.worker_identity(slot), *frames])

    def relay(self, slot: int, request: protocol.Message, correlation_id: int | None = None,
              client: bytes = CLIENT) -> int:
        """Relay ``request`` to the worker of ``slot``; returns its correlation id."""
        correlation_id = self.next_correlation_id() if correlation_id is None else correlation_id
        frames = protocol.encode_request(request, correlation_id, "test")
        self.send_frames(slot, backend.encode_relay(client, frames))
        return correlation_id

    def control(self, slot: int, op: str, **body: Any) -> dict[str, Any]:
        """Send a control message and wait for its ack."""
        ident = self.next_correlation_id()
        self.send_frames(slot, backend.encode_control(op, id=ident, **body))
        ack = self.expect_control("ack", timeout_s=30)
        assert ack["id"] == ident, ack
        return ack

    # --- receiving -------------------------------------------------------------------------------

    def receive(self, timeout_s: float = TIMEOUT_S) -> tuple[bytes, backend.Relay | backend.Control]:
        """The next message from any worker: (worker identity, decoded message)."""
        if self._inbox:
            return self._inbox.popleft()
        if not self.router.poll(int(timeout_s * 1000)):
            raise TimeoutError(f"nothing from a worker within {timeout_s} s")
        identity, *frames = self.router.recv_multipart()
        return identity, backend.decode(frames)

    def nothing_within(self, timeout_s: float) -> bool:
        """True if no message arrives within ``timeout_s`` (one that does is kept for later)."""
        try:
            self._inbox.append(self.receive(timeout_s))
        except TimeoutError:
            return True
        return False

    def expect_control(self, op: str, timeout_s: float = TIMEOUT_S) -> dict[str, Any]:
        _identity, message = self.receive(timeout_s)
        assert isinstance(message, backend.Control), f"expected a control {op!r}, got {message!r}"
        assert message.op == op, message
        return message.body

    def response(self, api_key: int, timeout_s: float = TIMEOUT_S, client: bytes = CLIENT,
                 ) -> tuple[protocol.ResponseHeader, Any]:
        """The next relayed response, decoded as a response to ``api_key``."""
        _identity, message = self.receive(timeout_s)
        assert isinstance(message, backend.Relay), f"expected a response, got {message!r}"
        assert message.client == client
        header, body = protocol.decode_response(api_key, [bytes(memoryview(f)) for f in message.frames])
        return header, body

    def response_header(self, timeout_s: float = TIMEOUT_S) -> protocol.ResponseHeader:
        """Only the header of the next relayed response (for responses without a known body)."""
        _identity, message = self.receive(timeout_s)
        assert isinstance(message, backend.Relay), f"expected a response, got {message!r}"
        reader = protocol._Reader(bytes(memoryview(message.frames[0])))
        return protocol._decode_fields(protocol.ResponseHeader, reader)

    def any_response(self, api_keys: dict[int, int], timeout_s: float = TIMEOUT_S,
                     ) -> tuple[protocol.ResponseHeader, Any]:
        """The next relayed response, decoded by the API key ``api_keys`` gives its correlation id."""
        _identity, message = self.receive(timeout_s)
        assert isinstance(message, backend.Relay), f"expected a response, got {message!r}"
        frames = [bytes(memoryview(f)) for f in message.frames]
        correlation_id = int.from_bytes(frames[0][:4], "little")
        return protocol.decode_response(api_keys[correlation_id], frames)

    def call(self, slot: int, request: protocol.Message, timeout_s: float = TIMEOUT_S,
             ) -> tuple[protocol.ResponseHeader, Any]:
        """Relay and wait for the response (no other request may be in flight)."""
        correlation_id = self.relay(slot, request)
        header, body = self.response(request.API_KEY, timeout_s)
        assert header.correlation_id == correlation_id
        return header, body


class WorkerProcess:
    """One worker slot run in a forked child, its data listener created here first."""

    def __init__(self, arbiter: FakeArbiter, data_dir: str, *, slot: int = 0,
                 partitions: list[tuple[str, int]] | None = None, log: dict[str, Any] | None = None,
                 specs: list[PartitionSpec] | None = None, child_setup: Callable[[], None] | None = None,
                 **config: Any) -> None:
        """``child_setup`` runs in the child before run_worker (to ignore a signal, to break a
        system call, to shorten an interval)."""
        self.arbiter = arbiter
        self.slot = slot
        self.child_setup = child_setup
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        pairs = partitions or [("orders", 0), ("orders", 1)]
        self.specs = specs if specs is not None else [PartitionSpec(t, p) for t, p in pairs]
        settings = {"heartbeat_interval_ms": 100, "graceful_timeout_ms": 10_000, **config}
        self.config = BrokerConfig(data_dir=data_dir, run_dir=arbiter.run_dir, workers=slot + 1,
                                   fetch_port=self.port - slot, port=1,
                                   log=LogConfig(**{**FAST_LOG, **(log or {})}), **settings)
        self.pid = 0
        self.status: int | None = None

    def directory(self, topic: str, partition: int) -> str:
        return os.path.join(self.config.data_dir, f"{topic}-{partition}")

    def start(self, *, wait_ready: bool = True) -> WorkerProcess:
        pid = os.fork()
        if pid == 0:  # the child: never returns into pytest
            status = 1
            try:
                _child_logging()
                if self.child_setup is not None:
                    self.child_setup()
                status = run_worker(self.slot, self.config, self.specs, self.listener, self.arbiter.address,
                                    self.arbiter.run_dir)
            except BaseException:
                traceback.print_exc()
            finally:
                sys.stderr.flush()
                os._exit(status)
        self.pid = pid
        if wait_ready:
            ready = self.arbiter.expect_control("ready", timeout_s=30)
            assert ready == {"slot": self.slot, "pid": pid}
        return self

    def signal(self, signum: int) -> None:
        os.kill(self.pid, signum)

    def wait(self, timeout_s: float = TIMEOUT_S) -> int:
        """Reap the child; its exit status (negative: killed by that signal)."""
        if self.status is not None:
            return self.status
        deadline = time.monotonic() + timeout_s
        while True:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.status = os.waitstatus_to_exitcode(status)
                return self.status
            if time.monotonic() > deadline:
                raise TimeoutError(f"worker {self.pid} still running after {timeout_s} s")
            time.sleep(0.01)

    def kill(self) -> None:
        if self.pid and self.status is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
            self.wait()

    def close(self) -> None:
        self.kill()
        self.listener.close()


def _child_logging() -> None:
    """Worker logs go to stderr (pytest shows them with a failing test), not to pytest's
    in-process capture handlers inherited through the fork."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    root.addHandler(handler)
    root.setLevel(logging.INFO)


class TcpClient:
    """A client of a worker's data port."""

    def __init__(self, port: int, *, rcvbuf: int | None = None) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf is not None:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.settimeout(TIMEOUT_S)
        self.sock.connect(("127.0.0.1", port))
        self.decoder = protocol.TcpFrameDecoder()
        self._messages: deque[list[bytes]] = deque()

    def close(self) -> None:
        self.sock.close()

    def send(self, request: protocol.Message, correlation_id: int) -> None:
        frames = protocol.encode_request(request, correlation_id, "tcp-test")
        self.sock.sendall(b"".join(bytes(f) for f in protocol.frame_tcp(frames)))

    def response(self, api_key: int, *, chunk: int = 256 << 10, pause_s: float = 0.0,
                 ) -> tuple[protocol.ResponseHeader, Any]:
        while not self._messages:
            data = self.sock.recv(chunk)
            if not data:
                raise ConnectionError("the worker closed the connection")
            self._messages.extend(self.decoder.feed(data))
            if pause_s:
                time.sleep(pause_s)
        return protocol.decode_response(api_key, self._messages.popleft())

    def nothing_within(self, timeout_s: float) -> bool:
        """Whether no byte arrives within ``timeout_s`` (a byte that does is kept for later)."""
        self.sock.settimeout(timeout_s)
        try:
            data = self.sock.recv(1)
        except TimeoutError:
            return True
        finally:
            self.sock.settimeout(TIMEOUT_S)
        self._messages.extend(self.decoder.feed(data))
        return False

    def is_closed_by_peer(self, timeout_s: float = TIMEOUT_S) -> bool:
        """Whether the worker closes the connection (EOF or reset) within ``timeout_s``."""
        self.sock.settimeout(timeout_s)
        try:
            while True:
                if not self.sock.recv(65536):
                    return True
        except ConnectionResetError:
            return True
        except TimeoutError:
            return False
        finally:
            self.sock.settimeout(TIMEOUT_S)


# --- batches and logs ------------------------------------------------------------------------------


def make_batch(tag: str, count: int = 3, value_bytes: int = 32) -> bytes:
    """A batch whose record values name the batch and the record."""
    values = [f"{tag}/{i}/".encode().ljust(value_bytes, b".") for i in range(count)]
    return records.build_batch(values, producer="worker-tests")


def values_of(payload: bytes | memoryview) -> list[bytes]:
    return [record.value for record in records.decode_records(payload)]


def batch_values(batch: bytes) -> list[bytes]:
    return values_of(batch)


def read_log_values(directory: str) -> list[tuple[int, bytes]]:
    """(offset, value) of every record of the log in ``directory``, reopened here (recovery runs)."""
    out = []
    with PartitionLog(directory, LogConfig()) as log:
        offset = log.log_start_offset
        while offset < log.high_watermark:
            data = log.read_bytes(offset, 1 << 20)
            decoded = list(records.decode_records(data))
            assert decoded
            out.extend((r.offset, r.value) for r in decoded if r.offset >= offset)
            offset = decoded[-1].offset + 1
    return out


def produce_request(topic: str, partition: int, payload: bytes, *, acks: int = 1,
                    timeout_ms: int = 10_000) -> protocol.ProduceRequest:
    return protocol.ProduceRequest(topic, partition, acks=acks, timeout_ms=timeout_ms, payload=payload)


def fetch_request(topic: str, partition: int, offset: int, *, max_bytes: int = 1 << 20, max_wait_ms: int = 0,
                  min_bytes: int = 1) -> protocol.FetchRequest:
    return protocol.FetchRequest(topic, partition, offset, max_bytes=max_bytes, max_wait_ms=max_wait_ms,
                                 min_bytes=min_bytes)

"""Client-side probes of a secured broker's front-end, with pyzmq's CURVE directly: key pairs
made with ``zmq.auth``, an allowlist directory, and a DEALER that records its handshake's fate."""

from __future__ import annotations

import itertools
import os
import shutil
from pathlib import Path

import zmq
import zmq.auth

from hpbroker import protocol

__all__ = ["Keys", "Probe", "make_keys"]


class Keys:
    """Key pairs made with pyzmq: ``secrets/NAME.key_secret`` and the public ``NAME.key``
    beside it; the broker's allowlist is ``allowlist/``."""

    def __init__(self, root: Path, names: list[str]) -> None:
        self.secrets = root / "secrets"
        self.allowlist = root / "allowlist"
        self.secrets.mkdir()
        self.allowlist.mkdir()
        for name in names:
            zmq.auth.create_certificates(str(self.secrets), name)

    def pair(self, name: str) -> tuple[bytes, bytes]:
        return zmq.auth.load_certificate(str(self.secrets / f"{name}.key_secret"))  # type: ignore[return-value]

    def allow(self, name: str) -> None:
        shutil.copy(self.secrets / f"{name}.key", self.allowlist / f"{name}.key")

    def disallow(self, name: str) -> None:
        os.unlink(self.allowlist / f"{name}.key")

    def env(self) -> dict[str, str]:
        return {"HPBROKER_SECURITY": "curve",
                "HPBROKER_SERVER_KEY_FILE": str(self.secrets / "broker.key_secret"),
                "HPBROKER_ALLOWLIST_DIR": str(self.allowlist)}


def make_keys(root: Path) -> Keys:
    """broker, alice and bob on the allowlist; mallory not."""
    keys = Keys(root, ["broker", "alice", "bob", "mallory"])
    for name in ("broker", "alice", "bob"):
        keys.allow(name)
    return keys


class Probe:
    """One DEALER on the broker's front-end (CURVE with ``pair``, NULL without) that has sent a
    metadata request, and a monitor that says whether its handshake failed."""

    _ids = itertools.count()

    def __init__(self, context: zmq.Context, port: int, server_key: bytes,
                 pair: tuple[bytes, bytes] | None) -> None:
        self.socket = context.socket(zmq.DEALER)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.setsockopt(zmq.RECONNECT_IVL, 20)
        if pair is not None:
            public, secret = pair
            self.socket.curve_publickey, self.socket.curve_secretkey = public, secret
            self.socket.curve_serverkey = server_key
        address = f"inproc://probe-monitor-{next(self._ids)}"
        self.socket.monitor(address, zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                            | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_SUCCEEDED
                            | zmq.EVENT_DISCONNECTED)
        self.monitor = context.socket(zmq.PAIR)
        self.monitor.setsockopt(zmq.LINGER, 0)
        self.monitor.connect(address)
        self.events: list[int] = []
        self.socket.connect(f"tcp://127.0.0.1:{port}")
        self.socket.send_multipart(protocol.encode_request(protocol.MetadataRequest([]), 1, "probe"))

    def take_events(self) -> list[int]:
        while self.monitor.poll(0):
            frames = self.monitor.recv_multipart()
            self.events.append(int.from_bytes(frames[0][:2], "little"))
        return self.events

    def refused(self) -> bool:
        failed = (zmq.EVENT_HANDSHAKE_FAILED_AUTH, zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL,
                  zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL, zmq.EVENT_DISCONNECTED)
        return any(event in failed for event in self.take_events())

    def answered(self) -> bool:
        return bool(self.socket.poll(0))

    def metadata(self, timeout_s: float = 10.0) -> protocol.MetadataResponse:
        if not self.socket.poll(int(timeout_s * 1000)):
            raise AssertionError(f"no metadata response in {timeout_s} s (events {self.take_events()})")
        _, response = protocol.decode_response(protocol.ApiKey.METADATA, self.socket.recv_multipart())
        return response

    def ask(self, message: protocol.Message, timeout_s: float = 10.0):
        """Send ``message`` on this connection and return its response's ``(header, body)``."""
        self.socket.send_multipart(protocol.encode_request(message, 2, "probe"))
        if not self.socket.poll(int(timeout_s * 1000)):
            raise AssertionError(f"no response to {type(message).__name__} in {timeout_s} s")
        return protocol.decode_response(message.API_KEY, self.socket.recv_multipart())

    def close(self) -> None:
        self.socket.disable_monitor()
        self.monitor.close()
        self.socket.close()

"""Client-side probes of a secured broker's front-end, with pyzmq's CURVE directly: key pairs
made with ``zmq.auth``, an allowlist directory, a DEALER that records its handshake's fate, and
a real secured broker (standalone or under ZooKeeper with the cluster's credentials) to point
them at."""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import shutil
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import zmq
import zmq.auth
from harness import BROKER_START_TIMEOUT_S, BrokerProcess, credentials_file, start_broker, wait_until

from hpbroker import protocol

__all__ = ["Keys", "Probe", "SecuredBroker", "make_keys", "secured_broker"]


class Keys:
    """Key pairs made with pyzmq: ``secrets/NAME.key_secret`` and the public ``NAME.key``
    beside it; the broker's allowlist is ``allowlist/``, holding ``allowed``."""

    def __init__(self, root: Path, names: Iterable[str], allowed: Iterable[str] = ()) -> None:
        self.secrets = root / "secrets"
        self.allowlist = root / "allowlist"
        self.secrets.mkdir()
        self.allowlist.mkdir()
        for name in names:
            zmq.auth.create_certificates(str(self.secrets), name)
        for name in allowed:
            self.allow(name)

    def pair(self, name: str) -> tuple[bytes, bytes]:
        return zmq.auth.load_certificate(str(self.secrets / f"{name}.key_secret"))  # type: ignore[return-value]

    def allow(self, name: str) -> None:
        shutil.copy(self.secrets / f"{name}.key", self.allowlist / f"{name}.key")

    def disallow(self, name: str) -> None:
        os.unlink(self.allowlist / f"{name}.key")

    def env(self, server: str = "broker") -> dict[str, str]:
        """A broker's security settings, its key pair ``server``'s."""
        return {"HPBROKER_SECURITY": "curve",
                "HPBROKER_SERVER_KEY_FILE": str(self.secrets / f"{server}.key_secret"),
                "HPBROKER_ALLOWLIST_DIR": str(self.allowlist)}


def make_keys(root: Path) -> Keys:
    """broker, alice and bob on the allowlist; mallory not."""
    return Keys(root, ["broker", "alice", "bob", "mallory"], allowed=["broker", "alice", "bob"])


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
        self.correlation_id = 1
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
        """Send ``message`` on this connection and return its response's ``(header, body)``
        (after :meth:`metadata` took the first request's answer)."""
        self.correlation_id += 1
        self.socket.send_multipart(protocol.encode_request(message, self.correlation_id, "probe"))
        if not self.socket.poll(int(timeout_s * 1000)):
            raise AssertionError(f"no response to {type(message).__name__} in {timeout_s} s")
        header, body = protocol.decode_response(message.API_KEY, self.socket.recv_multipart())
        assert header.correlation_id == self.correlation_id, (header, self.correlation_id)
        return header, body

    def close(self) -> None:
        self.socket.disable_monitor()
        self.monitor.close()
        self.socket.close()


@dataclass
class SecuredBroker:
    """A running broker with ``security = "curve"`` (:func:`secured_broker`).  ``session``: a
    ZooKeeper session with the cluster's credentials (None standalone); ``context``: for
    :class:`Probe` s, destroyed with the broker."""

    process: BrokerProcess
    port: int
    keys: Keys
    context: zmq.Context
    connect_string: str | None = None
    credentials_file: Path | None = None
    session: object | None = None

    @property
    def server_key(self) -> bytes:
        return self.keys.pair("broker")[0]

    def probe(self, name: str) -> Probe:
        """A probe authenticated as ``name``, its first request answered: ready to :meth:`Probe.ask`."""
        probe = Probe(self.context, self.port, self.server_key, self.keys.pair(name))
        probe.metadata()
        return probe


@contextlib.contextmanager
def secured_broker(root: Path, zookeeper: str | None = None, *, keys: Keys | None = None,
                   super_users: str = "", workers: int = 2,
                   env: dict[str, str] | None = None) -> Iterator[SecuredBroker]:
    """A real ``hpbroker serve`` with CURVE on, its keys ``keys`` (default :func:`make_keys`),
    ``super_users`` (comma-separated) allowed everything.  With ``zookeeper`` (a connect string,
    a test's chroot) it joins that ZooKeeper with the cluster's credentials (a file in ``root``),
    and the yielded ``session`` holds them too; the nodes, which carry the cluster's ACL, are
    removed with it at the end (nobody else could).  ``env``: more of the broker's settings.
    Yielded once every worker holds the security state (its data port serves)."""
    keys = keys or make_keys(root)
    settings = {**keys.env(), **({"HPBROKER_SUPER_USERS": super_users} if super_users else {})}
    credentials = None
    if zookeeper is not None:
        credentials = credentials_file(root)
        settings |= {"HPBROKER_ZOOKEEPER": zookeeper, "HPBROKER_ZOOKEEPER_CREDENTIALS_FILE": str(credentials)}
    settings |= env or {}
    process, port = start_broker(root / "data", root / "broker.log", workers=workers, env=settings)
    context = zmq.Context()
    session = None
    try:
        # Serving is not yet ready: each worker's data port answers 15 ("not ready") until the
        # arbiter's security state reaches it, just after "all workers serving".
        def told() -> bool:
            return len(set(re.findall(r"\[worker=(\d+)\] security state: ", process.log()))) >= workers
        wait_until(told, BROKER_START_TIMEOUT_S, what="every worker's security state")
        if zookeeper is not None:
            from hpbroker.coord.session import connect
            from hpbroker.coord.zk_security import load_credentials

            session = connect(zookeeper, session_timeout_s=10.0, credentials=load_credentials(credentials))
        yield SecuredBroker(process, port, keys, context, zookeeper, credentials, session)
    finally:
        process.stop()
        context.destroy(linger=0)
        if session is not None:
            session.client.delete("/", recursive=True)
            session.close()

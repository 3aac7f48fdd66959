"""BrokerConnection as a CurveZMQ client, against a real CURVE server with a ZAP allowlist.

The server here is a small ROUTER that answers FetchToken requests with the ``User-Id`` ZAP gave
the connection: a CurveZMQ server made as the broker makes its front-end (pyzmq's authenticator,
CURVE_SERVER, ZAP domain), so the client's side is tested on its own.  A refused handshake must
raise AuthenticationError well before the connect timeout, naming what is wrong.
"""

from __future__ import annotations

import threading
import time

import pytest
import zmq
from zmq.auth.thread import ThreadAuthenticator
from zmq.utils import z85

from hpbroker import protocol
from hpbroker.client.connection import BrokerAddress, BrokerConnection
from hpbroker.client.metadata import ClusterMetadata
from hpbroker.errors import AuthenticationError, BrokerNotAvailableError
from hpbroker.security.client import ClientSecurity
from hpbroker.security.keys import allow_key, generate_key_pair

CONNECT_TIMEOUT_S = 20.0  # a refusal must come long before this
REFUSED_WITHIN_S = 5.0


class Server:
    """A ROUTER on 127.0.0.1 answering FetchToken with the connection's User-Id (the principal);
    a CURVE server admitting the allowlist's keys when ``secret_key`` is given, else plain."""

    def __init__(self, secret_key: bytes | None, allowlist) -> None:
        self.context = zmq.Context()
        self.authenticator = None
        self.socket = self.context.socket(zmq.ROUTER)
        self.socket.linger = 0
        if secret_key is not None:
            self.authenticator = ThreadAuthenticator(self.context)
            self.authenticator.start()
            self.authenticator.configure_curve(domain="hpbroker", location=str(allowlist))
            self.authenticator.curve_user_id = lambda key: self.names.get(z85.encode(key), "?")
            self.socket.curve_server = True
            self.socket.curve_secretkey = secret_key
            self.socket.zap_domain = b"hpbroker"
        self.names: dict[bytes, str] = {}
        self.port = self.socket.bind_to_random_port("tcp://127.0.0.1")
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stopping.is_set():
            if not self.socket.poll(50):
                continue
            frames = self.socket.recv_multipart(copy=False)
            principal = frames[1].get("User-Id") if self.authenticator is not None else ""
            header, _request = protocol.decode_request([f.buffer for f in frames[1:]])
            answer = protocol.FetchTokenResponse(token="t", principal=principal or "", expires_at_ms=1)
            self.socket.send_multipart([frames[0], *protocol.encode_response(answer, header.correlation_id)])

    def close(self) -> None:
        self.stopping.set()
        self.thread.join(10)
        self.socket.close()
        if self.authenticator is not None:
            self.authenticator.stop()
        self.context.term()


@pytest.fixture
def keys(tmp_path):
    """Key pairs broker, alice (allowlisted) and mallory (not), and the allowlist."""
    made = {name: generate_key_pair(tmp_path / "keys", name) for name in ("broker", "alice", "mallory")}
    allow_key(tmp_path / "keys" / "alice.key", tmp_path / "allow")
    return made, tmp_path / "allow"


@pytest.fixture
def curve_server(keys):
    made, allowlist = keys
    server = Server(made["broker"].secret_key, allowlist)
    server.names = {made["alice"].public_key: "alice"}
    yield server
    server.close()


def client_security(keys, name: str, server: str = "broker") -> ClientSecurity:
    made, _ = keys
    pair = made[name]
    return ClientSecurity(name, pair.public_key, pair.secret_key, made[server].public_key)


def ask(port: int, security: ClientSecurity | None) -> protocol.FetchTokenResponse:
    connection = BrokerConnection(BrokerAddress("127.0.0.1", port), connect_timeout_s=CONNECT_TIMEOUT_S,
                                  security=security)
    try:
        return connection.call(protocol.FetchTokenRequest(), timeout_s=CONNECT_TIMEOUT_S)
    finally:
        connection.close()


def refused(port: int, security: ClientSecurity | None) -> str:
    """The AuthenticationError's message, asserting it came well within REFUSED_WITHIN_S."""
    started = time.monotonic()
    with pytest.raises(AuthenticationError) as raised:
        ask(port, security)
    assert time.monotonic() - started < REFUSED_WITHIN_S
    return raised.value.message


def test_allowlisted_key_is_answered_with_its_name_as_principal(keys, curve_server):
    assert ask(curve_server.port, client_security(keys, "alice")).principal == "alice"


def test_unknown_key_is_refused_at_once_naming_the_key(keys, curve_server):
    message = refused(curve_server.port, client_security(keys, "mallory"))
    assert f"127.0.0.1:{curve_server.port}" in message
    assert "refused key 'mallory'" in message and "allowlist" in message


def test_client_without_a_key_is_told_the_broker_requires_curve(curve_server):
    message = refused(curve_server.port, None)
    assert "requires CurveZMQ" in message and "key_file and server_key_file" in message


def test_wrong_server_key_is_refused_naming_the_server_key(keys, curve_server):
    message = refused(curve_server.port, client_security(keys, "alice", server="mallory"))
    assert "server key" in message and "'alice'" in message


def test_curve_client_of_a_broker_without_security_is_told_so(keys):
    server = Server(None, None)
    try:
        message = refused(server.port, client_security(keys, "alice"))
        assert "without security" in message
        assert ask(server.port, None).token == "t"  # the unsecured path as it was
    finally:
        server.close()


def test_refusal_survives_reconnects_and_clears_once_admitted(keys, curve_server, tmp_path):
    """A key allowlisted after a refusal gets in on ZeroMQ's next reconnection: the refusal is
    the last handshake's, not a verdict for the connection's life."""
    security = client_security(keys, "mallory")
    connection = BrokerConnection(BrokerAddress("127.0.0.1", curve_server.port),
                                  connect_timeout_s=CONNECT_TIMEOUT_S, security=security)
    try:
        with pytest.raises(AuthenticationError):
            connection.call(protocol.FetchTokenRequest(), timeout_s=CONNECT_TIMEOUT_S)
        with pytest.raises(AuthenticationError):  # asked again: refused again, at once
            connection.call(protocol.FetchTokenRequest(), timeout_s=CONNECT_TIMEOUT_S)
        allow_key(tmp_path / "keys" / "mallory.key", tmp_path / "allow")
        curve_server.names[security.public_key] = "mallory"
        curve_server.authenticator.configure_curve(domain="hpbroker", location=str(tmp_path / "allow"))
        deadline = time.monotonic() + CONNECT_TIMEOUT_S
        while True:
            try:
                answer = connection.call(protocol.FetchTokenRequest(), timeout_s=CONNECT_TIMEOUT_S)
                break
            except AuthenticationError:
                assert time.monotonic() < deadline, "never admitted after being allowlisted"
                time.sleep(0.1)
        assert answer.principal == "mallory" and connection.refused is None
    finally:
        connection.close()


def test_metadata_failover_connections_keep_the_security(keys, curve_server):
    """A connection the metadata opens to another broker is the same kind of client."""
    security = client_security(keys, "alice")
    dead = BrokerAddress("127.0.0.1", 1)  # nobody listens: fail over to the server
    live = BrokerAddress("127.0.0.1", curve_server.port)
    metadata = ClusterMetadata.for_bootstrap([dead, live], client_id="t", connect_timeout_s=0.5,
                                             timeout_s=CONNECT_TIMEOUT_S, security=security)
    try:
        assert metadata.connection.security is security
        answer = metadata.fail_over(BrokerNotAvailableError("down"),
                                    lambda other: other.call(protocol.FetchTokenRequest()), "a question")
        assert answer.principal == "alice"
        assert metadata.connection.address == live and metadata.connection.security is security
    finally:
        metadata.close()


def test_monitor_events_a_waiting_send_read_are_still_handed_out(keys, curve_server):
    """A send that waits for the connection reads the monitor itself (to see a refusal); the
    events it read still come out of monitor_events, for the producer's link state."""
    mallory = client_security(keys, "mallory")
    connection = BrokerConnection(BrokerAddress("127.0.0.1", curve_server.port),
                                  connect_timeout_s=CONNECT_TIMEOUT_S, security=mallory)
    try:
        with pytest.raises(AuthenticationError):
            connection.send(protocol.FetchTokenRequest())
        assert connection.events_pending
        assert zmq.EVENT_HANDSHAKE_FAILED_AUTH in connection.monitor_events()
        assert not connection.events_pending
    finally:
        connection.close()


def test_a_topic_the_acls_hide_is_an_authorization_error_that_says_so():
    from hpbroker.client.metadata import topic_error
    from hpbroker.errors import AuthorizationError

    error = topic_error("orders", AuthorizationError.code)
    assert isinstance(error, AuthorizationError)
    assert "ACLs do not allow this client's key to describe topic 'orders'" in error.message

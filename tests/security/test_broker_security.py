"""BrokerSecurity and its ZAP handler in one process: real ZeroMQ sockets on 127.0.0.1, real
key files; what the reload keeps and skips, what a revoked principal is told, what the workers
are sent, and that the arbiter halts when the handler's thread dies."""

from __future__ import annotations

import logging

import pytest
import zmq
from curve_probe import Probe, make_keys
from harness import wait_until

from hpbroker.broker.config import BrokerConfig
from hpbroker.errors import AuthenticationError, AuthorizationError, InvalidConfigError, InvalidRequestError
from hpbroker.security import tokens
from hpbroker.security.acls import AclEntry
from hpbroker.security.broker import BrokerSecurity
from hpbroker.workers.arbiter import EXIT_ERROR, Arbiter
from hpbroker.workers.security_state import SecurityState


def config_for(keys, tmp_path, **overrides) -> BrokerConfig:
    settings = {"data_dir": str(tmp_path / "data"), "security": "curve", "super_users": "root",
                "server_key_file": str(keys.secrets / "broker.key_secret"),
                "allowlist_dir": str(keys.allowlist)}
    return BrokerConfig(**{**settings, **overrides})


@pytest.fixture
def keys(tmp_path):
    return make_keys(tmp_path)


@pytest.fixture
def server(keys, tmp_path):
    """A started BrokerSecurity and its CURVE ROUTER bound on a free port:
    ``(security, router, port, context)``."""
    context = zmq.Context()
    security = BrokerSecurity(config_for(keys, tmp_path))
    router = context.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    security.secure_front(context, router)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    try:
        yield security, router, port, context
    finally:
        router.close()
        security.close()
        context.destroy(linger=0)


def receive_principal(security: BrokerSecurity, router: zmq.Socket) -> str | None:
    assert router.poll(10_000), "no request arrived"
    frames = router.recv_multipart(copy=False)
    return security.principal_of(frames[1])


def test_each_message_carries_its_keys_name(server, keys):
    security, router, port, context = server
    assert security.own_principal == "broker" and security.principals() == {"broker", "alice", "bob"}
    probe = Probe(context, port, keys.pair("broker")[0], keys.pair("alice"))
    assert receive_principal(security, router) == "alice"
    probe.close()


def test_reload_skips_a_bad_file_and_keeps_the_rest(server, keys):
    security, router, port, context = server
    (keys.allowlist / "broken.key").write_text("not a key file\n")
    keys.disallow("bob")
    keys.allow("mallory")
    assert security.reload() == ({"mallory"}, {"bob"})
    assert security.principals() == {"broker", "alice", "mallory"}
    probe = Probe(context, port, keys.pair("broker")[0], keys.pair("mallory"))
    assert receive_principal(security, router) == "mallory"
    probe.close()


def test_a_revoked_principal_is_refused_before_any_acl(server, keys):
    security, _, _, _ = server
    security.set_acls([AclEntry("bob", "produce", "topic", "literal", "orders")])
    assert security.authorize("bob", "produce", "topic", "orders") is None
    assert isinstance(security.authorize("alice", "produce", "topic", "orders"), AuthorizationError)
    assert security.mint_token("bob")[0]
    keys.disallow("bob")
    security.reload()
    error = security.authorize("bob", "produce", "topic", "orders")
    assert isinstance(error, AuthenticationError) and "no longer on the broker's allowlist" in error.message
    with pytest.raises(AuthenticationError):
        security.mint_token("bob")


def test_worker_state_and_tokens(server):
    security, _, _, _ = server
    assert security.set_acls([AclEntry("alice", "consume", "topic", "literal", "orders")])
    assert not security.set_acls([AclEntry("alice", "consume", "topic", "literal", "orders")])  # no change
    state = security.worker_state()
    entry = AclEntry("alice", "consume", "topic", "literal", "orders")
    fingerprints = {name: security.fingerprint_of(name) for name in ("alice", "bob", "broker")}
    assert all(len(fp) == 16 for fp in fingerprints.values())
    assert state == {"enabled": True, "token_key": security.token_key.hex(),
                     "principals": ["alice", "bob", "broker"], "fingerprints": fingerprints,
                     "super_users": ["root"], "acls": [entry.to_dict()], "acls_known": True,
                     "data_port_auth": "token",
                     "own_principal": "broker", "own_fingerprint": fingerprints["broker"]}
    token, expires_at_ms = security.mint_token("alice")
    key = bytes.fromhex(state["token_key"])
    assert tokens.verify(key, token, expires_at_ms - 1) == ("alice", expires_at_ms)
    assert tokens.verify(key, token, expires_at_ms - 1)[0].fingerprint == fingerprints["alice"]


def test_worker_state_says_whether_the_acls_are_known(keys, tmp_path):
    """With ZooKeeper the ACLs are unknown until their first read: the workers are told so (an
    empty list then means "not read yet", not "nothing allowed")."""
    credentials = tmp_path / "zookeeper.credentials"
    credentials.write_text("hpbroker:cluster-secret\n")
    credentials.chmod(0o600)
    security = BrokerSecurity(config_for(keys, tmp_path, zookeeper="127.0.0.1:2181",
                                         zookeeper_credentials_file=str(credentials)))
    try:
        state = security.worker_state()
        assert state["acls"] == [] and state["acls_known"] is False
        security.set_acls([])
        assert security.worker_state()["acls_known"] is True
    finally:
        security.close()


def test_security_off_does_nothing(tmp_path):
    security = BrokerSecurity(BrokerConfig(data_dir=str(tmp_path)))
    context = zmq.Context()
    router = context.socket(zmq.ROUTER)
    try:
        security.secure_front(context, router)
        assert router.getsockopt(zmq.MECHANISM) == zmq.NULL
        assert security.authorize(None, "produce", "topic", "orders") is None
        assert security.worker_state() == {"enabled": False} and security.check_alive()
        with pytest.raises(InvalidRequestError):
            security.mint_token("alice")
        with pytest.raises(InvalidRequestError):
            security.group_credentials("g")
    finally:
        router.close()
        context.term()


def test_a_server_key_file_with_a_bad_name_or_content_is_refused(keys, tmp_path):
    (tmp_path / "empty.key_secret").write_text("")
    with pytest.raises(InvalidConfigError, match="server_key_file: .*empty.key_secret is not a CURVE key"):
        BrokerSecurity(config_for(keys, tmp_path, server_key_file=str(tmp_path / "empty.key_secret")))
    with pytest.raises(InvalidConfigError, match="holds no secret-key"):
        BrokerSecurity(config_for(keys, tmp_path, server_key_file=str(keys.secrets / "alice.key")))
    (keys.allowlist / ".hidden.key").write_bytes((keys.secrets / "alice.key").read_bytes())
    with pytest.raises(InvalidConfigError, match=r"\.hidden\.key: bad key name '\.hidden'"):
        BrokerSecurity(config_for(keys, tmp_path))


def test_the_arbiter_halts_when_the_zap_handler_dies(keys, tmp_path, caplog):
    """The handler's thread ending is fatal: the arbiter's next turn stops the broker."""
    arbiter = Arbiter(config_for(keys, tmp_path))
    security = arbiter._security = BrokerSecurity(arbiter.config)
    arbiter._security_state = SecurityState(security, arbiter._slots, lambda *args: True, lambda: None)
    context = zmq.Context()
    router = context.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    try:
        security.secure_front(context, router)
        assert arbiter._security_turn() and not arbiter._stopping
        authenticator = security._authenticator
        assert authenticator is not None
        authenticator.pipe.send(b"TERMINATE")  # the thread leaves, as if it had crashed
        wait_until(lambda: not security.check_alive(), what="the ZAP thread gone")
        with caplog.at_level(logging.CRITICAL):
            assert not arbiter._security_turn()
        assert arbiter._stopping and arbiter._exit_status == EXIT_ERROR
        assert "ZAP authenticator's thread has died" in caplog.text
    finally:
        router.close()
        security.close()
        context.destroy(linger=0)


@pytest.mark.parametrize("content", ["", 'public-key = "short"\n', 'public-key = "' + "~" * 40 + '"\n'])
def test_the_allowlist_and_the_server_key_are_read_as_hpbroker_keys_reads_them(keys, tmp_path, content):
    """One reader of key files: the broker's start says what ``hpbroker keys`` says of a bad one."""
    from hpbroker.security.authenticator import read_allowlist
    from hpbroker.security.keys import read_key_file

    bad = keys.allowlist / "carol.key"
    bad.write_text(content)
    with pytest.raises(InvalidConfigError) as expected:
        read_key_file(bad)
    with pytest.raises(InvalidConfigError) as allowlist:
        read_allowlist(str(keys.allowlist), strict=True)
    assert allowlist.value.message == expected.value.message
    with pytest.raises(InvalidConfigError) as server_key:
        BrokerSecurity(config_for(keys, tmp_path, server_key_file=str(bad)))
    assert server_key.value.message == f"server_key_file: {expected.value.message}"

"""A secured worker's data port: fetch tokens first, then ACLs on every fetch and list-offsets
(hpbroker.workers.fetch_server, hpbroker.security.data_port), with the state the arbiter sends
in the "security" control message."""

from __future__ import annotations

import time

import pytest
from worker_harness import TcpClient, fetch_request, make_batch, produce_request

from hpbroker import protocol
from hpbroker.errors import (
    AuthenticationError,
    AuthorizationError,
    CoordinationError,
    PartitionNotAvailableError,
)
from hpbroker.protocol import ApiKey
from hpbroker.replica.fetcher import ReplicaFetcher
from hpbroker.security import tokens

KEY = bytes(range(32))
SECURE = {"security": "curve", "server_key_file": "unused.key_secret", "allowlist_dir": "unused"}


def _state(principals=("alice", "bob", "broker-0"), acls=None, **extra):
    if acls is None:
        acls = [{"principal": "alice", "operation": "consume", "resource_type": "topic",
                 "pattern_type": "literal", "name": "orders"}]
    return {"enabled": True, "token_key": KEY.hex(), "principals": list(principals), "super_users": [],
            "acls": acls, "data_port_auth": "token", "own_principal": "broker-0"} | extra


def _token(principal="alice", lifetime_ms=600_000, key=KEY, now_ms=None):
    now_ms = time.time_ns() // 1_000_000 if now_ms is None else now_ms
    return tokens.mint(key, principal, lifetime_ms, now_ms)[0]


@pytest.fixture
def secured(start_worker, arbiter):
    """A secured worker holding orders-0 with 3 records, its security state sent."""
    worker = start_worker(**SECURE)
    assert arbiter.call(0, produce_request("orders", 0, make_batch("a")))[0].error_code == 0
    assert arbiter.control(0, "security", **_state())["error"] is None
    return worker


def _authenticate(client, token, correlation_id=1):
    client.send(protocol.AuthenticateRequest(token), correlation_id)
    return client.response(ApiKey.AUTHENTICATE)


def _refused_and_closed(client, api_key, match):
    header, _ = client.response(api_key)
    assert header.error_code == AuthenticationError.code, header
    assert match in header.error_message, header.error_message
    assert client.is_closed_by_peer()


def test_fetch_without_a_token_is_refused_and_the_connection_closed(secured):
    client = TcpClient(secured.port)
    client.send(fetch_request("orders", 0, 0), 1)
    client.send(fetch_request("orders", 0, 0), 2)  # never read: the connection closes after 1
    _refused_and_closed(client, ApiKey.FETCH, "must be AuthenticateRequest")


def test_valid_token_is_accepted_and_its_fetches_served(secured):
    client = TcpClient(secured.port)
    token = _token()
    client.send(protocol.AuthenticateRequest(token), 1)
    client.send(fetch_request("orders", 0, 0), 2)  # pipelined right behind it
    header, response = client.response(ApiKey.AUTHENTICATE)
    assert (header.error_code, response.principal) == (0, "alice")
    assert response.expires_at_ms == tokens.verify(KEY, token, 0)[1]
    header, response = client.response(ApiKey.FETCH)
    assert (header.correlation_id, header.error_code) == (2, 0) and len(response.payload) > 0
    client.send(protocol.ListOffsetsRequest("orders", 0, protocol.LATEST_TIMESTAMP), 3)
    header, response = client.response(ApiKey.LIST_OFFSETS)  # consume implies describe
    assert (header.error_code, response.offset) == (0, 3)
    client.close()


@pytest.mark.parametrize("token, match", [
    (_token(lifetime_ms=1000, now_ms=1_000_000), "expired fetch token"),
    (_token(key=bytes(32)), "forged fetch token"),
    (_token()[:-5], "malformed fetch token"),
    ("", "no fetch token"),
])
def test_bad_token_is_refused_and_the_connection_closed(secured, token, match):
    client = TcpClient(secured.port)
    client.send(protocol.AuthenticateRequest(token), 1)
    client.send(fetch_request("orders", 0, 0), 2)
    _refused_and_closed(client, ApiKey.AUTHENTICATE, match)


def test_principal_without_consume_gets_28_and_the_connection_stays(secured):
    client = TcpClient(secured.port)
    assert _authenticate(client, _token("bob"))[0].error_code == 0
    client.send(fetch_request("orders", 0, 0), 2)
    header, response = client.response(ApiKey.FETCH)
    assert header.error_code == 28 and len(response.payload) == 0
    assert "principal 'bob' may not" in header.error_message and "'orders'" in header.error_message
    client.send(protocol.ListOffsetsRequest("orders", 0, protocol.LATEST_TIMESTAMP), 3)
    assert client.response(ApiKey.LIST_OFFSETS)[0].error_code == 28
    client.close()


def test_replica_fetch_needs_cluster_action(secured):
    client = TcpClient(secured.port)
    assert _authenticate(client, _token("alice"))[0].error_code == 0
    request = protocol.FetchRequest("orders", 0, 0, 1 << 20, 0, 1, replica_id=1, current_leader_epoch=0)
    frames = protocol.encode_request(request, 2, "test", version=1)
    client.sock.sendall(b"".join(bytes(f) for f in protocol.frame_tcp(frames)))
    header, _ = client.response(ApiKey.FETCH)
    assert header.error_code == 28 and "cluster_action" in header.error_message
    client.close()


def test_revoked_principal_is_refused_at_its_next_connection_and_on_those_open(secured, arbiter):
    kept = TcpClient(secured.port)
    token = _token("alice")
    assert _authenticate(kept, token)[0].error_code == 0
    kept.send(fetch_request("orders", 0, 0), 2)
    assert kept.response(ApiKey.FETCH)[0].error_code == 0
    assert arbiter.control(0, "security", **_state(principals=["bob"]))["error"] is None
    client = TcpClient(secured.port)
    client.send(protocol.AuthenticateRequest(token), 1)
    _refused_and_closed(client, ApiKey.AUTHENTICATE, "no longer on the broker's allowlist")
    # Authenticated before the revocation, its token still valid: refused all the same, as the
    # front-end refuses a revoked key's requests on a connection opened before.
    kept.send(fetch_request("orders", 0, 0), 3)
    _refused_and_closed(kept, ApiKey.FETCH, "no longer on the broker's allowlist")


def test_request_after_the_token_expired_is_refused_and_the_connection_closed(secured):
    now_ms = time.time_ns() // 1_000_000
    token, expires_at_ms = tokens.mint(KEY, "alice", 600_000, now_ms - 600_000 + 3000)  # 3 s left
    client = TcpClient(secured.port)
    assert _authenticate(client, token)[1].expires_at_ms == expires_at_ms
    client.send(fetch_request("orders", 0, 0), 2)
    assert client.response(ApiKey.FETCH)[0].error_code == 0
    while time.time_ns() // 1_000_000 <= expires_at_ms:
        time.sleep(0.05)
    client.send(fetch_request("orders", 0, 0), 3)
    _refused_and_closed(client, ApiKey.FETCH, "expired")


def test_connections_get_a_retriable_not_ready_until_the_security_state_arrives(start_worker, arbiter):
    worker = start_worker(**SECURE)
    client = TcpClient(worker.port)
    client.send(protocol.AuthenticateRequest(_token()), 1)
    header, _ = client.response(ApiKey.AUTHENTICATE)
    assert header.error_code == PartitionNotAvailableError.code, header  # retriable, unlike 27
    assert "not ready" in header.error_message
    assert client.is_closed_by_peer()
    assert arbiter.control(0, "security", **_state())["error"] is None
    client = TcpClient(worker.port)
    assert _authenticate(client, _token())[0].error_code == 0
    client.close()


def test_partition_fetcher_raises_a_retriable_error_while_the_data_port_is_not_ready(start_worker, arbiter):
    worker = start_worker(**SECURE)
    assert arbiter.call(0, produce_request("orders", 0, make_batch("a")))[0].error_code == 0
    asked = []

    def token(fresh):
        asked.append(fresh)
        return _token()

    fetcher = _fetcher(worker.port, token)
    with pytest.raises(PartitionNotAvailableError, match="not ready") as raised:
        fetcher.fetch(0)
    assert raised.value.retriable and asked == [False]  # no fresh token: the token was not refused
    assert not fetcher.in_flight
    assert arbiter.control(0, "security", **_state())["error"] is None
    completed = _fetch_one(fetcher)  # the same fetcher, tried again
    assert completed.error is None and len(completed.records) == 3
    fetcher.close()


def test_bad_security_state_is_refused_in_the_ack_and_the_old_one_kept(secured, arbiter):
    bad = _state(acls=[{"principal": "alice", "operation": "fly"}])
    assert "lacks" in arbiter.control(0, "security", **bad)["error"]
    client = TcpClient(secured.port)
    assert _authenticate(client, _token())[0].error_code == 0
    client.close()


def test_unsecured_data_port_answers_authenticate_with_no_principal(start_worker):
    worker = start_worker()
    client = TcpClient(worker.port)
    header, response = _authenticate(client, "anything")
    assert (header.error_code, response.principal, response.expires_at_ms) == (0, "", -1)
    client.send(fetch_request("orders", 0, 0), 2)
    assert client.response(ApiKey.FETCH)[0].error_code == 0
    client.close()


def test_loopback_data_port_serves_without_a_token(start_worker, arbiter):
    worker = start_worker(**SECURE, data_port_auth="loopback")
    assert arbiter.call(0, produce_request("orders", 0, make_batch("a")))[0].error_code == 0
    client = TcpClient(worker.port)
    client.send(fetch_request("orders", 0, 0), 1)  # before any security state, and without a token
    header, response = client.response(ApiKey.FETCH)
    assert header.error_code == 0 and len(response.payload) > 0
    client.send(protocol.ListOffsetsRequest("orders", 0, protocol.LATEST_TIMESTAMP), 2)
    assert client.response(ApiKey.LIST_OFFSETS)[1].offset == 3
    client.close()


def _replica_fetch(client, correlation_id, replica_id=1):
    request = protocol.FetchRequest("orders", 0, 0, 1 << 20, 0, 1, replica_id=replica_id,
                                    current_leader_epoch=0)
    client.send(request, correlation_id)
    return client.response(ApiKey.FETCH)[0]


def test_loopback_data_port_serves_replica_fetches_only_on_authenticated_connections(start_worker, arbiter):
    worker = start_worker(**SECURE, data_port_auth="loopback")
    assert arbiter.call(0, produce_request("orders", 0, make_batch("a")))[0].error_code == 0
    client = TcpClient(worker.port)  # before the state: an AuthenticateRequest is not ready (15)
    assert _authenticate(client, _token("broker-0"))[0].error_code == PartitionNotAvailableError.code
    assert client.is_closed_by_peer()
    assert arbiter.control(0, "security", **_state(data_port_auth="loopback"))["error"] is None
    client = TcpClient(worker.port)  # a local process posing as follower 1, without a token
    client.send(fetch_request("orders", 0, 0), 1)
    assert client.response(ApiKey.FETCH)[0].error_code == 0  # its consumer fetch is served
    header = _replica_fetch(client, 2)
    assert header.error_code == AuthenticationError.code and "loopback" in header.error_message, header
    assert client.is_closed_by_peer()
    client = TcpClient(worker.port)  # a token the guard refuses is refused here too
    client.send(protocol.AuthenticateRequest("anything"), 1)
    _refused_and_closed(client, ApiKey.AUTHENTICATE, "malformed fetch token")
    client = TcpClient(worker.port)  # a principal without cluster_action: 28, and the connection stays
    assert _authenticate(client, _token("alice"))[1].principal == "alice"
    assert _replica_fetch(client, 2).error_code == 28
    client.send(fetch_request("orders", 0, 0), 3)
    assert client.response(ApiKey.FETCH)[0].error_code == 0
    client.close()
    cluster_action = {"principal": "broker-0", "operation": "cluster_action", "resource_type": "cluster",
                      "pattern_type": "literal", "name": "cluster"}
    state = _state(acls=[cluster_action], data_port_auth="loopback")
    assert arbiter.control(0, "security", **state)["error"] is None
    client = TcpClient(worker.port)
    assert _authenticate(client, _token("broker-0"))[0].error_code == 0
    assert _replica_fetch(client, 2).error_code not in (27, 28)  # allowed (it leads nothing here: 23)
    client.close()


def _pump(fetcher, until, timeout_s=10.0):
    deadline = time.monotonic() + timeout_s
    while not until():
        assert time.monotonic() < deadline, "timed out"
        fetcher.process(0, time.monotonic())
        time.sleep(0.01)


def test_replica_fetcher_authenticates_first_on_every_connection(secured):
    minted = []

    def token():
        minted.append(tokens.mint(KEY, "alice", 600_000, time.time_ns() // 1_000_000))
        return minted[-1]

    answers = []
    fetcher = ReplicaFetcher(-1, "127.0.0.1", secured.port, now=time.monotonic(), token=token,
                             on_response=lambda t, p, h, r: answers.append((h.error_code, len(r.payload))))
    fetcher.fetch("orders", 0, 0, leader_epoch=-1, last_fetched_epoch=-1, max_bytes=1 << 20, max_wait_ms=0)
    _pump(fetcher, lambda: answers)
    assert answers == [(0, answers[0][1])] and answers[0][1] > 0 and len(minted) == 1
    fetcher.close()


def test_replica_fetcher_whose_token_is_refused_loses_its_fetches(secured):
    lost, answers = [], []
    fetcher = ReplicaFetcher(-1, "127.0.0.1", secured.port, now=time.monotonic(),
                             token=lambda: tokens.mint(bytes(32), "alice", 600_000, time.time_ns() // 10**6),
                             on_response=lambda *a: answers.append(a),
                             on_lost=lambda t, p: lost.append((t, p)))
    fetcher.fetch("orders", 0, 0, leader_epoch=-1, last_fetched_epoch=-1, max_bytes=1 << 20, max_wait_ms=0)
    _pump(fetcher, lambda: lost)
    assert lost == [("orders", 0)] and not answers
    fetcher.close()


def test_replica_fetcher_logs_a_not_ready_leader_as_such_not_as_a_refused_token(start_worker, caplog):
    worker = start_worker(**SECURE)  # no security state yet: its data port answers 15
    lost = []
    fetcher = ReplicaFetcher(-1, "127.0.0.1", worker.port, now=time.monotonic(),
                             token=lambda: tokens.mint(KEY, "broker-0", 600_000, time.time_ns() // 10**6),
                             on_response=lambda *a: None, on_lost=lambda t, p: lost.append((t, p)))
    with caplog.at_level("WARNING", logger="hpbroker.replica.fetcher"):
        fetcher.fetch("orders", 0, 0, leader_epoch=-1, last_fetched_epoch=-1, max_bytes=1 << 20,
                      max_wait_ms=0)
        _pump(fetcher, lambda: lost)
    fetcher.close()
    assert "not ready yet, retrying" in caplog.text, caplog.text
    assert "refused" not in caplog.text


# --- the consumer's fetcher (hpbroker.client.fetcher) ---------------------------------------------


def _fetch_one(fetcher, offset=0, timeout_s=10.0):
    fetcher.fetch(offset)
    deadline = time.monotonic() + timeout_s
    while True:
        completed = fetcher.receive()
        if completed is not None:
            return completed
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def _fetcher(port, token, **options):
    from hpbroker.client.fetcher import FetchConfig, PartitionFetcher

    return PartitionFetcher("orders", 0, "127.0.0.1", port, FetchConfig(fetch_max_wait_ms=0), token=token,
                            **options)


def test_partition_fetcher_authenticates_each_connection(secured):
    asked = []

    def token(fresh):
        asked.append(fresh)
        return _token()

    fetcher = _fetcher(secured.port, token)
    completed = _fetch_one(fetcher)
    assert completed.error is None and len(completed.records) == 3 and asked == [False]
    fetcher.close()


def test_partition_fetcher_asks_a_fresh_token_once_when_refused(secured):
    asked = []

    def token(fresh):
        asked.append(fresh)
        return _token() if fresh else _token(lifetime_ms=1000, now_ms=1_000_000)  # expired

    fetcher = _fetcher(secured.port, token)
    completed = _fetch_one(fetcher)
    assert completed.error is None and len(completed.records) == 3 and asked == [False, True]
    fetcher.close()


def test_partition_fetcher_raises_authentication_error_when_the_fresh_token_is_refused_too(secured):
    fetcher = _fetcher(secured.port, lambda fresh: _token(key=bytes(32)))
    with pytest.raises(AuthenticationError, match="refused the fetch token.*forged"):
        fetcher.fetch(0)
    fetcher.close()


def _list_latest(fetcher, timeout_s=10.0):
    fetcher.list_offsets(protocol.LATEST_TIMESTAMP)
    deadline = time.monotonic() + timeout_s
    while (listed := fetcher.receive()) is None:
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)
    return listed


def test_partition_fetcher_connects_again_with_a_new_token_before_the_old_expires(secured):
    # The fetcher's clock is the test's: the tokens live 600 s of real time, the fetcher is told
    # when two thirds of that have passed.  The first token is bob's (who may not describe
    # orders), the second alice's, so each answer says which token its connection presented.
    given = [_token("bob"), _token("alice")]
    asked = []

    def token(fresh):
        asked.append(fresh)
        return given[len(asked) - 1]

    now = [1000.0]
    fetcher = _fetcher(secured.port, token, clock=lambda: now[0])
    assert _list_latest(fetcher).error.code == 28 and asked == [False]  # bob's connection
    now[0] += 350  # well under two thirds of 600 s: the same connection
    assert _list_latest(fetcher).error.code == 28 and asked == [False]
    now[0] += 60  # past two thirds (400 s): connect again, with a new token, before any request
    assert _list_latest(fetcher).offset == 3 and asked == [False, False]  # alice's connection
    fetcher.close()


def test_guard_refuses_a_token_of_a_key_replaced_under_its_name_and_mints_with_its_own_key():
    from hpbroker.security.data_port import DataPortGuard
    from hpbroker.security.principal import Principal

    guard = DataPortGuard()
    guard.update({**_state(("alice", "broker-0")), "fingerprints": {"alice": "new-key-alice---",
                                                                  "broker-0": "broker-key------"},
                  "own_principal": "broker-0", "own_fingerprint": "broker-key------"})
    now_ms = time.time_ns() // 1_000_000
    old = tokens.mint(KEY, Principal("alice", "old-key-alice---"), 600_000, now_ms)[0]
    with pytest.raises(AuthenticationError, match="replaced by another key of that name"):
        guard.authenticate(old)
    new = tokens.mint(KEY, Principal("alice", "new-key-alice---"), 600_000, now_ms)[0]
    assert guard.authenticate(new)[0] == "alice"
    # A connection authenticated with the old key is refused at its next request (27).
    error = guard.check(Principal("alice", "old-key-alice---"), protocol.ApiKey.LIST_OFFSETS,
                        protocol.ListOffsetsRequest("orders", 0, -1))
    assert isinstance(error, AuthenticationError)
    own, _ = guard.mint_own()
    assert guard.authenticate(own)[0].fingerprint == "broker-key------"


def test_guard_answers_a_retriable_17_not_28_while_the_acls_are_not_known():
    """A broker that has not read its ACLs yet sends an empty list with ``acls_known`` false:
    the data port answers as its front-end does (17, retriable), super users and revocations
    aside, and judges by the ACLs once they are known."""
    from hpbroker.security.data_port import DataPortGuard

    guard = DataPortGuard()
    guard.update(_state(("alice", "broker-0", "root"), acls=[], super_users=["root"], acls_known=False))
    fetch = protocol.FetchRequest("orders", 0, 0, 1 << 20, 0, 1)
    replica_fetch = protocol.FetchRequest("orders", 0, 0, 1 << 20, 0, 1, replica_id=1, current_leader_epoch=0)
    listing = protocol.ListOffsetsRequest("orders", 0, protocol.LATEST_TIMESTAMP)
    asked = (("alice", ApiKey.FETCH, fetch), ("alice", ApiKey.LIST_OFFSETS, listing),
             ("broker-0", ApiKey.FETCH, replica_fetch))
    for principal, api_key, request in asked:
        error = guard.check(principal, api_key, request)
        assert isinstance(error, CoordinationError) and error.code == 17 and error.retriable, error
        assert "ACLs not loaded yet" in str(error)
    assert guard.check("root", ApiKey.FETCH, fetch) is None  # super users need no ACL
    assert isinstance(guard.check("mallory", ApiKey.FETCH, fetch), AuthenticationError)  # 27 first
    guard.update(_state(("alice", "broker-0", "root"), acls=[], super_users=["root"], acls_known=True))
    assert isinstance(guard.check("alice", ApiKey.FETCH, fetch), AuthorizationError)  # known: empty is empty
    guard.update(_state(("alice", "broker-0")))  # a state without the field: known
    assert guard.check("alice", ApiKey.FETCH, fetch) is None
    with pytest.raises(ValueError, match="acls_known"):
        guard.update(_state(acls_known="no"))


def test_partition_fetcher_gets_a_retriable_17_while_the_acls_are_unknown_then_its_records(secured, arbiter):
    """The client fetcher hands 17 on as a retriable error (the consumer backs off and asks
    again), keeps the connection, and is served once the ACLs are known."""
    assert arbiter.control(0, "security", **_state(acls=[], acls_known=False))["error"] is None
    fetcher = _fetcher(secured.port, lambda fresh: _token())
    completed = _fetch_one(fetcher)
    assert isinstance(completed.error, CoordinationError) and completed.error.retriable, completed.error
    assert completed.records == []
    listed = _list_latest(fetcher)
    assert isinstance(listed.error, CoordinationError) and listed.error.retriable, listed.error
    assert arbiter.control(0, "security", **_state())["error"] is None
    completed = _fetch_one(fetcher)
    assert completed.error is None and len(completed.records) == 3
    fetcher.close()

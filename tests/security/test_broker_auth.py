"""A broker with ``security = "curve"``: its front-end admits only the allowlisted keys, from the
very first connection after start, refuses the NULL mechanism, takes a changed allowlist on
SIGHUP, and stops at start on a bad key file or allowlist.  Real broker processes; the client
side is pyzmq's CURVE, directly."""

from __future__ import annotations

import re
import shutil
import signal
import sys
import time
from pathlib import Path

import pytest
import zmq
from curve_probe import Keys, Probe, make_keys
from harness import BROKER_TEST_ENV, BrokerProcess, free_ports, start_broker, wait_until

from hpbroker import protocol

WORKERS = 2


@pytest.fixture
def keys(tmp_path):
    return make_keys(tmp_path)


@pytest.fixture
def context():
    context = zmq.Context()
    yield context
    context.destroy(linger=0)


@pytest.fixture
def brokers():
    started: list[BrokerProcess] = []
    yield started
    for broker in started:
        broker.stop()


def serve(tmp_path: Path, keys: Keys, brokers: list[BrokerProcess]) -> tuple[BrokerProcess, int]:
    broker, port = start_broker(tmp_path / "data", tmp_path / "broker.log", workers=WORKERS, env=keys.env())
    brokers.append(broker)
    return broker, port


def server_key(keys: Keys) -> bytes:
    return keys.pair("broker")[0]


def assert_refused(probe: Probe, timeout_s: float = 10.0) -> None:
    """The broker refused the probe's handshake, and never answered it."""
    wait_until(probe.refused, timeout_s, what="the handshake to be refused")
    assert not probe.socket.poll(300), "a refused connection got an answer"


def test_allowlisted_key_gets_metadata(tmp_path, keys, context, brokers):
    broker, port = serve(tmp_path, keys, brokers)
    probe = Probe(context, port, server_key(keys), keys.pair("alice"))
    response = probe.metadata()
    assert [b.port for b in response.brokers] == [port]
    assert zmq.EVENT_HANDSHAKE_SUCCEEDED in probe.take_events()
    probe.close()


def test_unknown_key_and_null_mechanism_are_refused(tmp_path, keys, context, brokers):
    broker, port = serve(tmp_path, keys, brokers)
    unknown = Probe(context, port, server_key(keys), keys.pair("mallory"))
    null = Probe(context, port, server_key(keys), None)
    assert_refused(unknown)
    assert_refused(null)
    assert zmq.EVENT_HANDSHAKE_FAILED_AUTH in unknown.events  # the ZAP handler's refusal
    wait_until(lambda: "not on the allowlist" in broker.log(), what="the refusal logged")
    # A client with the wrong server key cannot complete the handshake either: the broker
    # cannot read its HELLO and drops the connection, which the client sees as a failed handshake.
    wrong_server = Probe(context, port, keys.pair("alice")[0], keys.pair("alice"))
    handshake_failed = {zmq.EVENT_HANDSHAKE_FAILED_AUTH, zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL,
                        zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL}
    wait_until(lambda: handshake_failed & set(wrong_server.take_events()), 10,
               what="the handshake with the wrong server key to fail")
    assert zmq.EVENT_HANDSHAKE_SUCCEEDED not in wrong_server.take_events()
    assert not wrong_server.socket.poll(300), "a connection with the wrong server key got an answer"
    for probe in (unknown, null, wrong_server):
        probe.close()


def test_no_unknown_connection_gets_in_while_the_broker_starts(tmp_path, keys, context, brokers):
    """Connections made from before the port is bound until well after it: an unknown key's and a
    NULL client's never get an answer, while an allowlisted one made as early does.  Each probe
    is kept until the broker refuses it (those made before the bind keep reconnecting every
    20 ms), at most 150 at a time."""
    live_limit, total_limit = 150, 2000
    port = free_ports(WORKERS + 1)
    argv = [sys.executable, "-m", "hpbroker.cli", "serve", "--port", str(port), "--fetch-port", str(port + 1),
            "--workers", str(WORKERS), "--data-dir", str(tmp_path / "data"), "--host", "127.0.0.1"]
    early_allowed = Probe(context, port, server_key(keys), keys.pair("alice"))
    broker = BrokerProcess(argv, tmp_path / "broker.log", {**BROKER_TEST_ENV, **keys.env()})
    brokers.append(broker)
    live: list[Probe] = []
    made = refused = 0
    made_before_bind = None  # probes made before the broker said it listens: before the bind
    serving_at = None
    deadline = time.monotonic() + 40
    while time.monotonic() < deadline and made < total_limit:
        if len(live) < live_limit:
            live.append(Probe(context, port, server_key(keys), keys.pair("mallory")))
            live.append(Probe(context, port, server_key(keys), None))
            made += 2
        for probe in list(live):
            assert not probe.answered(), f"an unauthenticated connection got an answer (probe {made})"
            if probe.refused():
                refused += 1
                live.remove(probe)
                probe.close()
        if made_before_bind is None and "listening on" in broker.log():
            made_before_bind = made
        if serving_at is None and re.search(rf"all {WORKERS} workers serving", broker.log()):
            serving_at = time.monotonic()
        if serving_at is not None and time.monotonic() - serving_at > 1.0 and refused >= 50:
            break
        assert broker.process.poll() is None, broker.log()
        time.sleep(0.005)
    assert serving_at is not None, f"the broker did not start:\n{broker.log()}"
    assert early_allowed.metadata().brokers  # made before the bind, answered once serving
    assert made_before_bind is not None and made_before_bind >= 20, made_before_bind
    assert refused >= 50, f"only {refused} of {made} probes were refused: the broker was not exercised"
    time.sleep(1.0)  # anything queued on an admitted connection would be answered by now
    assert not [p for p in live if p.answered()]
    for probe in (early_allowed, *live):
        probe.close()


def test_sighup_reloads_the_allowlist(tmp_path, keys, context, brokers):
    broker, port = serve(tmp_path, keys, brokers)
    wait_until(lambda: len(re.findall(r"security state: 3 principals", broker.log())) >= WORKERS,
               what="every worker's security state")
    connected = Probe(context, port, server_key(keys), keys.pair("bob"))
    assert connected.metadata().brokers
    header, response = connected.ask(protocol.FetchTokenRequest())
    assert header.error_code == 0 and response.principal == "bob"
    keys.disallow("bob")
    broker.process.send_signal(signal.SIGHUP)
    broker.wait_for_log(r"allowlist reloaded: 2 keys; removed bob")
    assert_refused(Probe(context, port, server_key(keys), keys.pair("bob")))
    assert Probe(context, port, server_key(keys), keys.pair("alice")).metadata().brokers
    # The connection bob made before stays open, but its requests are refused from now on.
    header, _ = connected.ask(protocol.FetchTokenRequest())
    assert header.error_code == 27
    # Every worker was told: its data port no longer takes bob's tokens.
    wait_until(lambda: len(re.findall(r"security state: 2 principals", broker.log())) >= WORKERS,
               what="the new security state in every worker")
    keys.allow("bob")
    broker.process.send_signal(signal.SIGHUP)
    broker.wait_for_log(r"allowlist reloaded: 3 keys; added bob")
    assert Probe(context, port, server_key(keys), keys.pair("bob")).metadata().brokers
    assert broker.process.poll() is None


def test_sighup_keeps_the_allowlist_when_its_directory_is_gone(tmp_path, keys, context, brokers):
    broker, port = serve(tmp_path, keys, brokers)
    moved = tmp_path / "moved"
    keys.allowlist.rename(moved)
    broker.process.send_signal(signal.SIGHUP)
    broker.wait_for_log(r"allowlist not reloaded, the 3 keys loaded before stay")
    assert Probe(context, port, server_key(keys), keys.pair("alice")).metadata().brokers
    assert_refused(Probe(context, port, server_key(keys), keys.pair("mallory")))


def start_failing(tmp_path: Path, env: dict[str, str]) -> str:
    port = free_ports(WORKERS + 1)
    argv = [sys.executable, "-m", "hpbroker.cli", "serve", "--port", str(port), "--fetch-port", str(port + 1),
            "--workers", str(WORKERS), "--data-dir", str(tmp_path / "data"), "--host", "127.0.0.1"]
    broker = BrokerProcess(argv, tmp_path / "broker.log", {**BROKER_TEST_ENV, **env})
    try:
        assert broker.wait_exit(30) == 1, broker.log()
    finally:
        broker.stop()
    assert "forked worker" not in broker.log()  # stopped before anything was started
    return broker.log()


@pytest.mark.parametrize("case", ["missing allowlist", "bad key in allowlist", "public server key",
                                  "missing server key", "damaged server key", "one key under two names"])
def test_bad_key_files_stop_the_start(tmp_path, keys, case):
    env = keys.env()
    if case == "missing allowlist":
        env["HPBROKER_ALLOWLIST_DIR"] = str(tmp_path / "nowhere")
        expected = f"cannot read the allowlist directory {tmp_path / 'nowhere'}"
    elif case == "bad key in allowlist":
        (keys.allowlist / "carol.key").write_text("public-key = \"short\"\n")
        expected = f"{keys.allowlist / 'carol.key'}: the public key is not 40 z85 characters"
    elif case == "public server key":
        env["HPBROKER_SERVER_KEY_FILE"] = str(keys.secrets / "broker.key")
        expected = "holds no secret-key: give the secret key file"
    elif case == "one key under two names":
        shutil.copy(keys.allowlist / "alice.key", keys.allowlist / "aaa-admin.key")
        expected = (f"allowlist: {keys.allowlist / 'alice.key'} and {keys.allowlist / 'aaa-admin.key'} hold "
                    f"the same public key")
    elif case == "missing server key":
        env["HPBROKER_SERVER_KEY_FILE"] = str(tmp_path / "none.key_secret")
        expected = f"server_key_file: key file {tmp_path / 'none.key_secret'} does not exist"
    else:
        damaged = tmp_path / "damaged.key_secret"
        text = (keys.secrets / "broker.key_secret").read_text()
        public = keys.pair("alice")[0].decode()
        damaged.write_text(re.sub(r'public-key = "[^"]+"', f'public-key = "{public}"', text))
        env["HPBROKER_SERVER_KEY_FILE"] = str(damaged)
        expected = "its public-key is not the secret key's"
    log = start_failing(tmp_path, env)
    assert "cannot start" in log and expected in log, log


def test_loopback_data_ports_bind_127_0_0_1_only(tmp_path, keys, brokers):
    """``data_port_auth = "loopback"``: the front-end on its host (here 127.0.0.2), the data ports
    on 127.0.0.1 alone."""
    import socket

    broker, port = start_broker(tmp_path / "data", tmp_path / "broker.log", workers=WORKERS, host="127.0.0.2",
                                env={**keys.env(), "HPBROKER_DATA_PORT_AUTH": "loopback"})
    brokers.append(broker)
    for slot in range(WORKERS):
        with socket.create_connection(("127.0.0.1", port + 1 + slot), timeout=5):
            pass
        with pytest.raises(ConnectionRefusedError), socket.create_connection(("127.0.0.2", port + 1 + slot),
                                                                             timeout=5):
            pass

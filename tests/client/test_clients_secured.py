"""The public clients and the CLI against a real broker with ``security = "curve"``.

One standalone ``hpbroker serve`` for the module: keys made with ``hpbroker.security.keys``,
``alice`` (a super user) and the broker on the allowlist, ``mallory`` not.  Admin, Producer and
Consumer take their keys as an argument, from the environment, or from a client config file; a
refused key, or no key, is an AuthenticationError that says so, long before any timeout.
"""

from __future__ import annotations

import itertools
import signal
import time

import pytest
from harness import curve_broker

from hpbroker.cli import main
from hpbroker.client.admin import Admin
from hpbroker.client.consumer import Consumer, TopicPartition
from hpbroker.client.producer import Producer
from hpbroker.errors import AuthenticationError
from hpbroker.security.client import ClientSecurity

REFUSED_WITHIN_S = 5.0
_topics = itertools.count()


pytestmark = pytest.mark.usefixtures("no_client_environment")


@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    """``(bootstrap, keydir, broker, allowlist)`` of a secured broker."""
    with curve_broker(tmp_path_factory.mktemp("secured"), allowed=["alice"], others=["mallory", "carol"],
                      super_users="alice", workers=1) as broker:
        yield broker.bootstrap, broker.keydir, broker.process, broker.allowlist


def security(keydir, name: str) -> ClientSecurity:
    return ClientSecurity.from_files(keydir / f"{name}.key_secret", keydir / "broker.key")


def refused(action) -> str:
    started = time.monotonic()
    with pytest.raises(AuthenticationError) as raised:
        action()
    assert time.monotonic() - started < REFUSED_WITHIN_S, "refused only after a timeout"
    return raised.value.message


def test_admin_producer_consumer_with_an_allowlisted_key(secured):
    bootstrap, keydir, *_ = secured
    alice, topic = security(keydir, "alice"), f"secured-{next(_topics)}"
    with Admin(bootstrap, security=alice) as admin:
        admin.create_topic(topic, 1)
    producer = Producer(bootstrap, security=alice, acks=1, audit_topic=None)
    try:
        offsets = [producer.send_future(topic, f"v{i}".encode()).result(30).offset for i in range(3)]
    finally:
        producer.close()
    assert offsets == [0, 1, 2]
    with Consumer(bootstrap, security=alice, auto_offset_reset="earliest",
                  consumer_timeout_ms=20_000) as consumer:
        consumer.assign([TopicPartition(topic, 0)])
        values = [record.value for _, record in zip(range(3), consumer, strict=False)]
    assert values == [b"v0", b"v1", b"v2"]


def test_unknown_key_is_refused_by_every_client(secured):
    bootstrap, keydir, *_ = secured
    mallory = security(keydir, "mallory")

    def admin():
        with Admin(bootstrap, security=mallory) as a:
            a.list_topics()

    def producer():
        p = Producer(bootstrap, security=mallory, audit_topic=None, max_block_ms=30_000)
        try:
            p.send_future("anything", b"x").result(30)
        finally:
            p.close(timeout_s=5)

    def consumer():
        with Consumer(bootstrap, security=mallory) as c:
            c.partitions_for_topic("anything")

    for action in (admin, producer, consumer):
        assert "refused key 'mallory'" in refused(action)


def test_client_without_a_key_is_told_to_give_one(secured):
    bootstrap, *_ = secured

    def admin():
        with Admin(bootstrap) as a:
            a.list_topics()

    assert "requires CurveZMQ" in refused(admin)


def test_keys_from_the_environment_and_from_a_client_config_file(secured, monkeypatch, tmp_path):
    bootstrap, keydir, *_ = secured
    monkeypatch.setenv("HPBROKER_CLIENT_KEY_FILE", str(keydir / "alice.key_secret"))
    monkeypatch.setenv("HPBROKER_CLIENT_SERVER_KEY_FILE", str(keydir / "broker.key"))
    with Admin(bootstrap) as admin:
        assert admin.security.name == "alice"
        admin.list_topics()
    monkeypatch.delenv("HPBROKER_CLIENT_KEY_FILE")
    monkeypatch.delenv("HPBROKER_CLIENT_SERVER_KEY_FILE")
    config = tmp_path / "client.toml"
    config.write_text(f'[security]\nkey_file = "{keydir / "alice.key_secret"}"\n'
                      f'server_key_file = "{keydir / "broker.key"}"\n')
    monkeypatch.setenv("HPBROKER_CLIENT_CONFIG", str(config))
    producer = Producer(bootstrap, audit_topic=None)
    try:
        assert producer.config.security.name == "alice"
    finally:
        producer.close()


def test_cli_takes_key_options_and_reports_a_refusal(secured, capsys):
    bootstrap, keydir, *_ = secured
    topic = f"secured-cli-{next(_topics)}"
    keys = ["--key-file", str(keydir / "alice.key_secret"), "--server-key-file", str(keydir / "broker.key")]
    assert main(["topics", "create", topic, "--partitions", "1", "--bootstrap", bootstrap, *keys]) == 0
    assert main(["topics", "list", "--bootstrap", bootstrap, *keys]) == 0
    assert topic in capsys.readouterr().out.split()
    assert main(["topics", "list", "--bootstrap", bootstrap]) == 1
    err = capsys.readouterr().err
    assert err.startswith("hpbroker topics: authentication error: ") and "requires CurveZMQ" in err
    half = ["--key-file", str(keydir / "alice.key_secret")]
    assert main(["topics", "list", "--bootstrap", bootstrap, *half]) == 1
    assert "--key-file / key_file argument is given without the --server-key-file" in capsys.readouterr().err


def test_revoked_key_is_refused_on_its_next_connection_and_admitted_again_once_allowed(secured, capsys):
    """``hpbroker keys revoke`` and SIGHUP cut the key's next connection; ``keys allow`` and
    SIGHUP let it in again, on the same client, which connects again by itself."""
    bootstrap, keydir, broker, allowlist = secured
    carol = security(keydir, "carol")
    assert main(["keys", "allow", str(keydir / "carol.key"), "--allowlist", str(allowlist)]) == 0
    broker.process.send_signal(signal.SIGHUP)
    broker.wait_for_log(r"allowlist reloaded: .*added carol")
    with Admin(bootstrap, security=carol) as admin:
        admin.list_topics()
    assert main(["keys", "revoke", "carol", "--allowlist", str(allowlist)]) == 0
    broker.process.send_signal(signal.SIGHUP)
    broker.wait_for_log(r"allowlist reloaded: .*removed carol")
    admin = Admin(bootstrap, security=carol)
    try:
        assert "refused key 'carol'" in refused(admin.list_topics)
        revoked = allowlist / "revoked" / "carol.key"
        assert main(["keys", "allow", str(revoked), "--allowlist", str(allowlist)]) == 0
        broker.process.send_signal(signal.SIGHUP)
        broker.wait_for_log(r"allowlist reloaded: .*added carol", count=2)
        admin.list_topics()
    finally:
        admin.close()
    capsys.readouterr()

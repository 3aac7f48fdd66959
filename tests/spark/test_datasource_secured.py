"""``spark.read.format("hpbroker")`` against a broker with ``security = "curve"``: the keys come
from the source's options (read on the driver, shipped with the plan), the executors read the
data ports with fetch tokens; without keys the read fails with the broker's reason."""

from __future__ import annotations

import pytest
from harness import start_broker

from hpbroker.client import Admin, ClientSecurity, Producer
from hpbroker.security.keys import allow_key, generate_key_pair

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    """``(bootstrap, keydir)`` of a secured broker whose super user is ``analyst``."""
    root = tmp_path_factory.mktemp("secured-spark")
    keydir, allowlist = root / "keys", root / "allow"
    for name in ("broker", "analyst"):
        generate_key_pair(keydir, name)
        allow_key(keydir / f"{name}.key", allowlist)
    env = {"HPBROKER_SECURITY": "curve", "HPBROKER_SERVER_KEY_FILE": str(keydir / "broker.key_secret"),
           "HPBROKER_ALLOWLIST_DIR": str(allowlist), "HPBROKER_SUPER_USERS": "analyst"}
    broker, port = start_broker(root / "data", root / "broker.log", env=env)
    try:
        yield f"127.0.0.1:{port}", keydir
    finally:
        assert broker.stop() == 0, broker.log()


@pytest.fixture(autouse=True)
def no_client_environment(monkeypatch):
    for variable in ("HPBROKER_CLIENT_KEY_FILE", "HPBROKER_CLIENT_SERVER_KEY_FILE", "HPBROKER_CLIENT_CONFIG"):
        monkeypatch.delenv(variable, raising=False)


def test_a_read_with_the_key_options_returns_every_record(spark, secured):
    bootstrap, keydir = secured
    key_file, server_key_file = str(keydir / "analyst.key_secret"), str(keydir / "broker.key")
    security = ClientSecurity.from_files(key_file, server_key_file)
    with Admin(bootstrap, security=security) as admin:
        admin.create_topic("secured-read", 2)
    with Producer(bootstrap, audit_topic=None, linger_ms=0, security=security) as producer:
        for partition in (0, 1):
            producer.send_many("secured-read", [b"value %d" % i for i in range(500)], partition=partition)
        producer.flush()
    df = (spark.read.format("hpbroker").option("bootstrap", bootstrap).option("topic", "secured-read")
          .option("keyFile", key_file).option("serverKeyFile", server_key_file).load())
    rows = df.select("partition", "offset", "value").collect()
    assert sorted((r.partition, r.offset) for r in rows) == [(p, o) for p in (0, 1) for o in range(500)]
    assert {bytes(r.value) for r in rows} == {b"value %d" % i for i in range(500)}


def test_a_read_without_keys_fails_with_the_brokers_reason(spark, secured):
    bootstrap, keydir = secured
    with pytest.raises(Exception, match="requires CurveZMQ"):
        (spark.read.format("hpbroker").option("bootstrap", bootstrap).option("topic", "secured-read")
         .load().collect())
    with pytest.raises(Exception, match="keyFile.*without"):
        (spark.read.format("hpbroker").option("bootstrap", bootstrap).option("topic", "secured-read")
         .option("keyFile", str(keydir / "analyst.key_secret")).load().collect())

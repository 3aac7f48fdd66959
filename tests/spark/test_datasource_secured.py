"""``spark.read.format("hpbroker")`` against a broker with ``security = "curve"``: the keys come
from the source's options (read on the driver, shipped with the plan), the executors read the
data ports with fetch tokens; without keys the read fails with the broker's reason."""

from __future__ import annotations

import pytest
from harness import curve_broker

from hpbroker.client import Admin, ClientSecurity, Producer

pytestmark = [pytest.mark.spark, pytest.mark.usefixtures("no_client_environment")]


@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    """``(bootstrap, keydir)`` of a secured broker whose super user is ``analyst``."""
    with curve_broker(tmp_path_factory.mktemp("secured-spark"), allowed=["analyst"],
                      super_users="analyst") as broker:
        yield broker.bootstrap, broker.keydir


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

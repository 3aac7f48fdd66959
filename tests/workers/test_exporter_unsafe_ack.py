"""The test-only HPBROKER_UNSAFE_ACK_BEFORE_REPLICATION=1 is visible in the broker's metrics:
``hpbroker_unsafe_ack_before_replication`` is 1 with exactly "1" in the environment, else 0."""

from __future__ import annotations

import pytest
from scrape import parse

from hpbroker.broker.config import BrokerConfig
from hpbroker.workers.exporter import MetricsEndpoint
from hpbroker.workers.replication import UNSAFE_ACK_BEFORE_REPLICATION_ENV


@pytest.mark.parametrize("value, expected", [("1", 1), (None, 0), ("0", 0), ("yes", 0)])
def test_the_unsafe_ack_switch_shows_in_the_metrics(tmp_path, monkeypatch, value, expected):
    if value is None:
        monkeypatch.delenv(UNSAFE_ACK_BEFORE_REPLICATION_ENV, raising=False)
    else:
        monkeypatch.setenv(UNSAFE_ACK_BEFORE_REPLICATION_ENV, value)
    endpoint = MetricsEndpoint(BrokerConfig(data_dir=str(tmp_path), host="127.0.0.1"), str(tmp_path), dict)
    try:
        assert parse(endpoint.render()).value("hpbroker_unsafe_ack_before_replication") == expected
    finally:
        endpoint.close()

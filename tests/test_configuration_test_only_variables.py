"""The test-only environment variable of the planted bug is no broker setting: a broker started
with it (as the chaos suite's planted-bug test starts three) loads its configuration."""

from __future__ import annotations

from hpbroker.broker.config import BrokerConfig
from hpbroker.workers.replication import UNSAFE_ACK_BEFORE_REPLICATION_ENV


def test_the_planted_bug_variable_is_left_to_the_workers():
    environ = {UNSAFE_ACK_BEFORE_REPLICATION_ENV: "1", "HPBROKER_PORT": "9300"}
    config = BrokerConfig.load(None, environ=environ)
    assert config.port == 9300

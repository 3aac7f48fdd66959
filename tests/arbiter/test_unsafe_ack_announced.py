"""A broker started with the test-only HPBROKER_UNSAFE_ACK_BEFORE_REPLICATION=1 says so loudly:
an ERROR line from the arbiter at start and ``hpbroker_unsafe_ack_before_replication 1`` in its
metrics; one started without it says neither."""

from __future__ import annotations

import sys

import pytest
from harness import BROKER_TEST_ENV, BrokerProcess, free_ports
from scrape import scrape

from hpbroker.workers.replication import UNSAFE_ACK_BEFORE_REPLICATION_ENV

ERROR_TEXT = f"{UNSAFE_ACK_BEFORE_REPLICATION_ENV}=1 in the environment"


@pytest.mark.parametrize("value, expected", [("1", 1), ("", 0)])
def test_the_arbiter_announces_the_unsafe_ack_switch(tmp_path, value, expected):
    port = free_ports(3)
    argv = [sys.executable, "-m", "hpbroker.cli", "serve", "--port", str(port), "--fetch-port", str(port + 1),
            "--workers", "1", "--data-dir", str(tmp_path / "data"), "--host", "127.0.0.1",
            "--metrics-port", str(port + 2)]
    process = BrokerProcess(argv, tmp_path / "broker.log",
                            {**BROKER_TEST_ENV, UNSAFE_ACK_BEFORE_REPLICATION_ENV: value})
    try:
        process.wait_for_log(r"all 1 workers serving", timeout_s=30)
        assert scrape(port + 2).value("hpbroker_unsafe_ack_before_replication") == expected
        errors = [line for line in process.log().splitlines() if ERROR_TEXT in line]
        if expected:
            assert errors and "ERROR" in errors[0], process.log()
        else:
            assert not errors
    finally:
        assert process.stop() == 0, process.log()

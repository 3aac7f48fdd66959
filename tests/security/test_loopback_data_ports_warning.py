"""``data_port_auth = "loopback"`` on a broker reached at another address: the data ports still
bind 127.0.0.1, and the start says plainly that consumers and followers on other hosts cannot
use them.  The arbiter's own start step in this process (no worker is forked)."""

from __future__ import annotations

import logging

import pytest
from curve_probe import make_keys
from harness import free_ports

from hpbroker.broker.config import BrokerConfig
from hpbroker.workers.arbiter import Arbiter
from hpbroker.workers.security_state import data_port_host

WARNING = "consumers on other hosts cannot fetch from it and followers on other hosts cannot replicate"


def config_for(tmp_path, **overrides) -> BrokerConfig:
    keys = make_keys(tmp_path)
    port = free_ports(2)
    settings = {"data_dir": str(tmp_path / "data"), "port": port, "fetch_port": port + 1, "workers": 1,
                "security": "curve", "server_key_file": str(keys.secrets / "broker.key_secret"),
                "allowlist_dir": str(keys.allowlist), "data_port_auth": "loopback"}
    return BrokerConfig(**{**settings, **overrides})


def test_loopback_data_ports_on_a_broker_served_to_other_hosts_are_warned_about(tmp_path, caplog):
    arbiter = Arbiter(config_for(tmp_path, host="0.0.0.0"))
    try:
        with caplog.at_level(logging.WARNING):
            arbiter._setup()
        assert [listener.getsockname()[0] for listener in arbiter._listeners] == ["127.0.0.1"]
        assert WARNING in caplog.text and "reached at 0.0.0.0" in caplog.text
    finally:
        arbiter._cleanup()


@pytest.mark.parametrize("host, auth, security, bound, warned", [
    ("127.0.0.1", "loopback", "curve", "127.0.0.1", False),
    ("localhost", "loopback", "curve", "127.0.0.1", False),
    ("::1", "loopback", "curve", "127.0.0.1", False),
    ("10.1.2.3", "loopback", "curve", "127.0.0.1", True),
    ("broker-1.example", "loopback", "curve", "127.0.0.1", True),
    ("10.1.2.3", "token", "curve", "10.1.2.3", False),
    ("10.1.2.3", "loopback", "none", "10.1.2.3", False),
])
def test_data_port_host(tmp_path, caplog, host, auth, security, bound, warned):
    config = config_for(tmp_path, host=host, data_port_auth=auth, security=security)
    with caplog.at_level(logging.WARNING):
        assert data_port_host(config) == bound
    assert (WARNING in caplog.text) is warned

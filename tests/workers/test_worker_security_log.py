"""A worker never writes the cluster's token key to its log, not even when the security state
that carries it is refused."""

from __future__ import annotations

import time

SECURE = {"security": "curve", "server_key_file": "unused.key_secret", "allowlist_dir": "unused"}
KEY = bytes(range(100, 132))


def test_a_refused_security_state_is_logged_without_its_token_key(start_worker, arbiter, capfd):
    start_worker(**SECURE)
    bad = {"enabled": True, "token_key": KEY.hex(), "principals": ["alice"], "super_users": [],
           "acls": "not a list", "data_port_auth": "token", "own_principal": "broker-0"}
    assert "acls must be a list" in arbiter.control(0, "security", **bad)["error"]
    deadline = time.monotonic() + 10
    err = ""
    while "control security" not in err and time.monotonic() < deadline:  # the child's stderr
        err += capfd.readouterr().err
        time.sleep(0.05)
    assert "control security" in err and "failed" in err
    assert KEY.hex() not in err

"""Secret material on disk: a secret key file that others may read is warned about, naming the
file, wherever it is read (the broker's ``server_key_file``, a client's key file, ``hpbroker
keys list``); the broker's run directory, whose backend socket carries the token key, is 0700."""

from __future__ import annotations

import logging
import os
import stat

import zmq.auth
from harness import start_broker

from hpbroker.security import keys
from hpbroker.security.broker import load_server_key
from hpbroker.security.client import ClientSecurity
from hpbroker.workers.arbiter import RUN_DIR_NAME


def _pair(tmp_path, name, mode):
    zmq.auth.create_certificates(str(tmp_path), name)
    secret = tmp_path / f"{name}.key_secret"
    os.chmod(secret, mode)
    return secret, tmp_path / f"{name}.key"


def _warnings(caplog):
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def test_a_secret_key_file_others_may_read_is_warned_about(tmp_path, caplog):
    secret, public = _pair(tmp_path, "alice", 0o644)
    with caplog.at_level(logging.WARNING):
        ClientSecurity.from_files(secret, public)
        load_server_key(str(secret))
    warned = _warnings(caplog)
    assert len(warned) == 2, warned
    expected = f"secret key file {secret} is readable by others (mode 644): chmod 600 it"
    assert all(expected in w for w in warned)


def test_a_private_secret_key_file_and_a_public_one_are_not(tmp_path, caplog):
    secret, public = _pair(tmp_path, "bob", 0o600)
    os.chmod(public, 0o644)
    with caplog.at_level(logging.WARNING):
        ClientSecurity.from_files(secret, public)
        keys.load_public_key(public)
    assert _warnings(caplog) == []


def test_the_run_directory_is_private(tmp_path):
    data = tmp_path / "data"
    existing = data / RUN_DIR_NAME
    existing.mkdir(parents=True, mode=0o755)
    os.chmod(existing, 0o755)  # a run directory left by an older broker, open to all
    broker, _ = start_broker(data, tmp_path / "broker.log", workers=1)
    try:
        assert stat.S_IMODE(os.stat(existing).st_mode) == 0o700
    finally:
        broker.stop()


def test_a_run_directory_the_operator_named_is_warned_about_not_changed(tmp_path):
    shared = tmp_path / "shared-run"
    shared.mkdir(mode=0o1777)
    os.chmod(shared, 0o1777)  # e.g. /tmp: other services use it too
    broker, _ = start_broker(tmp_path / "data", tmp_path / "broker.log", workers=1,
                             env={"HPBROKER_RUN_DIR": str(shared)})
    try:
        assert stat.S_IMODE(os.stat(shared).st_mode) == 0o1777
    finally:
        broker.stop()
    assert f"run_dir {shared} is mode 1777" in (tmp_path / "broker.log").read_text()

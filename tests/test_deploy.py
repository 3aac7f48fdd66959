"""deploy/: the systemd unit passes ``systemd-analyze verify`` and agrees with the broker's
defaults and the shipped configuration; install.sh is idempotent and keeps local settings."""

from __future__ import annotations

import configparser
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hpbroker.broker.config import BrokerConfig

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"
UNIT = DEPLOY / "hpbroker.service"
CONFIG = DEPLOY / "hpbroker.toml"
INSTALL = DEPLOY / "install.sh"
_SECONDS = {"s": 1, "sec": 1, "min": 60, "h": 3600}


def unit() -> configparser.ConfigParser:
    parser = configparser.ConfigParser(interpolation=None, strict=True, empty_lines_in_values=False)
    parser.optionxform = str  # systemd keys are case-sensitive
    parser.read(UNIT)
    return parser


def seconds(value: str) -> float:
    number, suffix = re.fullmatch(r"(\d+)\s*([a-z]*)", value).groups()
    return int(number) * _SECONDS[suffix or "s"]


@pytest.mark.skipif(shutil.which("systemd-analyze") is None,
                    reason="systemd-analyze is not installed (Debian package systemd)")
def test_unit_passes_systemd_analyze_verify(tmp_path):
    """verify insists that ExecStart's program exists: the copy runs this virtualenv's hpbroker."""
    hpbroker = Path(sys.executable).parent / "hpbroker"
    assert hpbroker.exists(), f"{hpbroker} missing: install the package in the virtualenv"
    copy = tmp_path / "hpbroker.service"
    copy.write_text(UNIT.read_text().replace("/opt/hpbroker/bin/hpbroker", str(hpbroker)))
    result = subprocess.run(["systemd-analyze", "verify", str(copy)], capture_output=True, text=True,
                            timeout=60)
    complaints = [line for line in (result.stdout + result.stderr).splitlines() if "hpbroker.service" in line]
    assert result.returncode == 0 and not complaints, result.stdout + result.stderr


def test_unit_is_a_notify_service_that_outwaits_the_graceful_stop():
    service = unit()["Service"]
    assert service["Type"] == "notify" and service["NotifyAccess"] == "main"
    assert service["ExecStart"] == "/opt/hpbroker/bin/hpbroker serve --config /etc/hpbroker/hpbroker.toml"
    assert service["User"] == "hpbroker" and service["Restart"] == "on-failure"
    assert service["KillSignal"] == "SIGTERM" and service["KillMode"] == "mixed"
    default_graceful_s = BrokerConfig(data_dir="x").graceful_timeout_ms / 1000
    assert seconds(service["TimeoutStopSec"]) >= default_graceful_s + 5
    assert seconds(service["TimeoutStartSec"]) >= BrokerConfig(data_dir="x").worker_boot_timeout_ms / 1000
    assert seconds(service["WatchdogSec"]) >= 10  # the arbiter pings at half of it
    for hardening in ("NoNewPrivileges", "PrivateTmp", "ProtectHome"):
        assert service[hardening] == "yes"
    assert service["ProtectSystem"] == "strict"


def test_shipped_configuration_loads_and_matches_the_unit():
    config = BrokerConfig.load(str(CONFIG), environ={})
    service = unit()["Service"]
    assert service["ReadWritePaths"] == config.data_dir == service["WorkingDirectory"] == "/var/lib/hpbroker"
    assert config.graceful_timeout_ms / 1000 + 5 <= seconds(service["TimeoutStopSec"])


def test_install_script_is_valid_bash():
    subprocess.run(["bash", "-n", str(INSTALL)], check=True)
    assert os.access(INSTALL, os.X_OK)


@pytest.mark.skipif(os.geteuid() != 0, reason="install.sh runs as root")
@pytest.mark.skipif(os.path.isdir("/run/systemd/system"),
                    reason="systemd runs here: install.sh would reload it")
def test_install_script_is_idempotent_and_keeps_local_settings(tmp_path):
    """INSTALL_PACKAGE=no skips the (slow, networked) pip step: a stand-in hpbroker is there."""
    prefix = tmp_path / "opt"
    (prefix / "bin").mkdir(parents=True)
    (prefix / "bin" / "hpbroker").write_text("#!/bin/sh\n")
    (prefix / "bin" / "hpbroker").chmod(0o755)
    env = {**os.environ, "PREFIX": str(prefix), "CONFIG_DIR": str(tmp_path / "etc"),
           "DATA_DIR": str(tmp_path / "data"), "UNIT_DIR": str(tmp_path / "units"), "SERVICE_USER": "root",
           "INSTALL_PACKAGE": "no", "PYTHON": sys.executable}
    first = subprocess.run([str(INSTALL)], env=env, capture_output=True, text=True, timeout=60)
    assert first.returncode == 0, first.stdout + first.stderr
    config = tmp_path / "etc" / "hpbroker.toml"
    assert BrokerConfig.load(str(config), environ={}).data_dir == str(tmp_path / "data")
    assert (tmp_path / "data").is_dir()
    installed = (tmp_path / "units" / "hpbroker.service").read_text()
    assert f"ExecStart={prefix}/bin/hpbroker serve --config {tmp_path}/etc/hpbroker.toml\n" in installed
    assert f"ReadWritePaths={tmp_path}/data\n" in installed and "User=root\n" in installed

    config.write_text(config.read_text() + "# a local change\n")
    second = subprocess.run([str(INSTALL)], env=env, capture_output=True, text=True, timeout=60)
    assert second.returncode == 0, second.stdout + second.stderr
    assert f"keeping {config}" in second.stdout and config.read_text().endswith("# a local change\n")
    assert (tmp_path / "units" / "hpbroker.service").read_text() == installed

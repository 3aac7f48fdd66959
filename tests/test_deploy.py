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
    assert service["ExecReload"] == "/bin/kill -HUP $MAINPID"  # SIGHUP: the allowlist is read again


def test_shipped_configuration_loads_and_matches_the_unit():
    config = BrokerConfig.load(str(CONFIG), environ={})
    service = unit()["Service"]
    assert service["ReadWritePaths"] == config.data_dir == service["WorkingDirectory"] == "/var/lib/hpbroker"
    assert config.graceful_timeout_ms / 1000 + 5 <= seconds(service["TimeoutStopSec"])


def test_install_script_is_valid_bash():
    subprocess.run(["bash", "-n", str(INSTALL)], check=True)
    assert os.access(INSTALL, os.X_OK)


def test_unit_gives_the_service_a_runtime_directory_and_outlasts_a_long_recovery():
    service = unit()["Service"]
    assert service["RuntimeDirectory"] == "hpbroker" and service["ProtectSystem"] == "strict"
    # The arbiter extends the start timeout from its loop while its workers recover.
    assert "EXTEND_TIMEOUT_USEC" in UNIT.read_text()


def test_make_install_passes_the_layout_through_sudo():
    result = subprocess.run(["make", "-s", "-n", "install", "DATA_DIR=/srv/it's & #1"], cwd=DEPLOY.parent,
                            env={**os.environ, "PREFIX": "/opt/hpb"}, capture_output=True, text=True,
                            check=True)
    assert re.search(r"env .*PREFIX='/opt/hpb' .*DATA_DIR='/srv/it'\\''s & #1' .*deploy/install.sh",
                     result.stdout), result.stdout
    assert "PYTHON=" not in result.stdout, "only what was given"


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="install.sh runs as root")
no_systemd = pytest.mark.skipif(os.path.isdir("/run/systemd/system"),
                                reason="systemd runs here: install.sh would reload it")


def install_env(tmp_path, **extra) -> dict[str, str]:
    """INSTALL_PACKAGE=no skips the (slow) pip step: a stand-in hpbroker is there."""
    prefix = tmp_path / "opt"
    (prefix / "bin").mkdir(parents=True, exist_ok=True)
    (prefix / "bin" / "hpbroker").write_text("#!/bin/sh\n")
    (prefix / "bin" / "hpbroker").chmod(0o755)
    env = {**os.environ, "PREFIX": str(prefix), "CONFIG_DIR": str(tmp_path / "etc"),
           "DATA_DIR": str(tmp_path / "data"), "UNIT_DIR": str(tmp_path / "units"), "SERVICE_USER": "root",
           "INSTALL_PACKAGE": "no", "PYTHON": sys.executable, **extra}
    return {key: value for key, value in env.items() if value is not None}


def run_install(env, script=INSTALL) -> subprocess.CompletedProcess:
    return subprocess.run([str(script)], env=env, capture_output=True, text=True, timeout=600)


@needs_root
@no_systemd
def test_install_script_is_idempotent_and_keeps_local_settings(tmp_path):
    prefix = tmp_path / "opt"
    env = install_env(tmp_path)
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


@needs_root
@no_systemd
def test_a_rerun_keeps_the_data_directory_of_the_configuration_and_its_mode(tmp_path):
    data_dir = tmp_path / "srv&#1%i$x"  # characters sed, TOML or systemd could take for syntax
    env = install_env(tmp_path, DATA_DIR=str(data_dir))
    first = run_install(env)
    assert first.returncode == 0, first.stdout + first.stderr
    config = tmp_path / "etc" / "hpbroker.toml"
    assert BrokerConfig.load(str(config), environ={}).data_dir == str(data_dir)
    unit_file = tmp_path / "units" / "hpbroker.service"
    installed = unit_file.read_text()
    escaped = str(data_dir).replace("%", "%%")
    assert f"ReadWritePaths={escaped}\n" in installed and f"WorkingDirectory={escaped}\n" in installed
    data_dir.chmod(0o700)

    # `make install` later, without DATA_DIR: the unit still names the configured directory.
    second = run_install({k: v for k, v in env.items() if k != "DATA_DIR"})
    assert second.returncode == 0, second.stdout + second.stderr
    assert unit_file.read_text() == installed
    assert (data_dir.stat().st_mode & 0o777) == 0o700, "a directory made by hand keeps its mode"
    assert not (tmp_path / "default").exists()

    refused = run_install({**env, "DATA_DIR": str(tmp_path / "elsewhere")})
    assert refused.returncode == 1
    assert f"DATA_DIR={tmp_path}/elsewhere but {config} says data_dir" in refused.stderr
    assert unit_file.read_text() == installed and not (tmp_path / "elsewhere").exists()


@needs_root
@no_systemd
def test_a_run_dir_outside_the_data_directory_is_writable_for_the_service(tmp_path):
    env = install_env(tmp_path)
    (tmp_path / "etc").mkdir()
    config = tmp_path / "etc" / "hpbroker.toml"
    configured = f'data_dir = "{tmp_path}/data"\nrun_dir = "/run/hpbroker/b1"'
    config.write_text(CONFIG.read_text().replace('data_dir = "/var/lib/hpbroker"', configured))
    result = run_install({k: v for k, v in env.items() if k != "DATA_DIR"})
    assert result.returncode == 0, result.stdout + result.stderr
    installed = (tmp_path / "units" / "hpbroker.service").read_text()
    assert "RuntimeDirectory=hpbroker/b1\n" in installed and f"ReadWritePaths={tmp_path}/data\n" in installed
    config.write_text(config.read_text().replace("/run/hpbroker/b1", f"{tmp_path}/run"))
    result = run_install({k: v for k, v in env.items() if k != "DATA_DIR"})
    assert result.returncode == 0, result.stdout + result.stderr
    installed = (tmp_path / "units" / "hpbroker.service").read_text()
    assert f"ReadWritePaths={tmp_path}/data {tmp_path}/run\n" in installed and (tmp_path / "run").is_dir()
    config.write_text(config.read_text().replace(f'data_dir = "{tmp_path}/data"', 'data_dir = "relative"'))
    result = run_install({k: v for k, v in env.items() if k != "DATA_DIR"})
    assert result.returncode == 1 and "must set data_dir to an absolute path" in result.stderr


@needs_root
@no_systemd
@pytest.mark.skipif(shutil.which("useradd") is None, reason="no useradd")
def test_the_service_user_is_created_in_a_group_that_exists_already(tmp_path):
    name = f"hpbt{os.getpid() % 100000}"
    subprocess.run(["groupadd", "--system", name], check=True)
    try:
        result = run_install(install_env(tmp_path, SERVICE_USER=name))
        assert result.returncode == 0, result.stdout + result.stderr
        assert f"created system user {name}" in result.stdout
        assert subprocess.run(["id", "-gn", name], capture_output=True, text=True).stdout.strip() == name
        assert f"User={name}\nGroup={name}\n" in (tmp_path / "units" / "hpbroker.service").read_text()
    finally:
        subprocess.run(["userdel", name], capture_output=True)
        subprocess.run(["groupdel", name], capture_output=True)


@needs_root
@no_systemd
@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_the_package_is_built_from_a_copy_and_the_checkout_is_left_as_it_was(tmp_path):
    """A checkout of what install.sh and the stand-in for pip look at; pip writes into the
    directory it is given what a real build leaves there (build/, *.egg-info, generated .c files)
    and notes what it found in it."""
    checkout = tmp_path / "checkout"
    for name in ("deploy/install.sh", "deploy/hpbroker.service", "deploy/hpbroker.toml", "setup.py",
                 "pyproject.toml", ".gitignore", "hpbroker/__init__.py"):
        (checkout / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(DEPLOY.parent / name, checkout / name)
    subprocess.run(["git", "init", "-q"], cwd=checkout, check=True)
    subprocess.run(["git", "add", "-A"], cwd=checkout, check=True)
    (checkout / "hpbroker" / "new_module.py").write_text("")  # new, not ignored: part of the source
    (checkout / "build").mkdir()
    (checkout / "build" / "stale.o").write_text("")  # ignored: an output of an earlier build
    before = sorted(str(p.relative_to(checkout)) for p in checkout.rglob("*") if ".git" not in p.parts)
    env = install_env(tmp_path, INSTALL_PACKAGE="yes")
    prefix = Path(env["PREFIX"])
    notes = tmp_path / "pip.txt"
    (prefix / "bin" / "python").write_text(f"""#!/bin/sh
[ "$1 $2 $3" = "-m pip install" ] || exit 0
for source; do :; done
[ -f "$source/setup.py" ] || exit 0
echo "$source" >{notes}
for f in hpbroker/new_module.py setup.py build; do [ -e "$source/$f" ] && echo "$f" >>{notes}; done
mkdir -p "$source/build" "$source/hpbroker.egg-info" && touch "$source/hpbroker/_core.c"
""")
    (prefix / "bin" / "hpbroker").write_text("#!/bin/sh\necho hpbroker 0.1.0\n")
    for program in ("python", "hpbroker"):
        (prefix / "bin" / program).chmod(0o755)
    result = run_install(env, checkout / "deploy" / "install.sh")
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"installed hpbroker 0.1.0 in {prefix}" in result.stdout
    source, *found = notes.read_text().splitlines()
    assert not Path(source).exists(), "the copy is removed"
    assert not Path(source).is_relative_to(checkout)
    assert found == ["hpbroker/new_module.py", "setup.py"], "the source, without the build outputs"
    after = sorted(str(p.relative_to(checkout)) for p in checkout.rglob("*") if ".git" not in p.parts)
    assert after == before, set(after) ^ set(before)

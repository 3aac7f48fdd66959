"""docs/CONFIGURATION.md tells the truth about every setting (a test parses its tables), and a
broker started with a bad configuration stops at once, naming the setting."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from hpbroker.broker.config import BrokerConfig
from hpbroker.errors import InvalidConfigError
from hpbroker.io import LogConfig

DOC = Path(__file__).resolve().parent.parent / "docs" / "CONFIGURATION.md"
_TYPES = {"int": "int", "str": "string", "bool": "bool"}
# Defaults the document describes in words, and what they are.
_DESCRIBED_DEFAULTS = {("broker", "workers"): ("the number of CPU cores", os.cpu_count() or 1)}
# Integer settings whose range depends on another setting.
_RANGES_IN_WORDS = {"fetch_port", "worker_timeout_ms", "frontend_heartbeat_interval_ms"}
_BOUND = r"[-\d_]+|2\^\d+ − 1"  # a number, or 2^31 − 1 and the like


@dataclasses.dataclass
class Row:
    name: str
    type: str
    unit: str
    default: str
    range: str
    environment: str
    meaning: str


def doc_rows(section: str) -> dict[str, Row]:
    """The rows of the settings table under ``## [section]``."""
    text = DOC.read_text().split(f"\n## [{section}]\n", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in text.splitlines():
        if not line.startswith("| `"):
            continue
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        assert len(cells) == 7, line
        row = Row(*cells)
        row.name = row.name.strip("`")
        rows[row.name] = row
    return rows


def sections():
    broker = [f for f in dataclasses.fields(BrokerConfig) if f.name != "log"]
    return [("broker", broker, "HPBROKER_"), ("log", list(dataclasses.fields(LogConfig)), "HPBROKER_LOG_")]


def _section_id(value) -> str:
    return value if isinstance(value, str) and not value.startswith("HPBROKER") else ""


def true_default(field: dataclasses.Field):
    return field.default_factory() if field.default is dataclasses.MISSING else field.default


def build(section: str, **changes) -> None:
    if section == "broker":
        BrokerConfig(**{"data_dir": "x", **changes})
    else:
        LogConfig(**changes)


def _number(text: str) -> int:
    text = text.replace("_", "").replace(" ", "").replace("−", "-")
    if (power := re.fullmatch(r"2\^(\d+)-1", text)) is not None:
        return 2 ** int(power[1]) - 1
    return int(text)


@pytest.mark.parametrize(("section", "fields", "prefix"), sections(), ids=_section_id)
def test_every_setting_is_documented_with_its_type_default_and_variable(section, fields, prefix):
    rows = doc_rows(section)
    assert sorted(rows) == sorted(f.name for f in fields), "the document lists other settings than the code"
    for field in fields:
        row = rows[field.name]
        assert row.type == _TYPES[field.type], field.name
        assert row.environment == f"`{prefix}{field.name.upper()}`", field.name
        default = true_default(field)
        if (section, field.name) in _DESCRIBED_DEFAULTS:
            words, value = _DESCRIBED_DEFAULTS[section, field.name]
            assert row.default == words and default == value
        else:
            literal = re.match(r"`([^`]*)`", row.default)
            assert literal, f"{field.name}: default {row.default!r} is not a `literal`"
            assert tomllib.loads(f"value = {literal[1]}")["value"] == default, field.name
        # The variable is real: setting it to the default is accepted.
        text = str(default).lower() if isinstance(default, bool) else str(default)
        loaded = BrokerConfig.load(None, environ={f"{prefix}{field.name.upper()}": text})
        assert getattr(loaded if section == "broker" else loaded.log, field.name) == default


@pytest.mark.parametrize(("section", "fields", "prefix"), sections(), ids=_section_id)
def test_documented_ranges_are_the_enforced_ones(section, fields, prefix):
    """Plain ``[low, high]`` ranges: both ends accepted, one beyond either end refused, by name."""
    rows = doc_rows(section)
    for field in fields:
        bounds = re.fullmatch(rf"\[({_BOUND}), ({_BOUND})\](, .*)?", rows[field.name].range)
        if bounds is None:
            assert field.type != "int" or field.name in _RANGES_IN_WORDS, f"{field.name}: no [low, high]"
            continue
        low, high = _number(bounds[1]), _number(bounds[2])
        for value, ok in ((low, True), (high, True), (low - 1, False), (high + 1, False)):
            try:
                build(section, **{field.name: value})
                refused = None
            except InvalidConfigError as e:
                refused = e.message
            accepted = refused is None or f"{field.name} must be" not in refused
            assert accepted == ok, (field.name, value, refused)


# --- hpbroker serve with a bad configuration -----------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "named"),
    [
        ("[broker]\nheartbeat_interval_ms = 5\n", "heartbeat_interval_ms must be in [10, 60000], got 5"),
        ("[broker]\nport = \"9092\"\n", "port must be an integer, got '9092'"),
        ("[broker]\nretention_ms = 5\n", "unknown [broker] settings ['retention_ms']"),
        ("[log]\nretention_hours = 5\n", "unknown [log] settings ['retention_hours']"),
        ("[log]\nsegment_bytes = 100\n", "segment_bytes must be in [512, 2147483647], got 100"),
        ("[log]\nflush_fsync = \"yes\"\n", "flush_fsync must be a bool"),
        ("broker = 5\n", "[broker] must be a table"),
        ("[listeners]\n", "unknown sections ['listeners']"),
    ],
)
def test_serve_refuses_a_bad_file_naming_the_setting(tmp_path, content, named):
    path = tmp_path / "bad.toml"
    path.write_text(content)
    result = subprocess.run([sys.executable, "-m", "hpbroker.cli", "serve", "--config", str(path),
                             "--data-dir", str(tmp_path / "data")],
                            capture_output=True, text=True, timeout=60,
                            env={k: v for k, v in os.environ.items() if not k.startswith("HPBROKER_")})
    assert result.returncode == 2, result.stderr
    assert named in result.stderr and result.stderr.startswith("hpbroker serve: invalid configuration: ")
    assert not (tmp_path / "data").exists(), "nothing may be created before the configuration is valid"


def test_log_settings_come_from_the_environment_above_the_file(tmp_path):
    path = tmp_path / "broker.toml"
    path.write_text("[log]\nretention_ms = 1000\nflush_fsync = true\n")
    config = BrokerConfig.load(str(path), environ={"HPBROKER_LOG_RETENTION_MS": "2000",
                                                   "HPBROKER_LOG_FLUSH_FSYNC": "false"})
    assert (config.log.retention_ms, config.log.flush_fsync) == (2000, False)
    with pytest.raises(InvalidConfigError, match="HPBROKER_LOG_RETENTION_H: no log setting 'retention_h'"):
        BrokerConfig.load(None, environ={"HPBROKER_LOG_RETENTION_H": "1"})


def test_the_client_bootstrap_variable_does_not_stop_a_broker():
    config = BrokerConfig.load(None, environ={"HPBROKER_BOOTSTRAP": "10.0.0.1:9092", "HPBROKER_PORT": "9300"})
    assert config.port == 9300


def test_a_front_end_heartbeat_no_shorter_than_its_timeout_is_refused():
    BrokerConfig(frontend_heartbeat_interval_ms=0)  # no heartbeats at all: fine
    BrokerConfig(frontend_heartbeat_interval_ms=100, frontend_heartbeat_timeout_ms=500)
    for interval, timeout in ((30_000, 30_000), (60_000, 30_000), (99, 30_000)):
        with pytest.raises(InvalidConfigError, match="frontend_heartbeat_interval_ms must be 0 or at least"):
            BrokerConfig(frontend_heartbeat_interval_ms=interval, frontend_heartbeat_timeout_ms=timeout)

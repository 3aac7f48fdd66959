"""BrokerConfig: defaults, validation naming the field, and file < environment < flags."""

from __future__ import annotations

import pytest

from hpbroker.broker.config import BrokerConfig
from hpbroker.errors import InvalidConfigError


def test_defaults_are_valid_and_documented_values():
    config = BrokerConfig()
    assert (config.port, config.fetch_port, config.host) == (9092, 9093, "127.0.0.1")
    assert config.workers >= 1 and config.log.flush_fsync is True and config.auto_create_topics is False


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"port": 0}, r"port must be in \[1, 65535\], got 0"),
        ({"workers": 0}, r"workers must be in \[1, 256\]"),
        ({"heartbeat_interval_ms": 5}, "heartbeat_interval_ms"),
        ({"worker_timeout_ms": 100, "heartbeat_interval_ms": 100}, r"worker_timeout_ms must be in \[200"),
        ({"port": 9094, "fetch_port": 9093, "workers": 4}, "collides with data ports 9093..9096"),
        ({"workers": "4"}, "workers must be an integer"),
        ({"data_dir": ""}, "must not be empty"),
        ({"auto_create_topics": "yes"}, "auto_create_topics must be a bool"),
        ({"metrics_port": 9092}, r"metrics_port 9092 collides with port 9092 or data ports 9093\.\."),
        ({"metrics_port": 9093, "workers": 2}, "metrics_port 9093 collides"),
        ({"metrics_port": 70000}, r"metrics_port must be in \[0, 65535\]"),
        ({"metrics_host": 5}, "metrics_host must be a string"),
        ({"metrics_lag_interval_ms": 10}, r"metrics_lag_interval_ms must be in \[100, "),
    ],
)
def test_invalid_values_name_the_field(changes, message):
    with pytest.raises(InvalidConfigError, match=message):
        BrokerConfig(**changes)


def test_file_then_environment_then_flags(tmp_path):
    path = tmp_path / "broker.toml"
    path.write_text('[broker]\nport = 9200\nworkers = 3\ndata_dir = "/srv/hp"\n\n[log]\nflush_ms = 7\n')
    from_file = BrokerConfig.load(str(path), environ={})
    assert (from_file.port, from_file.workers, from_file.data_dir) == (9200, 3, "/srv/hp")
    assert from_file.log.flush_ms == 7
    environ = {"HPBROKER_PORT": "9300", "HPBROKER_AUTO_CREATE_TOPICS": "1"}
    from_env = BrokerConfig.load(str(path), environ=environ)
    assert (from_env.port, from_env.auto_create_topics, from_env.workers) == (9300, True, 3)
    from_flags = BrokerConfig.load(str(path), environ={"HPBROKER_PORT": "9300"}, port=9400, workers=None)
    assert (from_flags.port, from_flags.workers) == (9400, 3), "a None flag means not given"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("[broker]\nprot = 1\n", r"unknown \[broker\] settings \['prot'\]"),
        ("[log]\nflush_mss = 1\n", r"unknown \[log\] settings \['flush_mss'\]"),
        ("[brokers]\n", "unknown sections"),
        ("[broker\n", "cannot read the config file"),
        ("[log]\nflush_ms = -1\n", "flush_ms"),
    ],
)
def test_bad_files_fail_with_the_field_named(tmp_path, content, message):
    path = tmp_path / "broker.toml"
    path.write_text(content)
    with pytest.raises(InvalidConfigError, match=message):
        BrokerConfig.load(str(path), environ={})


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({"HPBROKER_PORTS": "1"}, "no broker setting 'ports'"),
        ({"HPBROKER_PORT": "x"}, "is not an integer"),
        ({"HPBROKER_AUTO_CREATE_TOPICS": "maybe"}, "is not true or false"),
    ],
)
def test_bad_environment_values_are_refused(environ, message):
    with pytest.raises(InvalidConfigError, match=message):
        BrokerConfig.load(None, environ=environ)


def test_a_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(InvalidConfigError, match="cannot read the config file"):
        BrokerConfig.load(str(tmp_path / "nope.toml"), environ={})

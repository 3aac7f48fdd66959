"""``hpbroker serve``: an invalid configuration is one clear line and exit status 2."""

from __future__ import annotations

import pytest

from hpbroker.cli import main


@pytest.mark.parametrize(
    ("argv", "field"),
    [
        (["--workers", "0"], "workers must be in [1, 256], got 0"),
        (["--port", "70000"], "port must be in [1, 65535], got 70000"),
        (["--broker-id", "-1"], "broker_id must be in"),
    ],
)
def test_invalid_flag_is_one_line_naming_the_field(capsys, tmp_path, argv, field):
    assert main(["serve", "--data-dir", str(tmp_path), *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("hpbroker serve: invalid configuration: ") and field in err


def test_invalid_config_file_names_the_setting(capsys, tmp_path):
    path = tmp_path / "broker.toml"
    path.write_text("[broker]\nheartbeat_interval_ms = 1\n")
    assert main(["serve", "--config", str(path)]) == 2
    assert "heartbeat_interval_ms must be in [10, 60000], got 1" in capsys.readouterr().err


def test_invalid_environment_names_the_variable(capsys, monkeypatch):
    monkeypatch.setenv("HPBROKER_WORKERS", "many")
    assert main(["serve"]) == 2
    assert "HPBROKER_WORKERS='many' is not an integer" in capsys.readouterr().err


def test_up_hands_its_flags_to_the_stack(capsys, tmp_path):
    """``hpbroker up`` parses with the stack's own parser: its flags and its errors."""
    assert main(["up", "--data-dir", str(tmp_path), "--zookeeper-port", "70000"]) == 2
    err = capsys.readouterr().err
    assert "hpbroker up: invalid configuration: --zookeeper-port must be in [0, 65535]" in err
    with pytest.raises(SystemExit) as exit_info:
        main(["up", "--help"])
    assert exit_info.value.code == 0 and "usage: hpbroker up" in capsys.readouterr().out

"""loadgen against a broker with ``security = "curve"``: its producers, consumers and admin all
connect with the key files given on its command line (or in its configuration), and the data
ports serve its consumers through fetch tokens; without a key it stops with the broker's reason."""

from __future__ import annotations

import pytest
from harness import curve_broker

from loadgen.cli import main
from loadgen.config import LoadConfig
from loadgen.runner import LoadgenError, run

pytestmark = pytest.mark.usefixtures("no_client_environment")


@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    """``(bootstrap, keydir)`` of a secured broker whose super user is ``loader``."""
    with curve_broker(tmp_path_factory.mktemp("secured-loadgen"), allowed=["loader"],
                      super_users="loader") as broker:
        yield broker.bootstrap, broker.keydir


def test_an_end_to_end_run_with_keys_checks_every_record(secured):
    bootstrap, keydir = secured
    report = run(LoadConfig(workload="e2e", bootstrap=bootstrap, topic="secured-e2e", create_topic=True,
                            partitions=2, records=20_000, linger_ms=1, interval_s=0.25, progress="off",
                            delete_topic=True, key_file=str(keydir / "loader.key_secret"),
                            server_key_file=str(keydir / "broker.key")))
    assert report["failures"] == []
    assert report["produce"]["records"] == 20_000 and report["produce"]["failed"] == 0
    check = report["check"]
    assert check["ok"] and (check["received"], check["missing"], check["duplicated"]) == (20_000, 0, 0)


def test_the_command_line_takes_a_client_config_file(secured, tmp_path, capsys):
    bootstrap, keydir = secured
    config = tmp_path / "client.toml"
    config.write_text(f'[security]\nkey_file = "{keydir / "loader.key_secret"}"\n'
                      f'server_key_file = "{keydir / "broker.key"}"\n')
    status = main(["produce", "--bootstrap", bootstrap, "--topic", "secured-cli", "--create-topic",
                   "--records", "2000", "--progress", "off", "--delete-topic",
                   "--client-config", str(config)])
    assert status == 0, capsys.readouterr()


def test_without_a_key_the_run_stops_with_the_brokers_reason(secured):
    bootstrap, _ = secured
    with pytest.raises(LoadgenError, match="requires CurveZMQ|refused"):
        run(LoadConfig(workload="produce", bootstrap=bootstrap, topic="secured-nokey", create_topic=True,
                       records=100, progress="off"))


def test_a_key_file_that_cannot_be_read_is_a_usage_error(secured, tmp_path, capsys):
    bootstrap, keydir = secured
    with pytest.raises(SystemExit) as exited:
        main(["produce", "--bootstrap", bootstrap, "--records", "10", "--key-file", str(tmp_path / "none"),
              "--server-key-file", str(keydir / "broker.key")])
    assert exited.value.code == 2
    assert "none" in capsys.readouterr().err

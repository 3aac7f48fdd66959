"""Where a client's CurveZMQ keys come from: resolve_client_security's precedence and its errors."""

from __future__ import annotations

import pytest
import zmq

from hpbroker.broker.config import BrokerConfig
from hpbroker.errors import InvalidConfigError
from hpbroker.security.client import ClientSecurity, resolve_client_security
from hpbroker.security.keys import generate_key_pair


@pytest.fixture
def keydir(tmp_path):
    for name in ("broker", "alice", "bob", "carol"):
        generate_key_pair(tmp_path, name)
    return tmp_path


def env(keydir, name):
    return {"HPBROKER_CLIENT_KEY_FILE": str(keydir / f"{name}.key_secret"),
            "HPBROKER_CLIENT_SERVER_KEY_FILE": str(keydir / "broker.key")}


def config(path, key_file, server_key_file="broker.key"):
    path.write_text(f'[security]\nkey_file = "{key_file}"\nserver_key_file = "{server_key_file}"\n')
    return str(path)


def test_from_files_reads_the_pair_and_the_server_key(keydir):
    security = ClientSecurity.from_files(keydir / "alice.key_secret", keydir / "broker.key")
    assert security.name == "alice" and zmq.curve_public(security.secret_key) == security.public_key
    assert security.server_key == (keydir / "broker.key").read_text().split('"')[1].encode()
    assert "secret_key" not in repr(security)  # never printed in a log line


def test_nothing_anywhere_is_no_security(keydir):
    assert resolve_client_security(environ={}) is None


def test_precedence_object_then_arguments_then_environment_then_config_file(keydir):
    given = ClientSecurity.from_files(keydir / "carol.key_secret", keydir / "broker.key")
    environ = {**env(keydir, "bob"), "HPBROKER_CLIENT_CONFIG": config(keydir / "c.toml", "carol.key_secret")}
    arguments = {"key_file": str(keydir / "alice.key_secret"), "server_key_file": str(keydir / "broker.key")}
    assert resolve_client_security(given, **arguments, environ=environ) is given
    assert resolve_client_security(**arguments, environ=environ).name == "alice"
    assert resolve_client_security(environ=environ).name == "bob"
    del environ["HPBROKER_CLIENT_KEY_FILE"], environ["HPBROKER_CLIENT_SERVER_KEY_FILE"]
    assert resolve_client_security(environ=environ).name == "carol"
    # the config_file argument beats the environment's config file
    assert resolve_client_security(config_file=config(keydir / "d.toml", "alice.key_secret"),
                                   environ=environ).name == "alice"


def test_config_file_paths_are_relative_to_the_file(keydir, tmp_path):
    (tmp_path / "etc").mkdir()
    path = config(tmp_path / "etc" / "client.toml", "../alice.key_secret", str(keydir / "broker.key"))
    assert resolve_client_security(config_file=path, environ={}).name == "alice"


def test_config_file_without_security_section_is_no_security(tmp_path):
    (tmp_path / "c.toml").write_text("# nothing here\n")
    assert resolve_client_security(config_file=str(tmp_path / "c.toml"), environ={}) is None


@pytest.mark.parametrize("arguments, error", [
    ({"key_file": "x.key_secret"}, "given without the --server-key-file"),
    ({"server_key_file": "broker.key"}, "given without the --key-file"),
])
def test_half_a_pair_of_arguments_says_which_is_missing(keydir, arguments, error):
    with pytest.raises(InvalidConfigError, match=error):
        resolve_client_security(**arguments, environ=env(keydir, "bob"))  # no fall-through


def test_half_a_pair_in_the_environment_says_which_is_missing(keydir):
    with pytest.raises(InvalidConfigError,
                       match=r"\$HPBROKER_CLIENT_KEY_FILE is given without \$HPBROKER_CLIENT_SERVER"):
        resolve_client_security(environ={"HPBROKER_CLIENT_KEY_FILE": str(keydir / "alice.key_secret")})


def test_a_brokers_settings_in_the_environment_are_not_client_settings(keydir):
    """The broker's own server_key_file ($HPBROKER_SERVER_KEY_FILE, its secret key) is no client
    variable: a tool run in the broker's environment falls through to the client config file, or
    no security; and the client's variables are no broker settings."""
    broker_env = {"HPBROKER_SERVER_KEY_FILE": str(keydir / "broker.key_secret"), "HPBROKER_SECURITY": "curve"}
    assert resolve_client_security(environ=broker_env) is None
    path = config(keydir / "c.toml", "alice.key_secret")
    assert resolve_client_security(environ={**broker_env, "HPBROKER_CLIENT_CONFIG": path}).name == "alice"
    client_env = {**env(keydir, "alice"), "HPBROKER_CLIENT_CONFIG": path}
    assert BrokerConfig.load(environ=client_env) == BrokerConfig()


@pytest.mark.parametrize("text, error", [
    ('[security]\nkey_file = "alice.key_secret"\n', "key_file is given without .*server_key_file"),
    ("[security\n", "not valid TOML"),
    ('[security]\nkey = "x"\n', "unknown \\[security\\] setting"),
    ('security = 3\n', "must be a table"),
    ('[security]\nkey_file = 3\nserver_key_file = "broker.key"\n', "key_file must be a path"),
])
def test_bad_config_files_are_named_in_the_error(keydir, text, error):
    path = keydir / "c.toml"
    path.write_text(text)
    with pytest.raises(InvalidConfigError, match=error) as raised:
        resolve_client_security(config_file=str(path), environ={})
    assert str(path) in raised.value.message


def test_missing_config_file_from_the_environment(tmp_path):
    with pytest.raises(InvalidConfigError, match="does not exist"):
        resolve_client_security(environ={"HPBROKER_CLIENT_CONFIG": str(tmp_path / "nope.toml")})


def test_public_and_secret_files_swapped_are_each_named(keydir):
    with pytest.raises(InvalidConfigError, match="alice.key holds only a public key"):
        ClientSecurity.from_files(keydir / "alice.key", keydir / "broker.key")
    with pytest.raises(InvalidConfigError, match="broker.key_secret holds a secret key"):
        ClientSecurity.from_files(keydir / "alice.key_secret", keydir / "broker.key_secret")
    with pytest.raises(InvalidConfigError, match="does not exist"):
        ClientSecurity.from_files(keydir / "alice.key_secret", keydir / "nobody.key")

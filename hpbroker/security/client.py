"""A client's CurveZMQ identity: its key pair and the broker's public key (:class:`ClientSecurity`).

A broker with ``security = "curve"`` is a CURVE server: a client connects as a CURVE client that
knows the server's public key beforehand (so nobody else can pose as the broker) and proves its
own key, which the broker admits only when it is on the broker's allowlist.  The key's name (the
file's, ``alice`` for ``alice.key_secret``) is the client's principal.

Where a client's keys come from (:func:`resolve_client_security`), first found wins:

1. a :class:`ClientSecurity` given to the client (``security=``);
2. ``key_file`` and ``server_key_file`` arguments (the CLI's ``--key-file``/``--server-key-file``);
3. the environment: ``HPBROKER_CLIENT_KEY_FILE`` and ``HPBROKER_CLIENT_SERVER_KEY_FILE``;
4. a client config file: ``config_file`` (``--client-config``) or ``$HPBROKER_CLIENT_CONFIG``,
   TOML with ``[security] key_file = "...", server_key_file = "..."`` (relative paths are
   relative to the file);
5. none: the client connects without security (a broker with security refuses it).

Each level gives both files or neither: one without the other is an InvalidConfigError saying
which is missing, not a silent fall-through to the next level.  The variables start with
``HPBROKER_CLIENT_``, which the broker's own settings (``HPBROKER_<SETTING>``, among them its
``server_key_file``) never do, so a broker and a client may share an environment.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import zmq

from hpbroker.errors import InvalidConfigError
from hpbroker.security.keys import SECRET_SUFFIX, load_key_pair, read_key_file

__all__ = ["CLIENT_CONFIG_VARIABLE", "KEY_FILE_VARIABLE", "SERVER_KEY_FILE_VARIABLE", "ClientSecurity",
           "resolve_client_security"]

KEY_FILE_VARIABLE = "HPBROKER_CLIENT_KEY_FILE"
SERVER_KEY_FILE_VARIABLE = "HPBROKER_CLIENT_SERVER_KEY_FILE"
CLIENT_CONFIG_VARIABLE = "HPBROKER_CLIENT_CONFIG"


@dataclass(frozen=True, slots=True)
class ClientSecurity:
    """The client's principal and key pair, and the broker's public key (all keys z85, 40 bytes)."""

    name: str
    public_key: bytes
    secret_key: bytes = field(repr=False)
    server_key: bytes

    def apply(self, sock: zmq.Socket) -> None:
        """Make ``sock`` a CURVE client of the broker; call before it connects."""
        sock.setsockopt(zmq.CURVE_SERVERKEY, self.server_key)
        sock.setsockopt(zmq.CURVE_PUBLICKEY, self.public_key)
        sock.setsockopt(zmq.CURVE_SECRETKEY, self.secret_key)

    @classmethod
    def from_files(cls, key_file: str | os.PathLike[str],
                   server_key_file: str | os.PathLike[str]) -> ClientSecurity:
        """The client's secret key file (``NAME.key_secret``) and the broker's public key file;
        InvalidConfigError naming the file at fault, including each given in the other's place."""
        pair = load_key_pair(key_file)
        server_key, server_secret = read_key_file(server_key_file)
        if server_secret is not None:
            raise InvalidConfigError(
                f"server key file {server_key_file} holds a secret key: a client needs only the broker's "
                f"public key file (NAME.key, not NAME{SECRET_SUFFIX}: the broker's secret stays with it)")
        assert pair.secret_key is not None
        return cls(pair.name, pair.public_key, pair.secret_key, server_key)


def resolve_client_security(security: ClientSecurity | None = None, *, key_file: str | None = None,
                            server_key_file: str | None = None, config_file: str | None = None,
                            environ: Mapping[str, str] | None = None) -> ClientSecurity | None:
    """The client's security, from the first place that gives it (module docstring), or None."""
    if security is not None:
        return security
    environ = os.environ if environ is None else environ
    pair = _pair(key_file, server_key_file, "the --key-file / key_file argument",
                 "the --server-key-file / server_key_file argument")
    env_key_file = environ.get(KEY_FILE_VARIABLE) or None
    if pair is None:
        pair = _pair(env_key_file, environ.get(SERVER_KEY_FILE_VARIABLE) or None,
                     f"${KEY_FILE_VARIABLE}", f"${SERVER_KEY_FILE_VARIABLE}")
    if pair is None:
        config_file = config_file or environ.get(CLIENT_CONFIG_VARIABLE) or None
        if config_file is not None:
            pair = _from_config_file(Path(config_file))
    return None if pair is None else ClientSecurity.from_files(*pair)


def _pair(key_file: str | None, server_key_file: str | None, key_source: str,
          server_source: str) -> tuple[str, str] | None:
    if key_file is None and server_key_file is None:
        return None
    if server_key_file is None:
        raise InvalidConfigError(f"{key_source} is given without {server_source}: a CurveZMQ client "
                                 f"needs the broker's public key file too")
    if key_file is None:
        raise InvalidConfigError(f"{server_source} is given without {key_source}: a CurveZMQ client "
                                 f"needs its own secret key file (NAME{SECRET_SUFFIX}) too")
    return os.fspath(key_file), os.fspath(server_key_file)


def _from_config_file(path: Path) -> tuple[str, str] | None:
    """``[security] key_file, server_key_file`` of a client config file (both or neither)."""
    try:
        with path.open("rb") as f:
            document = tomllib.load(f)
    except FileNotFoundError:
        raise InvalidConfigError(f"client config file {path} does not exist") from None
    except OSError as e:
        raise InvalidConfigError(f"client config file {path} cannot be read: {e.strerror}") from None
    except tomllib.TOMLDecodeError as e:
        raise InvalidConfigError(f"client config file {path} is not valid TOML: {e}") from None
    section = document.get("security", {})
    if not isinstance(section, dict):
        raise InvalidConfigError(f"client config file {path}: [security] must be a table")
    unknown = sorted(set(section) - {"key_file", "server_key_file"})
    if unknown:
        raise InvalidConfigError(f"client config file {path}: unknown [security] setting(s) "
                                 f"{', '.join(unknown)} (known: key_file, server_key_file)")
    values = {}
    for name in ("key_file", "server_key_file"):
        value = section.get(name)
        if value is not None and (not isinstance(value, str) or not value):
            raise InvalidConfigError(f"client config file {path}: [security] {name} must be a path string")
        values[name] = None if value is None else os.fspath(path.parent / value)  # an absolute one stays
    return _pair(values["key_file"], values["server_key_file"], f"{path}: [security] key_file",
                 f"{path}: [security] server_key_file")

"""CurveZMQ key files: generate a key pair, read one, list a directory of them, allowlist and revoke.

A key pair is two files, in the format pyzmq's ``zmq.auth`` reads and writes
(``zmq.auth.create_certificates`` / ``load_certificate``), so either tool can make them::

    NAME.key          the public key (mode 0644): given to brokers' allowlists and to clients
    NAME.key_secret   the public and the secret key (mode 0600): stays with its owner

Each is text: comment lines (``#``), a ``metadata`` section (``name = NAME``, ``created = ...``)
and a ``curve`` section with ``public-key = "<z85>"`` (and ``secret-key = "<z85>"`` in the secret
file).  A z85 key is 40 characters encoding 32 bytes.

The key's NAME is its owner's *principal*: a broker that admits the key names every request on
its connection by it (ACLs are written for it).  Names are ``[A-Za-z0-9._-]{1,100}``, not
starting with ``.``.

An *allowlist* is a directory of public key files (``NAME.key``) that a broker admits (reloaded on
SIGHUP); :func:`revoke_key` moves ``NAME.key`` into its ``revoked/`` subdirectory, which the broker
does not read.  Nothing here talks to a broker.

Errors are :class:`~hpbroker.errors.InvalidConfigError` naming the file and what is wrong with it.
"""

from __future__ import annotations

import datetime
import logging
import os
import re
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path

import zmq
from zmq.utils import z85

from hpbroker.errors import InvalidConfigError

__all__ = ["KEY_NAME", "PUBLIC_SUFFIX", "REVOKED_DIR", "SECRET_SUFFIX", "KeyInfo", "KeyPair", "allow_key",
           "check_key_name", "generate_key_pair", "key_name", "list_keys", "load_key_pair", "load_public_key",
           "read_key_file", "revoke_key"]

logger = logging.getLogger(__name__)

PUBLIC_SUFFIX = ".key"  # zmq.auth's public certificate
SECRET_SUFFIX = ".key_secret"  # zmq.auth's secret certificate
REVOKED_DIR = "revoked"  # under an allowlist: keys taken off it (the broker does not read it)
Z85_KEY_CHARS = 40  # a 32-byte CURVE key in z85
KEY_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,99}")  # a key's name: its principal
_Z85_ALPHABET = frozenset(b"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                          b".-:+=^!/*?&<>()[]{}@%$#")


@dataclass(frozen=True, slots=True)
class KeyPair:
    """A principal's keys: ``secret_key`` is None when only the public file was read."""

    name: str
    public_key: bytes  # z85, 40 bytes
    secret_key: bytes | None  # z85, 40 bytes
    path: Path  # the file read (or, for a generated pair, the secret file)


@dataclass(frozen=True, slots=True)
class KeyInfo:
    """One key of a directory, as :func:`list_keys` finds it."""

    name: str
    public_key: bytes
    has_secret: bool  # NAME.key_secret is there too
    path: Path  # NAME.key, or NAME.key_secret when there is no public file


def check_key_name(name: str) -> str:
    """``name`` if it may name a key (module docstring), else InvalidConfigError saying why."""
    if not isinstance(name, str) or not KEY_NAME.fullmatch(name):
        raise InvalidConfigError(
            f"bad key name {name!r}: expected 1 to 100 of A-Z a-z 0-9 . _ - , not starting with '.'")
    return name


def generate_key_pair(directory: str | os.PathLike[str], name: str) -> KeyPair:
    """Write a new key pair ``NAME.key`` and ``NAME.key_secret`` (mode 0600) into ``directory``
    (made if missing).  Refuses, changing nothing, when either file exists: a key is never
    overwritten (its owner may still use it)."""
    check_key_name(name)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    public_path, secret_path = directory / (name + PUBLIC_SUFFIX), directory / (name + SECRET_SUFFIX)
    for path in (public_path, secret_path):
        if path.exists():
            raise InvalidConfigError(f"{path} exists: a key is never overwritten (revoke it, or "
                                     f"choose another name)")
    public_key, secret_key = zmq.curve_keypair()
    created = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    _write_new(secret_path, _render(name, created, public_key, secret_key), 0o600)
    try:
        _write_new(public_path, _render(name, created, public_key, None), 0o644)
    except BaseException:
        secret_path.unlink(missing_ok=True)
        raise
    logger.info("generated key pair %s in %s", name, directory)
    return KeyPair(name, public_key, secret_key, secret_path)


def _render(name: str, created: str, public_key: bytes, secret_key: bytes | None) -> str:
    kind = "secret" if secret_key is not None else "public"
    lines = [f"#   ****  hpbroker CURVE {kind} key of {name!r} (ZeroMQ certificate format)  ****",
             "#   " + ("Keep it: never give it away, never put it on an allowlist." if secret_key is not None
                      else "Give it to the brokers' allowlists and to clients (the broker's key)."),
             "metadata", f"    name = {name}", f"    created = {created}",
             "curve", f'    public-key = "{public_key.decode()}"']
    if secret_key is not None:
        lines.append(f'    secret-key = "{secret_key.decode()}"')
    return "\n".join(lines) + "\n"


def _write_new(path: Path, text: str, mode: int) -> None:
    """Create ``path`` (never replacing one) with ``mode`` from the start, and ``text`` in it."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    except FileExistsError:
        raise InvalidConfigError(f"{path} exists: a key is never overwritten") from None
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    os.chmod(path, mode)  # whatever the umask took away


def read_key_file(path: str | os.PathLike[str]) -> tuple[bytes, bytes | None]:
    """``(public_key, secret_key or None)`` of a key file, each checked (40 z85 characters of a
    32-byte key); InvalidConfigError naming the file: missing, unreadable, not a key file, or a
    key of the wrong length.  A file holding a secret key that its group or others may access
    is logged as a WARNING naming it (it should be mode 0600)."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            data = f.read()
            mode = os.fstat(f.fileno()).st_mode
    except FileNotFoundError:
        raise InvalidConfigError(f"key file {path} does not exist") from None
    except IsADirectoryError:
        raise InvalidConfigError(f"key file {path} is a directory, not a key file") from None
    except OSError as e:
        raise InvalidConfigError(f"key file {path} cannot be read: {e.strerror}") from None
    found: dict[bytes, bytes] = {}
    for line in data.splitlines():
        line = line.strip()
        for field in (b"public-key", b"secret-key"):
            if line.startswith(field) and b"=" in line:
                found.setdefault(field, line.split(b"=", 1)[1].strip(b" \t'\""))
    if b"public-key" not in found:
        raise InvalidConfigError(f"{path} is not a CURVE key file (no public-key line; make keys with "
                                 f"'hpbroker keys generate NAME')")
    public = _check_key(path, "public", found[b"public-key"])
    if b"secret-key" not in found:
        return public, None
    secret = _check_key(path, "secret", found[b"secret-key"])
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        logger.warning("secret key file %s is readable by others (mode %o): chmod 600 it", path,
                       stat.S_IMODE(mode))
    return public, secret


def _check_key(path: Path, kind: str, key: bytes) -> bytes:
    if len(key) != Z85_KEY_CHARS or not _Z85_ALPHABET.issuperset(key):
        raise InvalidConfigError(f"{path}: the {kind} key is not {Z85_KEY_CHARS} z85 characters "
                                 f"(found {len(key)}): the file is damaged or not a CURVE key file")
    try:
        z85.decode(key)
    except (ValueError, KeyError, IndexError):
        raise InvalidConfigError(f"{path}: the {kind} key is not valid z85") from None
    return key


def key_name(path: str | os.PathLike[str]) -> str:
    """The principal a key file names: its file name less ``.key`` / ``.key_secret``."""
    name = Path(path).name
    for suffix in (SECRET_SUFFIX, PUBLIC_SUFFIX):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return Path(path).stem


def load_public_key(path: str | os.PathLike[str]) -> bytes:
    """The z85 public key of a key file (a public file, or a secret one, which holds it too)."""
    return read_key_file(path)[0]


def load_key_pair(secret_path: str | os.PathLike[str]) -> KeyPair:
    """The key pair of a secret key file (``NAME.key_secret``), named by its file; a public file
    given instead is an InvalidConfigError saying so."""
    public_key, secret_key = read_key_file(secret_path)
    if secret_key is None:
        raise InvalidConfigError(f"{secret_path} holds only a public key: a client needs its secret key "
                                 f"file (NAME{SECRET_SUFFIX}, from 'hpbroker keys generate NAME')")
    return KeyPair(key_name(secret_path), public_key, secret_key, Path(secret_path))


def list_keys(directory: str | os.PathLike[str]) -> list[KeyInfo]:
    """The keys in ``directory`` by name: ``NAME.key`` and ``NAME.key_secret`` files (a file that
    is not a valid key is logged and left out).  A missing directory is an InvalidConfigError."""
    directory = Path(directory)
    if not directory.is_dir():
        raise InvalidConfigError(f"key directory {directory} does not exist")
    files: dict[str, dict[str, tuple[Path, bytes]]] = {}  # name -> suffix -> (path, public key)
    for path in sorted(directory.iterdir()):
        suffix = next((s for s in (SECRET_SUFFIX, PUBLIC_SUFFIX) if path.name.endswith(s)), None)
        if suffix is None or not path.is_file():
            continue
        try:
            public_key = read_key_file(path)[0]
        except InvalidConfigError as e:
            logger.warning("skipping %s: %s", path, e.message)
            continue
        files.setdefault(key_name(path), {})[suffix] = (path, public_key)
    keys = []
    for name in sorted(files):
        path, public_key = files[name].get(PUBLIC_SUFFIX) or files[name][SECRET_SUFFIX]
        keys.append(KeyInfo(name, public_key, SECRET_SUFFIX in files[name], path))
    return keys


def allow_key(public_path: str | os.PathLike[str], allowlist_dir: str | os.PathLike[str],
              name: str | None = None) -> Path:
    """Copy a public key file into an allowlist (made if missing) as ``NAME.key``, ``NAME``
    being ``name`` or else the file's own name (the principal the key will have); the path
    written.  Refused: a file holding a secret key (secrets never go on an allowlist), a name
    the allowlist has with another key, a key the allowlist has under another name (one key has
    one principal: revoke the other name first); the same key already there under the same
    name is left as it is."""
    public_path = Path(public_path)
    public_key, secret_key = read_key_file(public_path)
    if secret_key is not None:
        raise InvalidConfigError(f"{public_path} holds a secret key: allowlist the public file "
                                 f"NAME{PUBLIC_SUFFIX} instead (a secret key must stay with its owner)")
    name = check_key_name(key_name(public_path) if name is None else name)
    directory = Path(allowlist_dir)
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / (name + PUBLIC_SUFFIX)
    if target.exists():
        if read_key_file(target)[0] == public_key:
            return target
        raise InvalidConfigError(f"{target} exists with another key: revoke {name!r} first "
                                 f"('hpbroker keys revoke {name} --allowlist {directory}')")
    for other in sorted(directory.glob("*" + PUBLIC_SUFFIX)):
        try:
            same = other.is_file() and read_key_file(other)[0] == public_key
        except InvalidConfigError:
            continue  # not a key: the broker skips it too
        if same:
            other_name = other.name[:-len(PUBLIC_SUFFIX)]
            raise InvalidConfigError(f"the key in {public_path} is already on the allowlist as "
                                     f"{other_name!r} ({other}): one key has one principal; revoke "
                                     f"{other_name!r} first ('hpbroker keys revoke {other_name} "
                                     f"--allowlist {directory}') to allow it as {name!r}")
    shutil.copyfile(public_path, target)
    os.chmod(target, 0o644)
    logger.info("allowlisted key %s in %s", name, directory)
    return target


def revoke_key(allowlist_dir: str | os.PathLike[str], name: str) -> Path:
    """Take ``name`` off an allowlist: ``NAME.key`` moves to ``<allowlist_dir>/revoked/`` (a
    name revoked before gets a timestamp added); the path it moved to.  The broker refuses the
    key's next connection once it has re-read the directory (SIGHUP), and answers its requests
    on connections still open with error 27."""
    check_key_name(name)
    directory = Path(allowlist_dir)
    source = directory / (name + PUBLIC_SUFFIX)
    if not source.is_file():
        raise InvalidConfigError(f"no key {name!r} on the allowlist {directory} ({source} does not exist)")
    revoked = directory / REVOKED_DIR
    revoked.mkdir(exist_ok=True)
    target = revoked / source.name
    if target.exists():
        stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%S%fZ")
        target = revoked / f"{name}.{stamp}{PUBLIC_SUFFIX}"
    os.replace(source, target)
    logger.info("revoked key %s: moved to %s", name, target)
    return target

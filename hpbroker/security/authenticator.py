"""The front-end's ZAP handler: it admits the CurveZMQ public keys on the allowlist, and names
each connection's principal.

**The allowlist** is a directory of public key files, ``NAME.key`` as ``zmq.auth`` writes them
(``public-key = "<40 z85 characters>"``; the KEYS tooling's ``hpbroker keys``).  Only files
directly in it count (``revoked/`` beside them does not).  ``NAME`` is the key's *principal*:
every message the front-end ROUTER receives on a connection made with that key carries the
ZeroMQ metadata property ``User-Id`` = ``NAME#FINGERPRINT``, the fingerprint being the first 16
z85 characters of the public key (``hpbroker.security.principal``): the broker tells a
connection of a key from one of the key that replaced it under the same name.  One public key
under two names is refused: at start (a strict read) the broker does not start, naming both
files; on a reload the name first in sorted order keeps the key and the later file is skipped
with an ERROR naming both.

**The handler** is pyzmq's ``ThreadAuthenticator``: a thread with a REP socket bound to
``inproc://zeromq.zap.01`` in the broker's ZeroMQ context, answering libzmq's ZAP requests (RFC
27).  :meth:`AllowlistAuthenticator.start` reads the directory first (a missing or unreadable
directory, or a bad key file in it, is an InvalidConfigError naming the path), then binds and
starts the thread, and returns once the thread answers: a socket configured with
``ZAP_DOMAIN`` after that never meets a moment without its handler.  Only the CURVE mechanism
in the domain :data:`ZAP_DOMAIN` is admitted; everything else (NULL, PLAIN, another domain, a
malformed request) gets status 400.

**Reload** (:meth:`AllowlistAuthenticator.reload`, on SIGHUP): the directory is read again; a bad
file is logged and skipped and the others apply; a directory that cannot be read keeps the set
it had (ERROR).  The new set replaces the old one in one assignment, which the handler's thread
reads once per request: a request is judged against one set, old or new, never a mixture.  A
key removed (or replaced under its name) is refused on its next connection; connections already
made stay, and the front-end answers their requests 27 once their (name, fingerprint) is no
longer on the list (``hpbroker.security.broker``).

**Threads.**  :meth:`start`, :meth:`reload`, :meth:`stop` are the owner's (the arbiter's loop);
the handler's thread only reads :attr:`_user_ids`.  :meth:`alive` tells whether the handler's thread
still runs: when it has died, no new connection can complete its handshake, and the broker
halts (``BrokerSecurity.check_alive``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Mapping

import zmq
from zmq.auth.thread import ThreadAuthenticator
from zmq.utils import z85

from hpbroker.errors import InvalidConfigError
from hpbroker.security.keys import PUBLIC_SUFFIX, check_key_name, load_public_key
from hpbroker.security.principal import fingerprint, user_id

__all__ = ["ZAP_DOMAIN", "AllowlistAuthenticator", "read_allowlist"]

logger = logging.getLogger(__name__)

ZAP_DOMAIN = "hpbroker"  # the front-end's ZAP domain (ZAP_DOMAIN socket option)
_ZAP_VERSION = b"1.0"
_STOP_TIMEOUT_S = 5.0  # how long stop() waits for the handler's thread
_REFUSAL_LOG_INTERVAL_S = 10.0  # one WARNING per this long while connections are refused


def read_allowlist(directory: str, *, strict: bool,
                   current: Mapping[bytes, str] | None = None) -> dict[bytes, str]:
    """The allowlist in ``directory``: z85 public key -> principal name.  ``strict``: a bad key
    file, or a key under two names, is an InvalidConfigError; otherwise a bad file is logged
    (WARNING) and skipped, and of a key's two names the one it has in ``current`` (the
    allowlist in force), or else the first in sorted order, keeps it while the other file is
    skipped with an ERROR: a name added later never takes over a key's connections.  A
    directory that cannot be listed is always an InvalidConfigError."""
    try:
        entries = sorted(os.listdir(directory))
    except OSError as e:
        raise InvalidConfigError(f"cannot read the allowlist directory {directory}: "
                                 f"{e.strerror or e}") from None
    keys: dict[bytes, str] = {}
    for entry in entries:
        if not entry.endswith(PUBLIC_SUFFIX):
            continue
        path = os.path.join(directory, entry)
        name = entry[:-len(PUBLIC_SUFFIX)]
        try:
            if not os.path.isfile(path):
                continue
            try:
                check_key_name(name)
            except InvalidConfigError as e:
                raise InvalidConfigError(f"key file {path}: {e.message}") from None
            key = load_public_key(path)
        except InvalidConfigError as e:
            if strict:
                raise
            logger.warning("[security] allowlist: skipped %s: %s", path, e.message)
            continue
        if key in keys:
            first = os.path.join(directory, keys[key] + PUBLIC_SUFFIX)
            if strict:
                raise InvalidConfigError(f"allowlist: {path} and {first} hold the same public key: one key "
                                         f"has one principal; remove one of them")
            kept, skipped = keys[key], name
            if current is not None and current.get(key) == name:
                kept, skipped = name, keys[key]
            logger.error("[security] allowlist: skipped %s: it holds the same public key as %s (one key has "
                         "one principal); the key stays %r", os.path.join(directory, skipped + PUBLIC_SUFFIX),
                         os.path.join(directory, kept + PUBLIC_SUFFIX), kept)
            keys[key] = kept
            continue
        keys[key] = name
    return keys


class AllowlistAuthenticator(ThreadAuthenticator):
    """pyzmq's ZAP handler thread, admitting the keys in ``allowlist_dir`` (module docstring)."""

    def __init__(self, context: zmq.Context, allowlist_dir: str) -> None:
        super().__init__(context=context, log=logging.getLogger(__name__ + ".zap"))
        self.allowlist_dir = allowlist_dir
        self._keys: Mapping[bytes, str] = {}  # z85 public key -> name; replaced whole, never mutated
        self._user_ids: Mapping[bytes, bytes] = {}  # z85 public key -> User-Id; replaced with _keys
        self._refusals = 0  # refused since the last refusal logged (the handler's thread's)
        self._refusal_logged_at = -float("inf")

    def start(self) -> None:
        """Read the allowlist (InvalidConfigError when it cannot be), then bind the ZAP endpoint
        and start the handler's thread; returns once the thread serves."""
        self._set(read_allowlist(self.allowlist_dir, strict=True))
        try:
            super().start()
        except (zmq.ZMQError, RuntimeError) as e:
            self.stop()
            raise InvalidConfigError(f"cannot start the ZAP authenticator: {e}") from None
        logger.info("[security] allowlist %s: %d keys (%s)", self.allowlist_dir, len(self._keys),
                    ", ".join(sorted(self._keys.values())) or "none")

    def reload(self) -> tuple[frozenset[str], frozenset[str]]:
        """Read the allowlist again (module docstring): the names (added, removed); a name whose
        public key changed counts in both."""
        try:
            keys = read_allowlist(self.allowlist_dir, strict=False, current=self._keys)
        except InvalidConfigError as e:
            logger.error("[security] allowlist not reloaded, the %d keys loaded before stay: %s",
                         len(self._keys), e.message)
            return frozenset(), frozenset()
        before = {(name, key) for key, name in self._keys.items()}
        after = {(name, key) for key, name in keys.items()}
        self._set(keys)
        added = frozenset(name for name, _ in after - before)
        removed = frozenset(name for name, _ in before - after)
        return added, removed

    def stop(self) -> bool:
        """Stop the handler's thread and close its sockets; before the ZeroMQ context ends.  A
        thread that has died already is not asked (its end of the pipe is gone: a send would
        block for ever).  False when the thread did not stop within :data:`_STOP_TIMEOUT_S`:
        its sockets stay open (they are its own while it runs), so ``context.term()`` would
        wait for ever -- the owner ends the context with ``context.destroy(linger=0)`` instead."""
        if self.pipe is not None:
            thread = self.thread
            if thread is not None and thread.is_alive():
                with contextlib.suppress(zmq.ZMQError):
                    self.pipe.send(b"TERMINATE", zmq.NOBLOCK)
                thread.join(_STOP_TIMEOUT_S)
                if thread.is_alive():
                    logger.error("[security] the ZAP handler's thread did not stop within %g s; its "
                                 "sockets are closed with the context", _STOP_TIMEOUT_S)
                    return False
            self.pipe.close(linger=0)
            self.pipe = None  # type: ignore[assignment]
            self.thread = None  # type: ignore[assignment]
        if self.zap_socket is not None:
            self.zap_socket.close(linger=0)
            self.zap_socket = None  # type: ignore[assignment]
        return True

    def _set(self, keys: Mapping[bytes, str]) -> None:
        """Put ``keys`` in force: one assignment the handler's thread reads (module docstring)."""
        self._keys = {key: name for key, name in keys.items()}
        self._user_ids = {key: user_id(name, key).encode() for key, name in keys.items()}

    def principals(self) -> frozenset[str]:
        """The names on the allowlist now."""
        return frozenset(self._keys.values())

    def fingerprints(self) -> dict[str, str]:
        """The allowlist now: name -> its key's fingerprint (``hpbroker.security.principal``)."""
        return {name: fingerprint(key) for key, name in self._keys.items()}

    def alive(self) -> bool:
        """Whether the handler's thread runs."""
        return self.is_alive()

    async def handle_zap_message(self, msg: list[bytes]) -> None:
        """Answer one ZAP request (RFC 27): 200 with ``NAME#FINGERPRINT`` as User-Id for a CURVE key on
        the allowlist in our domain, 400 for anything else.  Never raises: the thread must live."""
        if len(msg) < 2:
            logger.error("[security] ZAP request of %d frames dropped: cannot be answered", len(msg))
            return
        request_id = msg[1]
        try:
            status, text, user_id = self._judge(msg)
        except Exception:  # the handler's thread must outlive a request it cannot judge
            logger.exception("[security] ZAP request failed")
            status, text, user_id = b"500", b"internal error", b""
        try:
            self.zap_socket.send_multipart([_ZAP_VERSION, request_id, status, text, user_id, b""])
        except zmq.ZMQError as e:
            logger.error("[security] cannot answer a ZAP request: %s", e)

    def _judge(self, msg: list[bytes]) -> tuple[bytes, bytes, bytes]:
        if len(msg) < 6 or msg[0] != _ZAP_VERSION:
            return b"400", b"malformed ZAP request", b""
        domain, address, mechanism, credentials = msg[2], msg[3], msg[5], msg[6:]
        who = address.decode("utf-8", "replace")
        if mechanism != b"CURVE" or len(credentials) != 1 or len(credentials[0]) != 32:
            self._refused(f"a {mechanism.decode('ascii', 'replace')} connection from {who}: only CURVE is "
                          "accepted")
            return b"400", b"CURVE required", b""
        if domain.decode("utf-8", "replace") != ZAP_DOMAIN:
            return b"400", b"unknown domain", b""
        key = z85.encode(credentials[0])
        uid = self._user_ids.get(key)  # one read: the set in force for this request
        if uid is None:
            self._refused(f"key {key.decode('ascii')} from {who}: not on the allowlist")
            return b"400", b"unknown key", b""
        logger.debug("[security] admitted %r from %s", uid, who)
        return b"200", b"OK", uid

    def _refused(self, what: str) -> None:
        """Log a refusal: the first at once, then at most one line per
        :data:`_REFUSAL_LOG_INTERVAL_S` with the count (a client retrying cannot flood the log)."""
        self._refusals += 1
        now = time.monotonic()
        if now - self._refusal_logged_at >= _REFUSAL_LOG_INTERVAL_S:
            logger.warning("[security] refused %s (%d connections refused since the last such line)", what,
                           self._refusals)
            self._refusals, self._refusal_logged_at = 0, now

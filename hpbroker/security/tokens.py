"""Fetch tokens: what a data-port connection presents to say who it acts for (pure, no I/O).

A broker with ``security = "curve"`` authenticates a client on its front-end (CurveZMQ); the TCP
data ports, where fetches are sent with ``sendfile``, have no such handshake.  So the front-end
issues a short-lived *fetch token* (``FetchTokenRequest``) bound to the principal it
authenticated, and the data port accepts a connection only after an ``AuthenticateRequest``
carrying a token it can verify (``hpbroker.security.data_port``).  Every broker of a cluster
shares the HMAC key (``token_key``), so a token issued by one is accepted by all.

Layout (all integers little-endian), then base64url without padding (printable ASCII)::

    version          u8      1 (TOKEN_VERSION)
    expires_at_ms    i64     ms since the epoch after which the token is refused
    principal_len    u16     bytes of the principal
    principal        principal_len bytes of UTF-8: the key name the token acts for
    hmac             u8[32]  HMAC-SHA256(token_key, every preceding byte)

A token grants nothing by itself: each fetch made with it is checked against the ACLs for its
principal.  Anyone holding it can use it until it expires (a bearer token), which is why it is
short-lived and travels only on the encrypted front-end and to the data port of the same
cluster.  :func:`verify` compares the HMAC in constant time and tells apart a malformed token, a
forged one (wrong HMAC: another key, or altered bytes) and an expired one, each an
:class:`~hpbroker.errors.AuthenticationError` whose message says which.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import struct

from hpbroker.errors import AuthenticationError, InvalidConfigError

__all__ = ["MAX_PRINCIPAL_BYTES", "TOKEN_KEY_BYTES", "TOKEN_VERSION", "mint", "verify"]

TOKEN_VERSION = 1  # the layout above
TOKEN_KEY_BYTES = 32  # the HMAC key's size
MAX_PRINCIPAL_BYTES = 1000  # key names are at most 100 characters; room for UTF-8
_HEAD = struct.Struct("<BqH")  # version, expires_at_ms, principal_len
_MAC_BYTES = hashlib.sha256().digest_size  # 32
# The longest token text a data port decodes: anything longer is malformed before any work.
_MAX_TOKEN_CHARS = 4 * (_HEAD.size + MAX_PRINCIPAL_BYTES + _MAC_BYTES) // 3 + 4


def _mac(key: bytes, data: bytes) -> bytes:
    return hmac.new(key, data, hashlib.sha256).digest()


def _check_key(key: bytes) -> None:
    if not isinstance(key, bytes) or len(key) < 16:
        raise InvalidConfigError(f"a fetch token key must be at least 16 bytes, got "
                                 f"{len(key) if isinstance(key, bytes) else type(key).__name__}")


def mint(key: bytes, principal: str, lifetime_ms: int, now_ms: int) -> tuple[str, int]:
    """A token for ``principal`` valid until ``now_ms + lifetime_ms``: ``(token, expires_at_ms)``.
    InvalidConfigError for a key shorter than 16 bytes, an empty or too long principal, or a
    lifetime that is not positive."""
    _check_key(key)
    encoded = principal.encode()
    if not encoded or len(encoded) > MAX_PRINCIPAL_BYTES:
        raise InvalidConfigError(f"a fetch token's principal must be 1 to {MAX_PRINCIPAL_BYTES} bytes of "
                                 f"UTF-8, got {len(encoded)}")
    if lifetime_ms <= 0:
        raise InvalidConfigError(f"a fetch token's lifetime must be positive, got {lifetime_ms} ms")
    expires_at_ms = now_ms + lifetime_ms
    body = _HEAD.pack(TOKEN_VERSION, expires_at_ms, len(encoded)) + encoded
    raw = body + _mac(key, body)
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii"), expires_at_ms


def verify(key: bytes, token: str, now_ms: int) -> tuple[str, int]:
    """The ``(principal, expires_at_ms)`` of a token minted with ``key`` that has not expired at
    ``now_ms``.  AuthenticationError otherwise, saying why: empty, malformed (not base64url,
    truncated, extra bytes), an unknown version, forged (the HMAC does not match: another key or
    altered bytes), or expired (and since when).  The HMAC is checked before the expiry, so an
    expired token is told apart from a forged one only when it is genuine."""
    _check_key(key)
    if not token:
        raise AuthenticationError("no fetch token was presented")
    if len(token) > _MAX_TOKEN_CHARS:
        raise AuthenticationError(f"malformed fetch token: {len(token)} characters, at most "
                                  f"{_MAX_TOKEN_CHARS} expected")
    try:
        raw = base64.b64decode(token + "=" * (-len(token) % 4), altchars=b"-_", validate=True)
    except (binascii.Error, ValueError) as e:
        raise AuthenticationError(f"malformed fetch token: not base64url ({e})") from None
    if len(raw) < _HEAD.size + _MAC_BYTES:
        raise AuthenticationError(f"malformed fetch token: {len(raw)} bytes, at least "
                                  f"{_HEAD.size + _MAC_BYTES} expected (truncated?)")
    version, expires_at_ms, principal_len = _HEAD.unpack_from(raw)
    if version != TOKEN_VERSION:
        raise AuthenticationError(f"fetch token version {version} is not served (this broker reads "
                                  f"version {TOKEN_VERSION})")
    expected = _HEAD.size + principal_len + _MAC_BYTES
    if len(raw) != expected:
        raise AuthenticationError(f"malformed fetch token: {len(raw)} bytes where its principal length "
                                  f"{principal_len} makes {expected} (truncated or extended?)")
    body, mac = raw[:-_MAC_BYTES], raw[-_MAC_BYTES:]
    if not hmac.compare_digest(mac, _mac(key, body)):
        raise AuthenticationError("forged fetch token: its HMAC does not match (issued with another "
                                  "cluster's key, or altered)")
    try:
        principal = body[_HEAD.size:].decode()
    except UnicodeDecodeError:  # genuine, so never seen: the minter encodes UTF-8
        raise AuthenticationError("malformed fetch token: its principal is not UTF-8") from None
    if now_ms >= expires_at_ms:
        raise AuthenticationError(f"expired fetch token of principal {principal!r}: it expired at "
                                  f"{expires_at_ms} ms, {now_ms - expires_at_ms} ms ago; get a new one "
                                  f"with FetchTokenRequest")
    return principal, expires_at_ms

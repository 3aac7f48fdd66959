"""Fetch tokens: what a data-port connection presents to say who it acts for (pure, no I/O).

A broker with ``security = "curve"`` authenticates a client on its front-end (CurveZMQ); the TCP
data ports, where fetches are sent with ``sendfile``, have no such handshake.  So the front-end
issues a short-lived *fetch token* (``FetchTokenRequest``) bound to the principal it
authenticated, and the data port accepts a connection only after an ``AuthenticateRequest``
carrying a token it can verify (``hpbroker.security.data_port``).  Every broker of a cluster
shares the HMAC key (``token_key``), so a token issued by one is accepted by all.

Layout (all integers little-endian), then base64url without padding (printable ASCII)::

    version          u8      2 (TOKEN_VERSION)
    expires_at_ms    i64     ms since the epoch after which the token is refused
    principal_len    u16     bytes of the principal
    principal        principal_len bytes of UTF-8: the key name the token acts for
    fingerprint_len  u8      bytes of the fingerprint (0 to 16)
    fingerprint      fingerprint_len bytes of ASCII: the first 16 z85 characters of the public
                     key the connection that asked for the token authenticated with
    hmac             u8[32]  HMAC-SHA256(token_key, every preceding byte)

A token grants nothing by itself: each fetch made with it is checked against the ACLs for its
principal.  The fingerprint ties it to one key of that name (``hpbroker.security.principal``):
once the name's key is replaced on the allowlist (a rotation), the data ports refuse tokens
minted for the old key, as the front-end refuses the old key's connections.  Anyone holding a
token can use it until it expires (a bearer token), which is why it is short-lived and travels
only on the encrypted front-end and to the data port of the same cluster.  :func:`verify`
compares the HMAC in constant time and tells apart a malformed token, a forged one (wrong HMAC:
another key, or altered bytes) and an expired one, each an
:class:`~hpbroker.errors.AuthenticationError` whose message says which.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import struct

from hpbroker.errors import AuthenticationError, InvalidConfigError
from hpbroker.security.principal import FINGERPRINT_CHARS, Principal

__all__ = ["MAX_FINGERPRINT_BYTES", "MAX_PRINCIPAL_BYTES", "TOKEN_KEY_BYTES", "TOKEN_VERSION", "mint",
           "verify"]

TOKEN_VERSION = 2  # the layout above (1: without the fingerprint, no longer served)
TOKEN_KEY_BYTES = 32  # the HMAC key's size
MAX_PRINCIPAL_BYTES = 1000  # key names are at most 100 characters; room for UTF-8
MAX_FINGERPRINT_BYTES = FINGERPRINT_CHARS
_HEAD = struct.Struct("<BqH")  # version, expires_at_ms, principal_len
_FP_LEN = struct.Struct("<B")  # fingerprint_len
_MAC_BYTES = hashlib.sha256().digest_size  # 32
# The longest token text a data port decodes: anything longer is malformed before any work.
_MAX_TOKEN_CHARS = 4 * (_HEAD.size + MAX_PRINCIPAL_BYTES + _FP_LEN.size + MAX_FINGERPRINT_BYTES
                        + _MAC_BYTES) // 3 + 4


def _mac(key: bytes, data: bytes) -> bytes:
    return hmac.new(key, data, hashlib.sha256).digest()


def _check_key(key: bytes) -> None:
    if not isinstance(key, bytes) or len(key) < 16:
        raise InvalidConfigError(f"a fetch token key must be at least 16 bytes, got "
                                 f"{len(key) if isinstance(key, bytes) else type(key).__name__}")


def mint(key: bytes, principal: str, lifetime_ms: int, now_ms: int, fingerprint: str | None = None,
         ) -> tuple[str, int]:
    """A token for ``principal`` valid until ``now_ms + lifetime_ms``: ``(token, expires_at_ms)``.
    ``fingerprint``: of the principal's key; by default ``principal.fingerprint`` when it is a
    :class:`~hpbroker.security.principal.Principal`, else empty (such a token is refused by a
    data port that knows the keys' fingerprints).  InvalidConfigError for a key shorter than 16
    bytes, an empty or too long principal or fingerprint, or a lifetime that is not positive."""
    _check_key(key)
    encoded = principal.encode()
    if not encoded or len(encoded) > MAX_PRINCIPAL_BYTES:
        raise InvalidConfigError(f"a fetch token's principal must be 1 to {MAX_PRINCIPAL_BYTES} bytes of "
                                 f"UTF-8, got {len(encoded)}")
    if fingerprint is None:
        fingerprint = getattr(principal, "fingerprint", "")
    try:
        fp = fingerprint.encode("ascii")
    except UnicodeEncodeError:
        raise InvalidConfigError(f"a fetch token's key fingerprint must be ASCII, got "
                                 f"{fingerprint!r}") from None
    if len(fp) > MAX_FINGERPRINT_BYTES:
        raise InvalidConfigError(f"a fetch token's key fingerprint must be at most {MAX_FINGERPRINT_BYTES} "
                                 f"characters, got {len(fp)}")
    if lifetime_ms <= 0:
        raise InvalidConfigError(f"a fetch token's lifetime must be positive, got {lifetime_ms} ms")
    expires_at_ms = now_ms + lifetime_ms
    body = _HEAD.pack(TOKEN_VERSION, expires_at_ms, len(encoded)) + encoded + _FP_LEN.pack(len(fp)) + fp
    raw = body + _mac(key, body)
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii"), expires_at_ms


def verify(key: bytes, token: str, now_ms: int) -> tuple[Principal, int]:
    """The ``(principal, expires_at_ms)`` of a token minted with ``key`` that has not expired at
    ``now_ms`` (the principal a :class:`~hpbroker.security.principal.Principal`: the name,
    with the key's fingerprint).  AuthenticationError otherwise, saying why: empty, malformed (not base64url,
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
    if len(raw) < _HEAD.size + _FP_LEN.size + _MAC_BYTES:
        raise AuthenticationError(f"malformed fetch token: {len(raw)} bytes, at least "
                                  f"{_HEAD.size + _FP_LEN.size + _MAC_BYTES} expected (truncated?)")
    version, expires_at_ms, principal_len = _HEAD.unpack_from(raw)
    if version != TOKEN_VERSION:
        raise AuthenticationError(f"fetch token version {version} is not served (this broker reads "
                                  f"version {TOKEN_VERSION})")
    fp_at = _HEAD.size + principal_len
    fp_len = raw[fp_at] if fp_at < len(raw) else 0
    expected = fp_at + _FP_LEN.size + fp_len + _MAC_BYTES
    if len(raw) != expected:
        raise AuthenticationError(f"malformed fetch token: {len(raw)} bytes where its principal length "
                                  f"{principal_len} makes {expected} (truncated or extended?)")
    body, mac = raw[:-_MAC_BYTES], raw[-_MAC_BYTES:]
    if not hmac.compare_digest(mac, _mac(key, body)):
        raise AuthenticationError("forged fetch token: its HMAC does not match (issued with another "
                                  "cluster's key, or altered)")
    try:
        principal = Principal(body[_HEAD.size:fp_at].decode(), body[fp_at + _FP_LEN.size:].decode("ascii"))
    except UnicodeDecodeError:  # genuine, so never seen: the minter encodes UTF-8 and ASCII
        raise AuthenticationError("malformed fetch token: its principal is not UTF-8") from None
    if now_ms >= expires_at_ms:
        raise AuthenticationError(f"expired fetch token of principal {principal!r}: it expired at "
                                  f"{expires_at_ms} ms, {now_ms - expires_at_ms} ms ago; get a new one "
                                  f"with FetchTokenRequest")
    return principal, expires_at_ms

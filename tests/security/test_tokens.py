"""Fetch tokens (hpbroker.security.tokens): what a data port accepts, and why it refuses."""

from __future__ import annotations

import base64
import hashlib
import hmac
import struct

import pytest

from hpbroker.errors import AuthenticationError, InvalidConfigError
from hpbroker.security import tokens
from hpbroker.security.principal import Principal

KEY = bytes(range(32))
OTHER_KEY = bytes(range(1, 33))
NOW_MS = 1_800_000_000_000


def _raw(token: str) -> bytes:
    return base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))


def _text(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def test_minted_token_verifies_to_its_principal_and_expiry():
    token, expires_at_ms = tokens.mint(KEY, "alice", 600_000, NOW_MS)
    assert expires_at_ms == NOW_MS + 600_000
    assert token.isascii() and token.isprintable() and "=" not in token
    assert tokens.verify(KEY, token, NOW_MS) == ("alice", expires_at_ms)
    assert tokens.verify(KEY, token, expires_at_ms - 1) == ("alice", expires_at_ms)


def test_token_layout_is_the_documented_one():
    token, expires_at_ms = tokens.mint(KEY, "bob", 1000, NOW_MS, fingerprint="abcdefgh12345678")
    raw = _raw(token)
    assert raw[0] == 2
    assert struct.unpack_from("<qH", raw, 1) == (expires_at_ms, 3)
    assert raw[11:14] == b"bob"
    assert raw[14] == 16 and raw[15:31] == b"abcdefgh12345678"
    assert len(raw) == 1 + 8 + 2 + 3 + 1 + 16 + 32
    assert raw[31:] == hmac.new(KEY, raw[:31], hashlib.sha256).digest()


def test_token_carries_the_key_fingerprint_of_its_principal():
    principal = Principal("alice", "Q#k^3x!zzzzzzzzz")
    token, expires_at_ms = tokens.mint(KEY, principal, 1000, NOW_MS)
    verified, _ = tokens.verify(KEY, token, NOW_MS)
    assert verified == "alice" and verified.fingerprint == "Q#k^3x!zzzzzzzzz"
    assert tokens.verify(KEY, tokens.mint(KEY, "alice", 1000, NOW_MS)[0], NOW_MS)[0].fingerprint == ""


def test_version_1_tokens_without_a_fingerprint_are_no_longer_served():
    token, _ = tokens.mint(KEY, "alice", 1000, NOW_MS)
    raw = bytearray(_raw(token))
    raw[0] = 1
    with pytest.raises(AuthenticationError, match="fetch token version 1 is not served"):
        tokens.verify(KEY, _text(bytes(raw)), NOW_MS)


def test_unicode_principal_round_trips():
    token, _ = tokens.mint(KEY, "zoë.ops-1", 1000, NOW_MS)
    assert tokens.verify(KEY, token, NOW_MS)[0] == "zoë.ops-1"


def test_expired_token_is_refused_saying_expired():
    token, expires_at_ms = tokens.mint(KEY, "alice", 1000, NOW_MS)
    with pytest.raises(AuthenticationError, match=r"expired fetch token of principal 'alice'.*1 ms ago"):
        tokens.verify(KEY, token, expires_at_ms + 1)
    with pytest.raises(AuthenticationError, match="expired"):
        tokens.verify(KEY, token, expires_at_ms)


def test_token_of_another_key_is_refused_as_forged():
    token, _ = tokens.mint(OTHER_KEY, "alice", 1000, NOW_MS)
    with pytest.raises(AuthenticationError, match="forged fetch token"):
        tokens.verify(KEY, token, NOW_MS)


def test_altered_principal_or_expiry_is_refused_as_forged():
    token, _ = tokens.mint(KEY, "alice", 1000, NOW_MS)
    raw = bytearray(_raw(token))
    raw[11:16] = b"admin"  # same length, another principal
    with pytest.raises(AuthenticationError, match="forged"):
        tokens.verify(KEY, _text(bytes(raw)), NOW_MS)
    raw = bytearray(_raw(token))
    struct.pack_into("<q", raw, 1, NOW_MS + 10**9)  # a later expiry
    with pytest.raises(AuthenticationError, match="forged"):
        tokens.verify(KEY, _text(bytes(raw)), NOW_MS)


def test_expired_forgery_is_refused_as_forged_not_expired():
    token, expires_at_ms = tokens.mint(OTHER_KEY, "alice", 1000, NOW_MS)
    with pytest.raises(AuthenticationError, match="forged"):
        tokens.verify(KEY, token, expires_at_ms + 5)


@pytest.mark.parametrize("cut", [1, 5, 20, 40])
def test_truncated_token_is_refused_as_malformed(cut):
    token, _ = tokens.mint(KEY, "alice", 1000, NOW_MS)
    raw = _raw(token)
    with pytest.raises(AuthenticationError, match="malformed fetch token"):
        tokens.verify(KEY, _text(raw[:-cut]), NOW_MS)


def test_extended_token_is_refused_as_malformed():
    token, _ = tokens.mint(KEY, "alice", 1000, NOW_MS)
    with pytest.raises(AuthenticationError, match="malformed fetch token.*truncated or extended"):
        tokens.verify(KEY, _text(_raw(token) + b"xx"), NOW_MS)


def test_wrong_version_is_refused_saying_version():
    token, _ = tokens.mint(KEY, "alice", 1000, NOW_MS)
    raw = bytearray(_raw(token))
    raw[0] = 3
    with pytest.raises(AuthenticationError, match="fetch token version 3 is not served"):
        tokens.verify(KEY, _text(bytes(raw)), NOW_MS)


@pytest.mark.parametrize("text", ["", "not base64!", "é", "a" * 5000, "abc=def"])
def test_garbage_is_refused_with_a_clear_error(text):
    with pytest.raises(AuthenticationError, match="no fetch token|malformed"):
        tokens.verify(KEY, text, NOW_MS)


def test_errors_carry_code_27():
    with pytest.raises(AuthenticationError) as caught:
        tokens.verify(KEY, "", NOW_MS)
    assert caught.value.code == 27


@pytest.mark.parametrize("key, principal, lifetime_ms", [
    (b"short", "alice", 1000), (KEY, "", 1000), (KEY, "x" * 1001, 1000), (KEY, "alice", 0)])
def test_mint_refuses_bad_arguments(key, principal, lifetime_ms):
    with pytest.raises(InvalidConfigError):
        tokens.mint(key, principal, lifetime_ms, NOW_MS)

"""FetchTokens (hpbroker.client.fetch_tokens): a token per broker, renewed with a third of its
lifetime left, asked again when refused, none for a broker without security.  The connection
is a stand-in answering FetchTokenRequest: the logic under test is the cache."""

from __future__ import annotations

import time

import pytest

from hpbroker import protocol
from hpbroker.client.connection import BrokerAddress
from hpbroker.client.fetch_tokens import FetchTokens
from hpbroker.errors import AuthenticationError, InvalidRequestError

SECURITY = object()  # only tested for None
A, B = BrokerAddress("127.0.0.1", 9092), BrokerAddress("127.0.0.1", 9192)


class _Broker:
    def __init__(self, lifetime_ms=600_000, error=None):
        self.lifetime_ms = lifetime_ms
        self.error = error
        self.issued = 0

    def call(self, message, timeout_s):
        assert isinstance(message, protocol.FetchTokenRequest)
        if self.error is not None:
            raise self.error
        self.issued += 1
        expires = time.time_ns() // 1_000_000 + self.lifetime_ms
        return protocol.FetchTokenResponse(token=f"t{self.issued}", principal="alice", expires_at_ms=expires)


def test_no_security_no_token():
    assert FetchTokens(None, lambda address: pytest.fail("asked")).token_for(A) is None


def test_token_is_cached_per_address_and_asked_again_when_fresh():
    brokers = {A: _Broker(), B: _Broker()}
    tokens = FetchTokens(SECURITY, brokers.__getitem__)
    assert tokens.token_for(A) == tokens.token_for(A) == "t1"
    assert tokens.token_for(B) == "t1" and brokers[B].issued == 1
    assert tokens.token_for(A, fresh=True) == "t2"
    assert tokens.token_for(A) == "t2"


class _Clock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now_s = 1000.0

    def __call__(self) -> float:
        return self.now_s


def test_token_is_renewed_with_a_third_of_its_lifetime_left():
    broker = _Broker(lifetime_ms=900_000)  # 900 s, so the test's own run time does not count
    clock = _Clock()
    tokens = FetchTokens(SECURITY, lambda address: broker, clock=clock)
    assert tokens.token_for(A) == "t1"
    clock.now_s += 590  # under two thirds of the lifetime gone: the cached token serves
    assert tokens.token_for(A) == "t1"
    clock.now_s += 20  # 610 s of 900: less than a third left
    assert tokens.token_for(A) == "t2"
    assert tokens.token_for(A) == "t2"


def test_broker_without_security_needs_no_token_and_is_asked_once():
    broker = _Broker(error=InvalidRequestError("FetchTokenRequest needs security"))
    asked = []
    tokens = FetchTokens(SECURITY, lambda address: asked.append(address) or broker)
    assert tokens.token_for(A) is None and tokens.token_for(A) is None and asked == [A]


def test_refusal_is_raised():
    tokens = FetchTokens(SECURITY, lambda address: _Broker(error=AuthenticationError("refused key 'alice'")))
    with pytest.raises(AuthenticationError, match="refused key"):
        tokens.token_for(A)

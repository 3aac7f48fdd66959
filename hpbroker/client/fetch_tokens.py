"""Fetch tokens on the client: asked of a broker's front-end, cached, renewed before they expire.

A broker with ``security = "curve"`` and ``data_port_auth = "token"`` serves its TCP data ports
only to connections that first present a fetch token (docs/PROTOCOL.md, ``FetchTokenRequest``,
``AuthenticateRequest``).  The token is issued over the client's authenticated CurveZMQ
connection and is bound to the client's principal and an expiry; every broker of a cluster
accepts it (they share the token key).  :class:`FetchTokens` keeps one per broker front-end
address, asks for a new one when less than a third of its lifetime is left (so a new data
connection never presents one about to expire), and forgets it when a data port refused it
(:meth:`FetchTokens.token_for` with ``fresh=True``).

A client without security gets None: it presents no token.  A secured client talking to a broker
whose front-end answers ``FetchTokenRequest`` with error 10 (a broker without security) gets None
too, and remembers it for that address: that broker's data ports need no token.

The lifetime is measured on the client's clock from the moment the token arrived to the
``expires_at_ms`` the broker named, so a client clock behind the broker's renews early, never
late; one far ahead of it renews at once each time (its data connections still work).

Threads: one owner (the consumer's thread).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from hpbroker import protocol
from hpbroker.errors import InvalidRequestError

if TYPE_CHECKING:
    from hpbroker.client.connection import BrokerAddress, BrokerConnection
    from hpbroker.security.client import ClientSecurity

__all__ = ["FetchTokens"]

logger = logging.getLogger(__name__)

RENEW_SHARE = 1 / 3  # a token is renewed when less than this share of its lifetime is left


@dataclass(slots=True)
class _Token:
    token: str | None  # None: the broker's data ports need none
    principal: str
    expires_at_ms: int
    renew_at: float  # monotonic seconds (FetchTokens' clock)


class FetchTokens:
    """Fetch tokens per broker front-end address (module docstring).

    ``connect(address)``: a :class:`~hpbroker.client.connection.BrokerConnection` (secured with
    ``security``) to ask ``address`` over; the caller owns it.  ``timeout_s``: how long a
    FetchTokenRequest may take.  ``clock``: monotonic seconds, when a token is due for renewal
    (``time.monotonic``; tests pass their own)."""

    def __init__(self, security: ClientSecurity | None, connect: Callable[[BrokerAddress], BrokerConnection],
                 *, timeout_s: float = 30.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.security = security
        self._connect = connect
        self._timeout_s = timeout_s
        self._clock = clock
        self._tokens: dict[BrokerAddress, _Token] = {}

    def token_for(self, address: BrokerAddress, *, fresh: bool = False) -> str | None:
        """The token to present to the data ports of the broker whose front-end is ``address``;
        None when none is needed.  ``fresh``: the cached one was refused, ask for a new one.
        Raises the broker's error (AuthenticationError for a refused key, BrokerNotAvailableError,
        RequestTimedOutError)."""
        if self.security is None:
            return None
        cached = self._tokens.get(address)
        if cached is not None and not fresh and (cached.token is None or self._clock() < cached.renew_at):
            return cached.token
        self._tokens.pop(address, None)
        connection = self._connect(address)
        try:
            response = connection.call(protocol.FetchTokenRequest(), self._timeout_s)
        except InvalidRequestError:  # a broker without security: its data ports need no token
            logger.info("broker %s issues no fetch tokens (it runs without security): its data ports are "
                        "used without one", address)
            self._tokens[address] = _Token(None, "", -1, float("inf"))
            return None
        now_s, now_ms = self._clock(), time.time_ns() // 1_000_000
        left_s = max(0.0, (response.expires_at_ms - now_ms) / 1000)
        self._tokens[address] = _Token(response.token, response.principal, response.expires_at_ms,
                                       now_s + left_s * (1 - RENEW_SHARE))
        logger.debug("fetch token for %s from %s, expires at %d ms", response.principal, address,
                     response.expires_at_ms)
        return response.token

    def source(self, address: BrokerAddress) -> Callable[[bool], str | None]:
        """What a :class:`~hpbroker.client.fetcher.PartitionFetcher` calls for the token of
        ``address`` (``fresh`` as in :meth:`token_for`)."""
        return lambda fresh=False: self.token_for(address, fresh=fresh)

    def forget(self, address: BrokerAddress) -> None:
        self._tokens.pop(address, None)

"""The front-end's security checks: what :class:`~hpbroker.workers.frontend.Frontend` asks of
the broker's security for each request, with ``security = "curve"``.

:class:`FrontendSecurity` wraps the enabled
:class:`~hpbroker.security.broker.BrokerSecurity` and answers, for one decoded request and the
principal its connection authenticated:

- :meth:`~FrontendSecurity.check`: None when the request may go on; else the error to answer --
  27 for a principal no longer on the allowlist (its key removed, or replaced by another key of
  its name: a connection's principal carries its key's fingerprint,
  ``hpbroker.security.principal``), 17 (CoordinationError, retriable) while the ACLs are not
  read yet, 28 (AuthorizationError) for one no ACL allows.  What each request
  needs is ``hpbroker.security.request_access``'s; a produce or fetch that would auto-create
  its topic also needs ``create``; an init-producer-id needs ``produce`` on some topic; a
  fetch-token needs only an authenticated connection.  Refusals are logged at INFO, at most one
  line per :data:`DENIAL_LOG_INTERVAL_S` with the count of the others.
- :meth:`~FrontendSecurity.describable`: whether metadata may show a topic;
- :meth:`~FrontendSecurity.fetch_token` and :meth:`~FrontendSecurity.group_credentials`: the
  answers to those requests.

The front-end holds one (its ``_security``) only when security is on: without it the only cost
on a request is that attribute's test.  Single-threaded: the arbiter's loop alone calls it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from hpbroker import protocol
from hpbroker.broker.config import BrokerConfig
from hpbroker.broker.topics import TopicStore
from hpbroker.errors import AuthenticationError, AuthorizationError, HPBrokerError, InvalidRequestError
from hpbroker.protocol import ApiKey
from hpbroker.security.acls import Operation, ResourceType
from hpbroker.security.request_access import required_access

if TYPE_CHECKING:
    import zmq

    from hpbroker.coord.cluster import ClusterSnapshot
    from hpbroker.security.broker import BrokerSecurity

__all__ = ["DENIAL_LOG_INTERVAL_S", "FrontendSecurity", "no_fetch_tokens", "no_group_credentials"]

logger = logging.getLogger(__name__)

DENIAL_LOG_INTERVAL_S = 10.0  # at most one INFO line about refused requests this often


def no_fetch_tokens() -> HPBrokerError:
    """The answer to a FetchToken request on a broker without security."""
    return InvalidRequestError("fetch tokens are issued only by a broker with security = 'curve'")


def no_group_credentials() -> HPBrokerError:
    """The answer to a GroupCredentials request on a broker without security."""
    return InvalidRequestError("group credentials are issued only by a broker with security = 'curve' "
                               "and ZooKeeper")


class FrontendSecurity:
    """The front-end's checks (module docstring).  ``store``, ``cluster`` and ``config`` are the
    front-end's: whether a produce or fetch would auto-create its topic is judged as
    ``Frontend._auto_create`` judges it."""

    def __init__(self, security: BrokerSecurity, config: BrokerConfig, store: TopicStore,
                 cluster: Callable[[], ClusterSnapshot | None] | None, clock: Callable[[], float]) -> None:
        self.security = security
        self._config = config
        self._store = store
        self._cluster = cluster
        self._clock = clock
        self._denials_logged_at = float("-inf")
        self._denials_unlogged = 0

    def principal_of(self, frame: zmq.Frame) -> str | None:
        return self.security.principal_of(frame)

    def check(self, header: protocol.RequestHeader, request: Any, principal: str | None,
              ) -> HPBrokerError | None:
        """None when the request may go on; else the error to answer (logged, rate-limited).  A
        connection whose key is no longer on the allowlist (removed, or replaced under its name)
        gets 27 for every request, metadata included."""
        security = self.security
        error = security.revoked(principal) or security.acls_pending(principal) \
            or self._denial(header, request, principal)
        if error is not None:
            self._log_denial(error)
        return error

    def _denial(self, header: protocol.RequestHeader, request: Any, principal: str | None,
                ) -> HPBrokerError | None:
        """What the ACLs answer the request: None when they allow it."""
        security = self.security
        if header.api_key == ApiKey.INIT_PRODUCER_ID:
            if not security.allows_any(principal, Operation.PRODUCE):
                return AuthorizationError(f"principal {principal!r} may not produce to any topic, so it "
                                          "gets no producer id (no ACL allows it)")
            return None
        if header.api_key == ApiKey.FETCH_TOKEN:
            if principal is None:
                return AuthenticationError("a fetch token needs an authenticated connection")
            return None
        creates = header.api_key in (ApiKey.PRODUCE, ApiKey.FETCH) and self._would_auto_create(request)
        for operation, resource_type, name in required_access(header.api_key, request, creates_topic=creates):
            error = security.authorize(principal, operation, resource_type, name)
            if error is not None:
                return error
        return None

    def _would_auto_create(self, request: Any) -> bool:
        """Whether the front-end would try to create the produce's or fetch's topic."""
        if not self._config.auto_create_topics or request.partition >= self._config.default_partitions:
            return False
        topic = self._store.get(request.topic)
        if topic is not None:
            return False
        cluster = self._cluster() if self._cluster is not None else None
        registration = cluster.topics.get(request.topic) if cluster is not None else None
        return registration is None or not registration.replicas  # _check_not_replicated_in_cluster's rule

    def _log_denial(self, error: HPBrokerError) -> None:
        now = self._clock()
        if now < self._denials_logged_at + DENIAL_LOG_INTERVAL_S:
            self._denials_unlogged += 1
            return
        if self._denials_unlogged:
            logger.info("[arbiter] refused: %s (and %d more since the last such line)", error.message,
                        self._denials_unlogged)
        else:
            logger.info("[arbiter] refused: %s", error.message)
        self._denials_logged_at, self._denials_unlogged = now, 0

    def describable(self, principal: str | None, name: str) -> bool:
        """Whether metadata may show topic ``name`` to ``principal``."""
        return self.security.authorize(principal, Operation.DESCRIBE, ResourceType.TOPIC, name) is None

    def fetch_token(self, principal: str | None) -> protocol.FetchTokenResponse | HPBrokerError:
        if principal is None:
            return no_fetch_tokens()
        try:
            token, expires_at_ms = self.security.mint_token(principal)
        except HPBrokerError as e:
            return e
        return protocol.FetchTokenResponse(token, principal, expires_at_ms)

    def group_credentials(self, request: protocol.GroupCredentialsRequest,
                          ) -> protocol.GroupCredentialsResponse | HPBrokerError:
        try:
            issued = self.security.group_credentials(request.group)
        except HPBrokerError as e:
            logger.info("[arbiter] group credentials of %r refused: %s", request.group, e.message)
            return e
        return protocol.GroupCredentialsResponse(issued.zookeeper_user, issued.zookeeper_password,
                                                 list(issued.acl_ids))

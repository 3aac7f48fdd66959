"""The worker side of data-port security: who a TCP connection acts for, and what it may read.

A worker with ``security = "curve"`` holds one :class:`DataPortGuard`.  The arbiter feeds it the
broker's security state with the worker control message ``{"op": "security", ...}`` when the
worker becomes ready and whenever the allowlist, the ACLs or the token key change
(:meth:`DataPortGuard.update`); its body::

    {"enabled": true,
     "token_key": "<64 hex digits>" | null,   # the cluster's fetch-token HMAC key
     "principals": ["alice", ...],             # the key names on the allowlist now
     "fingerprints": {"alice": "<16 z85>", ...},  # each name's key (hpbroker.security.principal)
     "super_users": ["admin", ...],
     "acls": [AclEntry.to_dict(), ...],
     "acls_known": true,                       # false: the broker has not read the ACLs yet
     "data_port_auth": "token" | "loopback",
     "own_principal": "broker-1",              # this broker's key name (its replica fetches)
     "own_fingerprint": "<16 z85>"}            # and its key's fingerprint

Until the first state (with the token key) arrives the guard refuses every connection with error
15 (PartitionNotAvailableError, "not ready"): a worker never serves a data-port connection it
cannot check.  That happens after every worker start or respawn, until the arbiter's push
arrives, and on a broker with ZooKeeper until it has read the cluster's token key.  The error is
retriable, unlike 27: clients back off and connect again, as when the worker is not serving yet.

While the state says ``"acls_known": false`` (a broker with ZooKeeper that has not read the
ACLs yet: it is joining, or the first read failed or gave a node it cannot parse),
:meth:`DataPortGuard.check` answers every request but a super user's with error 17
(CoordinationError, "ACLs not loaded yet", retriable), as the front-end does, never 28: an empty
ACL list there means "unknown", not "nothing allowed".  A revoked key still gets 27 first.  A
state without the field (an older broker's) counts as known.

:meth:`DataPortGuard.authenticate` verifies a connection's fetch token
(``hpbroker.security.tokens``) and that its principal is still on the allowlist *with the same
key*: the token carries the fingerprint of the key it was minted for, and a name whose key was
replaced since (a rotation) is refused as a name removed is.  (A state without
``fingerprints`` is judged by names alone.)  Revocation
takes effect at once, even before the token expires, as on the front-end: a revoked key's token
is refused at its next connection, and :meth:`DataPortGuard.check` refuses the next request of a
connection authenticated before the revocation with error 27 (the data port then closes it).
:meth:`DataPortGuard.check` authorises each request on the connection's principal with
the front-end's table (``hpbroker.security.request_access``): a consumer fetch needs ``consume``
on the topic, a replica fetch ``cluster_action`` on the cluster, a list-offsets ``describe`` on
the topic (``hpbroker.security.acls``).

Single owner: the worker's event loop.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from hpbroker import protocol
from hpbroker.errors import (
    AuthenticationError,
    CoordinationError,
    HPBrokerError,
    InvalidRequestError,
    PartitionNotAvailableError,
)
from hpbroker.protocol import ApiKey
from hpbroker.security import tokens
from hpbroker.security.acls import AclEntry, Authorizer
from hpbroker.security.request_access import required_access

__all__ = ["DataPortGuard"]

logger = logging.getLogger(__name__)

_SERVED = frozenset({ApiKey.FETCH, ApiKey.LIST_OFFSETS})  # what a data port serves (fetch_server.py)


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class DataPortGuard:
    """Checks data-port connections against the broker's security state (module docstring).

    ``token_lifetime_ms``: how long the tokens this worker mints for its own replica fetches
    live (the broker's ``fetch_token_lifetime_ms``)."""

    def __init__(self, token_lifetime_ms: int = 600_000) -> None:
        self._token_lifetime_ms = token_lifetime_ms
        self._ready = False
        self._key: bytes | None = None
        self._principals: frozenset[str] = frozenset()
        self._fingerprints: dict[str, str] | None = None  # name -> its key's; None: names only
        self._authorizer = Authorizer()
        self._acls_known = True
        self.own_principal: str | None = None
        self._own_fingerprint = ""
        self.data_port_auth = "token"

    @property
    def ready(self) -> bool:
        """Whether a security state has arrived."""
        return self._ready

    def update(self, body: dict[str, Any]) -> None:
        """Take a new security state (the control message's body).  ValueError (InvalidConfigError
        for a bad ACL entry), with the state unchanged, when the body is malformed."""
        if not isinstance(body, dict):
            raise ValueError(f"security state must be an object, got {type(body).__name__}")
        key_hex = body.get("token_key")
        key = None
        if key_hex is not None:
            if not isinstance(key_hex, str):
                raise ValueError("token_key must be hex text or null")
            key = bytes.fromhex(key_hex)
            if len(key) < 16:
                raise ValueError(f"token_key must be at least 16 bytes, got {len(key)}")
        principals = body.get("principals", [])
        super_users = body.get("super_users", [])
        for name, value in (("principals", principals), ("super_users", super_users)):
            if not isinstance(value, list) or not all(isinstance(p, str) for p in value):
                raise ValueError(f"{name} must be a list of names, got {value!r}")
        fingerprints = body.get("fingerprints")
        if fingerprints is not None and (not isinstance(fingerprints, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in fingerprints.items())):
            raise ValueError(f"fingerprints must map names to key fingerprints, got {fingerprints!r}")
        acls = body.get("acls", [])
        if not isinstance(acls, list):
            raise ValueError(f"acls must be a list, got {acls!r}")
        authorizer = Authorizer([AclEntry.from_dict(entry) for entry in acls], super_users)
        acls_known = body.get("acls_known", True)
        if not isinstance(acls_known, bool):
            raise ValueError(f"acls_known must be true or false, got {acls_known!r}")
        own = body.get("own_principal")
        if own is not None and not isinstance(own, str):
            raise ValueError(f"own_principal must be a name, got {own!r}")
        own_fingerprint = body.get("own_fingerprint")
        if own_fingerprint is not None and not isinstance(own_fingerprint, str):
            raise ValueError(f"own_fingerprint must be a key fingerprint, got {own_fingerprint!r}")
        removed = self._principals - frozenset(principals)
        self._key, self._principals, self._authorizer = key, frozenset(principals), authorizer
        self._acls_known = acls_known
        self._fingerprints = dict(fingerprints) if fingerprints is not None else None
        self.own_principal = own or None
        self._own_fingerprint = own_fingerprint or (fingerprints or {}).get(own or "", "")
        self.data_port_auth = str(body.get("data_port_auth", "token"))
        self._ready = True
        logger.info("security state: %d principals, %d ACLs%s, %d super users, token key %s%s",
                    len(self._principals), len(authorizer.entries),
                    "" if acls_known else " (not loaded yet)", len(authorizer.super_users),
                    "set" if key else "missing",
                    f"; no longer allowed: {sorted(removed)}" if removed else "")

    def authenticate(self, token: str, now_ms: int | None = None) -> tuple[str, int]:
        """``(principal, expires_at_ms)`` of a connection presenting ``token``; AuthenticationError
        saying why not (malformed, forged, expired, principal no longer allowed), or
        PartitionNotAvailableError (retriable) while the guard is not ready (module docstring)."""
        key = self._key
        if not self._ready or key is None:
            raise _not_ready()
        principal, expires_at_ms = tokens.verify(key, token, _now_ms() if now_ms is None else now_ms)
        if not self._admitted(principal):
            raise _revoked(principal)
        return principal, expires_at_ms

    def _admitted(self, principal: str) -> bool:
        """Whether ``principal`` is on the allowlist, with the same key when the state says
        which (a token's principal carries its key's fingerprint)."""
        if principal not in self._principals:
            return False
        fingerprints = self._fingerprints
        return fingerprints is None or getattr(principal, "fingerprint", None) == fingerprints.get(principal)

    def check(self, principal: str, api_key: int, request: protocol.Message) -> HPBrokerError | None:
        """None when ``principal`` may make ``request``; else the error to answer: 28 when the
        ACLs do not allow it, 27 (AuthenticationError: the caller closes the connection) when
        the principal's key is no longer on the allowlist, 17 (CoordinationError, retriable)
        while the ACLs are not known yet and ``principal`` is no super user."""
        if not self._ready:
            return _not_ready()
        if not self._admitted(principal):
            return _revoked(principal)
        if api_key not in _SERVED:
            return InvalidRequestError(f"api_key {api_key} is not served on a data port")
        authorizer = self._authorizer
        if not self._acls_known and principal not in authorizer.super_users:
            return CoordinationError("ACLs not loaded yet: the broker has not read them from ZooKeeper; "
                                     "retry")
        for operation, resource_type, name in required_access(api_key, request):
            error = authorizer.check(principal, operation, resource_type, name)
            if error is not None:
                return error
        return None

    def mint_own(self, now_ms: int | None = None) -> tuple[str, int] | None:
        """A token for this broker's own principal (its replica fetches), ``(token,
        expires_at_ms)``; None before the state, the token key or the own principal is known."""
        if self._key is None or not self.own_principal:
            return None
        return tokens.mint(self._key, self.own_principal, self._token_lifetime_ms,
                           _now_ms() if now_ms is None else now_ms, fingerprint=self._own_fingerprint)


def _revoked(principal: str) -> AuthenticationError:
    return AuthenticationError(f"the key of principal {principal!r} is no longer on the broker's allowlist "
                               f"(revoked, or replaced by another key of that name)")


def _not_ready() -> PartitionNotAvailableError:
    return PartitionNotAvailableError("the data port is not ready: its worker has not received the "
                                      "broker's security state (or the cluster's token key) yet; connect "
                                      "again shortly")

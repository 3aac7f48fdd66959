"""The broker's security: the one object the arbiter holds (docs/SECURITY.md).

:class:`BrokerSecurity` gathers what ``security = "curve"`` needs on the arbiter's side:

- **the server key** (``server_key_file``, a ``zmq.auth`` secret key file ``NAME.key_secret``,
  read by ``hpbroker.security.keys``): read and checked when the object is made (the broker's
  start, before any worker is forked): a missing file, one without a secret key, or a secret
  key whose public key is not the one beside it in the file stops the start with an
  InvalidConfigError naming the path.  ``NAME`` is the broker's own principal
  (:attr:`BrokerSecurity.own_principal`): the one its followers' replica fetches carry, which
  the other brokers' allowlists must hold and their ACLs allow ``cluster_action`` (or list
  among ``super_users``).
- **the allowlist** (``hpbroker.security.authenticator``): read once when the object is made,
  so that a bad directory stops the start before anything else; its ZAP handler started by
  :meth:`BrokerSecurity.secure_front`, which then makes the front-end ROUTER a CURVE server
  (``CURVE_SERVER``, ``CURVE_SECRETKEY``, ``ZAP_DOMAIN``, ``ZAP_ENFORCE_DOMAIN``) -- all before
  the ROUTER binds.  With ``ZAP_ENFORCE_DOMAIN`` libzmq refuses a handshake when no handler
  answers rather than admitting it, and the handler is running before the bind anyway: no
  connection is ever admitted without the allowlist's say.
- **ACLs** (``hpbroker.security.acls``): :meth:`BrokerSecurity.authorize` answers every request
  the front-end checks.  A principal no longer on the allowlist (its key removed, SIGHUP) is refused
  with AuthenticationError (27) on the connections it still holds, before any ACL is looked at.
  A connection is identified by its key's name *and* fingerprint
  (``hpbroker.security.principal``): when a name's key is replaced (a leaked key rotated under
  the same name), the old key's connections are refused 27 as if the name had been removed, and
  the new key's are served.  ACLs come from ZooKeeper (:meth:`set_acls`, from the arbiter);
  standalone there are none, and only ``super_users`` are allowed anything.  With ZooKeeper,
  until the ACLs are first read (the broker joining, or the read failing), every request but a
  super user's gets CoordinationError (17, retriable: "ACLs not loaded yet"), never a refusal
  (:meth:`acls_pending`).
- **the token key** (32 bytes): the HMAC key of fetch tokens (``hpbroker.security.tokens``).
  Random at start; with ZooKeeper the cluster's (:meth:`set_token_key`: the arbiter reads it),
  so that a token minted by one broker's worker (a follower's replica fetch) is good at the
  others' data ports.
- **group credentials** (:meth:`group_credentials`): issued by the function the arbiter hands
  in once joined (:meth:`set_group_issuer`); this package never imports ``hpbroker.coord``.
- **the workers' state** (:meth:`worker_state`): what a worker needs to check its data port
  connections; the arbiter pushes it to every worker as the ``security`` control.

With ``security = "none"`` (:attr:`enabled` false) every method is a no-op: nothing is read,
:meth:`principal_of` is None, :meth:`authorize` None.  Only the arbiter's loop thread calls it.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import zmq

from hpbroker.broker.config import BrokerConfig, super_user_names
from hpbroker.errors import (
    AuthenticationError,
    CoordinationError,
    HPBrokerError,
    InvalidConfigError,
    InvalidRequestError,
)
from hpbroker.security import tokens
from hpbroker.security.acls import AclEntry, Authorizer
from hpbroker.security.authenticator import ZAP_DOMAIN, AllowlistAuthenticator, read_allowlist
from hpbroker.security.keys import SECRET_SUFFIX, key_name, read_key_file
from hpbroker.security.principal import fingerprint, from_user_id

if TYPE_CHECKING:  # only a type: hpbroker.security never imports hpbroker.coord
    from hpbroker.coord.zk_security import GroupCredentials

    # Issues a group's ZooKeeper credentials: (token_key, group) -> GroupCredentials.
    GroupIssuer = Callable[[bytes, str], GroupCredentials]

__all__ = ["BrokerSecurity", "ServerKey", "load_server_key"]

logger = logging.getLogger(__name__)


class ServerKey:
    """The broker's key pair (z85, 40 bytes each) and its name."""

    __slots__ = ("name", "public_key", "secret_key")

    def __init__(self, name: str, public_key: bytes, secret_key: bytes) -> None:
        self.name, self.public_key, self.secret_key = name, public_key, secret_key


def load_server_key(path: str) -> ServerKey:
    """Read and check ``server_key_file`` (module docstring, ``hpbroker.security.keys``'s reader);
    InvalidConfigError naming the path."""
    try:
        public, secret = read_key_file(path)
    except InvalidConfigError as e:
        raise InvalidConfigError(f"server_key_file: {e.message}") from None
    if secret is None:
        raise InvalidConfigError(f"server_key_file {path} holds no secret-key: give the secret key "
                                 f"file (NAME{SECRET_SUFFIX}, from `hpbroker keys generate NAME`), not the "
                                 "public one")
    try:
        own_public = zmq.curve_public(secret)
    except zmq.ZMQError:
        raise InvalidConfigError(f"server_key_file {path}: its secret-key is not a CurveZMQ key") from None
    if own_public != public:
        raise InvalidConfigError(f"server_key_file {path}: its public-key is not the secret key's (the file "
                                 "was edited or pieced together from two key pairs)")
    return ServerKey(key_name(path), public, secret)


class BrokerSecurity:
    """The arbiter's security object (module docstring).  Made in the broker's start, before
    any worker is forked; InvalidConfigError there stops the start."""

    def __init__(self, config: BrokerConfig) -> None:
        self.enabled = config.security == "curve"
        self.own_principal = ""
        self.super_users = super_user_names(config)
        self._config = config
        self._key: ServerKey | None = None
        self._authenticator: AllowlistAuthenticator | None = None
        self._principals: frozenset[str] = frozenset()
        self._fingerprints: dict[str, str] = {}  # name -> its key's fingerprint, the allowlist now
        self._acls: tuple[AclEntry, ...] = ()
        self._authorizer = Authorizer((), self.super_users)
        # With ZooKeeper the ACLs live there: until the first read (set_acls) they are not known,
        # and every request but a super user's gets CoordinationError (retriable), not a refusal.
        self.acls_known = not config.zookeeper
        self.token_key: bytes | None = None
        self._group_issuer: GroupIssuer | None = None
        if not self.enabled:
            return
        self._key = load_server_key(config.server_key_file)
        self.own_principal = self._key.name
        # Read now, strictly, so that a bad directory stops the start before anything is forked;
        # the authenticator reads it again when it starts.
        self._take_allowlist({fingerprint(key): name for key, name in
                              read_allowlist(config.allowlist_dir, strict=True).items()})
        self.token_key = os.urandom(tokens.TOKEN_KEY_BYTES)
        logger.info("[security] CurveZMQ on: broker key %r (%s), allowlist %s with %d keys, super users %s, "
                    "data ports by %s", self.own_principal, self._key.public_key.decode("ascii"),
                    config.allowlist_dir, len(self._principals),
                    ", ".join(sorted(self.super_users)) or "none", config.data_port_auth)

    # --- the front-end ------------------------------------------------------------------------

    def secure_front(self, context: zmq.Context, front: zmq.Socket) -> None:
        """Start the ZAP handler in ``context`` and make ``front`` a CURVE server in its domain.
        Call before ``front`` binds; InvalidConfigError (the broker halts) when it cannot."""
        if not self.enabled:
            return
        assert self._key is not None and self._authenticator is None
        authenticator = AllowlistAuthenticator(context, self._config.allowlist_dir)
        authenticator.start()
        self._authenticator = authenticator
        self._take_allowlist({fp: name for name, fp in authenticator.fingerprints().items()})
        front.setsockopt(zmq.CURVE_SERVER, 1)
        front.setsockopt(zmq.CURVE_SECRETKEY, self._key.secret_key)
        front.setsockopt(zmq.ZAP_DOMAIN, ZAP_DOMAIN.encode())
        front.setsockopt(zmq.ZAP_ENFORCE_DOMAIN, 1)

    def _take_allowlist(self, by_fingerprint: dict[str, str]) -> None:
        """The allowlist in force: fingerprint -> name."""
        self._fingerprints = {name: fp for fp, name in by_fingerprint.items()}
        self._principals = frozenset(self._fingerprints)

    def principal_of(self, frame: zmq.Frame) -> str | None:
        """The principal of the connection a message frame came on: its ``User-Id``
        (``NAME#FINGERPRINT``) as a :class:`~hpbroker.security.principal.Principal` (the name,
        carrying the key's fingerprint); None when security is off."""
        if not self.enabled:
            return None
        try:
            user_id = frame.get("User-Id")
        except zmq.ZMQError:
            return None
        return _principal(user_id) if user_id else None

    def admitted(self, principal: str | None) -> bool:
        """Whether ``principal`` is on the allowlist now: its name with the same key (a
        :class:`~hpbroker.security.principal.Principal`'s fingerprint; a plain name, given by
        the broker itself, is judged by its name)."""
        if not principal:
            return False
        expected = self._fingerprints.get(principal)
        return expected is not None and getattr(principal, "fingerprint", expected) == expected

    def authorize(self, principal: str | None, operation: Any, resource_type: Any,
                  name: str) -> HPBrokerError | None:
        """None when ``principal`` may do ``operation`` on the resource (always, security off);
        else the error to answer: AuthenticationError for a principal no longer on the
        allowlist, AuthorizationError (28) for one no ACL allows."""
        if not self.enabled:
            return None
        return self.revoked(principal) or self.acls_pending(principal) \
            or self._authorizer.check(principal, operation, resource_type, name)

    def revoked(self, principal: str | None) -> AuthenticationError | None:
        """AuthenticationError (27) for a principal no longer on the allowlist (its name removed,
        or its key replaced under the name); None otherwise (no principal included: the ACLs
        refuse that)."""
        if not self.enabled or not principal or self.admitted(principal):
            return None
        return _revoked(principal)

    def acls_pending(self, principal: str | None) -> HPBrokerError | None:
        """CoordinationError (retriable: ask again shortly) while the ACLs have not been read from
        ZooKeeper yet (the broker is joining, or the first read failed) and ``principal`` is no
        super user; else None (a principal no longer on the allowlist included: its refusal,
        27, needs no ACL)."""
        if self.acls_known or not self.enabled or principal in self.super_users \
                or (principal and not self.admitted(principal)):
            return None
        return CoordinationError("ACLs not loaded yet: the broker has not read them from ZooKeeper; retry")

    def allows_any(self, principal: str | None, operation: Any) -> bool:
        """Whether some ACL allows ``principal`` ``operation`` somewhere (always, security off)."""
        if not self.enabled:
            return True
        return self.admitted(principal) and self._authorizer.allows_any(principal, operation)

    # --- changes (the arbiter's loop) ---------------------------------------------------------

    def principals(self) -> frozenset[str]:
        """The names on the allowlist now."""
        return self._principals

    def fingerprint_of(self, name: str) -> str | None:
        """The fingerprint of the key ``name`` is allowlisted with (None: not on the allowlist)."""
        return self._fingerprints.get(name)

    def reload(self) -> tuple[frozenset[str], frozenset[str]]:
        """Read the allowlist again (SIGHUP): the names (added, removed)."""
        if self._authenticator is None:
            return frozenset(), frozenset()
        added, removed = self._authenticator.reload()
        self._take_allowlist({fp: name for name, fp in self._authenticator.fingerprints().items()})
        return added, removed

    def set_acls(self, entries: Iterable[AclEntry]) -> bool:
        """Take the ACLs as they are now in ZooKeeper; True when they changed."""
        acls = tuple(dict.fromkeys(entries))
        self.acls_known = True
        if acls == self._acls:
            return False
        self._acls = acls
        self._authorizer = Authorizer(acls, self.super_users)
        return True

    def check_alive(self) -> bool:
        """False when the ZAP handler's thread has died (fatal: no connection can be admitted)."""
        return self._authenticator is None or self._authenticator.alive()

    # --- ZooKeeper ----------------------------------------------------------------------------

    def set_token_key(self, token_key: bytes) -> None:
        """Take the cluster's token key (the arbiter reads it from ZooKeeper once joined), in
        place of the random one made at start."""
        if len(token_key) != tokens.TOKEN_KEY_BYTES:
            raise InvalidConfigError(f"a token key is {tokens.TOKEN_KEY_BYTES} bytes, not {len(token_key)}")
        self.token_key = token_key

    def set_group_issuer(self, issuer: GroupIssuer | None) -> None:
        """Take what issues a group's credentials (``(token_key, group) -> GroupCredentials``,
        made by the arbiter from ``hpbroker.coord.zk_security.issue_group_credentials`` once
        joined; it must never wait on ZooKeeper), or None when the session closes."""
        self._group_issuer = issuer

    def group_credentials(self, group: str) -> GroupCredentials:
        """The ZooKeeper credentials of ``group``, its node made with the group's ACL
        (asynchronously: this never waits on ZooKeeper).  InvalidRequestError when security or
        ZooKeeper is off."""
        if not self.enabled or self._group_issuer is None or self.token_key is None:
            raise InvalidRequestError("group credentials are issued only by a broker with security = 'curve' "
                                      "and ZooKeeper")
        return self._group_issuer(self.token_key, group)

    # --- tokens and workers -------------------------------------------------------------------

    def mint_token(self, principal: str) -> tuple[str, int]:
        """A fetch token for ``principal``: ``(token, expires_at_ms)``, valid for
        ``fetch_token_lifetime_ms``, bound to its key's fingerprint.  InvalidRequestError when
        security is off, AuthenticationError for a principal no longer on the allowlist."""
        if not self.enabled or self.token_key is None:
            raise InvalidRequestError("fetch tokens are issued only by a broker with security = 'curve'")
        if not self.admitted(principal):
            raise _revoked(principal, ": no fetch token")
        return tokens.mint(self.token_key, principal, self._config.fetch_token_lifetime_ms,
                           int(time.time() * 1000), fingerprint=self._fingerprints[principal])

    def worker_state(self) -> dict[str, Any]:
        """The ``security`` control's body (JSON-able): what a worker checks its data port
        connections with."""
        if not self.enabled:
            return {"enabled": False}
        return {"enabled": True, "token_key": self.token_key.hex() if self.token_key is not None else None,
                "principals": sorted(self._principals),
                "fingerprints": dict(sorted(self._fingerprints.items())),
                "super_users": sorted(self.super_users),
                "acls": [entry.to_dict() for entry in self._acls], "acls_known": self.acls_known,
                "data_port_auth": self._config.data_port_auth, "own_principal": self.own_principal,
                "own_fingerprint": fingerprint(self._key.public_key) if self._key is not None else ""}

    def close(self) -> bool:
        """Stop the ZAP handler; before the ZeroMQ context ends.  False when its thread did not
        stop: end the context with ``destroy(linger=0)``, not ``term()`` (which would wait for
        the thread's sockets for ever)."""
        stopped = True
        if self._authenticator is not None:
            stopped = self._authenticator.stop()
            self._authenticator = None
        return stopped


@functools.lru_cache(maxsize=1024)
def _principal(user_id: str) -> str:
    """A ``User-Id``'s principal (cached: the same few per broker, one per key ever admitted)."""
    return from_user_id(user_id)


def _revoked(principal: str, what: str = "") -> AuthenticationError:
    return AuthenticationError(f"key {principal!r} is no longer on the broker's allowlist (revoked, or "
                               f"replaced by another key of that name){what}")

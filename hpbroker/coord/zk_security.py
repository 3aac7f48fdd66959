"""ZooKeeper ACLs: who may write hpbroker's znodes (docs/SECURITY.md, "ZooKeeper").

ZooKeeper's ``digest`` scheme: a session that has added the auth ``user:password`` holds the id
``user:base64(sha1(user:password))`` (:func:`digest_id`), and a znode's ACL grants permissions to
ids.  Without credentials every znode is created world-writable, as ZooKeeper's default; with
them the nodes carry one of these ACLs:

- **cluster** (:func:`cluster_acl`): ``[digest(cluster) ALL, world READ]``.  Every node a broker
  or a tool with the cluster's credentials creates: registrations, topics, partition states,
  the controller's nodes, producer-id blocks, ``/consumers`` itself.  Anyone may read them (the
  consumers read brokers and topics without credentials); only the cluster writes.
- **private** (:func:`private_acl`): ``[digest(cluster) ALL]``: the token key and the ACLs,
  which nobody else may even read.
- **group** (:func:`group_acl`): ``[digest(cluster) ALL, digest(group) READ|WRITE|CREATE|DELETE,
  world READ]`` on ``/consumers/<group>`` and everything under it: the group's members (and the
  cluster) write the group's registrations, ownership and offsets; nobody else does.  Only the
  cluster holds ADMIN: a member cannot change an ACL (lock the brokers and tools out of its
  group, or open its nodes to the world).

**The token key** (``ZkPaths.token_key``: ``<root>/security/token_key``, 32 random bytes,
private ACL) is the cluster's one secret: the data-port tokens' HMAC key, and the key the group
credentials are derived from.  :func:`get_or_create_token_key` reads it, or creates it once (the
first broker wins a race); a key node that has not carried exactly the private ACL since its
creation may be known to others (planted while the tree was open), so it is never adopted.  Nor
is it replaced under running brokers (they keep the key they read at start, and brokers with
different keys refuse each other's replica fetches): a broker replaces it (:func:`replace_token_key`:
delete and create again, never re-ACL) only when no other broker is registered; otherwise it, and
a tool always, stops with CoordinationError telling the operator to run ``hpbroker zookeeper
secure``, which writes a fresh key.

**Group credentials** are derived, never stored: user ``group-`` + the first 24 hex digits of
sha256(group), password base64url(HMAC-SHA256(token_key, ``b"zookeeper-group:" + group``)), so
every broker hands out the same ones for a group and a member of one group cannot compute
another's.  A broker hands them (``GroupCredentialsRequest``, docs/PROTOCOL.md) to a principal
allowed ``consume`` on the group, after :func:`ensure_group_node` has started creating the
group's node with the group ACL (a member cannot: ``/consumers`` is the cluster's).

The credentials file holds one line, ``user:password`` (:func:`load_credentials`).  Keep it
mode 0600: it is the cluster's write access to ZooKeeper.  Anyone who may read a node's ACL sees
the cluster's digest id, a sha1 of ``user:password``: the password must be long and random (a
shorter one than :data:`MIN_PASSWORD_CHARS` is warned about).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import logging
import os
import stat
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kazoo.exceptions import (
    BadVersionError,
    KazooException,
    NoAuthError,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
)
from kazoo.security import ACL, Id, Permissions, make_acl

from hpbroker.coord.paths import ZkPaths
from hpbroker.errors import AuthorizationError, CoordinationError, InvalidConfigError
from hpbroker.security.tokens import TOKEN_KEY_BYTES  # the token key's length (pure: no kazoo, no zmq)

if TYPE_CHECKING:
    from hpbroker.coord.session import Session

__all__ = [
    "GroupCredentials",
    "MIN_PASSWORD_CHARS",
    "TOKEN_KEY_BYTES",
    "ZkCredentials",
    "cluster_acl",
    "digest_id",
    "ensure_group_node",
    "get_or_create_token_key",
    "group_acl",
    "group_credentials",
    "issue_group_credentials",
    "load_credentials",
    "member_acl",
    "private_acl",
    "refused",
    "replace_token_key",
    "tool_group_acl",
    "wait_for_node",
    "world_writable",
]

logger = logging.getLogger(__name__)

# A digest id (visible to anyone who may read a node's ACL) is sha1(user:password): a shorter
# password may be guessed offline
MIN_PASSWORD_CHARS = 20
_TOKEN_KEY_ATTEMPTS = 20  # reads of the key node (each after a race or a replacement) before giving up
_MAX_FILE_BYTES = 4096  # a credentials file is one short line; anything longer is not one
_GROUP_USER_PREFIX = "group-"
_GROUP_USER_HEX = 24  # hex digits of sha256(group) in the group's user name
_GROUP_LABEL = b"zookeeper-group:"  # the HMAC's domain separation from the data-port tokens
_WORLD_READ = make_acl("world", "anyone", read=True)
# a group's id on its nodes: everything but ADMIN, which stays the cluster's
_MEMBER_PERMS = Permissions.READ | Permissions.WRITE | Permissions.CREATE | Permissions.DELETE


@dataclass(frozen=True, slots=True)
class ZkCredentials:
    """A ZooKeeper digest user and its password.  ``repr`` hides the password."""

    user: str
    password: str

    def __post_init__(self) -> None:
        if not self.user or ":" in self.user or any(c.isspace() for c in self.user):
            raise InvalidConfigError(f"ZooKeeper user {self.user!r}: must be non-empty, "
                                     "without ':' or spaces")
        if not self.password or any(c in "\r\n" for c in self.password):
            raise InvalidConfigError(f"ZooKeeper user {self.user!r}: the password must be "
                                     "non-empty, one line")

    def __repr__(self) -> str:
        return f"ZkCredentials(user={self.user!r}, password=<hidden>)"

    @property
    def id(self) -> str:
        """The digest id a session authenticated as this user holds."""
        return digest_id(self.user, self.password)

    @property
    def auth_data(self) -> tuple[str, str]:
        """kazoo's ``(scheme, credential)`` for ``add_auth`` / ``auth_data``."""
        return "digest", f"{self.user}:{self.password}"


def load_credentials(path: str | os.PathLike[str]) -> ZkCredentials:
    """The credentials in ``path``: one line ``user:password`` (a trailing newline allowed;
    the password may contain ':').  InvalidConfigError naming the file and what is wrong with
    it (missing, unreadable, empty, no ':'); a file others may read, and a password shorter
    than :data:`MIN_PASSWORD_CHARS`, are logged as warnings."""
    name = os.fspath(path)
    try:
        with open(name, "rb") as f:
            raw = f.read(_MAX_FILE_BYTES + 1)
            mode = os.fstat(f.fileno()).st_mode
    except FileNotFoundError:
        raise InvalidConfigError(f"ZooKeeper credentials file {name}: no such file") from None
    except OSError as e:
        raise InvalidConfigError(f"ZooKeeper credentials file {name}: cannot read it: "
                                 f"{e.strerror or e}") from None
    if len(raw) > _MAX_FILE_BYTES:
        raise InvalidConfigError(f"ZooKeeper credentials file {name}: larger than {_MAX_FILE_BYTES} bytes; "
                                 "expected one line user:password")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidConfigError(f"ZooKeeper credentials file {name}: not UTF-8 text; "
                                 "expected one line user:password") from None
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        raise InvalidConfigError(f"ZooKeeper credentials file {name}: empty; expected one line user:password")
    if len(lines) > 1:
        raise InvalidConfigError(f"ZooKeeper credentials file {name}: {len(lines)} lines; "
                                 "expected one line user:password")
    user, colon, password = lines[0].strip().partition(":")
    if not colon:
        raise InvalidConfigError(f"ZooKeeper credentials file {name}: no ':' in its line; "
                                 "expected user:password")
    try:
        credentials = ZkCredentials(user, password)
    except InvalidConfigError as e:
        raise InvalidConfigError(f"ZooKeeper credentials file {name}: {e.message}") from None
    if len(password) < MIN_PASSWORD_CHARS:
        logger.warning("ZooKeeper credentials file %s: the password has %d characters, fewer than %d: "
                       "anyone who can read an ACL in ZooKeeper sees sha1(user:password) and can guess a "
                       "short one offline; use a long random one (openssl rand -base64 32)",
                       name, len(password), MIN_PASSWORD_CHARS)
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        logger.warning("ZooKeeper credentials file %s is readable by others (mode %o): chmod 600 it",
                       name, stat.S_IMODE(mode))
    return credentials


def digest_id(user: str, password: str) -> str:
    """``user:base64(sha1(user:password))``: the id ZooKeeper gives a session that added the
    digest auth ``user:password``."""
    digest = hashlib.sha1(f"{user}:{password}".encode()).digest()
    return f"{user}:{base64.b64encode(digest).decode('ascii')}"


def _digest_all(ids: Iterable[str]) -> list[ACL]:
    return [ACL(Permissions.ALL, Id("digest", acl_id)) for acl_id in dict.fromkeys(ids)]


def cluster_acl(credentials: ZkCredentials) -> list[ACL]:
    """All rights to the cluster, read to the world: every node brokers and tools create."""
    return [*_digest_all([credentials.id]), _WORLD_READ]


def private_acl(credentials: ZkCredentials) -> list[ACL]:
    """All rights to the cluster, nothing to anyone else: the token key, the ACLs."""
    return _digest_all([credentials.id])


def member_acl(acl_ids: Sequence[str]) -> list[ACL]:
    """The ACL of every node under ``/consumers/<group>``, from a GroupCredentialsResponse's
    ``acl_ids`` (the cluster's id first, then the group's): all rights to the first, read, write,
    create and delete (not ADMIN) to each other one, read to the world."""
    if not acl_ids:
        raise CoordinationError("a group ACL needs at least one digest id")
    cluster, *members = dict.fromkeys(acl_ids)
    return [*_digest_all([cluster]),
            *(ACL(_MEMBER_PERMS, Id("digest", acl_id)) for acl_id in members), _WORLD_READ]


def world_writable(acl: Iterable[ACL]) -> bool:
    """Whether ``acl`` lets anyone without credentials change the node (or its children)."""
    write = Permissions.WRITE | Permissions.CREATE | Permissions.DELETE | Permissions.ADMIN
    return any(entry.id.scheme == "world" and entry.perms & write for entry in acl)


# --- the token key ------------------------------------------------------------------------------


def get_or_create_token_key(session: Session, paths: ZkPaths | None = None, *,
                            credentials: ZkCredentials | None = None, tool: bool = False) -> bytes:
    """The cluster's token key, created (random, private ACL) if there is none yet.  Blocking:
    call it where the caller may wait on ZooKeeper (a broker's start).  ``credentials``: the
    session's (default ``session.credentials``); without any the key node would be readable by
    anyone, so CoordinationError.  AuthorizationError when ZooKeeper refuses (other
    credentials); CoordinationError when the node holds something other than a key.

    A key is trusted only when its node has had exactly the private ACL since it was created
    (ACL version 0): one found otherwise (planted before ZooKeeper ACLs were on, opened by
    someone, or its ACL set again by hand) may be known to others, so it is never used.  A
    broker (``tool`` false: a broker's start, registered already) replaces it by a fresh one
    (:func:`replace_token_key`, conditional on the version read; logged as a WARNING) only when no
    other broker is registered under ``/brokers/ids``: nobody holds the old key then.  With other
    brokers registered (they keep the key they read at their start), and always for a tool
    (``tool`` true), CoordinationError telling the operator to run ``hpbroker zookeeper secure``
    (a broker's start halts on it).  The data and the ACL are read as one state of the node
    (their versions must agree), else read again."""
    credentials = credentials or getattr(session, "credentials", None)
    if credentials is None:
        raise CoordinationError("the token key lives in ZooKeeper only with the cluster's credentials "
                                "(zookeeper_credentials_file)")
    path = (paths or ZkPaths()).token_key
    client = session.client
    private = sorted(private_acl(credentials))
    try:
        for _ in range(_TOKEN_KEY_ATTEMPTS):
            if _create_token_key(client, path, credentials):
                logger.info("created the cluster's token key at %s", path)
            try:
                key, stat_ = client.get(path)
                acl, acl_stat = client.get_acls(path)
            except NoNodeError:
                continue  # replaced or deleted meanwhile: read again
            if (acl_stat.czxid, acl_stat.version, acl_stat.aversion) != (stat_.czxid, stat_.version,
                                                                         stat_.aversion):
                continue  # changed between the two reads
            if sorted(acl) == private and stat_.aversion == 0:
                break
            untrusted = (f"the token key at {path} was not private to the cluster since its creation (ACL "
                         f"{_describe(acl)}, ACL version {stat_.aversion})")
            if tool:
                raise CoordinationError(f"{untrusted}: not using it; run `hpbroker zookeeper secure` (it "
                                        "writes a fresh key), then restart the brokers one at a time")
            others = _other_brokers(client, paths or ZkPaths())
            if others:
                raise CoordinationError(
                    f"{untrusted}, and brokers {others} are running with it: not replacing it under them; "
                    "run `hpbroker zookeeper secure` (it writes a fresh key), then restart the brokers one "
                    "at a time")
            logger.warning("the token key at %s was not private to the cluster since its creation (ACL %s, "
                           "ACL version %d): replacing it with a fresh key; fetch tokens and group "
                           "credentials made with the old one are no longer valid", path,
                           _describe(acl), stat_.aversion)
            replace_token_key(session, path, credentials, version=stat_.version)
        else:
            raise CoordinationError(f"the token key {path} kept changing while it was read")
    except NoAuthError:
        raise refused(f"reading the token key {path}", credentials) from None
    except KazooException as e:  # connection loss, session expired: the caller's orderly error
        raise CoordinationError(f"cannot read the token key {path}: {type(e).__name__} {e}") from None
    if len(key) != TOKEN_KEY_BYTES:
        raise CoordinationError(f"{path} holds {len(key)} bytes, not a {TOKEN_KEY_BYTES}-byte token key")
    return key


def _create_token_key(client: Any, path: str, credentials: ZkCredentials) -> bool:
    """Create the key node with a fresh key (the parent, with the cluster's ACL, when missing);
    False when it exists."""
    try:
        client.create(path, os.urandom(TOKEN_KEY_BYTES), acl=private_acl(credentials))
        return True
    except NodeExistsError:
        return False
    except NoNodeError:  # the parent is missing: create it, with the cluster's ACL
        client.ensure_path(path.rsplit("/", 1)[0], acl=cluster_acl(credentials))
    try:
        client.create(path, os.urandom(TOKEN_KEY_BYTES), acl=private_acl(credentials))
        return True
    except NodeExistsError:
        return False


def replace_token_key(session: Session, path: str, credentials: ZkCredentials, *,
                      version: int = -1) -> bool:
    """Replace the token key node at ``path`` by a fresh key under the private ACL: the node is
    deleted (conditional on ``version``; -1: whatever it holds) and created again, so that no
    moment exists when the fresh key is readable by others, or the old key looks private.
    False when another session changed or replaced it first (the caller reads it again).
    CoordinationError when the node has children (not a key node); NoAuthError propagates."""
    client = session.client
    try:
        client.delete(path, version=version)
    except (BadVersionError, NoNodeError):
        if version != -1:
            return False
    except NotEmptyError:
        raise CoordinationError(f"{path} has children: it is not a token key; delete it (and them) with "
                                "the cluster's credentials") from None
    return _create_token_key(client, path, credentials)


def _other_brokers(client: Any, paths: ZkPaths) -> list[str]:
    """The ids registered under ``/brokers/ids`` by other sessions than ``client``'s (a starting
    broker registers before it reads the token key), sorted."""
    own_session = client.client_id[0] if client.client_id else None
    try:
        children = client.get_children(paths.broker_ids)
    except NoNodeError:
        return []
    others = []
    for child in children:
        stat_ = client.exists(f"{paths.broker_ids}/{child}")
        if stat_ is not None and stat_.ephemeralOwner != own_session:
            others.append(child)
    return sorted(others, key=lambda child: (len(child), child))


def _describe(acl: Iterable[ACL]) -> str:
    return ", ".join(f"{entry.id.scheme}:{entry.id.id}={entry.perms}" for entry in acl) or "empty"


# --- group credentials --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GroupCredentials:
    """What a GroupCredentialsResponse carries: the group's digest user and password, and the
    ids that get all rights on the group's nodes.  ``repr`` hides the password."""

    zookeeper_user: str
    zookeeper_password: str
    acl_ids: tuple[str, ...]

    def __repr__(self) -> str:
        return f"GroupCredentials(zookeeper_user={self.zookeeper_user!r}, acl_ids={self.acl_ids!r})"

    @property
    def credentials(self) -> ZkCredentials:
        return ZkCredentials(self.zookeeper_user, self.zookeeper_password)


def group_credentials(token_key: bytes, group: str, cluster: ZkCredentials) -> GroupCredentials:
    """The group's credentials (module docstring): the same from every broker of the cluster."""
    encoded = group.encode("utf-8")
    user = _GROUP_USER_PREFIX + hashlib.sha256(encoded).hexdigest()[:_GROUP_USER_HEX]
    mac = hmac.new(token_key, _GROUP_LABEL + encoded, hashlib.sha256).digest()
    password = base64.urlsafe_b64encode(mac).rstrip(b"=").decode("ascii")
    return GroupCredentials(user, password, (cluster.id, digest_id(user, password)))


def group_acl(token_key: bytes, group: str, cluster: ZkCredentials) -> list[ACL]:
    """The ACL of ``/consumers/<group>`` and everything under it."""
    return member_acl(group_credentials(token_key, group, cluster).acl_ids)


def issue_group_credentials(session: Session, paths: ZkPaths, token_key: bytes, group: str,
                            cluster: ZkCredentials) -> GroupCredentials:
    """What a broker answers a GroupCredentialsRequest with, once the ACLs allow it: the group's
    credentials, after starting :func:`ensure_group_node` (which does not wait)."""
    issued = group_credentials(token_key, group, cluster)
    ensure_group_node(session, paths, group, member_acl(issued.acl_ids))
    return issued


def tool_group_acl(session: Session, paths: ZkPaths, group: str) -> list[ACL] | None:
    """For a tool that writes a group's nodes (``hpbroker groups reset-offsets``) with the
    cluster's credentials: the group's ACL, with ``/consumers`` (the cluster's ACL) and the
    group's node (the group's) made first if missing; the nodes it then creates stay writable
    by the group's members.  None for a session without credentials (no ACLs).  Blocking."""
    credentials = session.credentials
    if credentials is None:
        return None
    acl = group_acl(get_or_create_token_key(session, paths, tool=True), group, credentials)
    try:
        session.client.ensure_path(paths.consumers)
        with contextlib.suppress(NodeExistsError):
            session.client.create(paths.group(group), b"", acl=acl)
    except NoAuthError:
        raise refused(f"creating {paths.group(group)}", credentials) from None
    return acl


def ensure_group_node(session: Session, paths: ZkPaths, group: str, acl: Sequence[ACL]) -> None:
    """Make ``/consumers/<group>`` exist with ``acl`` (and ``/consumers`` with the session's
    default ACL), without waiting: every step is a kazoo async call chained on kazoo's
    callback thread, so the caller's loop never blocks; a failure is logged, and the member
    that then finds no group node says so.  A group node that exists with another ACL (made
    before security was on) gets ``acl``."""
    client = session.client
    path = paths.group(group)
    acl = list(acl)

    def failed(what: str, error: BaseException) -> None:
        logger.warning("[group %s] could not %s %s: %r", group, what, path, error)

    def acl_checked(result: Any) -> None:
        try:
            current, stat_ = result.get_nowait()
        except Exception as e:
            failed("read the ACL of", e)
            return
        if sorted(current) != sorted(acl):
            client.set_acls_async(path, acl, version=stat_.aversion).rawlink(
                lambda r: _log_failure(r, failed, "set the ACL of"))

    def created(result: Any) -> None:
        try:
            result.get_nowait()
            logger.info("[group %s] created %s with the group's ACL", group, path)
        except NodeExistsError:
            client.get_acls_async(path).rawlink(acl_checked)
        except Exception as e:
            failed("create", e)

    def parent_made(result: Any) -> None:
        try:
            result.get_nowait()
        except Exception as e:
            failed("create the parent of", e)
            return
        client.create_async(path, b"", acl=acl).rawlink(created)

    client.ensure_path_async(paths.consumers).rawlink(parent_made)


def _log_failure(result: Any, failed: Any, what: str) -> None:
    try:
        result.get_nowait()
    except Exception as e:
        failed(what, e)


def wait_for_node(session: Session, path: str, timeout_s: float, what: str) -> None:
    """Wait (at most ``timeout_s``) until ``path`` exists: a group member whose broker created
    its group node asynchronously.  CoordinationError naming ``what`` after that."""
    deadline = time.monotonic() + timeout_s
    delay_s = 0.02
    while session.client.exists(path) is None:
        if time.monotonic() >= deadline:
            raise CoordinationError(f"{path} does not exist after {timeout_s:g} s: {what}")
        time.sleep(delay_s)
        delay_s = min(delay_s * 2, 0.5)


def refused(what: str, credentials: ZkCredentials | None, *,
            remedy: str = "the node's ACL does not allow it (give the cluster's or the group's credentials)"
            ) -> AuthorizationError:
    """The error for ZooKeeper's NoAuth, for every module of ``hpbroker.coord``: what was
    refused, as whom, and ``remedy``."""
    who = "without credentials" if credentials is None else f"as {credentials.user!r}"
    return AuthorizationError(f"ZooKeeper refused {what} {who}: {remedy}")

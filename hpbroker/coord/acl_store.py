"""The cluster's ACLs in ZooKeeper: one znode, read, changed and watched by every broker and tool.

Node ``<root>/acls`` (``ZkPaths.acls``, next to ``brokers`` and ``consumers``), persistent, JSON::

    {"version": 1, "acls": [{"principal": "alice", "operation": "produce",
                             "resource_type": "topic", "pattern_type": "literal", "name": "orders"}, ...]}

``acls`` is sorted and holds each entry once (``AclEntry.to_dict``, ``hpbroker.security.acls``).
A missing node means no ACLs.  Every change is a read followed by a set conditional on the version
read (a create when the node is missing): two tools adding at the same time both land, the
loser of a race reads again and retries.

**Who may write it.**  Whoever writes the node decides every principal's rights, so it must be
the cluster's alone.  Changes need the cluster's ZooKeeper credentials on the session
(``Session.credentials``; InvalidConfigError without them), and the node is created with the
*private* ACL (``hpbroker.coord.zk_security``): only the cluster reads or writes it.  A broker's
:func:`watch_acls` creates it so at start when it is missing, and checks the node's ACL on every
read: a node that anyone but the cluster's digest id may change (the world, another id: made
before ZooKeeper ACLs were on, or by a tool without credentials) is not trusted -- logged
CRITICAL once per change of its ACL, and delivered as no entries (only super users are allowed
anything) until ``hpbroker zookeeper secure`` gives it the private ACL.

An entry this version cannot parse (written by a newer one, say) is skipped with a warning: an
allow rule missing only refuses more.  A node whose JSON does not parse at all is a
CoordinationError to a reader; a watcher keeps what it last had and logs an error.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable
from typing import Any

from kazoo.exceptions import BadVersionError, KazooException, NoAuthError, NodeExistsError, NoNodeError
from kazoo.security import ACL, Permissions

from hpbroker.coord.paths import ZkPaths
from hpbroker.coord.watches import _DataWatch, _start, _wait
from hpbroker.coord.zk_security import ZkCredentials, private_acl, refused
from hpbroker.errors import CoordinationError, InvalidConfigError
from hpbroker.security.acls import AclEntry

__all__ = ["AclsCallback", "add_acls", "decode_acls", "encode_acls", "foreign_writers", "read_acls",
           "remove_acls", "watch_acls"]

logger = logging.getLogger(__name__)

FORMAT_VERSION = 1  # the node's "version" field
_CONFLICT_ATTEMPTS = 50  # lost races in a row before a change gives up
_CLUSTER_ONLY = "only the cluster's credentials may (give --zookeeper-credentials-file)"
_NEEDS_CREDENTIALS = ("changing the ACLs needs the cluster's ZooKeeper credentials, so that their node is "
                      "private to the cluster: give --zookeeper-credentials-file FILE (or "
                      "$HPBROKER_ZOOKEEPER_CREDENTIALS_FILE)")
# the permissions that let an id change a node or what hangs under it
_CHANGES = Permissions.WRITE | Permissions.CREATE | Permissions.DELETE | Permissions.ADMIN

AclsCallback = Callable[[list[AclEntry]], None]


def encode_acls(entries: Iterable[AclEntry]) -> bytes:
    """The node's bytes for ``entries`` (sorted, each once)."""
    unique = sorted({json.dumps(e.to_dict(), sort_keys=True) for e in entries})
    return json.dumps({"version": FORMAT_VERSION, "acls": [json.loads(u) for u in unique]},
                      sort_keys=True).encode()


def decode_acls(data: bytes | None, where: str) -> list[AclEntry]:
    """The entries of the node's ``data`` (None or empty: none).  CoordinationError naming
    ``where`` when it is not the node's JSON; single entries that do not parse are skipped
    (logged)."""
    if not data:
        return []
    try:
        document = json.loads(data)
        listed = document["acls"]
        if not isinstance(listed, list):
            raise TypeError("'acls' is not a list")
    except (ValueError, KeyError, TypeError) as e:
        raise CoordinationError(f"{where} does not hold the ACLs' JSON ({e}); repair it with "
                                "`hpbroker acls` after removing the node") from None
    entries = []
    for item in listed:
        try:
            entries.append(AclEntry.from_dict(item))
        except InvalidConfigError as e:
            logger.warning("[zookeeper] skipped an ACL of %s that does not parse: %s", where, e.message)
    return entries


def foreign_writers(acl: Iterable[ACL], credentials: ZkCredentials | None) -> list[str]:
    """The ids of ``acl`` other than the cluster's digest id (``credentials.id``) that may change
    the node (write, create, delete, or set its ACL), as ``scheme:id``; [] when only the cluster
    may.  Without credentials every id that may change the node is foreign."""
    cluster = None if credentials is None else credentials.id
    return sorted(f"{entry.id.scheme}:{entry.id.id}" for entry in acl
                  if entry.perms & _CHANGES and not (entry.id.scheme == "digest" and entry.id.id == cluster))


def _read(client: Any, path: str) -> tuple[list[AclEntry], int | None]:
    """The entries and the node's version (None: no node)."""
    try:
        data, stat = client.get(path)
    except NoNodeError:
        return [], None
    return decode_acls(data, f"znode {path}"), stat.version


def read_acls(session: Any, paths: ZkPaths | None = None) -> list[AclEntry]:
    """Every ACL entry of the cluster ([] when none was ever added)."""
    path = (paths or ZkPaths()).acls
    credentials = getattr(session, "credentials", None)
    try:
        return _read(session.client, path)[0]
    except NoAuthError:
        raise refused(f"reading {path}", credentials, remedy=_CLUSTER_ONLY) from None
    except KazooException as e:
        raise CoordinationError(f"cannot read the ACLs at {path} in ZooKeeper: {e!r}") from None


def _change(session: Any, paths: ZkPaths | None, change: Callable[[list[AclEntry]], list[AclEntry]]) -> int:
    """Apply ``change`` (old entries -> new entries) with a conditional write; returns how many
    entries the node's set gained or lost."""
    path = (paths or ZkPaths()).acls
    client = session.client
    credentials = getattr(session, "credentials", None)
    if credentials is None:
        raise InvalidConfigError(_NEEDS_CREDENTIALS)
    for _ in range(_CONFLICT_ATTEMPTS):
        try:
            old, version = _read(client, path)
            new = change(old)
            delta = len(set(new) ^ set(old))
            if set(new) == set(old):
                return 0
            if version is None:
                client.create(path, encode_acls(new), acl=private_acl(credentials), makepath=True)
            else:
                client.set(path, encode_acls(new), version=version)
            return delta
        except (BadVersionError, NodeExistsError):
            continue  # changed by someone else since it was read: read again
        except NoAuthError:
            raise refused(f"changing {path}", credentials, remedy=_CLUSTER_ONLY) from None
        except KazooException as e:
            raise CoordinationError(f"cannot change the ACLs at {path} in ZooKeeper: {e!r}") from None
    raise CoordinationError(f"lost {_CONFLICT_ATTEMPTS} races in a row changing the ACLs at {path}")


def add_acls(session: Any, entries: Iterable[AclEntry], paths: ZkPaths | None = None) -> int:
    """Add ``entries``; returns how many were not there yet (adding one twice is no error).
    InvalidConfigError for a session without the cluster's credentials."""
    wanted = list(entries)

    def add(old: list[AclEntry]) -> list[AclEntry]:
        have = set(old)
        return [*old, *(e for e in wanted if e not in have)]

    return _change(session, paths, add)


def remove_acls(session: Any, entries: Iterable[AclEntry], paths: ZkPaths | None = None) -> int:
    """Remove ``entries``; returns how many were there (an absent one is no error).
    InvalidConfigError for a session without the cluster's credentials."""
    unwanted = set(entries)
    return _change(session, paths, lambda old: [e for e in old if e not in unwanted])


def watch_acls(session: Any, callback: AclsCallback, paths: ZkPaths | None = None) -> Any:
    """Call ``callback(entries)`` now and after every change of the ACLs, through
    ``hpbroker.coord.watches``: re-armed after reconnections and expiry; calls after the first
    come from the session's re-arm thread, so a broker hands the entries to its loop.

    With the cluster's credentials on the session, a missing node is created first, empty, with
    the private ACL (blocking; AuthorizationError when ZooKeeper refuses, CoordinationError when
    it fails).  Every read also reads the node's ACL: while anyone but the cluster may change the
    node (:func:`foreign_writers`; without credentials, anyone who may), the callback gets ``[]``
    whatever the node holds (fail closed: super users only), and a CRITICAL names the ids, once
    per change of the ACL.  ``[]`` too while the node does not exist.  A node that does not parse
    is logged and skipped (the previous entries stay in force).  Returns the watch; ``cancel()``
    ends it."""
    path = (paths or ZkPaths()).acls
    client = session.client
    credentials = getattr(session, "credentials", None)
    if credentials is not None:
        try:
            client.create(path, encode_acls([]), acl=private_acl(credentials), makepath=True)
            logger.info("[zookeeper] created %s, private to the cluster, without ACLs", path)
        except NodeExistsError:
            pass
        except NoAuthError:
            raise refused(f"creating {path}", credentials, remedy=_CLUSTER_ONLY) from None
        except KazooException as e:
            raise CoordinationError(f"cannot create the ACLs' node {path} in ZooKeeper: {e!r}") from None
    untrusted: list[list[str] | None] = [None]  # the foreign ids last logged (None: trusted)

    def changed(data: bytes | None, stat: Any, acl: list[ACL] | None) -> None:
        if stat is None:
            callback([])
            return
        writers = foreign_writers(acl or [], credentials)
        if writers:
            if writers != untrusted[0]:
                logger.critical("[zookeeper] %s may be changed by %s, not by the cluster alone: its ACLs are "
                                "ignored, only super users are allowed anything, until `hpbroker zookeeper "
                                "secure` makes it private (then review `hpbroker acls list`)",
                                path, ", ".join(writers))
                untrusted[0] = writers
            callback([])
            return
        if untrusted[0] is not None:
            logger.warning("[zookeeper] %s is private to the cluster again: its ACLs apply", path)
            untrusted[0] = None
        try:
            entries = decode_acls(data, f"znode {path}")
        except CoordinationError as e:
            logger.error("[zookeeper] %s; the ACLs in force stay as they were", e.message)
            return
        callback(entries)

    return _start(client, _AclsWatch(client, path, changed))


class _AclsWatch(_DataWatch):
    """A data watch whose every read also reads the node's ACL: the callback gets ``(data, stat,
    acl)`` (all None while there is no node), again when the data or the ACL's version changed.
    ZooKeeper fires no watch on a change of ACL alone; ``hpbroker zookeeper secure`` writes the
    node's data back after setting its ACL so that brokers read it again."""

    def _read(self, watcher: Any, timeout_s: float | None) -> tuple[object, tuple]:
        key, (data, stat) = super()._read(watcher, timeout_s)
        if stat is None:
            return None, (None, None, None)
        try:
            acl, acl_stat = _wait(self._client.get_acls_async(self.path), timeout_s)
        except NoNodeError:  # deleted since: the deletion's event reads it again
            return None, (None, None, None)
        return (key, acl_stat.aversion), (data, stat, acl)

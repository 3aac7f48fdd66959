"""Setting the ACLs of an existing tree: for a cluster turning ZooKeeper ACLs on (or off), as
Kafka's ``zookeeper-security-migration`` does.  ``hpbroker zookeeper secure`` runs it.

Nodes keep the ACL they were created with, so a cluster whose brokers start with
``zookeeper_credentials_file`` has their new nodes protected and the old ones still
world-writable.  :func:`secure_tree` walks everything under the root (and the chroot node, when
the connect string has one) and sets, by path (``hpbroker.coord.zk_security``):

- ``<root>/acls``: the private ACL;
- ``<root>/consumers/<group>`` and everything below it: that group's ACL;
- every other node: the cluster ACL.

The token key ``<root>/security/token_key`` is never re-ACLed: its value may have been read or
planted by anyone while the tree was open, so it is replaced by a fresh key under the private
ACL first (``zk_security.replace_token_key``), and the groups' ACLs are those of the fresh key.
So every secure run rotates the key: fetch tokens made with the old one are refused once the
brokers have the new one (they read it at start: restart them), and every group's ZooKeeper
credentials change (members take new ones when they join again).  ``unsecure=True`` deletes the
token key instead of opening it (a broker still running with security keeps its copy until it
is restarted; the next to start creates a fresh one).

Brokers ignore an ``acls`` node that anyone but the cluster may change
(``hpbroker.coord.acl_store``); ZooKeeper fires no watch on an ACL change, so after giving
``acls`` the private ACL :func:`secure_tree` writes its data back unchanged (a conditional set):
the brokers read it again, see it private, and apply its entries.  It was open to others until
then, so :attr:`SecureReport.notes` asks the operator to review it (``hpbroker acls list``).

``unsecure=True`` sets ZooKeeper's open ACL everywhere else (turning security off again).
Nodes that already carry the wanted ACL are left alone, so a second run changes nothing; an
ephemeral node created meanwhile by a broker already has its ACL.  The session must hold the
cluster's credentials (a node protected by other credentials is reported, not changed).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kazoo.exceptions import BadVersionError, NoAuthError, NoNodeError
from kazoo.security import OPEN_ACL_UNSAFE

from hpbroker.coord.paths import ZkPaths
from hpbroker.coord.session import Session
from hpbroker.coord.zk_security import (
    TOKEN_KEY_BYTES,
    cluster_acl,
    get_or_create_token_key,
    group_acl,
    private_acl,
    replace_token_key,
)
from hpbroker.errors import CoordinationError

__all__ = ["SecureReport", "secure_tree"]

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class SecureReport:
    """What :func:`secure_tree` did: nodes looked at, changed, and refused (path -> why), and
    notes for the operator (one line each)."""

    seen: int = 0
    changed: list[str] = field(default_factory=list)
    refused: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def secure_tree(session: Session, paths: ZkPaths, *, unsecure: bool = False, dry_run: bool = False,
                progress: Callable[[str], None] | None = None) -> SecureReport:
    """Set the ACL of every node of the cluster's tree (module docstring).  Blocking; meant for
    a tool.  CoordinationError when the session has no credentials and ``unsecure`` is off."""
    credentials = session.credentials
    if credentials is None:
        raise CoordinationError("setting the cluster's ACLs needs the cluster's credentials "
                                "(--zookeeper-credentials-file)")
    client = session.client
    report = SecureReport()
    private = {paths.acls}
    key = _rotate_token_key(session, paths, report, unsecure=unsecure, dry_run=dry_run, progress=progress)
    group_acls: dict[str, list[Any]] = {}

    def wanted(path: str) -> list[Any]:
        if unsecure:
            return list(OPEN_ACL_UNSAFE)
        if path in private:
            return private_acl(credentials)
        prefix = paths.consumers + "/"
        if path.startswith(prefix):
            group = path[len(prefix):].split("/", 1)[0]
            if group not in group_acls:
                assert key is not None
                group_acls[group] = group_acl(key, group, credentials)
            return group_acls[group]
        return cluster_acl(credentials)

    def visit(path: str) -> None:
        report.seen += 1
        if path == paths.token_key:
            return  # replaced (or deleted) above, never re-ACLed
        try:
            current, stat = client.get_acls(path)
            target = wanted(path)
            if sorted(current) != sorted(target):
                if not dry_run:
                    client.set_acls(path, target, version=stat.aversion)
                report.changed.append(path)
                if progress is not None:
                    progress(f"{'would set' if dry_run else 'set'} the ACL of {path}")
                if path == paths.acls and not unsecure:
                    if not dry_run:
                        _touch(client, path)
                    report.notes.append(f"{path} could be changed by others until now: review its entries "
                                        "(`hpbroker acls list`) and remove any you did not add")
            children = client.get_children(path)
        except NoNodeError:
            return  # deleted meanwhile (an ephemeral node whose session ended)
        except NoAuthError:
            report.refused[path] = "ZooKeeper refused: the node is protected by other credentials"
            return
        for child in sorted(children):
            if path == "/" and child == "zookeeper" and session.connect_string.chroot is None:
                continue  # ZooKeeper's own (quotas, config): never hpbroker's to change
            visit(("" if path == "/" else path) + "/" + child)

    if session.connect_string.chroot is not None and paths.root != "/":
        visit_node_only(client, "/", wanted("/"), report, dry_run, progress)  # the chroot itself
    if client.exists(paths.root) is None:
        return report
    visit(paths.root)
    return report


def _rotate_token_key(session: Session, paths: ZkPaths, report: SecureReport, *, unsecure: bool,
                      dry_run: bool, progress: Callable[[str], None] | None) -> bytes | None:
    """Replace the token key by a fresh one (delete it with ``unsecure``; module docstring);
    the key the groups' ACLs are computed with (a random one for a dry run: every group's
    ACL changes), None with ``unsecure``."""
    credentials = session.credentials
    assert credentials is not None
    path = paths.token_key
    exists = session.client.exists(path) is not None
    if unsecure:
        if exists:
            if not dry_run:
                with contextlib.suppress(NoNodeError):
                    session.client.delete(path)
            report.changed.append(path)
            report.notes.append(f"{'would delete' if dry_run else 'deleted'} the token key {path}: brokers "
                                "still running with security keep theirs until they are restarted")
            if progress is not None:
                progress(f"{'would delete' if dry_run else 'deleted'} the token key {path}")
        return None
    if dry_run:
        key = os.urandom(TOKEN_KEY_BYTES)
    else:
        try:
            replace_token_key(session, path, credentials)
        except NoAuthError:
            report.refused[path] = "ZooKeeper refused replacing the token key: its parent is protected by " \
                                   "other credentials"
            return get_or_create_token_key(session, paths)
        key = get_or_create_token_key(session, paths)
    report.changed.append(path)
    report.notes.append(f"{'would write' if dry_run else 'wrote'} a fresh token key at {path}: restart the "
                        "brokers one at a time for them to use it; fetch tokens made with the old key "
                        "are refused (clients fetch new ones), and every group's ZooKeeper credentials "
                        "change (members take new ones when they join again)")
    if progress is not None:
        progress(f"{'would replace' if dry_run else 'replaced'} the token key {path} with a fresh one")
    return key


def _touch(client: Any, path: str) -> None:
    """Write ``path``'s data back unchanged, so that its data watches fire (brokers read the ACLs
    node again after its ACL changed); a node changed or deleted meanwhile fired them already."""
    data, stat = client.get(path)
    with contextlib.suppress(BadVersionError, NoNodeError):
        client.set(path, data, version=stat.version)


def visit_node_only(client: Any, path: str, target: list[Any], report: SecureReport, dry_run: bool,
                    progress: Callable[[str], None] | None) -> None:
    """Set one node's ACL, not its children's (the chroot: other trees may hang there)."""
    report.seen += 1
    try:
        current, stat = client.get_acls(path)
        if sorted(current) != sorted(target):
            if not dry_run:
                client.set_acls(path, target, version=stat.aversion)
            report.changed.append(path)
            if progress is not None:
                progress(f"{'would set' if dry_run else 'set'} the ACL of {path} (the chroot)")
    except NoAuthError:
        report.refused[path] = "ZooKeeper refused: the node is protected by other credentials"

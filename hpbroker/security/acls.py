"""Access control lists: which principal may do what to which resource (docs/SECURITY.md).

Pure model, no I/O: :mod:`hpbroker.coord.acl_store` keeps the entries in ZooKeeper, the
front-end (``hpbroker.workers.frontend``) and the data ports (``hpbroker.security.data_port``)
ask an :class:`Authorizer` built from them.

An :class:`AclEntry` *allows* one principal one operation on the resources its pattern matches.
There are no deny rules: with security on, what no entry allows is refused (Kafka's
``allow.everyone.if.no.acl.found=false``).

- **principal**: a key name (``[A-Za-z0-9._-]{1,100}``, not starting with ``.``), or ``*`` for
  every authenticated principal;
- **resource**: a type (:class:`ResourceType`: topic, group, cluster) and a name.  The cluster's
  only name is ``cluster``;
- **pattern** (:class:`PatternType`): ``literal`` matches the name itself, and the literal name
  ``*`` every resource of the type; ``prefixed`` matches every name starting with it;
- **operation** (:class:`Operation`), valid per type as :data:`OPERATIONS_BY_TYPE` says.

Implications (as Kafka's): produce, consume, create, delete and alter on a resource each imply
describe on it; admin on the cluster allows every operation on every resource; a super user
(``super_users`` setting) is allowed everything without any entry.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from hpbroker.errors import AuthorizationError, InvalidConfigError
from hpbroker.security.keys import KEY_NAME as _PRINCIPAL  # a principal is a key's name

__all__ = [
    "ANY_PRINCIPAL",
    "CLUSTER_NAME",
    "OPERATIONS_BY_TYPE",
    "WILDCARD_NAME",
    "AclEntry",
    "Authorizer",
    "Operation",
    "PatternType",
    "ResourceType",
    "check_principal",
    "denial",
]


class Operation(enum.StrEnum):
    """What a principal does.  The value is the word on the wire, in ZooKeeper and in the CLI."""

    PRODUCE = "produce"  # append to a topic (ProduceRequest)
    CONSUME = "consume"  # read a topic (FetchRequest); join a group and commit its offsets
    CREATE = "create"  # create a topic (CreateTopicRequest, or a produce's auto-create)
    DELETE = "delete"  # delete a topic (DeleteTopicRequest)
    ALTER = "alter"  # change a topic's settings (AlterTopicConfigRequest)
    DESCRIBE = "describe"  # see a topic in metadata, list its offsets
    CLUSTER_ACTION = "cluster_action"  # broker-to-broker: replica fetches
    ADMIN = "admin"  # on the cluster: everything


class ResourceType(enum.StrEnum):
    TOPIC = "topic"
    GROUP = "group"
    CLUSTER = "cluster"


class PatternType(enum.StrEnum):
    LITERAL = "literal"  # the name itself; "*" is every resource of the type
    PREFIXED = "prefixed"  # every name starting with it


ANY_PRINCIPAL = "*"  # an entry's principal that matches every authenticated principal
WILDCARD_NAME = "*"  # a literal name that matches every resource of its type
CLUSTER_NAME = "cluster"  # the one cluster resource's name

# Operations an entry may name, per resource type.
OPERATIONS_BY_TYPE: Mapping[ResourceType, frozenset[Operation]] = {
    ResourceType.TOPIC: frozenset({Operation.PRODUCE, Operation.CONSUME, Operation.CREATE, Operation.DELETE,
                                   Operation.ALTER, Operation.DESCRIBE}),
    ResourceType.GROUP: frozenset({Operation.CONSUME, Operation.DESCRIBE, Operation.DELETE}),
    ResourceType.CLUSTER: frozenset({Operation.CLUSTER_ACTION, Operation.ADMIN}),
}
# Operations that imply describe on the same resource.
_IMPLY_DESCRIBE = frozenset({Operation.PRODUCE, Operation.CONSUME, Operation.CREATE, Operation.DELETE,
                             Operation.ALTER})

_NAME = re.compile(r"[A-Za-z0-9._-]{1,249}")  # a topic or group name, or a prefix of one
_FIELDS = ("principal", "operation", "resource_type", "pattern_type", "name")


def check_principal(principal: object, *, wildcard: bool = True) -> str:
    """``principal`` if it is a key name (or ``*`` where ``wildcard``), else InvalidConfigError."""
    if wildcard and principal == ANY_PRINCIPAL:
        return principal
    if not isinstance(principal, str) or not _PRINCIPAL.fullmatch(principal):
        raise InvalidConfigError(
            f"ACL principal {principal!r} is not a key name: 1 to 100 characters of [A-Za-z0-9._-], "
            f"not starting with '.'{', or * for every principal' if wildcard else ''}")
    return principal


def _enum(kind: type[enum.Enum], value: object, what: str) -> Any:
    try:
        return kind(value)
    except ValueError:
        choices = ", ".join(m.value for m in kind)  # type: ignore[attr-defined]
        raise InvalidConfigError(f"ACL {what} {value!r} is not one of: {choices}") from None


@dataclass(frozen=True, slots=True)
class AclEntry:
    """One allow rule (module docstring).  Fields are checked on construction (InvalidConfigError
    naming the field); strings are accepted for the enum fields and turned into members."""

    principal: str
    operation: Operation
    resource_type: ResourceType
    pattern_type: PatternType
    name: str

    def __post_init__(self) -> None:
        check_principal(self.principal)
        resource_type = _enum(ResourceType, self.resource_type, "resource type")
        operation = _enum(Operation, self.operation, "operation")
        pattern_type = _enum(PatternType, self.pattern_type, "pattern type")
        object.__setattr__(self, "resource_type", resource_type)
        object.__setattr__(self, "operation", operation)
        object.__setattr__(self, "pattern_type", pattern_type)
        allowed = OPERATIONS_BY_TYPE[resource_type]
        if operation not in allowed:
            raise InvalidConfigError(
                f"ACL operation {operation.value!r} does not apply to a {resource_type.value}; a "
                f"{resource_type.value} takes: {', '.join(sorted(o.value for o in allowed))}")
        name = self.name
        if resource_type is ResourceType.CLUSTER:
            if name != CLUSTER_NAME or pattern_type is not PatternType.LITERAL:
                raise InvalidConfigError(f"an ACL on the cluster names it literally as {CLUSTER_NAME!r}, "
                                         f"got {pattern_type.value} {name!r}")
        elif name == WILDCARD_NAME:
            if pattern_type is not PatternType.LITERAL:
                raise InvalidConfigError(f"the {resource_type.value} name '*' (every {resource_type.value}) "
                                         "is literal, never a prefix")
        elif not isinstance(name, str) or not _NAME.fullmatch(name) or \
                (pattern_type is PatternType.LITERAL and name in (".", "..")):
            raise InvalidConfigError(
                f"ACL {resource_type.value} {'prefix' if pattern_type is PatternType.PREFIXED else 'name'} "
                f"{name!r} is not valid: 1 to 249 characters of [A-Za-z0-9._-], or '*' for every "
                f"{resource_type.value}")

    def matches(self, resource_type: ResourceType, name: str) -> bool:
        """Whether this entry's resource pattern covers resource ``name`` of ``resource_type``."""
        if resource_type is not self.resource_type:
            return False
        if self.pattern_type is PatternType.PREFIXED:
            return name.startswith(self.name)
        return self.name == name or self.name == WILDCARD_NAME

    def to_dict(self) -> dict[str, str]:
        """JSON-able form (ZooKeeper's ``acls`` node, the workers' security state)."""
        return {"principal": self.principal, "operation": self.operation.value,
                "resource_type": self.resource_type.value, "pattern_type": self.pattern_type.value,
                "name": self.name}

    @classmethod
    def from_dict(cls, data: object) -> AclEntry:
        """The entry :meth:`to_dict` wrote; InvalidConfigError when a field is missing or wrong."""
        if not isinstance(data, Mapping):
            raise InvalidConfigError(f"an ACL entry must be an object, got {data!r}")
        missing = [f for f in _FIELDS if f not in data]
        if missing:
            raise InvalidConfigError(f"ACL entry {dict(data)!r} lacks {', '.join(missing)}")
        return cls(**{f: data[f] for f in _FIELDS})

    def describe(self) -> str:
        """One line for people: ``alice may produce on topic prefix 'orders.'``."""
        who = "every principal" if self.principal == ANY_PRINCIPAL else self.principal
        if self.resource_type is ResourceType.CLUSTER:
            where = "the cluster"
        elif self.name == WILDCARD_NAME:
            where = f"every {self.resource_type.value}"
        elif self.pattern_type is PatternType.PREFIXED:
            where = f"{self.resource_type.value}s starting with {self.name!r}"
        else:
            where = f"{self.resource_type.value} {self.name!r}"
        return f"{who} may {self.operation.value} on {where}"


def _phrase(operation: Operation, resource_type: ResourceType, name: str) -> str:
    """``produce to topic 'orders'``: the operation and resource of a refusal, in words."""
    if resource_type is ResourceType.CLUSTER:
        return f"{operation.value} on the cluster"
    resource = f"{resource_type.value} {name!r}"
    if operation is Operation.PRODUCE:
        return f"produce to {resource}"
    if operation is Operation.CONSUME:
        return f"consume from {resource}" if resource_type is ResourceType.TOPIC else f"consume in {resource}"
    return f"{operation.value} {resource}"


class Authorizer:
    """Answers "may ``principal`` do ``operation`` on this resource?" from a fixed set of entries
    and super users.  Immutable: a change of ACLs builds a new one.  Cost of a check: the
    entries of the principal and of ``*``, no more."""

    def __init__(self, entries: Iterable[AclEntry] = (), super_users: Iterable[str] = ()) -> None:
        self.entries: tuple[AclEntry, ...] = tuple(dict.fromkeys(entries))
        self.super_users = frozenset(super_users)
        self._by_principal: dict[str, list[AclEntry]] = {}
        for entry in self.entries:
            self._by_principal.setdefault(entry.principal, []).append(entry)

    def _entries_of(self, principal: str) -> Iterable[AclEntry]:
        own = self._by_principal.get(principal, ())
        anyone = self._by_principal.get(ANY_PRINCIPAL, ())
        return (*own, *anyone) if anyone else own

    def allows(self, principal: str | None, operation: Operation | str, resource_type: ResourceType | str,
               name: str) -> bool:
        """Whether an entry (or super-user status) allows it; an unauthenticated principal
        (None or empty) is allowed nothing."""
        if not principal:
            return False
        if principal in self.super_users:
            return True
        operation = Operation(operation)
        resource_type = ResourceType(resource_type)
        for entry in self._entries_of(principal):
            if entry.operation is Operation.ADMIN:
                return True
            if (entry.operation is operation
                    or (operation is Operation.DESCRIBE and entry.operation in _IMPLY_DESCRIBE)) \
                    and entry.matches(resource_type, name):
                return True
        return False

    def allows_any(self, principal: str | None, operation: Operation | str) -> bool:
        """Whether some entry allows ``operation`` on some resource (a producer id is handed to
        a principal that may produce somewhere): an entry naming it, admin, or a super user."""
        if not principal:
            return False
        if principal in self.super_users:
            return True
        operation = Operation(operation)
        return any(e.operation is operation or e.operation is Operation.ADMIN
                   for e in self._entries_of(principal))

    def check(self, principal: str | None, operation: Operation | str, resource_type: ResourceType | str,
              name: str) -> AuthorizationError | None:
        """None when allowed, else the error to answer (code 28), naming principal, operation and
        resource: ``principal 'alice' may not produce to topic 'orders' (no ACL allows it)``."""
        if self.allows(principal, operation, resource_type, name):
            return None
        return AuthorizationError(denial(principal, operation, resource_type, name))


def denial(principal: str | None, operation: Operation | str, resource_type: ResourceType | str,
           name: str) -> str:
    """The message of a refusal (:meth:`Authorizer.check`)."""
    who = f"principal {principal!r}" if principal else "an unauthenticated client"
    what = _phrase(Operation(operation), ResourceType(resource_type), name)
    return f"{who} may not {what} (no ACL allows it)"

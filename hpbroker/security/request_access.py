"""What each request needs from the ACLs (docs/SECURITY.md, "ACLs"), without I/O.

The front-end (``hpbroker.workers.frontend``) and the data ports
(``hpbroker.security.data_port``) ask :func:`required_access` for the (operation, resource type,
name) triples a request needs and refuse it with error 28 unless every one is allowed, so the
two paths cannot disagree on what a fetch or a list-offsets needs.  The requests not listed here
are decided by the front-end (a data port serves only Fetch and ListOffsets):

==========================  =========================================================
request                     needs
==========================  =========================================================
Produce                     produce on the topic (+ create when it creates the topic)
Fetch (a consumer's)        consume on the topic (+ create when it creates the topic)
Fetch (``replica_id`` >= 0) cluster_action on the cluster
ListOffsets                 describe on the topic
CreateTopic                 create on the topic
DeleteTopic                 delete on the topic
AlterTopicConfig            alter on the topic
GroupCredentials            consume on the group
Metadata                    nothing; topics not describable are hidden or get error 28
InitProducerId              produce (or admin) in some ACL of the principal
FetchToken                  nothing: any authenticated principal
==========================  =========================================================
"""

from __future__ import annotations

from typing import Any

from hpbroker.protocol import ApiKey
from hpbroker.security.acls import CLUSTER_NAME, Operation, ResourceType

__all__ = ["Access", "required_access"]

Access = tuple[Operation, ResourceType, str]  # (operation, resource type, resource name)

_TOPIC_OPERATION = {
    ApiKey.PRODUCE: Operation.PRODUCE,
    ApiKey.FETCH: Operation.CONSUME,
    ApiKey.LIST_OFFSETS: Operation.DESCRIBE,
}
_ADMIN_OPERATION = {
    ApiKey.CREATE_TOPIC: Operation.CREATE,
    ApiKey.DELETE_TOPIC: Operation.DELETE,
    ApiKey.ALTER_TOPIC_CONFIG: Operation.ALTER,
}


def required_access(api_key: int, request: Any, *, creates_topic: bool = False) -> tuple[Access, ...]:
    """The triples ``request`` (of ``api_key``) needs, every one of them (table above);
    ``creates_topic``: a produce or fetch that would create its topic.  Empty for the requests
    the front-end decides otherwise."""
    if api_key == ApiKey.FETCH and request.replica_id >= 0:
        return ((Operation.CLUSTER_ACTION, ResourceType.CLUSTER, CLUSTER_NAME),)
    operation = _TOPIC_OPERATION.get(api_key)
    if operation is not None:
        own = (operation, ResourceType.TOPIC, request.topic)
        if creates_topic and api_key != ApiKey.LIST_OFFSETS:
            return own, (Operation.CREATE, ResourceType.TOPIC, request.topic)
        return (own,)
    operation = _ADMIN_OPERATION.get(api_key)
    if operation is not None:
        return ((operation, ResourceType.TOPIC, request.name),)
    if api_key == ApiKey.GROUP_CREDENTIALS:
        return ((Operation.CONSUME, ResourceType.GROUP, request.group),)
    return ()

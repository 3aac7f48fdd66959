"""What each request needs from the ACLs: one table (hpbroker.security.request_access), used by
the front-end and by the data ports' guard alike, so the two paths cannot drift apart."""

from __future__ import annotations

import pytest

from hpbroker import protocol
from hpbroker.errors import AuthorizationError, InvalidRequestError
from hpbroker.protocol import ApiKey
from hpbroker.security.acls import CLUSTER_NAME, AclEntry, Operation, ResourceType
from hpbroker.security.data_port import DataPortGuard
from hpbroker.security.request_access import required_access

FETCH = protocol.FetchRequest("orders", 0, 0)
REPLICA_FETCH = protocol.FetchRequest("orders", 0, 0, replica_id=2)
LIST = protocol.ListOffsetsRequest("orders", 0)


@pytest.mark.parametrize(("api_key", "request_", "needs"), [
    (ApiKey.FETCH, FETCH, ((Operation.CONSUME, ResourceType.TOPIC, "orders"),)),
    (ApiKey.FETCH, REPLICA_FETCH, ((Operation.CLUSTER_ACTION, ResourceType.CLUSTER, CLUSTER_NAME),)),
    (ApiKey.LIST_OFFSETS, LIST, ((Operation.DESCRIBE, ResourceType.TOPIC, "orders"),)),
    (ApiKey.PRODUCE, protocol.ProduceRequest("orders", 0),
     ((Operation.PRODUCE, ResourceType.TOPIC, "orders"),)),
])
def test_required_access_names_what_each_request_needs(api_key, request_, needs):
    assert required_access(api_key, request_) == needs


def _guard(*entries: AclEntry) -> DataPortGuard:
    guard = DataPortGuard()
    guard.update({"enabled": True, "token_key": "00" * 32, "principals": ["alice"], "super_users": [],
                  "acls": [entry.to_dict() for entry in entries]})
    return guard


@pytest.mark.parametrize(("api_key", "request_"), [(ApiKey.FETCH, FETCH), (ApiKey.FETCH, REPLICA_FETCH),
                                                   (ApiKey.LIST_OFFSETS, LIST)])
def test_the_data_port_allows_exactly_what_the_table_asks_for(api_key, request_):
    (operation, resource_type, name), = required_access(api_key, request_)
    assert isinstance(_guard().check("alice", api_key, request_), AuthorizationError)
    entry = AclEntry("alice", operation, resource_type, "literal", name)
    assert _guard(entry).check("alice", api_key, request_) is None


def test_the_data_port_serves_no_other_request():
    guard = _guard(AclEntry("alice", Operation.PRODUCE, ResourceType.TOPIC, "literal", "orders"))
    error = guard.check("alice", ApiKey.PRODUCE, protocol.ProduceRequest("orders", 0))
    assert isinstance(error, InvalidRequestError)

"""A group member asks the connection it is given for the group's ZooKeeper credentials, and only
when that connection carries a key pair (hpbroker.client.group, "Security")."""

from __future__ import annotations

import pytest

from hpbroker import protocol
from hpbroker.client.group import _group_credentials
from hpbroker.coord.zk_security import GroupCredentials
from hpbroker.errors import CoordinationError, InvalidRequestError


class Connection:
    """A stand-in for the consumer's bootstrap connection: records the requests, answers with
    ``answer`` (raised when it is an exception)."""

    address = "127.0.0.1:9092"

    def __init__(self, security: object, answer: object = None) -> None:
        self.security = security
        self.answer = answer
        self.asked: list[protocol.Message] = []

    def call(self, message: protocol.Message, timeout_s: float) -> object:
        self.asked.append(message)
        if isinstance(self.answer, BaseException):
            raise self.answer
        return self.answer


def test_without_a_key_pair_nothing_is_asked():
    connection = Connection(security=None)
    assert _group_credentials(connection, "app", 1.0, "[group app]") is None
    assert connection.asked == []


def test_with_a_key_pair_the_given_connection_is_asked_for_the_groups_credentials():
    answer = protocol.GroupCredentialsResponse(zookeeper_user="group-1", zookeeper_password="secret",
                                               acl_ids=["cluster:x", "group-1:y"])
    connection = Connection(security=object(), answer=answer)
    credentials = _group_credentials(connection, "app", 1.0, "[group app]")
    assert credentials == GroupCredentials("group-1", "secret", ("cluster:x", "group-1:y"))
    assert [type(m) for m in connection.asked] == [protocol.GroupCredentialsRequest]
    assert connection.asked[0].group == "app"


def test_a_broker_without_security_or_zookeeper_lets_the_member_join_without_credentials():
    connection = Connection(security=object(), answer=InvalidRequestError("no ZooKeeper"))
    assert _group_credentials(connection, "app", 1.0, "[group app]") is None


def test_an_answer_without_a_user_or_acl_ids_is_an_error_naming_the_broker():
    connection = Connection(security=object(), answer=protocol.GroupCredentialsResponse())
    with pytest.raises(CoordinationError, match="127.0.0.1:9092 answered the group's credentials without"):
        _group_credentials(connection, "app", 1.0, "[group app]")

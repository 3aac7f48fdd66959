"""The ACL model: entries, their validation, and the Authorizer's decisions."""

from __future__ import annotations

import pytest

from hpbroker.errors import AuthorizationError, InvalidConfigError
from hpbroker.security.acls import AclEntry, Authorizer, Operation, PatternType, ResourceType


def topic(principal, operation, name, pattern="literal"):
    return AclEntry(principal, operation, "topic", pattern, name)


def test_entry_fields_become_enum_members_and_round_trip_through_dict():
    entry = topic("alice", "produce", "orders")
    assert entry.operation is Operation.PRODUCE
    assert entry.resource_type is ResourceType.TOPIC
    assert entry.pattern_type is PatternType.LITERAL
    assert entry.to_dict() == {"principal": "alice", "operation": "produce", "resource_type": "topic",
                               "pattern_type": "literal", "name": "orders"}
    assert AclEntry.from_dict(entry.to_dict()) == entry
    assert entry == AclEntry("alice", Operation.PRODUCE, ResourceType.TOPIC, PatternType.LITERAL, "orders")


@pytest.mark.parametrize(("fields", "words"), [
    (("alice", "write", "topic", "literal", "t"), "operation 'write' is not one of"),
    (("alice", "produce", "queue", "literal", "t"), "resource type 'queue' is not one of"),
    (("alice", "produce", "topic", "glob", "t"), "pattern type 'glob' is not one of"),
    (("", "produce", "topic", "literal", "t"), "principal '' is not a key name"),
    ((".hidden", "produce", "topic", "literal", "t"), "is not a key name"),
    (("a/b", "produce", "topic", "literal", "t"), "is not a key name"),
    (("alice", "produce", "topic", "literal", "bad/name"), "topic name 'bad/name' is not valid"),
    (("alice", "produce", "topic", "literal", ""), "topic name '' is not valid"),
    (("alice", "produce", "topic", "prefixed", "*"), "is literal, never a prefix"),
    (("alice", "produce", "group", "literal", "g"), "'produce' does not apply to a group"),
    (("alice", "cluster_action", "topic", "literal", "t"), "does not apply to a topic"),
    (("alice", "admin", "topic", "literal", "t"), "does not apply to a topic"),
    (("alice", "produce", "cluster", "literal", "cluster"), "does not apply to a cluster"),
    (("alice", "admin", "cluster", "literal", "kafka"), "names it literally as 'cluster'"),
    (("alice", "admin", "cluster", "prefixed", "cluster"), "names it literally as 'cluster'"),
])
def test_invalid_entry_is_refused_naming_what_is_wrong(fields, words):
    with pytest.raises(InvalidConfigError, match=words.replace("*", r"\*").replace("(", r"\(")):
        AclEntry(*fields)


def test_from_dict_names_missing_fields_and_refuses_non_objects():
    with pytest.raises(InvalidConfigError, match="lacks operation, name"):
        AclEntry.from_dict({"principal": "a", "resource_type": "topic", "pattern_type": "literal"})
    with pytest.raises(InvalidConfigError, match="must be an object"):
        AclEntry.from_dict(["alice"])


def test_literal_entry_allows_only_its_topic_and_operation():
    authorizer = Authorizer([topic("alice", "produce", "orders")])
    assert authorizer.allows("alice", "produce", "topic", "orders")
    assert not authorizer.allows("alice", "produce", "topic", "orders2")
    assert not authorizer.allows("alice", "consume", "topic", "orders")
    assert not authorizer.allows("bob", "produce", "topic", "orders")
    assert not authorizer.allows("alice", "consume", "group", "orders")


def test_prefixed_entry_allows_every_name_starting_with_it():
    authorizer = Authorizer([topic("alice", "consume", "orders.", "prefixed")])
    assert authorizer.allows("alice", "consume", "topic", "orders.eu")
    assert authorizer.allows("alice", "consume", "topic", "orders.")
    assert not authorizer.allows("alice", "consume", "topic", "orders")
    assert not authorizer.allows("alice", "consume", "topic", "xorders.eu")


def test_wildcard_name_matches_every_resource_of_its_type_only():
    authorizer = Authorizer([topic("alice", "describe", "*")])
    assert authorizer.allows("alice", "describe", "topic", "anything")
    assert not authorizer.allows("alice", "describe", "group", "anything")


def test_wildcard_principal_matches_every_authenticated_principal_but_not_none():
    authorizer = Authorizer([topic("*", "consume", "public")])
    assert authorizer.allows("alice", "consume", "topic", "public")
    assert authorizer.allows("bob", "consume", "topic", "public")
    assert not authorizer.allows(None, "consume", "topic", "public")
    assert not authorizer.allows("", "consume", "topic", "public")


@pytest.mark.parametrize("operation", ["produce", "consume", "create", "delete", "alter"])
def test_every_topic_operation_implies_describe_on_the_same_topic(operation):
    authorizer = Authorizer([topic("alice", operation, "orders")])
    assert authorizer.allows("alice", "describe", "topic", "orders")
    assert not authorizer.allows("alice", "describe", "topic", "other")


def test_describe_implies_nothing_else():
    authorizer = Authorizer([topic("alice", "describe", "orders")])
    for operation in ("produce", "consume", "create", "delete", "alter"):
        assert not authorizer.allows("alice", operation, "topic", "orders")


def test_group_consume_implies_group_describe():
    authorizer = Authorizer([AclEntry("alice", "consume", "group", "literal", "billing")])
    assert authorizer.allows("alice", "consume", "group", "billing")
    assert authorizer.allows("alice", "describe", "group", "billing")
    assert not authorizer.allows("alice", "consume", "topic", "billing")


def test_cluster_admin_allows_everything_and_cluster_action_only_itself():
    authorizer = Authorizer([AclEntry("ops", "admin", "cluster", "literal", "cluster"),
                             AclEntry("broker-2", "cluster_action", "cluster", "literal", "cluster")])
    for op, rtype, name in (("produce", "topic", "x"), ("delete", "topic", "y"),
                            ("consume", "group", "g"), ("cluster_action", "cluster", "cluster")):
        assert authorizer.allows("ops", op, rtype, name)
    assert authorizer.allows("broker-2", "cluster_action", "cluster", "cluster")
    assert not authorizer.allows("broker-2", "consume", "topic", "x")


def test_super_users_are_allowed_everything_without_entries():
    authorizer = Authorizer([], super_users={"root"})
    assert authorizer.allows("root", "delete", "topic", "orders")
    assert authorizer.allows("root", "cluster_action", "cluster", "cluster")
    assert authorizer.allows_any("root", "produce")
    assert not authorizer.allows("alice", "describe", "topic", "orders")


def test_nothing_is_allowed_without_entries():
    authorizer = Authorizer()
    assert not authorizer.allows("alice", "describe", "topic", "orders")
    assert not authorizer.allows_any("alice", "produce")


def test_allows_any_looks_for_the_operation_anywhere_or_admin():
    authorizer = Authorizer([topic("alice", "produce", "orders.", "prefixed"),
                             topic("*", "consume", "public"),
                             AclEntry("ops", "admin", "cluster", "literal", "cluster")])
    assert authorizer.allows_any("alice", "produce")
    assert authorizer.allows_any("ops", "produce")
    assert not authorizer.allows_any("bob", "produce")
    assert authorizer.allows_any("bob", "consume")


def test_check_names_principal_operation_and_resource():
    authorizer = Authorizer([topic("alice", "consume", "orders")])
    assert authorizer.check("alice", "consume", "topic", "orders") is None
    error = authorizer.check("alice", "produce", "topic", "orders")
    assert isinstance(error, AuthorizationError) and error.code == 28
    assert error.message == "principal 'alice' may not produce to topic 'orders' (no ACL allows it)"
    assert authorizer.check("bob", "consume", "group", "g").message == \
        "principal 'bob' may not consume in group 'g' (no ACL allows it)"
    assert authorizer.check("bob", "consume", "topic", "t").message == \
        "principal 'bob' may not consume from topic 't' (no ACL allows it)"
    assert authorizer.check("bob", "delete", "topic", "t").message == \
        "principal 'bob' may not delete topic 't' (no ACL allows it)"
    assert authorizer.check("b2", "cluster_action", "cluster", "cluster").message == \
        "principal 'b2' may not cluster_action on the cluster (no ACL allows it)"
    assert authorizer.check(None, "describe", "topic", "t").message.startswith("an unauthenticated client")


def test_duplicate_entries_are_kept_once():
    entry = topic("alice", "produce", "orders")
    assert Authorizer([entry, AclEntry.from_dict(entry.to_dict())]).entries == (entry,)


def test_describe_reads_as_a_sentence():
    assert topic("alice", "produce", "orders.", "prefixed").describe() == \
        "alice may produce on topics starting with 'orders.'"
    assert topic("*", "describe", "*").describe() == "every principal may describe on every topic"
    assert AclEntry("ops", "admin", "cluster", "literal", "cluster").describe() == \
        "ops may admin on the cluster"

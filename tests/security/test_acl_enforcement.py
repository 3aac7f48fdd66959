"""ACLs enforced by a real broker with ``security = "curve"`` and ZooKeeper: an allowlisted client
whose ACLs lack a permission gets error 28 and nothing changes (no record appended, no topic
created, deleted or altered); once ``hpbroker acls add`` grants it, the same request succeeds
without a restart.  The client side is pyzmq's CURVE directly; ``ops`` is a super user that looks."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from curve_probe import Keys, Probe, secured_broker
from harness import wait_until

from hpbroker import protocol, records

pytestmark = [pytest.mark.zookeeper, pytest.mark.slow]

WORKERS = 1
NAMES = ["broker", "alice", "ops"]


@pytest.fixture
def secured(tmp_path, zookeeper, chroot):
    """A broker with CURVE, ZooKeeper ACLs and ``ops`` as super user; ``(alice, ops, acls)``
    where ``acls(*args)`` runs ``hpbroker acls ...`` with the cluster's credentials."""
    keys = Keys(tmp_path, NAMES, allowed=NAMES)
    with secured_broker(tmp_path, zookeeper.connect_string + chroot, keys=keys, super_users="ops",
                        workers=WORKERS) as broker:

        def acls(*args: str) -> None:
            done = subprocess.run([sys.executable, "-m", "hpbroker.cli", "acls", *args,
                                   "--zookeeper", broker.connect_string,
                                   "--zookeeper-credentials-file", str(broker.credentials_file)],
                                  capture_output=True, text=True, timeout=60, env=os.environ.copy())
            assert done.returncode == 0, done.stderr

        yield broker.probe("alice"), broker.probe("ops"), acls


def log_end(client: Probe, topic: str) -> int:
    header, body = client.ask(protocol.ListOffsetsRequest(topic, 0, protocol.LATEST_TIMESTAMP))
    assert header.error_code == 0, header.error_message
    return body.offset


def topic_metadata(client: Probe, topic: str) -> protocol.TopicMetadata:
    header, body = client.ask(protocol.MetadataRequest([topic]))
    assert header.error_code == 0
    return body.topics[0]


def succeeds_once_allowed(client: Probe, message: protocol.Message, what: str):
    """Send ``message`` until it is no longer refused (the brokers take a new ACL from their
    ZooKeeper watch, moments after it is written); every refused try is error 28 (or 17,
    retriable: a producer id block not taken yet)."""
    answers = []

    def allowed() -> bool:
        header, body = client.ask(message)
        answers.append((header, body))
        assert header.error_code in (0, 17, 28), header.error_message
        return header.error_code == 0

    wait_until(allowed, 20, interval_s=0.1, what=what)
    return answers[-1]


def test_requests_without_acls_are_refused_and_change_nothing_until_acls_allow_them(secured):
    alice, ops, acls = secured

    # create: refused, no topic; allowed once the ACL is added
    header, _ = alice.ask(protocol.CreateTopicRequest("orders", 1))
    assert header.error_code == 28
    assert header.error_message == "principal 'alice' may not create topic 'orders' (no ACL allows it)"
    assert topic_metadata(ops, "orders").error_code == 6
    acls("add", "--principal", "alice", "--operation", "create", "--topic", "orders")
    succeeds_once_allowed(alice, protocol.CreateTopicRequest("orders", 1), "alice's create to be allowed")
    wait_until(lambda: topic_metadata(ops, "orders").error_code == 0, 20, what="the topic to exist")
    end = log_end(ops, "orders")

    # produce: refused, nothing appended; allowed once the ACL is added
    produce = protocol.ProduceRequest("orders", 0, acks=1,
                                      payload=records.build_batch([b"a", b"b"], producer="acl-test"))
    header, _ = alice.ask(produce)
    assert header.error_code == 28
    assert header.error_message == "principal 'alice' may not produce to topic 'orders' (no ACL allows it)"
    assert log_end(ops, "orders") == end
    acls("add", "--principal", "alice", "--operation", "produce", "--topic-prefix", "ord")
    succeeds_once_allowed(alice, produce, "alice's produce to be allowed")
    assert log_end(ops, "orders") == end + 2

    # alter and delete: refused, the topic unchanged and still there
    alter = protocol.AlterTopicConfigRequest("orders", [protocol.TopicConfigEntry("retention_ms", "60000")])
    header, _ = alice.ask(alter)
    assert header.error_code == 28 and "may not alter topic 'orders'" in header.error_message
    header, _ = alice.ask(protocol.DeleteTopicRequest("orders"))
    assert header.error_code == 28 and "may not delete topic 'orders'" in header.error_message
    metadata = topic_metadata(ops, "orders")
    assert metadata.error_code == 0
    assert "retention_ms" not in {entry.key for entry in metadata.configs}

    # metadata: alice sees what she may describe (produce and create imply it), nothing else
    header, _ = ops.ask(protocol.CreateTopicRequest("payroll", 1))
    assert header.error_code == 0
    _, body = alice.ask(protocol.MetadataRequest([]))
    assert [t.name for t in body.topics] == ["orders"]
    assert topic_metadata(alice, "payroll").error_code == 28

    # removing the ACL takes the permission back, without a restart either
    acls("remove", "--principal", "alice", "--operation", "produce", "--topic-prefix", "ord")
    wait_until(lambda: alice.ask(produce)[0].error_code == 28, 20, interval_s=0.1,
               what="alice's produce to be refused again")


def test_fetch_token_group_credentials_and_producer_ids_follow_the_acls(secured):
    alice, ops, acls = secured
    header, body = alice.ask(protocol.FetchTokenRequest())
    assert header.error_code == 0 and body.principal == "alice" and body.token and body.expires_at_ms > 0

    header, body = alice.ask(protocol.GroupCredentialsRequest("billing"))
    assert header.error_code == 28
    assert header.error_message == "principal 'alice' may not consume in group 'billing' (no ACL allows it)"
    assert body.zookeeper_password == ""
    header, body = alice.ask(protocol.InitProducerIdRequest())
    assert header.error_code == 28 and "may not produce to any topic" in header.error_message

    acls("add", "--principal", "alice", "--operation", "consume", "--group", "billing")
    _, body = succeeds_once_allowed(alice, protocol.GroupCredentialsRequest("billing"),
                                    "alice's group credentials to be allowed")
    assert body.zookeeper_user.startswith("group-") and body.zookeeper_password and len(body.acl_ids) == 2
    acls("add", "--principal", "alice", "--operation", "produce", "--topic", "orders")
    _, body = succeeds_once_allowed(alice, protocol.InitProducerIdRequest(),
                                    "alice's producer id to be allowed")
    assert body.producer_id >= 0


def test_a_standalone_secured_broker_allows_only_its_super_users(tmp_path):
    keys = Keys(tmp_path, NAMES, allowed=NAMES)
    with secured_broker(tmp_path, keys=keys, super_users="ops", workers=WORKERS) as broker:
        alice, ops = broker.probe("alice"), broker.probe("ops")
        header, _ = alice.ask(protocol.CreateTopicRequest("orders", 1))
        assert header.error_code == 28
        assert topic_metadata(ops, "orders").error_code == 6
        assert ops.ask(protocol.CreateTopicRequest("orders", 1))[0].error_code == 0
        assert alice.ask(protocol.MetadataRequest([]))[1].topics == []
        assert [t.name for t in ops.ask(protocol.MetadataRequest([]))[1].topics] == ["orders"]
        wait_until(lambda: "refused: principal 'alice' may not create topic 'orders'" in broker.process.log(),
                   what="the refusal logged")

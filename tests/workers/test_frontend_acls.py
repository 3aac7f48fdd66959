"""The front-end's ACL checks, driven request by request over real ZeroMQ sockets (inproc): a
refused request is answered with error 28 and neither relayed to its worker nor applied to the
topic store; an allowed one goes on as without security.  The broker's security object is a
stand-in whose principal is set by the test (a real CURVE handshake is the end-to-end tests'
business); its decisions are the real Authorizer's."""

from __future__ import annotations

import itertools
import os

import pytest
import zmq

from hpbroker import protocol
from hpbroker.broker.config import BrokerConfig
from hpbroker.broker.topics import TopicStore
from hpbroker.errors import AuthorizationError, CoordinationError, InvalidRequestError
from hpbroker.security.acls import AclEntry, Authorizer
from hpbroker.workers import backend
from hpbroker.workers.frontend import Frontend
from hpbroker.workers.slots import Slot, SlotState

_ids = itertools.count()


class StandinSecurity:
    """What the front-end uses of ``hpbroker.security.broker.BrokerSecurity``."""

    def __init__(self, *, enabled: bool = True, principal: str = "alice") -> None:
        self.enabled = enabled
        self.principal = principal
        self.authorizer = Authorizer()
        self.issued: list[str] = []
        self.pending = False  # the ACLs not read yet

    def allow(self, *entries: AclEntry) -> None:
        self.authorizer = Authorizer([*self.authorizer.entries, *entries])

    def principal_of(self, frame: zmq.Frame) -> str | None:
        assert isinstance(frame, zmq.Frame)
        return self.principal

    def authorize(self, principal, operation, resource_type, name):
        pending = self.acls_pending(principal)
        return pending or self.authorizer.check(principal, operation, resource_type, name)

    def acls_pending(self, principal):
        return CoordinationError("ACLs not loaded yet") if self.pending else None

    def revoked(self, principal):
        return None  # the principal stays on the allowlist (revocation: tests/security)

    def allows_any(self, principal, operation) -> bool:
        return self.authorizer.allows_any(principal, operation)

    def mint_token(self, principal: str) -> tuple[str, int]:
        self.issued.append(principal)
        return f"token-of-{principal}", 123

    def group_credentials(self, group: str):
        from types import SimpleNamespace

        return SimpleNamespace(zookeeper_user=f"group-{group}", zookeeper_password="secret",
                               acl_ids=("a:1", "b:2"))


class Rig:
    """A Frontend with one serving slot, a client DEALER on its front ROUTER and a worker DEALER
    on its back ROUTER."""

    def __init__(self, tmp_path, security, clock=None, **config) -> None:
        n = next(_ids)
        self.context = zmq.Context()
        self.front = self.context.socket(zmq.ROUTER)
        self.front.bind(f"inproc://front-{n}")
        self.back = self.context.socket(zmq.ROUTER)
        self.back.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.back.bind(f"inproc://back-{n}")
        self.client = self.context.socket(zmq.DEALER)
        self.client.connect(f"inproc://front-{n}")
        self.worker = self.context.socket(zmq.DEALER)
        self.worker.setsockopt(zmq.ROUTING_ID, backend.worker_identity(0))
        self.worker.connect(f"inproc://back-{n}")
        self.worker.send(b"hello")  # the back ROUTER knows the worker's identity once this arrives
        assert self.back.poll(5000)
        self.back.recv_multipart()
        data_dir = tmp_path / "data"
        data_dir.mkdir(parents=True)
        self.store = TopicStore(data_dir)
        self.config = BrokerConfig(data_dir=str(data_dir), workers=1, **config)
        slot = Slot(0, state=SlotState.SERVING, pid=os.getpid())
        options = {} if clock is None else {"clock": clock}
        self.frontend = Frontend(self.config, self.store, [slot], str(tmp_path), admin_timeout_s=5.0,
                                 **options)
        self.frontend.security = security
        self.frontend.attach(self.front, self.back)
        self.correlation = itertools.count(1)

    def send(self, message: protocol.Message) -> int:
        correlation_id = next(self.correlation)
        self.client.send_multipart(protocol.encode_request(message, correlation_id))
        assert self.front.poll(5000)
        self.frontend.on_request(self.front.recv_multipart(copy=False))
        return correlation_id

    def answer(self, message: protocol.Message):
        correlation_id = self.send(message)
        assert self.client.poll(5000), "no answer"
        header, body = protocol.decode_response(message.API_KEY, self.client.recv_multipart())
        assert header.correlation_id == correlation_id
        return header, body

    def relayed(self) -> int | None:
        """The correlation id of the next request relayed to the worker (None: none within 1 s)."""
        while self.worker.poll(1000):
            message = backend.decode(self.worker.recv_multipart())
            if isinstance(message, backend.Relay):
                return protocol.decode_request(message.frames)[0].correlation_id
        return None

    def close(self) -> None:
        for sock in (self.client, self.worker, self.front, self.back):
            sock.close(linger=0)
        self.context.term()


@pytest.fixture
def rig(tmp_path):
    made: list[Rig] = []

    def make(security=None, **config) -> Rig:
        made.append(Rig(tmp_path / str(len(made)), security, **config))
        return made[-1]

    yield make
    for r in made:
        r.close()


def produce(topic="orders", acks=1) -> protocol.ProduceRequest:
    return protocol.ProduceRequest(topic, 0, acks=acks, payload=b"")


def topic_acl(operation, name, principal="alice", pattern="literal") -> AclEntry:
    return AclEntry(principal, operation, "topic", pattern, name)


def test_produce_without_acl_is_refused_and_not_relayed_until_an_acl_allows_it(rig):
    security = StandinSecurity()
    r = rig(security)
    r.store.create("orders", 1)
    header, _ = r.answer(produce())
    assert header.error_code == AuthorizationError.code
    assert header.error_message == "principal 'alice' may not produce to topic 'orders' (no ACL allows it)"
    assert r.frontend.error_counts == {(protocol.ApiKey.PRODUCE, 28): 1}
    security.allow(topic_acl("produce", "orders"))
    allowed = r.send(produce())
    assert r.relayed() == allowed  # the refused one never reached the worker: this is the first


def test_until_the_acls_are_read_every_request_gets_a_retriable_error_not_a_refusal(rig):
    security = StandinSecurity()
    security.pending = True
    r = rig(security)
    r.store.create("orders", 1)
    for message in (produce(), protocol.MetadataRequest(["orders"]), protocol.InitProducerIdRequest(),
                    protocol.FetchTokenRequest()):
        header, _ = r.answer(message)
        assert header.error_code == CoordinationError.code, message
        assert "ACLs not loaded yet" in header.error_message
    assert security.issued == []
    security.pending = False
    security.allow(topic_acl("produce", "orders"))
    allowed = r.send(produce())
    assert r.relayed() == allowed  # the one asked while the ACLs were unknown never reached the worker


def test_a_refused_acks_0_produce_is_counted_but_not_answered_nor_relayed(rig):
    security = StandinSecurity()
    r = rig(security)
    r.store.create("orders", 1)
    r.send(produce(acks=0))
    assert r.frontend.error_counts == {(protocol.ApiKey.PRODUCE, 28): 1}
    security.allow(topic_acl("produce", "orders"))
    allowed = r.send(produce(acks=0))
    assert r.relayed() == allowed
    assert not r.client.poll(0)


def test_fetch_needs_consume_and_a_replica_fetch_needs_cluster_action(rig):
    security = StandinSecurity(principal="broker-1")
    r = rig(security)
    r.store.create("orders", 1)
    consumer_fetch = protocol.FetchRequest("orders", 0, 0)
    replica_fetch = protocol.FetchRequest("orders", 0, 0, replica_id=1)
    assert r.answer(consumer_fetch)[0].error_message == \
        "principal 'broker-1' may not consume from topic 'orders' (no ACL allows it)"
    assert r.answer(replica_fetch)[0].error_message == \
        "principal 'broker-1' may not cluster_action on the cluster (no ACL allows it)"
    security.allow(AclEntry("broker-1", "cluster_action", "cluster", "literal", "cluster"))
    assert r.answer(consumer_fetch)[0].error_code == 28
    allowed = r.send(replica_fetch)
    assert r.relayed() == allowed


def test_list_offsets_needs_describe_which_consume_implies(rig):
    security = StandinSecurity()
    r = rig(security)
    r.store.create("orders", 1)
    request = protocol.ListOffsetsRequest("orders", 0, -1)
    assert r.answer(request)[0].error_code == 28
    security.allow(topic_acl("consume", "ord", pattern="prefixed"))
    allowed = r.send(request)
    assert r.relayed() == allowed


def test_a_produce_that_would_create_its_topic_also_needs_create(rig):
    security = StandinSecurity()
    r = rig(security, auto_create_topics=True)
    security.allow(topic_acl("produce", "*"))
    header, _ = r.answer(produce("fresh"))
    assert header.error_message == "principal 'alice' may not create topic 'fresh' (no ACL allows it)"
    assert r.store.get("fresh") is None


def test_create_delete_and_alter_refused_leave_the_store_as_it_was(rig):
    security = StandinSecurity()
    r = rig(security)
    r.store.create("orders", 1)
    version = r.store.version
    assert r.answer(protocol.CreateTopicRequest("new", 1))[0].error_message == \
        "principal 'alice' may not create topic 'new' (no ACL allows it)"
    assert r.answer(protocol.DeleteTopicRequest("orders"))[0].error_message == \
        "principal 'alice' may not delete topic 'orders' (no ACL allows it)"
    alter = protocol.AlterTopicConfigRequest("orders", [protocol.TopicConfigEntry("retention_ms", "1000")])
    assert r.answer(alter)[0].error_message == \
        "principal 'alice' may not alter topic 'orders' (no ACL allows it)"
    assert r.store.version == version
    assert r.store.get("new") is None
    assert not r.store.get("orders").deleting and "retention_ms" not in r.store.get("orders").config
    assert r.relayed() is None  # and no worker was told anything


def test_metadata_lists_only_describable_topics_and_names_the_others_with_error_28(rig):
    security = StandinSecurity()
    r = rig(security)
    for name in ("orders", "payments", "logs.app"):
        r.store.create(name, 1)
    security.allow(topic_acl("describe", "orders"), topic_acl("consume", "logs.", pattern="prefixed"))
    header, body = r.answer(protocol.MetadataRequest([]))
    assert header.error_code == 0
    assert [t.name for t in body.topics] == ["logs.app", "orders"]
    _, body = r.answer(protocol.MetadataRequest(["orders", "payments", "nosuch"]))
    assert [(t.name, t.error_code, len(t.partitions)) for t in body.topics] == \
        [("orders", 0, 1), ("payments", 28, 0), ("nosuch", 28, 0)]


def test_init_producer_id_needs_produce_somewhere(rig):
    security = StandinSecurity()
    r = rig(security)
    header, _ = r.answer(protocol.InitProducerIdRequest())
    assert header.error_message == \
        "principal 'alice' may not produce to any topic, so it gets no producer id (no ACL allows it)"
    security.allow(topic_acl("produce", "x.", pattern="prefixed"))
    assert r.answer(protocol.InitProducerIdRequest())[0].error_code == 17  # past the check: no ids yet


def test_fetch_token_is_issued_to_the_principal_with_security_and_refused_without(rig):
    security = StandinSecurity()
    header, body = rig(security).answer(protocol.FetchTokenRequest())
    assert (header.error_code, body.token, body.principal, body.expires_at_ms) == \
        (0, "token-of-alice", "alice", 123)
    for off in (None, StandinSecurity(enabled=False)):
        header, body = rig(off).answer(protocol.FetchTokenRequest())
        assert header.error_code == InvalidRequestError.code and body.token == ""
        assert "security = 'curve'" in header.error_message


def test_group_credentials_need_consume_on_the_group(rig):
    security = StandinSecurity()
    r = rig(security)
    request = protocol.GroupCredentialsRequest("billing")
    assert r.answer(request)[0].error_message == \
        "principal 'alice' may not consume in group 'billing' (no ACL allows it)"
    security.allow(AclEntry("alice", "consume", "group", "literal", "billing"))
    header, body = r.answer(request)
    assert (header.error_code, body.zookeeper_user, body.zookeeper_password, body.acl_ids) == \
        (0, "group-billing", "secret", ["a:1", "b:2"])
    assert rig(None).answer(request)[0].error_code == InvalidRequestError.code


def test_a_disabled_security_object_serves_as_a_broker_without_security(rig):
    r = rig(StandinSecurity(enabled=False))
    r.store.create("orders", 1)
    allowed = r.send(produce())
    assert r.relayed() == allowed
    assert [t.name for t in r.answer(protocol.MetadataRequest([]))[1].topics] == ["orders"]


def test_authenticate_on_the_front_end_is_answered_with_error_10(rig):
    header, _ = rig(None).answer(protocol.AuthenticateRequest("t"))
    assert header.error_code == InvalidRequestError.code
    assert "data ports only" in header.error_message


def test_refusals_are_logged_at_most_once_per_interval_with_a_count_of_the_rest(rig, caplog):
    now = [100.0]
    r = rig(StandinSecurity(), clock=lambda: now[0])
    r.store.create("orders", 1)
    caplog.set_level("INFO", logger="hpbroker.workers.frontend_security")
    for at in (100.0, 101.0, 102.0, 111.0):
        now[0] = at
        assert r.answer(produce())[0].error_code == 28
    lines = [rec.getMessage() for rec in caplog.records if "refused" in rec.getMessage()]
    assert lines == [
        "[arbiter] refused: principal 'alice' may not produce to topic 'orders' (no ACL allows it)",
        "[arbiter] refused: principal 'alice' may not produce to topic 'orders' (no ACL allows it) "
        "(and 2 more since the last such line)",
    ]
    assert r.frontend.error_counts == {(protocol.ApiKey.PRODUCE, 28): 4}

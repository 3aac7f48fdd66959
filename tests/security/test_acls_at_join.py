"""A secured broker joining ZooKeeper: the requests that wait while it joins are judged by the
ACLs stored there, never refused (28, final) because they were not read yet; while the ACLs
are unknown the answer is 17 (retriable).  The arbiter's own start steps, in this process, with
a real ZooKeeper and a real CURVE front-end on 127.0.0.1; no worker is forked."""

from __future__ import annotations

import dataclasses

import pytest
import zmq
from curve_probe import Probe, make_keys
from harness import free_ports

from hpbroker import protocol
from hpbroker.broker.config import BrokerConfig
from hpbroker.coord.acl_store import add_acls
from hpbroker.coord.session import connect
from hpbroker.coord.zk_security import load_credentials
from hpbroker.errors import (
    AuthenticationError,
    AuthorizationError,
    CoordinationError,
    UnknownTopicOrPartitionError,
)
from hpbroker.security.acls import AclEntry
from hpbroker.security.broker import BrokerSecurity
from hpbroker.workers.arbiter import Arbiter


@pytest.fixture
def cluster(tmp_path, zookeeper, chroot):
    """(config, keys, cluster session) of a secured broker in ``chroot``."""
    keys = make_keys(tmp_path)
    credentials_file = tmp_path / "zookeeper.credentials"
    credentials_file.write_text("hpbroker:cluster-secret\n")
    credentials_file.chmod(0o600)
    port = free_ports(2)
    config = BrokerConfig(data_dir=str(tmp_path / "data"), port=port, fetch_port=port + 1, workers=1,
                          security="curve", server_key_file=str(keys.secrets / "broker.key_secret"),
                          allowlist_dir=str(keys.allowlist), super_users="bob",
                          zookeeper=zookeeper.connect_string + chroot,
                          zookeeper_credentials_file=str(credentials_file))
    session = connect(config.zookeeper, session_timeout_s=10.0,
                      credentials=load_credentials(credentials_file))
    try:
        yield config, keys, session
    finally:
        session.client.delete("/", recursive=True)
        session.close()


def test_a_request_sent_while_the_broker_joins_is_judged_by_the_stored_acls(cluster):
    config, keys, session = cluster
    add_acls(session, [AclEntry("alice", "describe", "topic", "literal", "orders")])
    arbiter = Arbiter(config)
    context = zmq.Context()
    probe = None
    try:
        arbiter._setup()
        arbiter._open_sockets()  # bound: clients connect and send before ZooKeeper is joined
        probe = Probe(context, config.port, keys.pair("broker")[0], keys.pair("alice"))
        probe.socket.send_multipart(protocol.encode_request(protocol.MetadataRequest(["orders"]), 2, "probe"))
        assert arbiter._front.poll(10_000), "the request never reached the front-end"
        assert arbiter._join_zookeeper()
        arbiter._drain_frontend()  # what the loop does first
        answers = []
        while len(answers) < 2 and probe.socket.poll(10_000):
            answers.append(protocol.decode_response(protocol.ApiKey.METADATA, probe.socket.recv_multipart()))
        assert len(answers) == 2, "no answer to the requests sent during the join"
        for header, response in answers:
            assert header.error_code == 0
            assert all(topic.error_code != AuthorizationError.code for topic in response.topics)
        (header, response), = [a for a in answers if a[0].correlation_id == 2]
        (described,) = response.topics
        assert described.name == "orders"
        assert described.error_code == UnknownTopicOrPartitionError.code  # described: it does not exist
    finally:
        if probe is not None:
            probe.close()
        arbiter._stopping = True
        arbiter._cleanup()
        context.destroy(linger=0)


def test_until_the_acls_are_read_requests_get_a_retriable_error(cluster):
    config, _, _ = cluster
    security = BrokerSecurity(config)
    error = security.authorize("alice", "describe", "topic", "orders")
    assert isinstance(error, CoordinationError) and error.retriable and "ACLs not loaded yet" in error.message
    assert security.authorize("bob", "describe", "topic", "orders") is None  # a super user needs none
    assert isinstance(security.authorize("mallory", "describe", "topic", "orders"), AuthenticationError)
    security.set_acls([])
    assert isinstance(security.authorize("alice", "describe", "topic", "orders"), AuthorizationError)
    standalone = BrokerSecurity(dataclasses.replace(config, zookeeper="", zookeeper_credentials_file=""))
    assert isinstance(standalone.authorize("alice", "describe", "topic", "orders"), AuthorizationError)

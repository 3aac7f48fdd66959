"""Admin requests and bootstrap fail-over: a request goes to the next broker only when the one
asked never took it; a broker's answer, whatever its error, is the outcome.  A create that had
no answer (it may have created the topic) goes on to the next broker, and a TopicAlreadyExists
then is checked against the topic: the one asked for is success.  Against stand-in front-ends
(``standins``), with a dead address (a free port) first where the first broker is down."""

from __future__ import annotations

import pytest
from harness import free_ports
from standins import StandInFrontEnd

from hpbroker import protocol
from hpbroker.client import Admin
from hpbroker.errors import (
    InvalidReplicationFactorError,
    RequestTimedOutError,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
)

SETTINGS = {"connect_timeout_ms": 300, "request_timeout_ms": 500}


def dead_address() -> str:
    return f"127.0.0.1:{free_ports(1)}"


def described(name: str, partitions: int, replicas: int):
    """A metadata answer naming topic ``name`` with ``partitions`` partitions of ``replicas``
    replicas each, led by broker 0 (no broker list: the client's candidates stay the bootstrap)."""
    return protocol.MetadataResponse([], [protocol.TopicMetadata(name, 0, [
        protocol.PartitionMetadata(p, 0, 0, 0, 0, 0, 1, list(range(replicas)), list(range(replicas)))
        for p in range(partitions)])]), 0, ""


def broker(*, create=None, metadata=None):
    """A handler answering a CreateTopicRequest with ``create(request)`` and a MetadataRequest
    with ``metadata(request)`` (each None: no answer)."""
    def handle(header, request):
        if isinstance(request, protocol.CreateTopicRequest):
            return create(request) if create is not None else None
        if isinstance(request, protocol.MetadataRequest):
            return metadata(request) if metadata is not None else None
        return None
    return handle


def exists(request):
    return protocol.CreateTopicResponse(), TopicAlreadyExistsError.code, f"topic {request.name!r} exists"


def test_a_create_answered_with_error_12_is_that_answer_and_goes_to_no_other_broker(stand_ins):
    leaders_late = stand_ins(StandInFrontEnd, broker(create=lambda request: (
        protocol.CreateTopicResponse(), RequestTimedOutError.code, "the topic exists; its leaders follow")))
    other = stand_ins(StandInFrontEnd, broker(create=exists))
    bootstrap = [dead_address(), f"127.0.0.1:{leaders_late.port}", f"127.0.0.1:{other.port}"]
    with Admin(bootstrap, **SETTINGS) as admin, \
            pytest.raises(RequestTimedOutError, match="its leaders follow"):
        admin.create_topic("t", 6, replication_factor=3)
    assert len(leaders_late.of_type(protocol.CreateTopicRequest)) == 1
    assert other.of_type(protocol.CreateTopicRequest) == [], "an answer is the outcome: not sent again"


def test_any_error_a_broker_answers_ends_the_fail_over(stand_ins):
    refusing = stand_ins(StandInFrontEnd, broker(create=lambda request: (
        protocol.CreateTopicResponse(), InvalidReplicationFactorError.code, "3 above the 2 live brokers")))
    other = stand_ins(StandInFrontEnd, broker(create=exists))
    bootstrap = [dead_address(), f"127.0.0.1:{refusing.port}", f"127.0.0.1:{other.port}"]
    with Admin(bootstrap, **SETTINGS) as admin, \
            pytest.raises(InvalidReplicationFactorError, match="above the 2 live brokers"):
        admin.create_topic("t", 6, replication_factor=3)
    assert other.requests == []


@pytest.mark.parametrize("replication_factor", [2, None])
def test_a_create_with_no_answer_goes_on_and_the_topic_as_asked_existing_there_is_success(
        stand_ins, replication_factor):
    silent = stand_ins(StandInFrontEnd, broker())
    other = stand_ins(StandInFrontEnd, broker(create=exists, metadata=lambda request: described("t", 3, 2)))
    bootstrap = [dead_address(), f"127.0.0.1:{silent.port}", f"127.0.0.1:{other.port}"]
    with Admin(bootstrap, **SETTINGS) as admin:
        admin.create_topic("t", 3, replication_factor=replication_factor)  # no error
    assert len(silent.of_type(protocol.CreateTopicRequest)) == 1
    assert len(other.of_type(protocol.CreateTopicRequest)) == 1


@pytest.mark.parametrize(("partitions", "replicas", "why"), [(4, 2, "4 partitions, not 3"),
                                                             (3, 1, "replication factor 1, not 2")])
def test_a_create_with_no_answer_then_a_different_topic_existing_is_topic_already_exists(
        stand_ins, partitions, replicas, why):
    silent = stand_ins(StandInFrontEnd, broker())
    other = stand_ins(StandInFrontEnd, broker(
        create=exists, metadata=lambda request: described("t", partitions, replicas)))
    with Admin([f"127.0.0.1:{silent.port}", f"127.0.0.1:{other.port}"], **SETTINGS) as admin, \
            pytest.raises(TopicAlreadyExistsError, match=why):
        admin.create_topic("t", 3, replication_factor=2)


def test_topic_already_exists_is_raised_as_it_is_when_every_attempt_was_answered(stand_ins):
    other = stand_ins(StandInFrontEnd, broker(create=exists, metadata=lambda request: described("t", 3, 2)))
    with Admin(f"127.0.0.1:{other.port}", **SETTINGS) as admin, \
            pytest.raises(TopicAlreadyExistsError, match="exists"):
        admin.create_topic("t", 3, replication_factor=2)
    assert other.of_type(protocol.MetadataRequest) == [], "nothing to check"


def test_retrying_a_create_no_broker_answered_takes_the_topic_as_asked_as_created(stand_ins):
    answering = [False]
    flaky = stand_ins(StandInFrontEnd, broker(
        create=lambda request: exists(request) if answering[0] else None,
        metadata=lambda request: described("t", 3, 2)))
    with Admin(f"127.0.0.1:{flaky.port}", **SETTINGS) as admin:
        with pytest.raises(RequestTimedOutError, match="may or may not have been applied"):
            admin.create_topic("t", 3, replication_factor=2)
        answering[0] = True
        admin.create_topic("t", 3, replication_factor=2)  # the first one did it: no error
        with pytest.raises(TopicAlreadyExistsError):  # settled: from now on it is an error again
            admin.create_topic("t", 3, replication_factor=2)


def test_a_delete_with_no_answer_is_not_sent_to_another_broker(stand_ins):
    def silent_delete(header, request):
        if isinstance(request, protocol.MetadataRequest):
            return described("t", 1, 1)
        return None

    silent = stand_ins(StandInFrontEnd, silent_delete)
    other = stand_ins(StandInFrontEnd, broker(metadata=lambda request: described("t", 1, 1)))
    with Admin([f"127.0.0.1:{silent.port}", f"127.0.0.1:{other.port}"], **SETTINGS) as admin, \
            pytest.raises(RequestTimedOutError, match="may or may not have been applied"):
        admin.delete_topic("t")
    assert other.requests == []


def test_the_check_waits_for_the_answering_brokers_metadata_to_show_the_topic(stand_ins):
    """The broker that says "exists" may not describe the topic yet: it is asked again."""
    asked = []

    def lagging(request):
        asked.append(request)
        if len(asked) < 3:
            unknown = protocol.TopicMetadata("t", UnknownTopicOrPartitionError.code)
            return protocol.MetadataResponse([], [unknown]), 0, ""
        return described("t", 3, 2)

    silent = stand_ins(StandInFrontEnd, broker())
    other = stand_ins(StandInFrontEnd, broker(create=exists, metadata=lagging))
    with Admin([f"127.0.0.1:{silent.port}", f"127.0.0.1:{other.port}"], **SETTINGS) as admin:
        admin.create_topic("t", 3, replication_factor=2)
    assert len(asked) == 3

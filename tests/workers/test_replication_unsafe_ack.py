"""HPBROKER_UNSAFE_ACK_BEFORE_REPLICATION=1, the planted bug the chaos suite's checker must catch:
a leader answers acks=-1 at its own flush, without the ISR and without min_insync_replicas.
Real worker processes; the variable reaches them through the fork."""

from __future__ import annotations

import pytest
from replication_harness import TOPIC, lead
from worker_harness import make_batch, produce_request

from hpbroker.errors import NotEnoughReplicasError
from hpbroker.protocol import ApiKey
from hpbroker.workers.replication import UNSAFE_ACK_BEFORE_REPLICATION_ENV

WARNING_TEXT = f"{UNSAFE_ACK_BEFORE_REPLICATION_ENV}=1: acks=all produce requests are answered"


@pytest.mark.parametrize("unsafe", [False, True], ids=["unset", "set-to-1"])
def test_acks_all_waits_for_the_isr_unless_the_unsafe_switch_is_set(brokers, monkeypatch, capfd, unsafe):
    monkeypatch.delenv(UNSAFE_ACK_BEFORE_REPLICATION_ENV, raising=False)
    if unsafe:
        monkeypatch.setenv(UNSAFE_ACK_BEFORE_REPLICATION_ENV, "1")
    leader, follower = brokers(2)
    lead(leader, [follower], min_insync_replicas=2)
    assert leader.call(produce_request(TOPIC, 0, make_batch("a"), acks=-1))[0].error_code == 0

    follower.pause()  # the follower cannot have the next records
    correlation_id = leader.arbiter.relay(0, produce_request(TOPIC, 0, make_batch("b"), acks=-1,
                                                             timeout_ms=60_000))
    if unsafe:
        header, response = leader.arbiter.response(ApiKey.PRODUCE)
        assert (header.correlation_id, header.error_code, response.base_offset) == (correlation_id, 0, 3)
    else:
        assert leader.arbiter.nothing_within(1.5), "acks=-1 answered while the follower was stopped"
    follower.resume()
    if not unsafe:
        header, _ = leader.arbiter.response(ApiKey.PRODUCE)
        assert (header.correlation_id, header.error_code) == (correlation_id, 0)

    # The ISR below min_insync_replicas: refused, unless the switch is set.
    ack = leader.role(TOPIC, 0, "leader", epoch=1, leader=0, leader_address=leader.address, replicas=[0, 1],
                      isr=[0], min_insync_replicas=2)
    assert ack["error"] is None, ack
    header, _ = leader.call(produce_request(TOPIC, 0, make_batch("c"), acks=-1))
    assert header.error_code == (0 if unsafe else NotEnoughReplicasError.code)

    warnings = [line for line in capfd.readouterr().err.splitlines() if WARNING_TEXT in line]
    assert len(warnings) == (2 if unsafe else 0), warnings  # one per worker started
    assert all(" WARNING " in line for line in warnings)

"""A broker's replication agent (``hpbroker.coord.broker_replication``) against a real ZooKeeper:
a leader's ISR proposal is written only while ZooKeeper still holds the ISR it was made from, and
never puts back a broker that is not alive."""

from __future__ import annotations

import pytest
from harness import wait_until
from test_controller import PATHS, FakeBrokers, create_topic, leadership

from hpbroker.coord.broker_replication import BrokerReplication, StateChanged
from hpbroker.coord.partition_state import PartitionState, create_states

pytestmark = pytest.mark.zookeeper


def _seen(replication: BrokerReplication, isr: tuple[int, ...]) -> list[tuple[int, ...]]:
    """Wait until the agent's watch delivered a state with ``isr`` (every write before it is
    done); the ISRs it delivered meanwhile."""
    seen: list[StateChanged] = []

    def arrived():
        seen.extend(e for e in replication.take_events() if isinstance(e, StateChanged))
        return any(e.state is not None and e.state.isr == isr for e in seen)
    wait_until(arrived, 20, what=f"the state with ISR {list(isr)}")
    return [e.state.isr for e in seen if e.state is not None]


def test_a_proposal_made_from_an_older_isr_is_dropped_and_one_from_the_current_isr_written(zk, agent):
    brokers = FakeBrokers(zk)
    brokers.up(1, 2, 3)
    create_topic(zk, "proposed", {0: [1, 2, 3]})
    create_states(zk, PATHS, "proposed", {0: PartitionState(1, 4, (1, 2), 0)})
    replication = agent(1)
    replication.watch_topic("proposed", 1)
    _seen(replication, (1, 2))
    # made from [1] (say before broker 2 came back): ZooKeeper holds [1, 2] now
    replication.propose_isr("proposed", 0, 4, (1, 3), (1,))
    replication.propose_isr("proposed", 0, 4, (1, 2, 3), (1, 2))
    assert (1, 3) not in _seen(replication, (1, 2, 3))
    assert leadership(zk, "proposed") == (1, 4, [1, 2, 3])


def test_a_proposal_never_adds_a_broker_that_is_not_alive(zk, agent):
    brokers = FakeBrokers(zk)
    brokers.up(1, 2)
    create_topic(zk, "alive", {0: [1, 2, 3]})
    create_states(zk, PATHS, "alive", {0: PartitionState(1, 0, (1,), 0)})
    replication = agent(1)
    replication.watch_topic("alive", 1)
    _seen(replication, (1,))
    replication.propose_isr("alive", 0, 0, (1, 2, 3), (1,))
    _seen(replication, (1, 2))
    assert leadership(zk, "alive") == (1, 0, [1, 2])

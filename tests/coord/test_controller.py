"""The controller against a real ZooKeeper: election, failover between controllers, fencing of a
deposed one, and the leader/ISR rules as brokers (ephemeral nodes written with the registry's
encoder) come and go."""

from __future__ import annotations

import logging
import threading
import time

import pytest
from harness import wait_until

from hpbroker.coord.controller import (
    Controller,
    failover_state,
    initial_state,
    preferred_state,
    read_controller,
)
from hpbroker.coord.partition_state import PartitionState, read_state, update_state
from hpbroker.coord.paths import ZkPaths
from hpbroker.coord.registry import BrokerRegistration, TopicRegistration, TopicRegistry, encode_broker
from hpbroker.errors import InvalidConfigError

pytestmark = pytest.mark.zookeeper

PATHS = ZkPaths()
DEADLINE_S = 20.0


class FakeBrokers:
    """Broker registrations as ephemeral nodes of one test session: up, down, restarted."""

    def __init__(self, zk) -> None:
        self.client = zk.client

    def _data(self, broker_id: int) -> bytes:
        registration = BrokerRegistration(broker_id, "127.0.0.1", 9092 + broker_id, (9192 + broker_id,))
        return encode_broker(registration)

    def up(self, *broker_ids: int) -> None:
        for broker_id in broker_ids:
            self.client.create(PATHS.broker(broker_id), self._data(broker_id), ephemeral=True, makepath=True)

    def down(self, *broker_ids: int) -> None:
        for broker_id in broker_ids:
            self.client.delete(PATHS.broker(broker_id))

    def restart(self, broker_id: int) -> None:
        """Replace the node in one transaction: the list of live ids never changes."""
        txn = self.client.transaction()
        txn.delete(PATHS.broker(broker_id))
        txn.create(PATHS.broker(broker_id), self._data(broker_id), ephemeral=True)
        assert not any(isinstance(result, Exception) for result in txn.commit())


@pytest.fixture
def brokers(zk) -> FakeBrokers:
    return FakeBrokers(zk)


class Controllers:
    """``controllers(broker_id, **options)`` -> a started Controller on a session of its own."""

    def __init__(self, sessions) -> None:
        self._sessions = sessions
        self.made: list[tuple[Controller, object]] = []

    def __call__(self, broker_id: int = 9, **options) -> Controller:
        session = self._sessions()
        controller = Controller(session, PATHS, broker_id, **options)
        self.made.append((controller, session))
        controller.start()
        return controller

    def session_of(self, controller: Controller):
        return next(session for made, session in self.made if made is controller)


@pytest.fixture
def controllers(sessions):
    made = Controllers(sessions)
    yield made
    for controller, _ in made.made:
        controller.close()


def active(controller: Controller) -> Controller:
    wait_until(lambda: controller.is_active, DEADLINE_S,
               what=f"controller {controller.broker_id} to be active")
    return controller


def create_topic(zk, name: str, replicas: dict[int, list[int]]) -> None:
    TopicRegistry(zk).publish(TopicRegistration(name, len(replicas), {}, created_by=0,
                                                replicas={p: tuple(r) for p, r in replicas.items()}))


def leadership(zk, topic: str, partition: int = 0) -> tuple[int, int, list[int]] | None:
    found = read_state(zk, PATHS, topic, partition)
    return None if found is None else (found[0].leader, found[0].leader_epoch, list(found[0].isr))


def wait_leadership(zk, topic: str, expected: tuple[int, int, list[int]], partition: int = 0) -> None:
    wait_until(lambda: leadership(zk, topic, partition) == expected, DEADLINE_S,
               what=f"{topic}-{partition} to reach (leader, leader epoch, isr) {expected}; "
                    f"it is {leadership(zk, topic, partition)}")


def seen_live(controller: Controller, *broker_ids: int) -> None:
    """Wait for a pass that began after ``broker_ids`` were live to have finished."""
    wait_until(lambda: set(broker_ids) <= set(controller.state()["live_brokers"]), DEADLINE_S,
               what=f"the controller to see brokers {broker_ids}")


def leader_isr_change(zk, topic: str, isr: tuple[int, ...], partition: int = 0) -> None:
    """What a leader writes when its ISR grows or shrinks: a conditional set, no controller check."""
    state, version = read_state(zk, PATHS, topic, partition)
    changed = PartitionState(state.leader, state.leader_epoch, isr, state.controller_epoch)
    assert update_state(zk, PATHS, topic, partition, changed, expected_version=version) is not None


# --- election ------------------------------------------------------------------------------------


def test_one_controller_wins_and_the_other_takes_over_with_the_next_epoch_when_it_resigns(controllers, zk):
    first, second = controllers(1), controllers(2)
    wait_until(lambda: first.is_active or second.is_active, DEADLINE_S, what="an election")
    winner, other = (first, second) if first.is_active else (second, first)
    epoch = winner.controller_epoch
    assert epoch >= 1 and not other.is_active and other.controller_epoch == -1
    assert read_controller(zk, PATHS) == (winner.broker_id, epoch)
    assert winner.state()["active"] and winner.state()["controller_epoch"] == epoch

    winner.close()  # resigns: the other takes over without waiting for a session timeout
    active(other)
    assert other.controller_epoch == epoch + 1
    assert read_controller(zk, PATHS) == (other.broker_id, epoch + 1)
    assert not winner.is_active and winner.state()["controller_epoch"] == -1


def test_close_resigns_at_once(controllers, zk):
    controller = active(controllers(4))
    assert read_controller(zk, PATHS) == (4, 1)
    controller.close()
    assert read_controller(zk, PATHS) is None
    assert zk.client.exists(PATHS.controller_epoch) is not None  # the epoch stays: the next one is 2


def test_session_expiry_moves_the_role_to_another_broker(controllers, expire_session):
    first = active(controllers(1))
    second = controllers(2)
    epoch = first.controller_epoch
    expire_session(controllers.session_of(first))
    active(second)
    assert second.controller_epoch == epoch + 1
    wait_until(lambda: not first.is_active, DEADLINE_S, what="the expired controller to step down")


def test_a_deposed_controllers_write_is_refused(controllers, brokers, zk):
    """A controller that stalls while deciding, and meanwhile loses its role, cannot write what it
    decided: ZooKeeper checks the controller epoch's version in the same transaction."""
    asked, release = threading.Event(), threading.Event()

    def stalling_unclean(topic: str) -> bool:
        asked.set()
        release.wait(DEADLINE_S)
        return True  # would elect broker 2, out of sync

    brokers.up(1, 2)
    create_topic(zk, "t", {0: [1, 2]})
    try:
        first = active(controllers(1, unclean_leader_election=stalling_unclean))
        second = controllers(2)
        wait_leadership(zk, "t", (1, 0, [1, 2]))
        leader_isr_change(zk, "t", (1,))  # broker 2 fell behind
        brokers.down(1)
        assert asked.wait(DEADLINE_S), "the first controller never asked about unclean election"
        zk.client.delete(PATHS.controller)  # the first loses its role while it waits
        active(second)
        assert second.controller_epoch == first.controller_epoch + 1
        wait_leadership(zk, "t", (-1, 1, [1]))  # the new controller: no clean leader
        before = read_state(zk, PATHS, "t", 0)
        assert before[0].controller_epoch == second.controller_epoch
    finally:
        release.set()
    wait_until(lambda: not first.is_active, DEADLINE_S, what="the deposed controller to step down")
    assert read_state(zk, PATHS, "t", 0) == before  # its unclean election never landed
    assert read_controller(zk, PATHS) == (2, second.controller_epoch)


def test_the_controller_epoch_alone_fences_a_deposed_controller(controllers, brokers, zk):
    """Another controller elected (the epoch node bumped) but no state touched: the stalled
    controller's write matches the state's version and is still refused."""
    asked, release = threading.Event(), threading.Event()

    def stalling_unclean(topic: str) -> bool:
        asked.set()
        release.wait(DEADLINE_S)
        return True

    brokers.up(1, 2)
    create_topic(zk, "t", {0: [1, 2]})
    try:
        first = active(controllers(1, unclean_leader_election=stalling_unclean))
        wait_leadership(zk, "t", (1, 0, [1, 2]))
        leader_isr_change(zk, "t", (1,))
        before = read_state(zk, PATHS, "t", 0)
        brokers.down(1)
        assert asked.wait(DEADLINE_S), "the controller never asked about unclean election"
        # another broker's election, by hand: it takes /controller and bumps the epoch, nothing more
        epoch = first.controller_epoch
        _, epoch_stat = zk.client.get(PATHS.controller_epoch)
        zk.client.delete(PATHS.controller)
        txn = zk.client.transaction()
        txn.create(PATHS.controller, b'{"broker_id":5,"timestamp_ms":0,"version":1}', ephemeral=True)
        txn.set_data(PATHS.controller_epoch, b'{"epoch":%d,"version":1}' % (epoch + 1),
                     version=epoch_stat.version)
        assert not any(isinstance(result, Exception) for result in txn.commit())
    finally:
        release.set()
    wait_until(lambda: not first.is_active, DEADLINE_S, what="the deposed controller to step down")
    assert read_state(zk, PATHS, "t", 0) == before
    assert read_controller(zk, PATHS) == (5, epoch + 1)


# --- leader and ISR rules -------------------------------------------------------------------------


def test_leader_loss_elects_the_next_isr_replica_with_a_new_leader_epoch_and_shrinks_the_isr(
        controllers, brokers, zk, caplog):
    caplog.set_level(logging.INFO, logger="hpbroker.coord.controller")
    brokers.up(0, 1, 2)
    create_topic(zk, "orders", {0: [1, 2, 0], 1: [2, 0, 1]})
    controller = active(controllers())
    wait_leadership(zk, "orders", (1, 0, [1, 2, 0]))
    wait_leadership(zk, "orders", (2, 0, [2, 0, 1]), partition=1)
    brokers.down(1)
    wait_leadership(zk, "orders", (2, 1, [2, 0]))
    wait_leadership(zk, "orders", (2, 0, [2, 0]), partition=1)  # a follower: ISR only
    assert read_state(zk, PATHS, "orders", 0)[0].controller_epoch == controller.controller_epoch
    wait_until(lambda: "[controller] elected broker 2 leader of orders-0 in epoch 1 (broker 1 gone); "
                       "isr [2, 0]" in caplog.text, DEADLINE_S, what="the election to be logged")


def test_follower_loss_shrinks_the_isr_only(controllers, brokers, zk):
    brokers.up(0, 1, 2)
    create_topic(zk, "t", {0: [1, 2, 0]})
    controller = active(controllers())
    wait_leadership(zk, "t", (1, 0, [1, 2, 0]))
    brokers.down(2)
    wait_leadership(zk, "t", (1, 0, [1, 0]))
    wait_until(lambda: controller.state()["isr_shrinks"] == 1, DEADLINE_S, what="the shrink counted")
    assert controller.state()["leader_elections"] == 0


def test_with_every_isr_member_gone_the_partition_waits_for_one_of_them(controllers, brokers, zk):
    brokers.up(1, 2)
    create_topic(zk, "t", {0: [1, 2]})
    controller = active(controllers())
    wait_leadership(zk, "t", (1, 0, [1, 2]))
    brokers.down(2)
    wait_leadership(zk, "t", (1, 0, [1]))
    brokers.down(1)
    wait_leadership(zk, "t", (-1, 1, [1]))  # offline; the last ISR kept
    brokers.up(2)  # out of sync: never leader while unclean election is off
    seen_live(controller, 2)
    assert leadership(zk, "t") == (-1, 1, [1])
    assert controller.state()["offline_partitions"] == 1
    brokers.up(1)
    wait_leadership(zk, "t", (1, 2, [1]))
    seen_live(controller, 1, 2)
    assert controller.state()["offline_partitions"] == 0


def test_unclean_leader_election_takes_any_live_replica(controllers, brokers, zk):
    asked = []

    def unclean(topic: str) -> bool:
        asked.append(topic)
        return topic == "dirty"

    brokers.up(1, 2)
    create_topic(zk, "dirty", {0: [1, 2]})
    create_topic(zk, "clean", {0: [1, 2]})
    controller = active(controllers(unclean_leader_election=unclean))
    for topic in ("dirty", "clean"):
        wait_leadership(zk, topic, (1, 0, [1, 2]))
        leader_isr_change(zk, topic, (1,))
    brokers.down(1)  # broker 2 is alive but out of sync
    wait_leadership(zk, "dirty", (2, 1, [2]))
    wait_leadership(zk, "clean", (-1, 1, [1]))
    assert {"dirty", "clean"} <= set(asked)
    assert controller.state()["offline_partitions"] == 1


def test_leadership_moves_back_to_the_preferred_replica_once_it_is_in_the_isr(controllers, brokers, zk):
    brokers.up(1, 2)
    create_topic(zk, "t", {0: [1, 2]})
    controller = active(controllers(rebalance_interval_s=0.2))
    wait_leadership(zk, "t", (1, 0, [1, 2]))
    brokers.down(1)
    wait_leadership(zk, "t", (2, 1, [2]))
    brokers.up(1)
    seen_live(controller, 1)
    rebalances = controller.state()["rebalances"]
    wait_until(lambda: controller.state()["rebalances"] > rebalances, DEADLINE_S, what="a rebalance pass")
    assert leadership(zk, "t") == (2, 1, [2])  # not in the ISR yet: stays a follower
    assert controller.state()["preferred_replica_imbalance"] == 1
    leader_isr_change(zk, "t", (2, 1))  # the leader took it back into the ISR
    wait_leadership(zk, "t", (1, 2, [2, 1]))


def test_no_rebalance_when_it_is_off(controllers, brokers, zk):
    brokers.up(1, 2)
    create_topic(zk, "t", {0: [1, 2]})
    controller = active(controllers(auto_leader_rebalance=False, rebalance_interval_s=0.1))
    wait_leadership(zk, "t", (1, 0, [1, 2]))
    brokers.down(1)
    wait_leadership(zk, "t", (2, 1, [2]))
    brokers.up(1)
    leader_isr_change(zk, "t", (2, 1))
    seen_live(controller, 1)
    time.sleep(1.0)  # ten rebalance intervals, in which nothing may happen
    passes = controller.state()["passes"]
    brokers.up(5)  # and a pass after them
    wait_until(lambda: controller.state()["passes"] > passes, DEADLINE_S, what="another pass")
    assert leadership(zk, "t") == (2, 1, [2, 1])
    assert controller.state()["rebalances"] == 0


def test_a_new_topic_gets_its_partition_states(controllers, brokers, zk):
    brokers.up(1, 2)
    controller = active(controllers())
    create_topic(zk, "fresh", {0: [1, 2], 1: [3, 1], 2: [3, 4]})  # 3 and 4 are down
    TopicRegistry(zk).publish(TopicRegistration("plain", 2, {}, created_by=0))  # not replicated
    wait_leadership(zk, "fresh", (1, 0, [1, 2]))
    wait_leadership(zk, "fresh", (1, 0, [1]), partition=1)
    wait_leadership(zk, "fresh", (-1, 0, []), partition=2)
    wait_until(lambda: controller.state()["partitions"] == 3, DEADLINE_S, what="three partitions counted")
    assert controller.state()["topics"] == 1 and controller.state()["offline_partitions"] == 1
    assert zk.client.exists(PATHS.topic_partitions("plain")) is None
    brokers.up(4)  # the partition never had a leader: its first live replica takes it
    wait_leadership(zk, "fresh", (4, 1, [4]), partition=2)
    assert read_state(zk, PATHS, "fresh", 2)[0].controller_epoch == controller.controller_epoch


def test_a_restarted_broker_loses_leadership_even_when_its_id_never_left(controllers, brokers, zk):
    """A broker back before the controller saw it go (a new session under the same id) has lost
    whatever it had not flushed: it is treated as gone and back."""
    brokers.up(0, 1, 2)
    create_topic(zk, "t", {0: [1, 2, 0]})
    controller = active(controllers())
    wait_leadership(zk, "t", (1, 0, [1, 2, 0]))
    seen_live(controller, 0, 1, 2)
    brokers.restart(1)
    wait_leadership(zk, "t", (2, 1, [2, 0]))


def test_a_controller_taking_over_repairs_what_happened_without_one(controllers, brokers, zk):
    brokers.up(0, 1, 2)
    create_topic(zk, "t", {0: [1, 2, 0]})
    first = active(controllers(7))
    wait_leadership(zk, "t", (1, 0, [1, 2, 0]))
    first.close()
    brokers.down(1)  # while no controller is active
    second = active(controllers(8))
    wait_leadership(zk, "t", (2, 1, [2, 0]))
    assert read_state(zk, PATHS, "t", 0)[0].controller_epoch == second.controller_epoch == 2


def test_a_deleted_topic_is_forgotten(controllers, brokers, zk):
    brokers.up(1, 2)
    create_topic(zk, "old", {0: [1, 2]})
    controller = active(controllers())
    wait_leadership(zk, "old", (1, 0, [1, 2]))
    assert TopicRegistry(zk).remove("old")
    wait_until(lambda: controller.state()["topics"] == 0, DEADLINE_S, what="the topic forgotten")
    brokers.down(1)
    create_topic(zk, "new", {0: [1, 2]})
    wait_leadership(zk, "new", (2, 0, [2]))
    assert zk.client.exists(PATHS.topic("old")) is None


# --- the rules alone ------------------------------------------------------------------------------


def state(leader: int, leader_epoch: int, isr: tuple[int, ...]) -> PartitionState:
    return PartitionState(leader, leader_epoch, isr, 1)


def never(*_: object) -> bool:
    raise AssertionError("unclean election asked when not needed")


def test_rules_on_reassignment_treat_a_dropped_replica_as_gone():
    # replicas moved from [1, 2] to [2, 3]: leader 1 is no longer a replica
    new, reason = failover_state((2, 3), state(1, 4, (1, 2)), {1, 2, 3}, controller_epoch=2, unclean=never)
    assert (new.leader, new.leader_epoch, new.isr, new.controller_epoch) == (2, 5, (2,), 2)
    assert reason == "broker 1 no longer a replica"
    new, reason = failover_state((1, 3), state(1, 4, (1, 2)), {1, 2, 3}, controller_epoch=2, unclean=never)
    assert (new.leader, new.leader_epoch, new.isr) == (1, 4, (1,))


def test_rules_leave_a_healthy_partition_alone():
    assert failover_state((1, 2), state(1, 3, (1, 2)), {1, 2}, controller_epoch=1, unclean=never) is None
    assert failover_state((1, 2), state(-1, 3, (1,)), {2}, controller_epoch=1, unclean=lambda: False) is None
    assert preferred_state((1, 2), state(2, 3, (2,)), {1, 2}, controller_epoch=1) is None  # not in the ISR
    assert preferred_state((1, 2), state(2, 3, (2, 1)), {2}, controller_epoch=1) is None  # not alive
    assert preferred_state((1, 2), state(1, 3, (2, 1)), {1, 2}, controller_epoch=1) is None
    assert initial_state((3, 1, 2), {1, 2}, controller_epoch=5) == PartitionState(1, 0, (1, 2), 5)


def test_rebalance_interval_must_be_positive(zk):
    with pytest.raises(InvalidConfigError, match="rebalance_interval_s"):
        Controller(zk, PATHS, 1, rebalance_interval_s=0)

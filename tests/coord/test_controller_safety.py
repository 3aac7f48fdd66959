"""The controller's safety rules against a real ZooKeeper: a bounced broker that is the only ISR
member leads again (never an unclean election in its place), a bounce is handled once even when
the pass is retried, one failing topic does not hold up the others, and a reassignment that
dropped the leader before a new replica was in sync keeps the leader on."""

from __future__ import annotations

import logging

import pytest
from harness import wait_until
from kazoo.security import OPEN_ACL_UNSAFE, make_acl, make_digest_acl
from test_controller import (
    DEADLINE_S,
    PATHS,
    Controllers,
    FakeBrokers,
    active,
    create_topic,
    leader_isr_change,
    leadership,
    never,
    seen_live,
    state,
    wait_leadership,
)

from hpbroker.coord.controller import awaits_new_replicas, failover_state
from hpbroker.coord.registry import TopicRegistration, encode_topic

pytestmark = pytest.mark.zookeeper


@pytest.fixture
def brokers(zk) -> FakeBrokers:
    return FakeBrokers(zk)


@pytest.fixture
def controllers(sessions):
    made = Controllers(sessions)
    yield made
    for controller, _ in made.made:
        controller.close()


def freeze(zk, topic: str, partition: int = 0) -> None:
    """Make ZooKeeper refuse every write of the partition's state (it stays readable)."""
    zk.client.add_auth("digest", "admin:secret")
    zk.client.set_acls(PATHS.partition_state(topic, partition),
                       [make_acl("world", "anyone", read=True), make_digest_acl("admin", "secret", all=True)])


def thaw(zk, topic: str, partition: int = 0) -> None:
    zk.client.set_acls(PATHS.partition_state(topic, partition), OPEN_ACL_UNSAFE)


def reassign(zk, topic: str, replicas: dict[int, list[int]]) -> None:
    """Rewrite the topic node's replica lists, as a reassignment's steps do."""
    path = PATHS.topic(topic)
    zk.client.set(path, encode_topic(TopicRegistration(topic, len(replicas), {}, created_by=0,
                                                       replicas={p: tuple(r) for p, r in replicas.items()})))


# --- a bounced broker ------------------------------------------------------------------------------


def test_a_bounced_leader_alone_in_the_isr_leads_again_even_with_unclean_election_on(
        controllers, brokers, zk):
    brokers.up(1, 2)
    create_topic(zk, "t", {0: [1, 2]})
    controller = active(controllers(unclean_leader_election=lambda topic: True))
    wait_leadership(zk, "t", (1, 0, [1, 2]))
    leader_isr_change(zk, "t", (1,))  # broker 2 fell behind
    seen_live(controller, 1, 2)
    brokers.restart(1)  # back within its session timeout: still the only in-sync replica
    wait_leadership(zk, "t", (1, 2, [1]))  # offline for a moment (epoch 1), then broker 1 again


def test_a_bounce_is_handled_once_while_another_topic_fails_and_its_pass_is_retried(controllers, brokers, zk):
    brokers.up(1, 2)
    create_topic(zk, "a", {0: [1, 2]})
    create_topic(zk, "b", {0: [1, 2]})
    controller = active(controllers())
    wait_leadership(zk, "a", (1, 0, [1, 2]))
    wait_leadership(zk, "b", (1, 0, [1, 2]))
    leader_isr_change(zk, "a", (1,))
    seen_live(controller, 1, 2)
    freeze(zk, "b")  # every pass fails on b, after a
    brokers.restart(1)
    wait_leadership(zk, "a", (1, 2, [1]))
    passes = controller.state()["passes"]
    wait_until(lambda: controller.state()["passes"] >= passes + 2, DEADLINE_S, what="two passes retried")
    assert leadership(zk, "b") == (1, 0, [1, 2])
    thaw(zk, "b")
    wait_leadership(zk, "b", (2, 1, [2]))  # the bounce handled in b, once
    seen_live(controller, 1, 2)
    assert leadership(zk, "a") == (1, 2, [1])  # and never again in a


def test_one_failing_topic_does_not_hold_up_the_failover_of_the_others(controllers, brokers, zk):
    brokers.up(1, 2)
    create_topic(zk, "a", {0: [1, 2]})
    create_topic(zk, "b", {0: [1, 2]})
    active(controllers())
    wait_leadership(zk, "a", (1, 0, [1, 2]))
    wait_leadership(zk, "b", (1, 0, [1, 2]))
    freeze(zk, "a")  # sorted first
    brokers.down(1)
    wait_leadership(zk, "b", (2, 1, [2]))
    assert leadership(zk, "a") == (1, 0, [1, 2])
    thaw(zk, "a")
    wait_leadership(zk, "a", (2, 1, [2]))  # retried


# --- a reassignment's last step -------------------------------------------------------------------


def test_a_reassigned_leader_keeps_leading_until_a_new_replica_is_in_sync(controllers, brokers, zk, caplog):
    caplog.set_level(logging.INFO, logger="hpbroker.coord.controller")
    brokers.up(1, 2, 3)
    create_topic(zk, "t", {0: [1, 2]})
    controller = active(controllers(unclean_leader_election=lambda topic: True))
    wait_leadership(zk, "t", (1, 0, [1, 2]))
    leader_isr_change(zk, "t", (1,))  # the new replica, 2, fell behind just before the last step
    reassign(zk, "t", {0: [2, 3]})
    wait_until(lambda: "broker 1 keeps leading t-0 in epoch 0 although it is no longer a replica"
                       in caplog.text, DEADLINE_S, what="the warning")
    assert any(r.levelno == logging.WARNING and "keeps leading" in r.getMessage() for r in caplog.records)
    brokers.up(4)
    seen_live(controller, 4)
    assert leadership(zk, "t") == (1, 0, [1])
    leader_isr_change(zk, "t", (1, 2))  # caught up
    wait_leadership(zk, "t", (2, 1, [2]))


def test_rules_keep_a_dropped_leader_while_no_replica_of_the_new_list_is_in_sync():
    # replicas moved from [1] to [2, 3]; 2 is alive but out of sync
    assert failover_state((2, 3), state(1, 4, (1,)), {1, 2, 3}, controller_epoch=2, unclean=never) is None
    assert awaits_new_replicas((2, 3), state(1, 4, (1,)), {1, 2, 3})
    # a gone non-replica leaves the ISR; the leader stays
    new, _ = failover_state((2, 3), state(1, 4, (1, 5)), {1, 2, 3}, controller_epoch=2, unclean=never)
    assert (new.leader, new.leader_epoch, new.isr) == (1, 4, (1,))
    # the dropped leader gone too: an in-sync former replica leads rather than an out-of-sync one
    new, _ = failover_state((2, 3), state(1, 4, (1, 5)), {2, 3, 5}, controller_epoch=2, unclean=never)
    assert (new.leader, new.leader_epoch, new.isr) == (5, 5, (5,))
    # a replica in sync: the non-replicas leave and it leads
    new, _ = failover_state((2, 3), state(1, 4, (1, 3)), {1, 2, 3}, controller_epoch=2, unclean=never)
    assert (new.leader, new.leader_epoch, new.isr) == (3, 5, (3,))
    assert not awaits_new_replicas((2, 3), state(1, 4, (1, 3)), {1, 2, 3})

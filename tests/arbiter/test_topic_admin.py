"""TopicAdmin: creation and deletion carried out by the owning slots, without processes."""

from __future__ import annotations

import pytest

from hpbroker.broker.topics import TopicStore
from hpbroker.errors import InvalidTopicError, RequestTimedOutError, StorageError
from hpbroker.workers.admin import RETRY_INTERVAL_S, TopicAdmin
from hpbroker.workers.ownership import owner_slot

SLOTS = 3


class Harness:
    def __init__(self, data_dir, serving=range(SLOTS)):
        self.store = TopicStore(data_dir)
        self.serving = set(serving)
        self.sent: list[tuple[int, str, dict]] = []
        self.replies: list[tuple[object, object]] = []
        self.refuse = False
        self.admin = TopicAdmin(self.store, SLOTS, send_control=self._send, reply=self._reply,
                                is_serving=self.serving.__contains__, timeout_s=10)

    def _send(self, slot, op, body):
        if self.refuse:
            return False
        self.sent.append((slot, op, body))
        return True

    def _reply(self, waiter, error):
        self.replies.append((waiter, error))

    def take(self, op=None):
        sent = [m for m in self.sent if op is None or m[1] == op]
        self.sent = [m for m in self.sent if m not in sent]
        return sent

    def ack_all(self, messages, error=None):
        for slot, _, body in messages:
            self.admin.acked(slot, body["id"], error)

    def boot_all(self):
        for slot in range(SLOTS):
            self.admin.assign(slot)
            if slot in self.serving:
                self.admin.slot_ready(slot)


def owners(name, partitions):
    return {owner_slot(name, p, SLOTS) for p in range(partitions)}


def test_create_opens_on_every_owner_and_answers_after_all_acks(tmp_path):
    h = Harness(tmp_path)
    h.boot_all()
    h.admin.create("client", "orders", 5, {"retention_ms": "1000"}, now=0)
    opens = h.take("open")
    assert {slot for slot, _, _ in opens} == owners("orders", 5) == {0, 1, 2}
    partitions = sorted(p["partition"] for _, _, body in opens for p in body["partitions"])
    assert partitions == [0, 1, 2, 3, 4]
    for slot, _, body in opens:
        assert all(owner_slot("orders", p["partition"], SLOTS) == slot for p in body["partitions"])
        assert all(p["config"] == {"retention_ms": 1000} for p in body["partitions"])
    h.ack_all(opens[:-1])
    assert h.replies == []
    h.ack_all(opens[-1:])
    assert h.replies == [("client", None)]


def test_slot_booting_during_create_gets_the_open_when_ready(tmp_path):
    h = Harness(tmp_path, serving=[0, 1])
    h.boot_all()  # slot 2 forked without the topic, still booting
    h.admin.create("client", "orders", 3, (), now=0)
    h.ack_all(h.take("open"))
    assert h.replies == []
    h.serving.add(2)
    h.admin.slot_ready(2)
    (late,) = h.take("open")
    assert late[0] == 2
    h.ack_all([late])
    assert h.replies == [("client", None)]


def test_slot_forked_after_create_confirms_by_becoming_ready(tmp_path):
    h = Harness(tmp_path, serving=[0, 1])
    h.boot_all()
    h.admin.create("client", "orders", 3, (), now=0)
    h.ack_all(h.take("open"))
    h.admin.slot_down(2)  # died while booting; its successor is forked with the topic
    specs = h.admin.assign(2)
    assert [(s.topic, s.partition) for s in specs] == \
        [("orders", p) for p in range(3) if owner_slot("orders", p, SLOTS) == 2]
    h.serving.add(2)
    h.admin.slot_ready(2)
    assert h.take("open") == []
    assert h.replies == [("client", None)]


def test_open_failure_is_reported_to_the_client(tmp_path):
    h = Harness(tmp_path)
    h.boot_all()
    h.admin.create("client", "orders", 1, (), now=0)
    h.ack_all(h.take("open"), error="disk full")
    ((waiter, error),) = h.replies
    assert isinstance(error, StorageError) and "disk full" in error.message


def test_invalid_create_raises_and_persists_nothing(tmp_path):
    h = Harness(tmp_path)
    with pytest.raises(InvalidTopicError):
        h.admin.create("client", "bad/name", 1, (), now=0)
    assert h.sent == [] and TopicStore(tmp_path).topics() == []


def test_delete_forgets_the_topic_only_after_every_owner_deleted(tmp_path):
    h = Harness(tmp_path)
    h.store.create("orders", 4)
    h.boot_all()
    h.admin.delete("client", "orders", now=0)
    deletes = h.take("delete")
    assert {slot for slot, _, _ in deletes} == owners("orders", 4)
    assert all(body["topic"] == "orders" for _, _, body in deletes)
    h.ack_all(deletes[:-1])
    assert TopicStore(tmp_path).get("orders").deleting and h.replies == []
    h.ack_all(deletes[-1:])
    assert TopicStore(tmp_path).get("orders") is None
    assert h.replies == [("client", None)]


def test_slot_down_during_delete_deletes_after_its_respawn(tmp_path):
    h = Harness(tmp_path)
    h.store.create("orders", 3)
    h.boot_all()
    h.admin.delete("client", "orders", now=0)
    deletes = h.take("delete")
    dead = deletes[0][0]
    h.ack_all(deletes[1:])
    h.admin.slot_down(dead)
    h.serving.discard(dead)
    h.admin.acked(dead, deletes[0][2]["id"], None)  # a stale ack from the dead process is ignored
    assert h.store.get("orders") is not None
    specs = h.admin.assign(dead)  # the successor opens the partitions so it can delete them
    assert {s.topic for s in specs} == {"orders"}
    h.serving.add(dead)
    h.admin.slot_ready(dead)
    (again,) = h.take("delete")
    assert again[0] == dead and h.take("open") == []
    h.ack_all([again])
    assert h.store.get("orders") is None and h.replies == [("client", None)]


def test_interrupted_delete_resumes_at_the_next_start(tmp_path):
    h = Harness(tmp_path)
    h.store.create("orders", 3)
    h.store.create("keep", 3)
    h.store.mark_deleting("orders")
    restarted = Harness(tmp_path)
    assert restarted.admin.deleting() == ["orders"]
    restarted.boot_all()
    deletes = restarted.take("delete")
    assert {slot for slot, _, _ in deletes} == owners("orders", 3)
    restarted.ack_all(deletes)
    assert [t.name for t in TopicStore(tmp_path).topics(include_deleting=True)] == ["keep"]


def test_slot_that_already_deleted_is_not_given_the_partitions_again(tmp_path):
    h = Harness(tmp_path)
    h.store.create("orders", 3)
    h.boot_all()
    h.admin.delete("client", "orders", now=0)
    deletes = h.take("delete")
    h.ack_all(deletes[:1])
    done = deletes[0][0]
    h.admin.slot_down(done)
    assert h.admin.assign(done) == []


def test_unanswered_create_times_out_with_error_12(tmp_path):
    h = Harness(tmp_path)
    h.boot_all()
    h.admin.create("client", "orders", 2, (), now=0)
    h.admin.expire(now=5)
    assert h.replies == []
    h.admin.expire(now=10)
    ((waiter, error),) = h.replies
    assert isinstance(error, RequestTimedOutError) and "waiting for worker slots" in error.message
    h.ack_all(h.take("open"))  # late acks change nothing
    assert len(h.replies) == 1


def test_unanswered_delete_times_out_but_goes_on(tmp_path):
    h = Harness(tmp_path)
    h.store.create("orders", 1)
    h.boot_all()
    h.admin.delete("client", "orders", now=0)
    h.admin.expire(now=11)
    assert isinstance(h.replies[0][1], RequestTimedOutError)
    h.ack_all(h.take("delete"))
    assert h.store.get("orders") is None and len(h.replies) == 1


def test_control_that_cannot_be_sent_is_retried_when_the_slot_is_ready_again(tmp_path):
    h = Harness(tmp_path)
    h.boot_all()
    h.refuse = True
    h.admin.create("client", "orders", 1, (), now=0)
    slot = owner_slot("orders", 0, SLOTS)
    h.refuse = False
    h.admin.slot_down(slot)
    h.admin.assign(slot)
    h.admin.slot_ready(slot)
    assert h.replies == [("client", None)]


def test_alter_configures_every_owner_and_answers_after_all_acks(tmp_path):
    h = Harness(tmp_path)
    h.boot_all()
    h.admin.create("creator", "orders", 5, {"retention_ms": "1000"}, now=0)
    h.ack_all(h.take("open"))
    h.admin.alter("client", "orders", {"segment_bytes": "4096", "retention_ms": None}, now=1)
    configures = h.take("configure")
    assert {slot for slot, _, _ in configures} == owners("orders", 5)
    assert all(body["topic"] == "orders" and body["config"] == {"segment_bytes": 4096}
               for _, _, body in configures)
    h.ack_all(configures[:-1])
    assert h.replies == [("creator", None)]
    h.ack_all(configures[-1:])
    assert h.replies[-1] == ("client", None)
    h.admin.alter("again", "orders", {"segment_bytes": "4096"}, now=2)
    assert h.take() == [] and h.replies[-1] == ("again", None), "no change: answered at once"


def test_slots_booting_or_forked_during_an_alter_end_up_with_the_new_settings(tmp_path):
    h = Harness(tmp_path, serving=[0, 1])
    h.store.create("orders", 3)
    h.boot_all()  # slot 2 forked with the old settings, still booting
    h.admin.alter("client", "orders", {"flush_ms": "9"}, now=0)
    h.ack_all(h.take("configure"))
    assert h.replies == []
    h.serving.add(2)
    h.admin.slot_ready(2)
    (late,) = h.take("configure")
    assert late[0] == 2 and late[2]["config"] == {"flush_ms": 9}
    h.ack_all([late])
    assert h.replies == [("client", None)]

    h.admin.alter("second", "orders", {"flush_ms": "10"}, now=1)
    h.admin.slot_down(1)
    for slot, _, body in h.take("configure"):
        if slot != 1:
            h.admin.acked(slot, body["id"], None)
    assert h.replies[-1] == ("client", None)
    specs = h.admin.assign(1)  # the respawned process is forked with the new settings
    assert all(spec.config == {"flush_ms": 10} for spec in specs)
    h.admin.slot_ready(1)
    assert h.take("configure") == [] and h.replies[-1] == ("second", None)


def test_a_stale_configure_ack_does_not_confirm_a_newer_alter(tmp_path):
    h = Harness(tmp_path)
    h.store.create("orders", 1)
    h.boot_all()
    h.admin.alter("first", "orders", {"flush_ms": "5"}, now=0)
    first = h.take("configure")
    h.admin.alter("second", "orders", {"flush_ms": "6"}, now=0)
    second = h.take("configure")
    h.ack_all(first)
    assert h.replies == []
    h.ack_all(second)
    assert sorted(waiter for waiter, _ in h.replies) == ["first", "second"]


def test_unanswered_alter_times_out_with_error_12_and_a_failed_one_says_so(tmp_path):
    h = Harness(tmp_path)
    h.store.create("orders", 1)
    h.boot_all()
    h.admin.alter("client", "orders", {"flush_ms": "5"}, now=0)
    h.admin.expire(11)
    (reply,) = h.replies
    assert isinstance(reply[1], RequestTimedOutError) and "alter of topic 'orders'" in reply[1].message
    h.admin.alter("again", "orders", {"flush_ms": "7"}, now=20)
    h.ack_all(h.take("configure")[-1:], error="InvalidConfigError: boom")
    assert isinstance(h.replies[-1][1], StorageError) and "boom" in h.replies[-1][1].message


def test_an_open_carrying_the_altered_settings_confirms_the_alter(tmp_path):
    h = Harness(tmp_path, serving=[0, 1])
    h.boot_all()  # slot 2 respawned without the topic, still booting
    h.admin.create("creator", "orders", 3, (), now=0)
    h.admin.alter("client", "orders", {"flush_ms": "9"}, now=0)
    h.ack_all(h.take("open"))
    h.ack_all(h.take("configure"))
    assert h.replies == []
    h.serving.add(2)
    h.admin.slot_ready(2)
    (late,) = h.take("open")
    assert late[0] == 2 and late[2]["partitions"][0]["config"] == {"flush_ms": 9}
    assert h.take("configure") == []
    h.ack_all([late])
    assert sorted(h.replies) == [("client", None), ("creator", None)]


def test_a_control_refused_by_a_busy_slot_is_sent_again_on_a_later_tick(tmp_path):
    h = Harness(tmp_path)
    h.store.create("orders", 1)
    h.boot_all()
    slot = owner_slot("orders", 0, SLOTS)
    h.refuse = True
    h.admin.alter("client", "orders", {"flush_ms": "5"}, now=0)
    h.admin.expire(0.1)
    assert h.sent == [] and h.replies == []
    h.refuse = False
    h.admin.expire(0.2)
    h.admin.expire(0.2 + RETRY_INTERVAL_S)
    (configure,) = h.take("configure")
    assert configure[0] == slot and configure[2]["config"] == {"flush_ms": 5}
    h.admin.expire(1 + 2 * RETRY_INTERVAL_S)
    assert h.take() == [], "sent once"
    h.ack_all([configure])
    assert h.replies == [("client", None)]


def test_a_failed_configure_is_sent_again_by_the_next_alter(tmp_path):
    h = Harness(tmp_path)
    h.store.create("orders", 1)
    h.boot_all()
    h.admin.alter("client", "orders", {"flush_ms": "5"}, now=0)
    h.ack_all(h.take("configure"), error="StorageError: disk gone")
    assert isinstance(h.replies[-1][1], StorageError)
    h.admin.alter("again", "orders", {"flush_ms": "5"}, now=1)
    (configure,) = h.take("configure")
    assert configure[2]["config"] == {"flush_ms": 5} and h.replies[-1][0] == "client"
    h.ack_all([configure])
    assert h.replies[-1] == ("again", None)

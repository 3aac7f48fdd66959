"""The security state reaches every worker even when a send fails: the arbiter's side
(``hpbroker.workers.security_state``) with the real front-end's backend ROUTER and a worker's
DEALER that connects only after the first send, on a clock the test moves."""

from __future__ import annotations

import itertools
import os

import pytest
import zmq
from curve_probe import make_keys

from hpbroker.broker.config import BrokerConfig
from hpbroker.broker.topics import TopicStore
from hpbroker.security.broker import BrokerSecurity
from hpbroker.workers import backend
from hpbroker.workers.frontend import Frontend
from hpbroker.workers.security_state import RESEND_AFTER_S, SecurityState
from hpbroker.workers.slots import Slot, SlotState

_ids = itertools.count()


@pytest.fixture
def rig(tmp_path):
    """(state, slot, back ROUTER, worker DEALER not yet connected, clock list, address)."""
    keys = make_keys(tmp_path)
    config = BrokerConfig(data_dir=str(tmp_path / "data"), workers=1, security="curve",
                          server_key_file=str(keys.secrets / "broker.key_secret"),
                          allowlist_dir=str(keys.allowlist))
    os.makedirs(config.data_dir)
    context = zmq.Context()
    address = f"inproc://back-{next(_ids)}"
    back = context.socket(zmq.ROUTER)
    back.setsockopt(zmq.ROUTER_MANDATORY, 1)
    back.bind(address)
    worker = context.socket(zmq.DEALER)
    worker.setsockopt(zmq.ROUTING_ID, backend.worker_identity(0))
    slot = Slot(0, state=SlotState.SERVING, pid=4242)
    frontend = Frontend(config, TopicStore(config.data_dir), [slot], str(tmp_path), admin_timeout_s=5.0)
    frontend.attach(context.socket(zmq.ROUTER), back)
    now = [100.0]
    state = SecurityState(BrokerSecurity(config), [slot], frontend.send_control, lambda: None,
                          clock=lambda: now[0])
    try:
        yield state, slot, back, worker, now, address
    finally:
        worker.close(linger=0)
        back.close(linger=0)
        frontend._front.close(linger=0)
        context.term()


def received(worker: zmq.Socket, timeout_ms: int = 2000) -> dict | None:
    """The next security control the worker got (None: none within the timeout)."""
    if not worker.poll(timeout_ms):
        return None
    message = backend.decode(worker.recv_multipart())
    assert message.op == "security"
    return message.body


def test_a_state_whose_send_failed_is_sent_again_until_acknowledged(rig):
    state, slot, back, worker, now, address = rig
    state.slot_ready(slot)  # the worker's process is not connected: the send fails
    worker.connect(address)
    worker.send(b"hello")  # the back ROUTER knows the worker once this arrives
    assert back.poll(5000)
    back.recv_multipart()

    now[0] += RESEND_AFTER_S / 2
    assert state.turn()
    assert received(worker, 300) is None  # not before RESEND_AFTER_S

    now[0] += RESEND_AFTER_S
    assert state.turn()
    body = received(worker)
    assert body is not None and body["principals"] == ["alice", "bob", "broker"]
    assert body["id"] == f"security-{slot.pid}-{state.version}"

    state.acked(slot, body["id"], None)  # the worker took it: nothing more is sent
    now[0] += 10 * RESEND_AFTER_S
    assert state.turn()
    assert received(worker, 300) is None

    state.push()  # a change: a new version, sent at once; its ack refused, so sent again
    changed = received(worker)
    assert changed is not None and changed["id"] == f"security-{slot.pid}-{state.version}" != body["id"]
    state.acked(slot, changed["id"], "ValueError: bad state")
    now[0] += RESEND_AFTER_S
    assert state.turn()
    again = received(worker)
    assert again is not None and again["id"] == changed["id"]
    state.acked(slot, again["id"], None)


def test_a_new_process_in_the_slot_is_sent_the_state_whatever_its_predecessor_acknowledged(rig):
    state, slot, back, worker, now, address = rig
    worker.connect(address)
    worker.send(b"hello")
    assert back.poll(5000)
    back.recv_multipart()
    state.slot_ready(slot)
    state.acked(slot, received(worker)["id"], None)
    slot.pid = 4343  # respawned; its ready lost, say: the turn still sees it behind
    now[0] += RESEND_AFTER_S
    assert state.turn()
    body = received(worker)
    assert body is not None and body["id"] == f"security-4343-{state.version}"


def test_a_worker_that_stays_behind_is_logged_once_a_minute_not_once_a_resend(rig, caplog):
    state, slot, back, worker, now, address = rig
    worker.connect(address)
    state.slot_ready(slot)
    assert received(worker) is not None  # never acknowledged: resent every RESEND_AFTER_S
    with caplog.at_level("INFO", logger="hpbroker.workers.security_state"):
        for _ in range(30):
            now[0] += RESEND_AFTER_S
            state.turn()
            assert received(worker) is not None
    lines = [r for r in caplog.records if "has not acknowledged" in r.getMessage()]
    assert len(lines) == 1

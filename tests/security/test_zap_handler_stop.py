"""Stopping the broker when the ZAP handler's thread will not stop: the arbiter's cleanup still
ends its ZeroMQ context instead of waiting for ever on the thread's sockets.  Real sockets, the
real handler; its thread made deaf to TERMINATE."""

from __future__ import annotations

import threading

import zmq
from curve_probe import make_keys

from hpbroker.broker.config import BrokerConfig
from hpbroker.security import authenticator
from hpbroker.security.broker import BrokerSecurity
from hpbroker.workers.arbiter import Arbiter


def test_cleanup_ends_the_context_when_the_zap_thread_ignores_terminate(tmp_path, monkeypatch):
    monkeypatch.setattr(authenticator, "_STOP_TIMEOUT_S", 0.2)
    keys = make_keys(tmp_path)
    arbiter = Arbiter(BrokerConfig(data_dir=str(tmp_path / "data"), security="curve",
                                   server_key_file=str(keys.secrets / "broker.key_secret"),
                                   allowlist_dir=str(keys.allowlist)))
    security = arbiter._security = BrokerSecurity(arbiter.config)
    context = arbiter._context = zmq.Context()
    router = arbiter._front = context.socket(zmq.ROUTER)
    security.secure_front(context, router)
    handler = security._authenticator
    assert handler is not None and handler.thread is not None
    handler.thread._handle_pipe_message = lambda message: False  # deaf to TERMINATE
    cleanup = threading.Thread(target=arbiter._cleanup, daemon=True)
    cleanup.start()
    cleanup.join(15.0)
    assert not cleanup.is_alive(), "the arbiter's cleanup hangs on the ZeroMQ context"
    assert context.closed

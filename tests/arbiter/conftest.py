"""Fixtures shared by the arbiter tests."""

from __future__ import annotations

import pytest
from harness import Client, start_standin


@pytest.fixture
def standin(tmp_path):
    """``standin(**kwargs)``: an arbiter with stand-in workers (``harness.start_standin``) and a
    client on its front-end, ``(broker, config, client)``; all stopped at teardown."""
    started = []

    def start(**kwargs):
        broker, config = start_standin(tmp_path, **kwargs)
        client = Client(config["port"])
        started.append((broker, client))
        return broker, config, client

    yield start
    for broker, client in started:
        client.close()
        broker.stop()

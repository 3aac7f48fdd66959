"""The arbiter's metrics endpoint (hpbroker.workers.exporter) on its own: what a scrape renders
while the arbiter's loop changes what it hands over."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import zmq
from harness import wait_until
from scrape import parse

from hpbroker.broker.config import BrokerConfig
from hpbroker.workers.exporter import MetricsEndpoint, SlotView
from hpbroker.workers.peers import FrontendPeers


class StoppedMidScrape(MetricsEndpoint):
    """The consumer-group poller is there when a scrape first looks, and gone (the loop ran
    ``stop_watching_groups``) when it looks again."""

    def __init__(self, *args, **kwargs) -> None:
        self._poller_reads = 0
        super().__init__(*args, **kwargs)

    @property
    def _groups(self):
        self._poller_reads += 1
        return self._poller if self._poller_reads == 1 else None

    @_groups.setter
    def _groups(self, value) -> None:
        self._poller = value


class FakePoller:
    snapshot = SimpleNamespace(read_at=0.0, offsets={("g", "t", 0): 3})  # a GroupOffsets


@pytest.fixture
def endpoint(tmp_path):
    config = BrokerConfig(data_dir=str(tmp_path), host="127.0.0.1")  # metrics_port 0: any free port
    made = []

    def make(cls=MetricsEndpoint) -> MetricsEndpoint:
        endpoint = cls(config, str(tmp_path), dict)
        made.append(endpoint)
        return endpoint

    yield make
    for endpoint in made:
        endpoint.close()


def test_a_scrape_while_the_group_poller_is_stopped_still_renders(endpoint):
    metrics = endpoint(StoppedMidScrape)
    metrics.slots = (SlotView(0, "stopping", 0, 0),)
    metrics.stopping = True
    metrics._poller, metrics._poller_reads = FakePoller(), 0
    scraped = parse(metrics.render())
    assert scraped.value("hpbroker_workers", state="stopping") == 1


def test_front_end_connections_made_before_the_endpoint_serves_are_counted_exactly(endpoint):
    metrics = endpoint()
    context = zmq.Context()
    router = context.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    clients = []
    peers = None
    try:
        peers = FrontendPeers(router, port=0, max_connections=100)  # as the arbiter does: before the bind
        metrics.watch_peers(peers)
        port = router.bind_to_random_port("tcp://127.0.0.1")
        for _ in range(3):  # connected before anything drains the monitor or serves
            client = context.socket(zmq.DEALER)
            client.setsockopt(zmq.LINGER, 0)
            client.connect(f"tcp://127.0.0.1:{port}")
            clients.append(client)

        def connections() -> float | None:
            peers.drain()
            return parse(metrics.render()).value("hpbroker_frontend_connections")

        wait_until(lambda: connections() == 3, 10, what="3 connections counted")
        metrics.start()
        clients.pop().close()
        wait_until(lambda: connections() == 2, 10, what="a disconnection counted")
    finally:
        metrics.close()
        if peers is not None:
            peers.close()  # disables the monitor, before the router closes
        for client in clients:
            client.close()
        router.close()
        context.term()

"""The arbiter's metrics endpoint (hpbroker.workers.exporter) on its own: what a scrape renders
while the arbiter's loop changes what it hands over."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from scrape import parse

from hpbroker.broker.config import BrokerConfig
from hpbroker.workers.exporter import MetricsEndpoint, SlotView


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

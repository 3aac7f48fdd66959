"""The ages /metrics reports (hpbroker.workers.exporter) are never negative and never jump with a
step of the wall clock: a worker's report age is measured on the monotonic clock from the
scrape that first read it, the consumer groups' offsets age on the monotonic clock outright."""

from __future__ import annotations

import os
import time
from types import SimpleNamespace

import pytest
from harness import wait_until
from scrape import parse

from hpbroker.broker.config import BrokerConfig
from hpbroker.workers.exporter import MetricsEndpoint, SlotView
from hpbroker.workers.stats import WorkerStats, write_stats

HOUR_S = 3600
GENEROUS_S = 30.0  # an age this test could see without any step: the test's own run time, at most


class SteppingClocks:
    """A wall clock and a monotonic clock that move only when told to, each on its own."""

    def __init__(self) -> None:
        self.wall_s, self.monotonic_s = 1_700_000_000.0, 1000.0

    def wall(self) -> float:
        return self.wall_s

    def monotonic(self) -> float:
        return self.monotonic_s


@pytest.fixture
def endpoint(tmp_path):
    config = BrokerConfig(data_dir=str(tmp_path), host="127.0.0.1")  # metrics_port 0: any free port
    metrics = MetricsEndpoint(config, str(tmp_path), dict)
    metrics.slots = (SlotView(0, "serving", os.getpid(), 0),)
    yield metrics
    metrics.close()


def _report(run_dir, time_ms: int) -> None:
    """The slot 0 worker's stats file, as written at wall-clock ``time_ms``."""
    snapshot = WorkerStats().snapshot(0, [], 0)
    snapshot["pid"], snapshot["time_ms"] = os.getpid(), time_ms
    write_stats(str(run_dir), 0, snapshot)


def _report_age(metrics) -> float:
    return parse(metrics.render()).value("hpbroker_worker_report_age_seconds", worker=0)


def test_a_report_written_before_a_forward_step_is_not_an_hour_old(endpoint, tmp_path):
    _report(tmp_path, int((time.time() - HOUR_S) * 1000))  # then the wall clock stepped an hour ahead
    assert 0 <= _report_age(endpoint) < GENEROUS_S


def test_a_report_written_before_a_backward_step_is_not_negative(endpoint, tmp_path):
    _report(tmp_path, int((time.time() + HOUR_S) * 1000))  # then the wall clock stepped an hour back
    assert 0 <= _report_age(endpoint) < GENEROUS_S


def test_a_report_age_grows_on_the_monotonic_clock_whatever_the_wall_clock_does(endpoint, tmp_path):
    from hpbroker.workers.exporter import _ReportAges

    clocks = SteppingClocks()
    endpoint._reports = _ReportAges(wall_clock=clocks.wall, monotonic_clock=clocks.monotonic)
    clocks.wall_s += 2
    clocks.monotonic_s += 2
    _report(tmp_path, int((clocks.wall_s - 1.5) * 1000))
    assert _report_age(endpoint) == pytest.approx(1.5), "the wall-clock age, at its first read"
    clocks.wall_s -= HOUR_S  # the worker hangs; the wall clock steps back
    clocks.monotonic_s += 4
    assert _report_age(endpoint) == pytest.approx(5.5)
    clocks.wall_s += 2 * HOUR_S  # and forward
    clocks.monotonic_s += 1
    assert _report_age(endpoint) == pytest.approx(6.5)
    _report(tmp_path, int(clocks.wall_s * 1000))  # a new report, written under the stepped clock
    assert _report_age(endpoint) == pytest.approx(0.0)


def test_a_new_reports_wall_clock_age_is_bounded_by_the_previous_read(endpoint, tmp_path):
    from hpbroker.workers.exporter import _ReportAges

    clocks = SteppingClocks()
    endpoint._reports = _ReportAges(wall_clock=clocks.wall, monotonic_clock=clocks.monotonic)
    clocks.monotonic_s += 100
    _report(tmp_path, int(clocks.wall_s * 1000))
    assert _report_age(endpoint) == pytest.approx(0.0)
    clocks.monotonic_s += 15  # the next scrape, 15 s later, finds a report written before a step
    _report(tmp_path, int((clocks.wall_s + 5) * 1000))
    clocks.wall_s += HOUR_S + 10
    assert _report_age(endpoint) == pytest.approx(15.0), "at most the time since the previous read"
    clocks.monotonic_s += 15
    _report(tmp_path, int((clocks.wall_s + HOUR_S) * 1000))  # one from before a backward step
    assert _report_age(endpoint) == pytest.approx(0.0)


def test_a_report_without_a_valid_time_shows_no_age(endpoint, tmp_path):
    _report(tmp_path, "soon")  # a file from a worker of another version
    assert parse(endpoint.render()).series("hpbroker_worker_report_age_seconds") == {}


def test_the_group_offsets_age_is_on_the_monotonic_clock(endpoint):
    from hpbroker.coord.lag import GroupOffsetsPoller

    poller = GroupOffsetsPoller(SimpleNamespace(), interval_s=60)  # no topics wanted: reads no ZooKeeper
    poller.start()
    try:
        wait_until(lambda: poller.snapshot is not None, 10, what="the first round")
        assert abs(poller.snapshot.read_at - time.monotonic()) < GENEROUS_S
        endpoint._groups = poller
        age = parse(endpoint.render()).value("hpbroker_consumer_group_offsets_age_seconds")
        assert 0 <= age < GENEROUS_S
    finally:
        endpoint._groups = None
        poller.close()

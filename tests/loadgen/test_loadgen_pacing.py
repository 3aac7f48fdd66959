"""The rate controller, driven by a fake clock: steady, no drift, catch-up bounded, limits."""

from __future__ import annotations

import math

import pytest

from loadgen.pacing import Pacer


def drive(pacer: Pacer, until_s: float, *, oversleep_s: float = 0.0, send_s: float = 0.0):
    """Run the pacer's loop on a fake clock; returns the (time, chunk) sends."""
    now, sends = pacer.start_s, []
    for _ in range(10_000_000):
        if now >= until_s:
            break
        n, wait_s = pacer.next(now)
        if n == 0:
            if math.isinf(wait_s):
                break
            now += wait_s + oversleep_s
            continue
        sends.append((now, n))
        pacer.sent(n)
        now += send_s
    return sends


def test_steady_rate_sends_what_the_clock_says_within_one_chunk():
    pacer = Pacer(100_000, 10.0, max_chunk=1000, pace_s=0.001)
    sends = drive(pacer, 12.0)
    sent = 0
    for t, n in sends:
        sent += n
        assert sent <= math.floor(100_000 * (t - 10.0))  # never ahead of the schedule
    assert sent == pytest.approx(200_000, abs=100)
    assert all(n == 100 for _, n in sends[1:])  # chunks of rate * pace


def test_late_wake_ups_do_not_drift():
    """Every sleep overshoots by 0.3 ms (a busy machine): chunks grow, the total stays on time."""
    pacer = Pacer(50_000, 0.0, max_chunk=1000, pace_s=0.001)
    sends = drive(pacer, 10.0, oversleep_s=0.0003)
    total = sum(n for _, n in sends)
    assert total == pytest.approx(500_000, abs=1000)  # not 10 s * 50k / 1.3
    assert pacer.max_lag_s < 0.001


def test_falling_behind_catches_up_in_bounded_chunks_and_reports_the_lag():
    pacer = Pacer(1_000_000, 0.0, max_chunk=500, pace_s=0.001)
    n, _ = pacer.next(0.050)  # woke 50 ms late: 50,000 due
    assert n == 500
    pacer.sent(n)
    assert pacer.max_lag_s == pytest.approx((50_000 - 500) / 1e6)  # beyond one pacing chunk
    assert pacer.lag_s(0.050) == pytest.approx(49_500 / 1e6)


def test_early_wake_up_waits_for_the_next_chunk():
    pacer = Pacer(1000, 0.0, max_chunk=100, pace_s=0.01)  # 10 records per 10 ms
    n, wait_s = pacer.next(0.005)
    assert n == 0 and wait_s == pytest.approx(0.005, abs=1e-5)


def test_max_rate_sends_full_chunks_without_waiting():
    pacer = Pacer(None, 0.0, max_chunk=1000)
    for _ in range(5):
        n, wait_s = pacer.next(0.0)
        assert (n, wait_s) == (1000, 0.0)
        pacer.sent(n)
    assert pacer.lag_s(123.0) == 0.0


@pytest.mark.parametrize("rate", [None, 10_000.0])
def test_limit_is_reached_exactly_then_the_pacer_says_done(rate):
    pacer = Pacer(rate, 0.0, limit=2_345, max_chunk=1000)
    sends = drive(pacer, 100.0)
    assert sum(n for _, n in sends) == 2_345
    assert pacer.next(1000.0) == (0, math.inf)


def test_low_rates_send_one_record_at_a_time_on_schedule():
    pacer = Pacer(10, 0.0, max_chunk=1000, pace_s=0.001)
    sends = drive(pacer, 1.0)
    assert [n for _, n in sends] == [1] * 9
    assert [round(t, 3) for t, _ in sends] == [round(0.1 * k, 3) for k in range(1, 10)]


def test_invalid_settings_are_refused():
    with pytest.raises(ValueError):
        Pacer(0, 0.0)
    with pytest.raises(ValueError):
        Pacer(10, 0.0, max_chunk=0)

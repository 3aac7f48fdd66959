"""The seeded fault schedule: the same seed gives the same steps, every nemesis comes first in a
round-robin pass, alone, then some steps mix two; steps never overlap and all fit the duration."""

from __future__ import annotations

import pytest

from chaos.nemesis import NEMESES
from chaos.schedule import Step, format_schedule, make_schedule

NAMES = list(NEMESES)


def _schedule(seed: int, duration_s: float = 1800.0, names=NAMES):
    return make_schedule(seed, duration_s, names, mean_gap_s=6.0, hold_range_s=(5.0, 15.0))


def test_the_same_seed_replays_the_same_schedule_and_another_seed_does_not():
    assert _schedule(42) == _schedule(42)
    assert _schedule(42) != _schedule(43)


def test_the_first_pass_takes_every_nemesis_in_order_then_draws_from_all():
    steps = _schedule(7)
    assert [s.nemesis for s in steps[:len(NAMES)]] == NAMES
    later = {s.nemesis for s in steps[len(NAMES):]}
    assert len(steps) > 5 * len(NAMES) and later == set(NAMES)


def test_faults_never_overlap_and_fit_the_duration():
    for seed in range(20):
        steps = _schedule(seed, duration_s=600.0)
        assert steps
        for before, after in zip(steps, steps[1:], strict=False):
            gap = after.at_s - (before.at_s + before.hold_s)
            assert gap >= 3.0 - 1e-6, (before, after)  # at least half the mean gap
        assert all(5.0 <= s.hold_s <= 15.0 for s in steps)
        assert steps[-1].at_s + steps[-1].hold_s <= 600.0


def test_a_short_duration_cuts_the_schedule_and_an_empty_one_has_no_step():
    assert _schedule(1, duration_s=0.0) == []
    short = _schedule(1, duration_s=60.0)
    assert 0 < len(short) < len(NAMES)
    assert [s.nemesis for s in short] == NAMES[:len(short)]


def test_bad_arguments_are_refused_with_the_reason():
    with pytest.raises(ValueError, match="at least one nemesis"):
        make_schedule(1, 60, [], mean_gap_s=1, hold_range_s=(1, 2))
    with pytest.raises(ValueError, match="named twice"):
        make_schedule(1, 60, ["kill", "kill"], mean_gap_s=1, hold_range_s=(1, 2))
    with pytest.raises(ValueError, match="hold_range_s"):
        make_schedule(1, 60, ["kill"], mean_gap_s=1, hold_range_s=(3, 2))
    with pytest.raises(ValueError, match="negative"):
        make_schedule(1, -1, ["kill"], mean_gap_s=1, hold_range_s=(1, 2))


def test_the_printed_schedule_lists_each_step_and_the_count_per_nemesis():
    text = format_schedule([Step(1.5, "kill", 8.0), Step(20.25, "split", 9.5),
                            Step(40.0, "kill", 6.0, "pause")])
    lines = text.splitlines()
    assert lines[0].split() == ["#1", "at", "1.5", "s", "kill", "hold", "8.0", "s"]
    assert lines[1].split()[:5] == ["#2", "at", "20.2", "s", "split"]
    assert lines[2].split() == ["#3", "at", "40.0", "s", "kill+pause", "hold", "6.0", "s", "(mixed:", "pause",
                                "from", "+2.0", "s)"]
    assert lines[-1] == "4 faults in 3 steps (1 mixed): kill 2, split 1, pause 1"


def test_after_the_first_pass_alone_some_steps_mix_two_different_nemeses():
    for seed in range(20):
        steps = _schedule(seed)
        assert all(s.mixed is None for s in steps[:len(NAMES)])
        assert steps[len(NAMES)].mixed is not None  # the first step after the first pass
        mixed = [s for s in steps if s.mixed is not None]
        assert all(s.mixed != s.nemesis and s.mixed != "clock" for s in mixed)
        assert 0.1 < len(mixed) / len(steps) < 0.5


@pytest.mark.parametrize("seed", range(50))
def test_the_short_preset_runs_every_nemesis_alone_and_one_mixed_step_whatever_the_seed(seed):
    """Its worst case: the first pass at the longest gaps and holds, then a mixed step."""
    from chaos.runner import SHORT

    steps = make_schedule(seed, SHORT.duration_s, list(SHORT.nemeses), mean_gap_s=SHORT.mean_gap_s,
                          hold_range_s=SHORT.hold_range_s)
    assert [s.nemesis for s in steps[:len(NAMES)]] == NAMES
    assert any(s.mixed is not None for s in steps)
    worst = (len(NAMES) + 1) * (1.5 * SHORT.mean_gap_s + SHORT.hold_range_s[1])
    assert worst <= SHORT.duration_s

"""The seeded fault schedule of a chaos campaign: which nemesis, when, for how long.

``make_schedule(seed, duration_s, nemeses, mean_gap_s=..., hold_range_s=...)`` is a pure
function of its arguments (its own ``random.Random(seed)``), so a printed seed replays the same
schedule.  Its steps, in time order::

    step k:  at_s[k] = at_s[k-1] + hold_s[k-1] + gap[k]      (at_s[0] = gap[0])
             gap ~ uniform(mean_gap_s / 2, 3 * mean_gap_s / 2), hold_s ~ uniform(hold_range_s)

The first pass takes every named nemesis once in the order given (round-robin), the rest are
drawn at random; steps are kept while ``at_s + hold_s <= duration_s``, so every nemesis runs at
least once when the duration allows the first pass (about ``len(nemeses) * (mean_gap_s + mean
hold)``), and a shorter duration cuts the first pass too.

Faults never overlap: ``at_s`` is the earliest start, relative to the campaign's start, as if
healing took no time; a runner starts a step at ``at_s`` or, when the previous fault's healing
ran late, after that healing plus a pause, never while another fault holds.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Step", "format_schedule", "make_schedule"]


@dataclass(frozen=True)
class Step:
    """Inject ``nemesis`` at ``at_s`` seconds into the campaign, heal it ``hold_s`` later."""

    at_s: float
    nemesis: str
    hold_s: float

    @property
    def nemeses(self) -> tuple[str, ...]:
        """The nemeses this step injects."""
        return (self.nemesis,)


def make_schedule(seed: int, duration_s: float, nemeses: Sequence[str], *, mean_gap_s: float,
                  hold_range_s: tuple[float, float]) -> list[Step]:
    """The schedule (module docstring); ValueError for no nemesis, a duplicate one, a negative
    duration or gap, or a hold range that is not ``0 < low <= high``."""
    names = list(nemeses)
    if not names:
        raise ValueError("a schedule needs at least one nemesis")
    if len(set(names)) != len(names):
        raise ValueError(f"a nemesis is named twice: {names}")
    if duration_s < 0 or mean_gap_s < 0:
        raise ValueError(f"duration_s and mean_gap_s must not be negative, got {duration_s} and {mean_gap_s}")
    low, high = hold_range_s
    if not 0 < low <= high:
        raise ValueError(f"hold_range_s must be (low, high) with 0 < low <= high, got {hold_range_s}")
    rng = random.Random(seed)
    steps: list[Step] = []
    at_s = 0.0
    while True:
        first_pass = len(steps) < len(names)
        name = names[len(steps)] if first_pass else rng.choice(names)
        at_s += rng.uniform(mean_gap_s / 2, 3 * mean_gap_s / 2)
        hold_s = rng.uniform(low, high)
        if at_s + hold_s > duration_s:
            return steps
        steps.append(Step(round(at_s, 3), name, round(hold_s, 3)))
        at_s += hold_s


def format_schedule(steps: Sequence[Step]) -> str:
    """One line per step (``#3  at 41.2 s  split  hold 9.8 s``), then the count per nemesis."""
    lines = [f"#{k:<4} at {step.at_s:8.1f} s  {step.nemesis:<15} hold {step.hold_s:5.1f} s"
             for k, step in enumerate(steps, 1)]
    counts: dict[str, int] = {}
    for step in steps:
        counts[step.nemesis] = counts.get(step.nemesis, 0) + 1
    lines.append(f"{len(steps)} faults: " + ", ".join(f"{name} {count}" for name, count in counts.items()))
    return "\n".join(lines)

"""The seeded fault schedule of a chaos campaign: which nemesis, when, for how long.

``make_schedule(seed, duration_s, nemeses, mean_gap_s=..., hold_range_s=...)`` is a pure
function of its arguments (its own ``random.Random(seed)``), so a printed seed replays the same
schedule.  Its steps, in time order::

    step k:  at_s[k] = at_s[k-1] + hold_s[k-1] + gap[k]      (at_s[0] = gap[0])
             gap ~ uniform(mean_gap_s / 2, 3 * mean_gap_s / 2), hold_s ~ uniform(hold_range_s)

The first pass takes every named nemesis once, alone, in the order given (round-robin); the
rest are drawn at random, and some of them are *mixed*: the step's first nemesis is injected at
``at_s``, a second, different one at ``at_s + hold_s / 3`` while the first still holds, and both
are healed at ``at_s + hold_s`` (Jepsen's composed faults: a kill during a partition, a pause
during a ZooKeeper kill...).  The first step after the first pass is always mixed (when two
nemeses or more are named), each later one with probability :data:`MIXED_SHARE`; ``clock`` is
never the second of a mixed step (it has one broker to hit, which the first fault may hold).
Steps are kept while ``at_s + hold_s <= duration_s``, so every nemesis runs alone at least once
when the duration allows the first pass (about ``len(nemeses) * (mean_gap_s + mean hold)``), and
a shorter duration cuts the first pass too.

Steps never overlap (only the two faults of a mixed step do, on purpose): ``at_s`` is the
earliest start, relative to the campaign's start, as if healing took no time; a runner starts a
step at ``at_s`` or, when the previous step's healing and recovery ran late, after them plus a
pause, never while another step holds.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["MIXED_SHARE", "Step", "format_schedule", "make_schedule"]

#: after the first pass (and its one guaranteed mixed step), the share of mixed steps
MIXED_SHARE = 0.25
_NEVER_SECOND = ("clock",)  # one target only: the first fault of the step may hold it


@dataclass(frozen=True)
class Step:
    """Inject ``nemesis`` at ``at_s`` seconds into the campaign, heal it ``hold_s`` later; a
    mixed step injects ``mixed`` too, ``hold_s / 3`` after the first, and heals both together."""

    at_s: float
    nemesis: str
    hold_s: float
    mixed: str | None = None

    @property
    def nemeses(self) -> tuple[str, ...]:
        """The nemeses this step injects, in order."""
        return (self.nemesis,) if self.mixed is None else (self.nemesis, self.mixed)

    @property
    def name(self) -> str:
        """``kill`` or, mixed, ``kill+split``."""
        return "+".join(self.nemeses)


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
        mixed = None
        seconds = [n for n in names if n != name and n not in _NEVER_SECOND]
        if not first_pass and seconds and (len(steps) == len(names) or rng.random() < MIXED_SHARE):
            mixed = rng.choice(seconds)
        at_s += rng.uniform(mean_gap_s / 2, 3 * mean_gap_s / 2)
        hold_s = rng.uniform(low, high)
        if at_s + hold_s > duration_s:
            return steps
        steps.append(Step(round(at_s, 3), name, round(hold_s, 3), mixed))
        at_s += hold_s


def format_schedule(steps: Sequence[Step]) -> str:
    """One line per step (``#3  at 41.2 s  split  hold 9.8 s``; a mixed one ``kill+split ...
    (split from +3.3 s)``), then the count per nemesis and of mixed steps."""
    lines = []
    for k, step in enumerate(steps, 1):
        line = f"#{k:<4} at {step.at_s:8.1f} s  {step.name:<15} hold {step.hold_s:5.1f} s"
        if step.mixed is not None:
            line += f"  (mixed: {step.mixed} from +{step.hold_s / 3:.1f} s)"
        lines.append(line)
    counts: dict[str, int] = {}
    for step in steps:
        for name in step.nemeses:
            counts[name] = counts.get(name, 0) + 1
    mixed = sum(step.mixed is not None for step in steps)
    lines.append(f"{sum(counts.values())} faults in {len(steps)} steps ({mixed} mixed): "
                 + ", ".join(f"{name} {count}" for name, count in counts.items()))
    return "\n".join(lines)

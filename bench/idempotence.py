"""Producer settings compared within one run: idempotence on against off, and requests in flight
per partition 5 against 1 (``python -m bench.scenarios --idempotence-compare``).

A comparison runs its variants in rounds: each round runs every variant once, in an order rotated
by one each round (round 0: a, b, c; round 1: b, c, a; ...), so a slow stretch of the shared
machine, or a broker warming up, falls on every variant alike instead of on whichever runs first
or last.  Each side is reported by its median and its range over the rounds; the cost of a
variant against a baseline is the relative difference of the medians, beside the median (and
range) of the per-round ratios, which cancels drift between rounds.

Pure bookkeeping: what one run measures is the caller's ``measure`` function.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

__all__ = ["IDEMPOTENCE_OFF", "IDEMPOTENCE_ON", "IDEMPOTENCE_ON_1", "Variant", "interleave", "order",
           "relative_change", "spread"]


@dataclass(frozen=True, slots=True)
class Variant:
    """One side of a comparison: a short label, a slug for run and topic names ([a-z0-9-]), and
    the loadgen settings (``LoadConfig`` fields) that make it."""

    label: str
    slug: str
    settings: tuple[tuple[str, object], ...]

    @property
    def options(self) -> dict:
        return dict(self.settings)


#: the client's default: idempotent, up to 5 produce requests in flight per partition.
IDEMPOTENCE_ON = Variant("idempotence on, 5 in flight", "idem-on-5",
                         (("enable_idempotence", True), ("max_in_flight", 5)))
#: idempotent, one request in flight per partition (the pipelining question's baseline).
IDEMPOTENCE_ON_1 = Variant("idempotence on, 1 in flight", "idem-on-1",
                           (("enable_idempotence", True), ("max_in_flight", 1)))
#: not idempotent (the client then keeps 1 request in flight per partition whatever it is told).
IDEMPOTENCE_OFF = Variant("idempotence off", "idem-off", (("enable_idempotence", False),))


def order(count: int, rounds: int) -> list[list[int]]:
    """The variant indexes each round runs, in order: ``range(count)`` rotated by the round."""
    if count < 1 or rounds < 0:
        raise ValueError(f"need at least one variant and no negative rounds, got {count}, {rounds}")
    return [[(r + i) % count for i in range(count)] for r in range(rounds)]


def interleave(variants: Sequence[Variant], rounds: int,
               measure: Callable[[Variant], dict]) -> dict[str, list[dict]]:
    """Run ``measure`` on every variant once per round (see :func:`order`); per variant label,
    its figures in round order, each with ``round`` added."""
    results: dict[str, list[dict]] = {v.label: [] for v in variants}
    if len(results) != len(variants):
        raise ValueError("variant labels must be distinct")
    for number, indexes in enumerate(order(len(variants), rounds)):
        for index in indexes:
            figures = dict(measure(variants[index]))
            figures["round"] = number
            results[variants[index].label].append(figures)
    return results


def spread(values: Sequence[float]) -> tuple[float, float, float]:
    """``(median, low, high)`` of ``values`` (at least one)."""
    if not values:
        raise ValueError("no values")
    return statistics.median(values), min(values), max(values)


def relative_change(variant: Sequence[float], baseline: Sequence[float]) -> dict:
    """How much ``variant`` differs from ``baseline``, in percent of the baseline (positive:
    ``variant`` is higher): ``of_medians`` from the two medians, and ``paired_median``,
    ``paired_low``, ``paired_high`` over the per-round ratios (the i-th of each list ran in the
    same round; both lists equally long)."""
    if len(variant) != len(baseline) or not variant:
        raise ValueError(f"need two equally long, non-empty lists, got {len(variant)} and {len(baseline)}")
    paired = [100.0 * (v / b - 1.0) for v, b in zip(variant, baseline, strict=True)]
    median_paired, low, high = spread(paired)
    return {"of_medians": 100.0 * (statistics.median(variant) / statistics.median(baseline) - 1.0),
            "paired_median": median_paired, "paired_low": low, "paired_high": high}

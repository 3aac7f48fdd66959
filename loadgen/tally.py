"""The consumer side's check: every record of every loadgen producer seen once, in order.

Each consumer process keeps a :class:`Tally` of the records it read, fed one partition's list of
record headers at a time (numpy, see ``payload.HEADER_DTYPE``):

- per producer (``run_id``, ``producer`` index): a bitmap of the sequence numbers seen (one byte
  per number up to the highest seen), how many records arrived, how many of them repeated a
  number already seen (**duplicated**);
- per producer and partition: the highest number seen so far; a record below it that is not a
  duplicate arrived **out of order** (after a later record of the same producer in the same
  partition: a producer's records keep their order within a partition);
- per partition: records, duplicated, out of order;
- records without loadgen's header (or of another run, when a run id is given): **foreign**.

At the end, :func:`merge_tallies` ORs the bitmaps of every consumer process, so a number seen by
two consumers counts as duplicated too, and compares them with what each producer says it sent:
**missing** = sent - distinct numbers seen, **unexpected** = numbers seen that were never sent.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from loadgen.payload import MAGIC_U16

__all__ = ["CheckResult", "Tally", "merge_tallies"]

_MAX_SEQUENCE = 1 << 40  # a larger number is no loadgen sequence: counted as foreign


@dataclass(slots=True)
class _ProducerState:
    seen: np.ndarray = field(default_factory=lambda: np.zeros(1 << 16, dtype=np.bool_))
    records: int = 0
    duplicated: int = 0
    out_of_order: int = 0
    highest: dict[int, int] = field(default_factory=dict)  # partition -> highest sequence seen


@dataclass(slots=True)
class _PartitionCounts:
    records: int = 0
    duplicated: int = 0
    out_of_order: int = 0


class Tally:
    """One consumer process's record of loadgen records (module docstring).  Single thread."""

    def __init__(self, run_id: int | None = None) -> None:
        self.run_id = run_id  # None: tally records of every run
        self.producers: dict[tuple[int, int], _ProducerState] = {}
        self.partitions: dict[int, _PartitionCounts] = defaultdict(_PartitionCounts)
        self.foreign = 0

    def add(self, partition: int, headers: np.ndarray) -> int:
        """Tally one partition's records, in offset order; returns how many were loadgen's."""
        if headers.size == 0:
            return 0
        ok = (headers["magic"] == MAGIC_U16) & (headers["sequence"] < _MAX_SEQUENCE)
        if self.run_id is not None:
            ok &= headers["run_id"] == self.run_id
        if not ok.all():
            self.foreign += int(headers.size - np.count_nonzero(ok))
            headers = headers[ok]
            if headers.size == 0:
                return 0
        producers, runs = headers["producer"], headers["run_id"]
        if (producers == producers[0]).all() and (runs == runs[0]).all():
            self._add_group((int(runs[0]), int(producers[0])), partition,
                            headers["sequence"].astype(np.int64))
            return int(headers.size)
        keys = (runs.astype(np.uint64) << np.uint64(16)) | producers.astype(np.uint64)
        for key in np.unique(keys).tolist():
            self._add_group((key >> 16, key & 0xFFFF), partition,
                            headers["sequence"][keys == key].astype(np.int64))
        return int(headers.size)

    def _add_group(self, producer_key: tuple[int, int], partition: int, sequences: np.ndarray) -> None:
        state = self.producers.get(producer_key)
        if state is None:
            state = self.producers[producer_key] = _ProducerState()
        n = int(sequences.size)
        first, last = int(sequences[0]), int(sequences[-1])
        increasing = n == 1 or bool((sequences[1:] > sequences[:-1]).all())
        top = last if increasing else int(sequences.max())
        if top >= state.seen.size:
            grown = np.zeros(max(top + 1, 2 * state.seen.size), dtype=np.bool_)
            grown[:state.seen.size] = state.seen
            state.seen = grown
        previous = state.highest.get(partition, -1)
        if increasing and last - first == n - 1:  # the common case: one run of numbers
            window = state.seen[first:last + 1]
            duplicated = int(np.count_nonzero(window))
            repeated = window.copy() if duplicated else None
            window[:] = True
        else:
            if increasing:
                repeated = state.seen[sequences]  # no repeats within the list
            else:
                repeated = _repeats_within(sequences) | state.seen[sequences]
            duplicated = int(np.count_nonzero(repeated))
            state.seen[sequences] = True
        if first > previous and increasing:
            late = 0
        else:  # below the highest number seen before it in this partition, and not a repeat
            before = np.empty_like(sequences)
            before[0] = previous
            np.maximum(np.maximum.accumulate(sequences)[:-1], previous, out=before[1:])
            below = sequences < before
            late = int(np.count_nonzero(below if repeated is None else below & ~repeated))
        state.highest[partition] = max(previous, top)
        state.records += n
        state.duplicated += duplicated
        state.out_of_order += late
        counts = self.partitions[partition]
        counts.records += n
        counts.duplicated += duplicated
        counts.out_of_order += late

    @property
    def records(self) -> int:
        return sum(state.records for state in self.producers.values())

    def export(self) -> dict:
        """A picklable summary for :func:`merge_tallies` (bitmaps packed 8 numbers a byte)."""
        producers = []
        for (run_id, producer), state in self.producers.items():
            top = max(state.highest.values(), default=-1)
            producers.append({"run_id": run_id, "producer": producer, "records": state.records,
                              "duplicated": state.duplicated, "out_of_order": state.out_of_order,
                              "bits": np.packbits(state.seen[:top + 1]).tobytes(), "length": top + 1})
        partitions = {p: {"records": c.records, "duplicated": c.duplicated, "out_of_order": c.out_of_order}
                      for p, c in sorted(self.partitions.items())}
        return {"producers": producers, "partitions": partitions, "foreign": self.foreign}


def _repeats_within(sequences: np.ndarray) -> np.ndarray:
    """True where a number already occurred earlier in the same array."""
    order = np.argsort(sequences, kind="stable")
    ordered = sequences[order]
    repeat_sorted = np.zeros(sequences.size, dtype=np.bool_)
    repeat_sorted[1:] = ordered[1:] == ordered[:-1]
    out = np.empty_like(repeat_sorted)
    out[order] = repeat_sorted
    return out


@dataclass(slots=True)
class CheckResult:
    """What the consumers saw against what the producers sent (module docstring)."""

    sent: int = 0
    received: int = 0
    distinct: int = 0
    missing: int = 0
    duplicated: int = 0
    out_of_order: int = 0
    unexpected: int = 0
    foreign: int = 0
    per_producer: list[dict] = field(default_factory=list)
    per_partition: dict[int, dict] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not (self.missing or self.duplicated or self.out_of_order or self.unexpected)

    def to_dict(self) -> dict:
        return {"ok": self.ok, "sent": self.sent, "received": self.received, "distinct": self.distinct,
                "missing": self.missing, "duplicated": self.duplicated, "out_of_order": self.out_of_order,
                "unexpected": self.unexpected, "foreign": self.foreign, "per_producer": self.per_producer,
                "per_partition": {str(p): c for p, c in sorted(self.per_partition.items())}}


def merge_tallies(exports: list[dict], sent: dict[tuple[int, int], int] | None) -> CheckResult:
    """Combine the consumers' :meth:`Tally.export` results.  ``sent``: (run_id, producer) ->
    records sent, when the producers ran in this run; None to judge by the numbers seen alone
    (missing = holes below the highest number seen)."""
    result = CheckResult()
    merged: dict[tuple[int, int], dict] = {}
    for export in exports:
        result.foreign += export["foreign"]
        for p, counts in export["partitions"].items():
            into = result.per_partition.setdefault(int(p), {"records": 0, "duplicated": 0, "out_of_order": 0})
            for name, value in counts.items():
                into[name] += value
        for entry in export["producers"]:
            key = (entry["run_id"], entry["producer"])
            bits = np.unpackbits(np.frombuffer(entry["bits"], dtype=np.uint8))[:entry["length"]].astype(bool)
            into = merged.get(key)
            if into is None:
                merged[key] = {"seen": bits, "records": entry["records"], "duplicated": entry["duplicated"],
                               "out_of_order": entry["out_of_order"]}
                continue
            size = max(into["seen"].size, bits.size)
            a, b = _padded(into["seen"], size), _padded(bits, size)
            into["duplicated"] += entry["duplicated"] + int((a & b).sum())  # seen by two consumers
            into["seen"] = a | b
            into["records"] += entry["records"]
            into["out_of_order"] += entry["out_of_order"]
    keys = sorted(set(merged) | set(sent or {}))
    for key in keys:
        state = merged.get(key, {"seen": np.zeros(0, dtype=bool), "records": 0, "duplicated": 0,
                                 "out_of_order": 0})
        seen = state["seen"]
        distinct = int(seen.sum())
        if sent is not None:
            expected = sent.get(key, 0)
            unexpected = int(seen[expected:].sum())
            missing = expected - (distinct - unexpected)
        else:
            expected = seen.size  # every number below the highest seen
            unexpected = 0
            missing = expected - distinct
        row = {"run_id": f"{key[0]:08x}", "producer": key[1],
               "sent": expected if sent is not None else None, "received": state["records"],
               "distinct": distinct, "missing": missing, "duplicated": state["duplicated"],
               "out_of_order": state["out_of_order"], "unexpected": unexpected}
        result.per_producer.append(row)
        result.sent += expected
        result.received += state["records"]
        result.distinct += distinct
        result.missing += missing
        result.duplicated += state["duplicated"]
        result.out_of_order += state["out_of_order"]
        result.unexpected += unexpected
    return result


def _padded(bits: np.ndarray, size: int) -> np.ndarray:
    if bits.size == size:
        return bits
    out = np.zeros(size, dtype=bool)
    out[:bits.size] = bits
    return out

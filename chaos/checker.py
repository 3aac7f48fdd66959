"""The checker: every acknowledged record of a campaign against everything read, in Jepsen's words.

Input: a :class:`chaos.history.History`, the topics (``{name: {"acks": "all"|"1", "partitions": n}}``)
and the faults injected (objects or dicts with ``nemesis``, ``target``, ``start``, ``end``,
``detail``).  Reads are the ``poll`` lines of every consumer, the ``drain`` client's included; a
*position* is a (partition, offset) of one topic; an *observation* is an ``ack`` with an offset >= 0
or a ``poll``.  Per topic:

- ``attempted``: invoke lines; ``acknowledged``: distinct values with an ``ack``; ``failed``:
  distinct values with a ``fail`` and no ``ack`` (indeterminate: in the log or not, both fine),
  ``failed_read`` of them were read; ``unsettled``: invoked values with neither (their producer
  was killed before the callback: as indeterminate as a fail); ``read``: distinct positions
  polled; ``verified``: acknowledged values read at their acknowledged position with the same
  value.

Anomalies (each counted, with up to :data:`MAX_EXAMPLES` examples):

- The final drain (the ``drain`` client) is the authority on what the log holds at the end, as
  Jepsen's final polls are.  For a partition the drain read completely (from its log start to
  its end offset; ``check``'s ``drained`` says which), a value acknowledged in that partition and
  absent from the drain's reads of it is a ``lost-write``, whatever the other consumers read
  before (a record read by the group, then truncated away, is lost).
- ``lost-write`` elsewhere (a partition the drain did not read to its end): a value acknowledged
  at (p, o), never read at any position, while some read of partition p reached an offset >= o
  (the bound inclusive, as Jepsen's: another value read at o passed it too).  Loss the readers
  would have had to pass.
- ``unseen``: a value acknowledged, never read, and not a lost-write (no read of its partition got
  to its offset, and the drain did not read that partition to its end).  The two are disjoint, as
  Jepsen's; with a complete drain there is no unseen value.
- ``duplicate``: one value observed at two or more distinct positions.  A consumer reading the same
  position again (after a rebalance, or the drain) is one position, not a duplicate.
- ``inconsistent-offsets``: one position observed with two or more distinct values.
- ``nonmonotonic-poll``: within one consumer stream (a client in one file), two successive polls of
  one partition with no ``assign`` line between them where the offset did not increase.
- ``poll-skip``: the same successive pair jumps from offset a to b > a + 1 while some record at an
  offset in (a, b) of that partition was observed by anyone.
- ``group-skip``: the consumer group as a whole skipped a record: in a partition the drain read
  completely, an offset the drain read, below the highest offset any group member polled, that
  no member ever polled (at-least-once broken across members: a group that commits past what it
  handed out makes the next owner start beyond unread records; per-consumer poll-skip cannot see
  it, since an ``assign`` separates the two owners).
- ``phantom``: a value read but never invoked by any producer (corruption, or a record the log
  invented).  Reported, not part of :meth:`Result.ok`.

``Result.ok(acks)`` holds when no topic of that acks level has a lost-write, unseen,
inconsistent-offsets, poll-skip or group-skip (:data:`FATAL_KINDS`).  Anomalies of the other acks levels are
counted and reported just the same; they only do not decide ``ok``.

Unavailability: for each fault and each partition of each topic, the longest gap between
consecutive ``ack`` times of that partition among the gaps that overlap [start, end] of the fault;
where no ack exists before (after) the fault, its start (end) bounds the gap; a fault not healed
ends at the history's end.  Per nemesis and topic: the p50 (median) and max over its faults of
each fault's worst partition (a partition the fault did not touch only shows the usual gap
between two acks, which would pull a median over every partition down to nothing).

Attribution to a nemesis (the per-nemesis tables): the faults of a mixed step (``mixed``, e.g.
``kill+split``, set on both) count under that name, not under either nemesis alone, as do their
unavailability gaps.  An event belongs to the fault that started last at or before its time
(the window of a fault runs from its start to the next fault's start, since its effects outlast
the heal), or to ``none`` before the first fault.  The time of an acknowledged
record is its first ack; of a lost-write or unseen value, its first ack; of a duplicate value, its
first ack, else its first read; of an inconsistent position, its first observation; of a poll
anomaly, the later poll; of a phantom, its first read.

Cost: O(n log n) in the number of lines (numpy sorts); at its peak about 120 bytes per ack and
poll line on top of the history itself (1 M records, 4 M lines: 1.5 s, 650 MB in all).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, NamedTuple

import numpy as np

from chaos.history import ACKED, FAILED, INVOKED, History, TopicHistory

__all__ = ["ANOMALY_KINDS", "FATAL_KINDS", "MAX_EXAMPLES", "Anomaly", "FaultUnavailability",
           "NemesisResult", "Result", "TopicResult", "check", "normalize_acks"]

ANOMALY_KINDS = ("lost-write", "unseen", "duplicate", "inconsistent-offsets", "nonmonotonic-poll",
                 "poll-skip", "group-skip", "phantom")
#: the kinds that make :meth:`Result.ok` false for the acks level asked
FATAL_KINDS = ("lost-write", "unseen", "inconsistent-offsets", "poll-skip", "group-skip")
MAX_EXAMPLES = 10
NO_FAULT = "none"
DRAIN_CLIENT = "drain"  #: the client name of the final reader


@dataclass
class Anomaly:
    count: int = 0
    examples: list[str] = field(default_factory=list)


@dataclass
class TopicResult:
    topic: str
    acks: str
    partitions: int
    attempted: int = 0
    acknowledged: int = 0
    failed: int = 0
    failed_read: int = 0
    #: values invoked with neither an ack nor a fail (a producer killed before its callback)
    unsettled: int = 0
    read: int = 0
    verified: int = 0
    anomalies: dict[str, Anomaly] = field(default_factory=lambda: {k: Anomaly() for k in ANOMALY_KINDS})
    #: the most frequent fail texts, with their counts
    fail_errors: dict[str, int] = field(default_factory=dict)
    #: the partitions the drain read from their log start to their end offset (None: not said)
    drained: list[int] | None = None


@dataclass
class FaultUnavailability:
    nemesis: str
    target: str
    start: float
    end: float | None
    detail: str
    #: topic -> partition -> seconds without an acknowledged write
    unavailable_s: dict[str, dict[int, float]] = field(default_factory=dict)


@dataclass
class NemesisResult:
    """One nemesis's share of the campaign; per-topic dicts keyed by topic name."""

    nemesis: str
    faults: int = 0
    acknowledged: dict[str, int] = field(default_factory=dict)
    verified: dict[str, int] = field(default_factory=dict)
    #: topic -> kind -> count
    anomalies: dict[str, dict[str, int]] = field(default_factory=dict)
    unavailability_p50_s: dict[str, float | None] = field(default_factory=dict)
    unavailability_max_s: dict[str, float | None] = field(default_factory=dict)


@dataclass
class Result:
    topics: dict[str, TopicResult] = field(default_factory=dict)
    faults: list[FaultUnavailability] = field(default_factory=list)
    #: in order of first fault, then ``none``
    nemeses: dict[str, NemesisResult] = field(default_factory=dict)
    #: acks per second per topic, bucket i covering [throughput_start_s + i, + i + 1)
    throughput_start_s: float | None = None
    throughput: dict[str, list[int]] = field(default_factory=dict)
    #: files, lines, torn_lines, torn_files, start_s, end_s of the history read
    history: dict[str, Any] = field(default_factory=dict)

    def ok(self, acks: str = "all") -> bool:
        """No lost-write, unseen, inconsistent-offsets or poll-skip on the topics of ``acks``."""
        level = normalize_acks(acks)
        return not any(t.anomalies[kind].count for t in self.topics.values() if t.acks == level
                       for kind in FATAL_KINDS)

    def to_json(self) -> dict[str, Any]:
        """A dict of plain JSON types (partition keys become strings), ``ok_all`` included."""
        doc = asdict(self)
        for fault in doc["faults"]:
            fault["unavailable_s"] = {t: {str(p): s for p, s in parts.items()}
                                      for t, parts in fault["unavailable_s"].items()}
        doc["ok_all"] = self.ok("all")
        return doc


def normalize_acks(acks: Any) -> str:
    """``"all"``, ``-1`` -> ``"all"``; anything else its string (``1`` -> ``"1"``)."""
    text = str(acks).strip().lower()
    return "all" if text in ("all", "-1") else text


def _fault_field(fault: Any, name: str) -> Any:
    return fault.get(name) if isinstance(fault, dict) else getattr(fault, name, None)


def _attributed(fault: Any) -> str:
    """The name a fault's effects are counted under: its mixed step's, else its nemesis's."""
    return str(_fault_field(fault, "mixed") or _fault_field(fault, "nemesis"))


def check(history: History, topics: dict[str, dict], faults: list[Any],
          drained: dict[str, Any] | None = None) -> Result:
    """Checks ``history``; see the module docstring for every definition.  ``drained``: topic ->
    the partitions the ``drain`` client read completely (from the log start to the end offset);
    None (or a topic missing) means none was, and the highest-offset-read rule decides loss."""
    result = Result(history={"files": history.files, "lines": history.lines,
                             "torn_lines": history.torn_lines, "torn_files": list(history.torn_files),
                             "start_s": history.start_s, "end_s": history.end_s})
    fault_list = sorted(faults, key=lambda f: float(_fault_field(f, "start")))
    end_of_history = history.end_s
    windows = _Windows(fault_list, end_of_history)
    names = sorted(set(topics) | set(history.topics))
    for name in names:
        spec = topics.get(name, {})
        th = history.topics.get(name) or TopicHistory(name)
        partitions = int(spec.get("partitions", 0) or 0)
        complete = None if drained is None else sorted(int(p) for p in drained.get(name, ()))
        topic_result, events = _check_topic(th, history, normalize_acks(spec.get("acks", "?")), partitions,
                                            complete)
        result.topics[name] = topic_result
        windows.attribute(name, events)
    result.faults, per_nemesis_gaps = _unavailability(history, result.topics, fault_list, end_of_history)
    result.nemeses = windows.results(names, per_nemesis_gaps)
    result.throughput_start_s, result.throughput = _throughput(history, names)
    return result


# --- per topic ---------------------------------------------------------------------------------

def _col(values: Any, dtype: Any) -> np.ndarray:
    return np.frombuffer(values, dtype=dtype) if len(values) else np.zeros(0, dtype=dtype)


def _pair_rank(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, int]:
    """Dense ids of the (a, b) pairs, numbered in sorted order; and how many distinct."""
    if not len(a):
        return np.zeros(0, dtype=np.int64), 0
    order = np.lexsort((b, a))
    sa, sb = a[order], b[order]
    new = np.empty(len(a), dtype=bool)
    new[0] = True
    new[1:] = (sa[1:] != sa[:-1]) | (sb[1:] != sb[:-1])
    ids = np.empty(len(a), dtype=np.int64)
    ids[order] = np.cumsum(new) - 1
    return ids, int(new.sum())


def _first_time(index: np.ndarray, times: np.ndarray, size: int) -> np.ndarray:
    first = np.full(size, np.inf)
    if len(index):
        np.minimum.at(first, index, times)
    return first


#: kind -> times of its anomalies; "acknowledged" and "verified" -> times of those records
_Events = dict[str, np.ndarray]


def _check_topic(th: TopicHistory, history: History, acks: str, partitions: int,
                 complete: list[int] | None) -> tuple[TopicResult, _Events]:
    r = TopicResult(th.topic, acks, partitions, attempted=th.invokes, drained=complete)
    events: _Events = {}
    nv = len(th.values)
    flags = _col(th.flags, np.uint8)
    at, ap, ao, av = (_col(th.ack_time, np.float64), _col(th.ack_partition, np.int64),
                      _col(th.ack_offset, np.int64), _col(th.ack_value, np.int64))
    pt, pp, po, pv = (_col(th.poll_time, np.float64), _col(th.poll_partition, np.int64),
                      _col(th.poll_offset, np.int64), _col(th.poll_value, np.int64))
    acked = (flags & ACKED) != 0
    read_mask = np.zeros(nv, dtype=bool)
    read_mask[pv] = True
    failed = ((flags & FAILED) != 0) & ~acked
    r.acknowledged, r.failed = int(acked.sum()), int(failed.sum())
    r.unsettled = int((((flags & INVOKED) != 0) & ~acked & ((flags & FAILED) == 0)).sum())
    r.failed_read = int((failed & read_mask).sum())
    r.fail_errors = dict(th.fail_errors.most_common(10))
    first_ack = _first_time(av, at, nv)
    first_read = _first_time(pv, pt, nv)
    events["acknowledged"] = first_ack[acked]

    # observations: acks with an offset, then polls
    valid = ao >= 0
    n_ack = int(valid.sum())
    obs_p, obs_o = np.concatenate((ap[valid], pp)), np.concatenate((ao[valid], po))
    obs_v, obs_t = np.concatenate((av[valid], pv)), np.concatenate((at[valid], pt))
    pos_id, n_pos = _pair_rank(obs_p, obs_o)
    pair_id, n_pair = _pair_rank(pos_id, obs_v)
    _, first_obs = np.unique(pair_id, return_index=True)
    pair_pos, pair_v = pos_id[first_obs], obs_v[first_obs]
    _, pos_first_obs = np.unique(pos_id, return_index=True)
    pos_p, pos_o = obs_p[pos_first_obs], obs_o[pos_first_obs]  # sorted by (partition, offset)
    r.read = len(np.unique(pos_id[n_ack:]))

    # verified: an acknowledged (position, value) also polled
    polled_pair = np.zeros(n_pair, dtype=bool)
    polled_pair[pair_id[n_ack:]] = True
    verified_values = np.unique(av[valid][polled_pair[pair_id[:n_ack]]])
    r.verified = len(verified_values)
    events["verified"] = first_ack[verified_values]

    final = _Final.of(th, history, complete or [])
    _lost_and_unseen(r, events, th, ap, ao, av, pp, po, read_mask, first_ack, final)
    seen = _Seen(pair_pos, pair_v, pos_p, pos_o, _first_time(pos_id, obs_t, n_pos))
    _positions(r, events, th, history, seen, first_ack, first_read)
    _polls(r, events, th, history, pos_p, pos_o)
    _group_skips(r, events, th, history, final, first_ack)
    phantom = np.flatnonzero(read_mask & ((flags & INVOKED) == 0))
    examples = [f"{th.values[v]!r} read at {th.topic}/{_where(th, v)}, never invoked"
                for v in phantom[:MAX_EXAMPLES]]
    _record(r, events, "phantom", first_read[phantom], examples, len(phantom))
    return r, events


def _where(th: TopicHistory, vid: int) -> str:
    pv = _col(th.poll_value, np.int64)
    rows = np.flatnonzero(pv == vid)[:3]
    return ", ".join(f"{th.poll_partition[i]}@{th.poll_offset[i]}" for i in rows)


def _record(r: TopicResult, events: _Events, kind: str, times: np.ndarray, examples: list[str],
            count: int) -> None:
    r.anomalies[kind] = Anomaly(int(count), examples[:MAX_EXAMPLES])
    events[kind] = np.asarray(times, dtype=np.float64)


class _Final(NamedTuple):
    """What the drain read of the partitions it read completely: ``keys`` the sorted
    ``partition * stride + value id`` of its polls there; ``complete`` those partitions."""

    complete: np.ndarray
    keys: np.ndarray
    stride: int

    @classmethod
    def of(cls, th: TopicHistory, history: History, complete: list[int]) -> _Final:
        stride = max(len(th.values), 1)
        drains = [i for i, name in enumerate(history.streams) if name == DRAIN_CLIENT]
        ps, pp, pv = (_col(th.poll_stream, np.int64), _col(th.poll_partition, np.int64),
                      _col(th.poll_value, np.int64))
        done = np.asarray(complete, dtype=np.int64)
        rows = np.isin(ps, drains) & np.isin(pp, done)
        return cls(done, np.unique(pp[rows] * stride + pv[rows]), stride)

    def decides(self, partitions: np.ndarray) -> np.ndarray:
        return np.isin(partitions, self.complete)

    def holds(self, partitions: np.ndarray, values: np.ndarray) -> np.ndarray:
        return np.isin(partitions * self.stride + values, self.keys)


def _lost_and_unseen(r: TopicResult, events: _Events, th: TopicHistory, ap: np.ndarray, ao: np.ndarray,
                     av: np.ndarray, pp: np.ndarray, po: np.ndarray, read_mask: np.ndarray,
                     first_ack: np.ndarray, final: _Final) -> None:
    high = _highest_read(pp, po, ap)  # per ack row: the highest offset read in its partition, or -1
    unread = ~read_mask[av]
    decided = final.decides(ap)
    dropped = decided & ~final.holds(ap, av)  # the complete drain of its partition lacks it
    lost_rows = dropped | (~decided & unread & (ao >= 0) & (ao <= high))
    lost = np.unique(av[lost_rows])
    unseen = np.setdiff1d(np.unique(av[unread & ~decided]), lost, assume_unique=True)
    unseen = np.setdiff1d(unseen, np.unique(av[decided]), assume_unique=True)
    lost_examples = []
    for v in lost[:MAX_EXAMPLES]:
        i = int(np.flatnonzero(lost_rows & (av == v))[0])
        where = (f"{th.values[v]!r} acknowledged at {th.topic}/{ap[i]}@{ao[i]} (t={th.ack_time[i]:.3f}); ")
        if dropped[i]:
            before = f"read before at {_where(th, int(v))}" if read_mask[v] else "never read"
            lost_examples.append(f"{where}missing from the complete final drain of partition {ap[i]} "
                                 f"({before})")
        else:
            lost_examples.append(where + f"partition {ap[i]} read up to offset {high[i]}, value never read")
    unseen_examples = []
    for v in unseen[:MAX_EXAMPLES]:
        i = int(np.flatnonzero(av == v)[0])
        unseen_examples.append(f"{th.values[v]!r} acknowledged at {th.topic}/{ap[i]}@{ao[i]} "
                               f"(t={th.ack_time[i]:.3f}); partition {ap[i]} read up to offset {high[i]}")
    _record(r, events, "lost-write", first_ack[lost], lost_examples, len(lost))
    _record(r, events, "unseen", first_ack[unseen], unseen_examples, len(unseen))


def _highest_read(pp: np.ndarray, po: np.ndarray, ap: np.ndarray) -> np.ndarray:
    if not len(pp) or not len(ap):
        return np.full(len(ap), -1, dtype=np.int64)
    order = np.lexsort((po, pp))
    sp, so = pp[order], po[order]
    last = np.flatnonzero(np.append(sp[1:] != sp[:-1], True))
    parts, highs = sp[last], so[last]
    idx = np.clip(np.searchsorted(parts, ap), 0, len(parts) - 1)
    return np.where(parts[idx] == ap, highs[idx], -1)


class _Seen(NamedTuple):
    """The distinct observations of a topic: ``pair_pos[i]``, ``pair_v[i]`` the position id and
    value id of distinct pair i; position id q is (``pos_p[q]``, ``pos_o[q]``), ids in sorted
    order, first observed at ``pos_first_time[q]``."""

    pair_pos: np.ndarray
    pair_v: np.ndarray
    pos_p: np.ndarray
    pos_o: np.ndarray
    pos_first_time: np.ndarray


def _positions(r: TopicResult, events: _Events, th: TopicHistory, history: History, seen: _Seen,
               first_ack: np.ndarray, first_read: np.ndarray) -> None:
    """duplicate (a value at several positions) and inconsistent-offsets (a position, several values)."""
    pair_pos, pair_v, pos_p, pos_o, pos_first_time = seen
    nv, n_pos = len(first_ack), len(pos_p)
    per_value = np.bincount(pair_v, minlength=nv) if nv else np.zeros(0, dtype=np.int64)
    dup = np.flatnonzero(per_value > 1)
    times = np.where(np.isfinite(first_ack[dup]), first_ack[dup], first_read[dup])
    examples = [f"{th.values[v]!r} at {per_value[v]} positions of {th.topic} (first t={t:.3f}): "
                f"{_value_sides(th, int(v))}" for v, t in zip(dup[:MAX_EXAMPLES], times, strict=False)]
    _record(r, events, "duplicate", times, examples, len(dup))
    per_pos = np.bincount(pair_pos, minlength=n_pos) if n_pos else np.zeros(0, dtype=np.int64)
    bad = np.flatnonzero(per_pos > 1)
    examples = [f"{th.topic}/{pos_p[q]}@{pos_o[q]} holds {per_pos[q]} values "
                f"(first t={pos_first_time[q]:.3f}): "
                f"{_position_sides(th, history, int(pos_p[q]), int(pos_o[q]))}" for q in bad[:MAX_EXAMPLES]]
    _record(r, events, "inconsistent-offsets", pos_first_time[bad], examples, len(bad))


def _value_sides(th: TopicHistory, vid: int) -> str:
    """Where one value was acknowledged and where read (for examples)."""
    rows = np.flatnonzero(_col(th.ack_value, np.int64) == vid)
    acked = sorted({(th.ack_partition[i], th.ack_offset[i]) for i in rows})
    rows = np.flatnonzero(_col(th.poll_value, np.int64) == vid)
    read = sorted({(th.poll_partition[i], th.poll_offset[i]) for i in rows})
    text = "; ".join(f"{what} at {', '.join(f'{p}@{o}' for p, o in where[:5])}"
                     for what, where in (("acknowledged", acked), ("read", read)) if where)
    return text or "never acknowledged nor read"


def _position_sides(th: TopicHistory, history: History, partition: int, offset: int) -> str:
    """Which value each side saw at one position (for examples)."""
    seen: dict[str, list[str]] = {}
    rows = np.flatnonzero((_col(th.ack_partition, np.int64) == partition)
                          & (_col(th.ack_offset, np.int64) == offset))
    for i in rows:
        seen.setdefault(th.values[th.ack_value[i]], []).append("acknowledged")
    rows = np.flatnonzero((_col(th.poll_partition, np.int64) == partition)
                          & (_col(th.poll_offset, np.int64) == offset))
    for i in rows:
        seen.setdefault(th.values[th.poll_value[i]], []).append(
            f"read by {history.streams[th.poll_stream[i]]}")
    return ", ".join(f"{value!r} ({', '.join(sorted(set(sides)))})"
                     for value, sides in list(seen.items())[:5])


def _polls(r: TopicResult, events: _Events, th: TopicHistory, history: History, pos_p: np.ndarray,
           pos_o: np.ndarray) -> None:
    """nonmonotonic-poll and poll-skip over each stream's successive polls of a partition."""
    ps, pe = _col(th.poll_stream, np.int64), _col(th.poll_epoch, np.int64)
    pp, po = _col(th.poll_partition, np.int64), _col(th.poll_offset, np.int64)
    pt = _col(th.poll_time, np.float64)
    order = np.lexsort((np.arange(len(ps)), pp, ps))
    ps, pe, pp, po, pt = ps[order], pe[order], pp[order], po[order], pt[order]
    same = (ps[1:] == ps[:-1]) & (pp[1:] == pp[:-1]) & (pe[1:] == pe[:-1])
    prev, cur = po[:-1], po[1:]

    def pair_text(i: int, what: str) -> str:
        return (f"{history.streams[ps[i + 1]]} polled {th.topic}/{pp[i + 1]} offset {prev[i]} then {cur[i]}"
                f" (t={pt[i + 1]:.3f}){what}")

    nonmono = np.flatnonzero(same & (cur <= prev))
    _record(r, events, "nonmonotonic-poll", pt[1:][nonmono],
            [pair_text(i, "") for i in nonmono[:MAX_EXAMPLES]], len(nonmono))
    gaps = np.flatnonzero(same & (cur > prev + 1))
    skipped = np.zeros(len(gaps), dtype=np.int64)
    first_skipped = np.zeros(len(gaps), dtype=np.int64)
    for partition in np.unique(pp[1:][gaps]):
        lo, hi = np.searchsorted(pos_p, partition, "left"), np.searchsorted(pos_p, partition, "right")
        known = pos_o[lo:hi]
        mine = pp[1:][gaps] == partition
        left = np.searchsorted(known, prev[gaps[mine]], "right")
        right = np.searchsorted(known, cur[gaps[mine]], "left")
        skipped[mine] = right - left
        first_skipped[mine] = known[np.minimum(left, len(known) - 1)]
    skips = skipped > 0
    rows = gaps[skips]
    examples = [pair_text(i, f", skipping {n} known records from offset {f}")
                for i, n, f in zip(rows[:MAX_EXAMPLES], skipped[skips][:MAX_EXAMPLES],
                                   first_skipped[skips][:MAX_EXAMPLES], strict=True)]
    _record(r, events, "poll-skip", pt[1:][rows], examples, len(rows))


def _group_skips(r: TopicResult, events: _Events, th: TopicHistory, history: History, final: _Final,
                 first_ack: np.ndarray) -> None:
    """group-skip: offsets of completely drained partitions the drain read below the group's
    highest poll there, that no group member polled."""
    ps, pp, po, pv, pt = (_col(th.poll_stream, np.int64), _col(th.poll_partition, np.int64),
                          _col(th.poll_offset, np.int64), _col(th.poll_value, np.int64),
                          _col(th.poll_time, np.float64))
    drains = np.isin(ps, [i for i, name in enumerate(history.streams) if name == DRAIN_CLIENT])
    group, drained = ~drains, drains & final.decides(pp)
    stride = int(po.max()) + 2 if len(po) else 1
    polled = np.unique(pp[group] * stride + po[group])
    high = _highest_read(pp[group], po[group], pp[drained])  # the group's highest offset in that partition
    missed = (po[drained] < high) & ~np.isin(pp[drained] * stride + po[drained], polled)
    rows = np.flatnonzero(drained)[missed]
    rows = rows[np.unique(pp[rows] * stride + po[rows], return_index=True)[1]]  # one per position
    times = np.where(np.isfinite(first_ack[pv[rows]]), first_ack[pv[rows]], pt[rows])
    examples = [f"{th.values[pv[i]]!r} at {th.topic}/{pp[i]}@{po[i]}: read by the drain, never handed to a "
                f"group member, though the group read that partition further" for i in rows[:MAX_EXAMPLES]]
    _record(r, events, "group-skip", times, examples, len(rows))


# --- faults ------------------------------------------------------------------------------------

def _fault_end(fault: Any, end_of_history: float | None) -> float:
    end = _fault_field(fault, "end")
    start = float(_fault_field(fault, "start"))
    if end is None:
        end = end_of_history if end_of_history is not None else start
    return max(start, float(end))


def _gap(times: np.ndarray, start: float, end: float) -> float:
    """The longest gap between consecutive sorted ``times`` overlapping [start, end], the fault's
    bounds standing in for a missing ack on either side."""
    i = np.searchsorted(times, start, "right") - 1  # last ack at or before start
    j = np.searchsorted(times, end, "left")  # first ack at or after end
    left = [times[i]] if i >= 0 else [start]
    right = [times[j]] if j < len(times) else [end]
    inside = times[max(i + 1, 0):j]
    points = np.concatenate((left, inside, right))
    return float(np.diff(points).max()) if len(points) > 1 else 0.0


def _unavailability(history: History, topics: dict[str, TopicResult], faults: list[Any],
                    end_of_history: float | None) -> tuple[list[FaultUnavailability], dict]:
    acks_by_partition: dict[str, dict[int, np.ndarray]] = {}
    for name, tr in topics.items():
        th = history.topics.get(name) or TopicHistory(name)
        at, ap = _col(th.ack_time, np.float64), _col(th.ack_partition, np.int64)
        parts = set(range(tr.partitions)) | {int(p) for p in np.unique(ap)}
        acks_by_partition[name] = {p: np.sort(at[ap == p]) for p in sorted(parts)}
    out, gaps = [], {}
    for fault in faults:
        nemesis = str(_fault_field(fault, "nemesis"))
        start, end = float(_fault_field(fault, "start")), _fault_end(fault, end_of_history)
        key = _attributed(fault)
        fu = FaultUnavailability(nemesis, str(_fault_field(fault, "target") or ""), start,
                                 _fault_field(fault, "end"), str(_fault_field(fault, "detail") or ""))
        for name, per_partition in acks_by_partition.items():
            fu.unavailable_s[name] = {p: round(_gap(times, start, end), 6)
                                      for p, times in per_partition.items()}
            worst = max(fu.unavailable_s[name].values(), default=None)  # the partition it hit hardest
            if worst is not None:
                gaps.setdefault(key, {}).setdefault(name, []).append(worst)
        out.append(fu)
    return out, gaps


class _Windows:
    """Attributes event times to the fault that started last (see the module docstring)."""

    def __init__(self, faults: list[Any], end_of_history: float | None) -> None:
        self.starts = np.array([float(_fault_field(f, "start")) for f in faults], dtype=np.float64)
        self.nemesis = [_attributed(f) for f in faults]
        self.order = list(dict.fromkeys(self.nemesis))
        self.counts: dict[str, dict[str, dict[str, int]]] = {}  # nemesis -> topic -> key -> count

    def attribute(self, topic: str, events: _Events) -> None:
        for key, times in events.items():
            times = times[np.isfinite(times)]
            idx = np.searchsorted(self.starts, times, "right") - 1
            for i, n in zip(*np.unique(idx, return_counts=True), strict=True):
                name = self.nemesis[i] if i >= 0 else NO_FAULT
                per_topic = self.counts.setdefault(name, {}).setdefault(topic, {})
                per_topic[key] = per_topic.get(key, 0) + int(n)

    def results(self, topics: list[str], gaps: dict[str, dict[str, list[float]]]) -> dict[str, NemesisResult]:
        out = {}
        names = self.order + ([NO_FAULT] if NO_FAULT in self.counts else [])
        for name in names:
            nr = NemesisResult(name, faults=self.nemesis.count(name))
            counts = self.counts.get(name, {})
            for topic in topics:
                c = counts.get(topic, {})
                nr.acknowledged[topic] = c.get("acknowledged", 0)
                nr.verified[topic] = c.get("verified", 0)
                nr.anomalies[topic] = {kind: c.get(kind, 0) for kind in ANOMALY_KINDS}
                values = gaps.get(name, {}).get(topic, [])
                nr.unavailability_p50_s[topic] = round(float(np.median(values)), 6) if values else None
                nr.unavailability_max_s[topic] = round(float(max(values)), 6) if values else None
            out[name] = nr
        return out


def _throughput(history: History, topics: list[str]) -> tuple[float | None, dict[str, list[int]]]:
    times = {name: _col(history.topics[name].ack_time, np.float64) if name in history.topics
             else np.zeros(0) for name in topics}
    every = [t for t in times.values() if len(t)]
    if not every:
        return None, {name: [] for name in topics}
    start = math.floor(min(float(t.min()) for t in every))
    buckets = int(max(float(t.max()) for t in every) - start) + 1
    return float(start), {name: np.bincount((t - start).astype(np.int64), minlength=buckets).tolist()
                          for name, t in times.items()}

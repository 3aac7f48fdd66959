"""The verdict of a campaign: OK, FAILED or INCONCLUSIVE, and the exit status that says it.

=================  ======  ==================================================================
verdict            status  when
=================  ======  ==================================================================
``FAILED``         1       the acks=all topics show a lost-write, inconsistent-offsets,
                           poll-skip or group-skip (a bug found, whatever else went wrong), or an unseen
                           value while nothing made the run inconclusive
``INCONCLUSIVE``   3       no such anomaly, but the run cannot vouch for the cluster: a
                           problem met (a nemesis that could not inject, verify or heal, a
                           settling that timed out, a client that died, a partition the drain
                           could not read to its end), or an empty campaign (a topic with no
                           acknowledged or no verified record, no fault, a requested nemesis
                           never injected, fewer faults than planned)
``OK``             0       neither
=================  ======  ==================================================================

(2 is the command line's refusal and 130 an interruption; neither reaches a verdict.)  An unseen
value on acks=all is a record the drain could not read, so with any problem it is counted among
the problems rather than as a failure: only a complete final read proves a loss.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from chaos.checker import Result

__all__ = ["EXIT_STATUS", "Verdict", "judge"]

#: the exit status of each verdict
EXIT_STATUS = {"OK": 0, "FAILED": 1, "INCONCLUSIVE": 3}
_HARD_KINDS = ("lost-write", "inconsistent-offsets", "poll-skip", "group-skip")


@dataclass
class Verdict:
    verdict: str
    #: the acks=all anomalies that decide FAILED, by kind
    anomalies: dict[str, int] = field(default_factory=dict)
    #: everything that makes the run inconclusive, as sentences
    problems: list[str] = field(default_factory=list)
    #: nemesis -> [planned, injected]
    faults: dict[str, list[int]] = field(default_factory=dict)

    @property
    def exit_status(self) -> int:
        return EXIT_STATUS[self.verdict]

    def line(self) -> str:
        """``OK``, ``FAILED (lost-write 3)`` or ``INCONCLUSIVE (2 problems)``."""
        if self.verdict == "FAILED":
            return "FAILED (" + ", ".join(f"{k} {n}" for k, n in self.anomalies.items()) + ")"
        if self.verdict == "INCONCLUSIVE":
            return f"INCONCLUSIVE ({len(self.problems)} problem{'s' * (len(self.problems) != 1)})"
        return "OK"

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "exit_status": self.exit_status, "line": self.line()}


def _field(fault: Any, name: str) -> Any:
    return fault.get(name) if isinstance(fault, dict) else getattr(fault, name, None)


def judge(result: Result, *, problems: Sequence[str], planned: Sequence[str], faults: Sequence[Any],
          nemeses: Sequence[str]) -> Verdict:
    """The verdict of a campaign whose check gave ``result``: ``problems`` met while it ran,
    ``planned`` the nemesis of each planned fault (a mixed step counts each of its nemeses),
    ``faults`` those injected (:class:`chaos.nemesis.Fault` or its dict), ``nemeses`` those
    asked for."""
    found = list(problems)
    counts: dict[str, list[int]] = {name: [0, 0] for name in nemeses}
    for name in planned:
        counts.setdefault(name, [0, 0])[0] += 1
    for fault in faults:
        counts.setdefault(str(_field(fault, "nemesis")), [0, 0])[1] += 1
        if _field(fault, "healed") is False or _field(fault, "end") is None:
            found.append(f"fault {_field(fault, 'nemesis')} on {_field(fault, 'target')} was not healed")
    if not faults:
        found.append("no fault was injected")
    never = [name for name in nemeses if not counts[name][1]]
    if never:
        found.append(f"nemeses asked for and never injected: {', '.join(never)}")
    if len(faults) < len(planned):
        found.append(f"{len(faults)} of {len(planned)} planned faults injected")
    for t in result.topics.values():
        if t.acknowledged == 0:
            found.append(f"topic {t.topic}: no record was acknowledged")
        elif t.verified == 0:
            found.append(f"topic {t.topic}: no acknowledged record was read back")
    acks_all = [t for t in result.topics.values() if t.acks == "all"]
    if not acks_all:
        found.append("no acks=all topic was checked")
    hard = {kind: sum(t.anomalies[kind].count for t in acks_all) for kind in _HARD_KINDS}
    hard = {k: n for k, n in hard.items() if n}
    unseen = sum(t.anomalies["unseen"].count for t in acks_all)
    if hard or (unseen and not found):
        return Verdict("FAILED", {**hard, **({"unseen": unseen} if unseen else {})}, found, counts)
    if unseen:
        found.append(f"{unseen} acknowledged acks=all records unseen: the final drain did not read "
                     "their partitions to the end, so their fate is unknown")
    return Verdict("INCONCLUSIVE" if found else "OK", {}, found, counts)

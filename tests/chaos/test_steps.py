"""How the campaign runs its schedule's steps, with stand-in nemeses and cluster: a mixed step
holds two faults at once, the second away from the first's target; a step heals (the network
first) and waits for a full ISR before the next one, and that recovery time is recorded; the
report counts a mixed step's effects under its own name (no cluster needed)."""

from __future__ import annotations

import json

import pytest

from chaos import runner
from chaos.checker import check
from chaos.history import HistoryWriter, read_histories
from chaos.nemesis import Fault, Nemesis
from chaos.schedule import Step

EVENTS: list[tuple] = []


def _fake(kind: str) -> type[Nemesis]:
    class Fake(Nemesis):
        name = kind

        def inject(self, cluster, rng, topics, avoid=()):
            target = next(b for b in ("b1", "b2", "b3") if b not in avoid)
            EVENTS.append(("inject", kind, target, tuple(sorted(avoid))))
            return self._fault(target, 0.0 + len(EVENTS), f"{kind} on {target}", [])

        def _verify(self, cluster, fault):
            return "ok"

        def heal(self, cluster, fault):
            EVENTS.append(("heal", kind, fault.target))
            self._healed(fault)

    return Fake


class _Cluster:
    def __init__(self, in_sync=True):
        self.in_sync = in_sync

    def wait_in_sync(self, topics, timeout_s):
        EVENTS.append(("wait_in_sync",))
        if not self.in_sync:
            raise RuntimeError(f"partitions not led with a full ISR after {timeout_s:g} s: ...")
        return 1.25


@pytest.fixture
def fakes(monkeypatch):
    EVENTS.clear()
    monkeypatch.setattr(runner, "NEMESES", {k: _fake(k) for k in ("kill", "split", "pause")})
    monkeypatch.setattr(runner.time, "sleep", lambda s: None)


def _schedule(tmp_path, steps, cluster):
    faults, problems = [], []
    runner._run_schedule(cluster, steps, {"t": {}}, 1, tmp_path / "faults.jsonl", 0.0, faults, problems)
    return faults, problems


def test_a_mixed_step_holds_two_faults_on_different_targets_and_heals_the_network_first(fakes, tmp_path):
    faults, problems = _schedule(tmp_path, [Step(0.0, "kill", 6.0), Step(0.0, "kill", 6.0, "split")],
                                 _Cluster())
    assert problems == []
    assert EVENTS == [("inject", "kill", "b1", ()), ("heal", "kill", "b1"), ("wait_in_sync",),
                      ("inject", "kill", "b1", ()), ("inject", "split", "b2", ("b1",)),
                      ("heal", "split", "b2"), ("heal", "kill", "b1"), ("wait_in_sync",)]
    assert [(f.step, f.mixed, f.recovered_s, f.healed) for f in faults] == [
        (1, "", 1.25, True), (2, "kill+split", 1.25, True), (2, "kill+split", 1.25, True)]
    written = [json.loads(line) for line in (tmp_path / "faults.jsonl").read_text().splitlines()]
    assert [(w["nemesis"], w["mixed"], w["evidence"]) for w in written] == [
        ("kill", "", "ok"), ("kill", "kill+split", "ok"), ("split", "kill+split", "ok")]


def test_a_cluster_not_back_to_full_isr_after_a_step_is_a_problem(fakes, tmp_path):
    faults, problems = _schedule(tmp_path, [Step(0.0, "pause", 6.0)], _Cluster(in_sync=False))
    assert [f.recovered_s for f in faults] == [None]
    [problem] = problems
    assert problem.startswith("after pause on b1: partitions not led with a full ISR")


def test_a_mixed_steps_effects_are_counted_under_its_own_name(tmp_path):
    with HistoryWriter(tmp_path / "p.history") as p:
        for i in range(10):
            p.invoke("p", "t", f"v{i}", t=i)
            p.ack("p", "t", 0, i, f"v{i}", t=i + 0.5)
    faults = [Fault("kill", "b1", 2.0, 3.0, healed=True),
              Fault("kill", "b1", 5.0, 8.0, healed=True, step=2, mixed="kill+split"),
              Fault("split", "b2", 6.0, 8.0, healed=True, step=2, mixed="kill+split")]
    result = check(read_histories(tmp_path), {"t": {"acks": "all", "partitions": 1}}, faults, {"t": []})
    assert list(result.nemeses) == ["kill", "kill+split", "none"]
    assert result.nemeses["kill+split"].faults == 2
    assert result.nemeses["kill+split"].acknowledged["t"] == 5  # acks at 5.5 .. 9.5
    assert result.nemeses["kill"].acknowledged["t"] == 3  # 2.5, 3.5, 4.5

"""One chaos campaign, from an empty directory to a report.

The steps, in order (each bounded in time)::

    schedule  make_schedule(seed, ...), printed with the seed and the command that replays it
    cluster   ChaosCluster: network, ZooKeeper ensemble, brokers b1..bN; the topics created
    clients   Workload.start(): producers and the consumer group write their histories
    faults    for each step: wait for its time, inject, hold, heal; faults.jsonl gets one line
    settle    heal everything still broken, wait for every partition's leader and full ISR
    drain     stop the producers (they settle what they sent), stop the group, read every
              partition from its start (the ``drain`` client)
    check     read_histories -> check -> write_report; the summary printed

Files under ``--out``: ``meta.json`` (seed, duration, argv, topics, brokers, nemeses),
``faults.jsonl`` (one :class:`~chaos.nemesis.Fault` a line, written as each one heals),
``history/*.history`` (the clients'), ``clients/*.log`` (their warnings), ``cluster/`` (the
brokers' and ZooKeeper's logs and data), ``chaos.log`` (this process's log), and the report
(``report.md``, ``report.json``, ``throughput.svg``).

Cleanup: whatever happens (a failure, Ctrl-C, SIGTERM), the clients are killed by PID and the
cluster closed (its processes killed by PID, tmpfs unmounted, namespaces removed); a second
Ctrl-C during the cleanup is ignored so it cannot leave namespaces behind.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import random
import shlex
import signal
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from chaos.checker import check
from chaos.cluster import ChaosCluster, faketime_available
from chaos.history import read_histories
from chaos.nemesis import NEMESES, Fault, Nemesis
from chaos.report import summary, write_report
from chaos.schedule import Step, format_schedule, make_schedule
from chaos.verdict import judge
from chaos.workload import Workload, WorkloadConfig, drain

__all__ = ["CampaignOptions", "FULL", "NEMESES", "SHORT", "replay_command", "run_campaign", "unavailable"]

logger = logging.getLogger(__name__)

_SETTLE_TIMEOUT_S = 180.0  # after the faults: every partition led, its ISR full
_RECOVERY_TIMEOUT_S = 120.0  # after each step's heal: the same, before the next step
_DRAIN_TIMEOUT_S = 180.0
_PLANTED_BUG = "HPBROKER_UNSAFE_ACK_BEFORE_REPLICATION"  # test-only: brokers inherit it
_CATCH_UP_S = 10.0  # the group's last chance to read what the producers settled before it stops


@dataclass(frozen=True)
class CampaignOptions:
    """Everything that decides a campaign; ``seed`` None draws one (printed, so it replays)."""

    duration_s: float = 1800.0
    seed: int | None = None
    brokers: int = 3
    nemeses: tuple[str, ...] = tuple(NEMESES)
    out: Path = Path("chaos-results")
    short: bool = False
    partitions: int = 6
    replication_factor: int = 3
    min_insync_replicas: int = 2
    workers: int = 2
    producers_per_topic: int = 1
    rate_per_producer: float = 300.0
    consumers_per_topic: int = 2
    session_timeout_ms: int = 6000
    replica_lag_time_max_ms: int = 10_000
    #: the mean pause between one fault's heal and the next injection (schedule.make_schedule).
    mean_gap_s: float = 1.5
    #: how long a fault holds before its heal starts (a pause always outlasts the session timeout).
    hold_range_s: tuple[float, float] = (3.0, 8.0)
    #: settings every broker gets besides the cluster's own (names of the [broker] section).
    broker_settings: dict[str, Any] = dataclasses.field(default_factory=dict)
    argv: tuple[str, ...] = ()

    def replace(self, **changes: Any) -> CampaignOptions:
        return dataclasses.replace(self, **changes)

    def topics(self) -> dict[str, dict[str, Any]]:
        """``{name: {"acks": ..., "partitions": n}}``: ``chaos-all`` (acks=all) and ``chaos-one`` (acks=1)."""
        return {"chaos-all": {"acks": "all", "partitions": self.partitions},
                "chaos-one": {"acks": "1", "partitions": self.partitions}}


#: ``make chaos``: half an hour of faults, planned one every seven seconds or so (about 250);
#: heals that take longer than planned (a restarted broker, a pause held past the session
#: timeout) push the later steps back, so the campaign runs past its duration rather than skip one.
FULL = CampaignOptions()
#: ``--short`` (and ``make test``): about three minutes, every nemesis once or more, a short
#: session timeout so that pauses and isolations cost seconds, three partitions a topic.
SHORT = CampaignOptions(duration_s=150.0, short=True, partitions=3, session_timeout_ms=4000,
                        replica_lag_time_max_ms=4000, rate_per_producer=200.0, mean_gap_s=3.0,
                        hold_range_s=(6.0, 9.0))


def replay_command(options: CampaignOptions, seed: int) -> str:
    """The command that runs this campaign again with the same schedule."""
    argv = ["python", "-m", "chaos", "--seed", str(seed)]
    if options.short:
        argv.append("--short")
    argv += ["--duration", f"{options.duration_s:g}", "--brokers", str(options.brokers),
             "--nemeses", ",".join(options.nemeses), "--partitions", str(options.partitions),
             "--rate", f"{options.rate_per_producer:g}",
             "--session-timeout-ms", str(options.session_timeout_ms)]
    return shlex.join(argv)


def _interrupted(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@contextlib.contextmanager
def uninterruptible() -> Iterator[None]:
    """SIGINT and SIGTERM ignored inside (the cleanup must finish: a second Ctrl-C, or a CI
    runner's repeated SIGTERM, cannot leave namespaces, mounts or processes behind); the
    previous handlers back afterwards."""
    previous = {signum: signal.signal(signum, signal.SIG_IGN) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def refuse_out(out: Path) -> str | None:
    """Why ``out`` cannot take a new campaign (it exists and is not an empty directory), or None.
    Each campaign gets a directory of its own: a reused one would mix two runs' histories,
    whose values are alike, and the checker would take one run's reads for the other's."""
    if not out.exists():
        return None
    if not out.is_dir():
        return f"--out {out} exists and is not a directory"
    if any(out.iterdir()):
        return (f"--out {out} is not empty (it holds an earlier campaign?); give a new or empty "
                "directory: each campaign's results need a directory of their own")
    return None


def run_campaign(options: CampaignOptions) -> int:
    """Run one campaign; the exit status (chaos.verdict): 0 OK, 1 FAILED (acks=all anomalies),
    3 INCONCLUSIVE (problems, or an empty campaign); 2 when it cannot run here or ``--out`` is
    taken."""
    reason = unavailable(options)
    if reason is not None:
        print(f"chaos: this machine cannot run the campaign: {reason}", file=sys.stderr)
        return 2
    out = options.out.resolve()
    refusal = refuse_out(out)
    if refusal is not None:
        print(f"chaos: {refusal}", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    _log_to(out / "chaos.log")
    seed = options.seed if options.seed is not None else random.SystemRandom().randrange(1, 2**31)
    steps = make_schedule(seed, options.duration_s, list(options.nemeses), mean_gap_s=options.mean_gap_s,
                          hold_range_s=options.hold_range_s)
    planned = [name for step in steps for name in step.nemeses]
    print(f"chaos: seed {seed}; {len(steps)} steps ({len(planned)} faults) over {options.duration_s:.0f} s; "
          f"results in {out}")
    print(f"chaos: replay with: {replay_command(options, seed)}")
    print(format_schedule(steps), flush=True)
    missing = [name for name in options.nemeses if name not in planned]
    if missing:
        print(f"chaos: warning: {options.duration_s:.0f} s leave no room for {', '.join(missing)}",
              flush=True)
    topics = options.topics()
    meta = {"seed": seed, "duration_s": options.duration_s, "argv": list(options.argv), "topics": topics,
            "brokers": options.brokers, "nemeses": list(options.nemeses), "short": options.short,
            "replay": replay_command(options, seed), "planned_faults": len(planned),
            "unsafe_ack_before_replication": os.environ.get(_PLANTED_BUG) == "1", "started": time.time()}
    (out / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    previous_term = signal.signal(signal.SIGTERM, _interrupted)
    faults: list[Fault] = []
    drained: dict[str, list[int]] = {}
    try:
        problems = _run(options, seed, steps, topics, out, faults, drained)
    finally:
        signal.signal(signal.SIGTERM, previous_term)
    history = read_histories(out / "history")
    result = check(history, topics, faults, drained)
    verdict = judge(result, problems=problems, planned=planned, faults=faults, nemeses=options.nemeses)
    meta.update(ended=time.time(), faults=len(faults), problems=verdict.problems, verdict=verdict.to_json())
    (out / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    write_report(result, faults, meta, out)
    print(summary(result, meta))
    for problem in verdict.problems:
        print(f"chaos: problem: {problem}")
    print(f"chaos: {verdict.line()}; {len(faults)} of {len(planned)} planned faults injected; "
          f"report: {out / 'report.md'}")
    return verdict.exit_status


def _log_to(path: Path) -> None:
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    if root.level > logging.INFO or root.level == logging.NOTSET:
        root.setLevel(logging.INFO)


def _run(options: CampaignOptions, seed: int, steps: list[Step], topics: dict[str, dict[str, Any]],
         out: Path, faults: list[Fault], drained: dict[str, list[int]]) -> list[str]:
    """The cluster, the clients and the faults (appended to ``faults`` as they heal).  Returns
    the problems met after the cluster started (a nemesis that could not inject or heal, a
    settling that timed out...): the campaign still drains and checks, and reports them.
    Everything started here is stopped here, whatever happens."""
    cluster = ChaosCluster(out / "cluster", brokers=options.brokers, workers=options.workers,
                           session_timeout_ms=options.session_timeout_ms,
                           faketime_broker=1 if "clock" in options.nemeses else None,
                           broker_settings={"replica_lag_time_max_ms": options.replica_lag_time_max_ms,
                                            **options.broker_settings})
    workload: Workload | None = None
    problems: list[str] = []

    def attempt(what: str, step: Any) -> Any:
        try:
            return step()
        except Exception as e:  # reported, and the campaign goes on to the check
            logger.exception("%s failed", what)
            problems.append(f"{what}: {e!r}")
            print(f"chaos: {what} failed: {e!r}", flush=True)
            return None

    try:
        start_cluster(cluster, topics, options)
        assert cluster.ensemble is not None
        workload = Workload(WorkloadConfig(
            cluster.bootstrap(), cluster.ensemble.connect_string, topics, out / "history",
            producers_per_topic=options.producers_per_topic, rate_per_producer=options.rate_per_producer,
            consumers_per_topic=options.consumers_per_topic, session_timeout_ms=options.session_timeout_ms,
            max_duration_s=options.duration_s + 3600))
        workload.start()
        attempt("the schedule", lambda: _run_schedule(cluster, steps, topics, seed, out / "faults.jsonl",
                                                      options.mean_gap_s / 2, faults, problems))
        attempt("healing everything", lambda: heal_everything(cluster))
        if not wait_full_isr(cluster, topics, _SETTLE_TIMEOUT_S):
            problems.append(f"not every partition had a leader and a full ISR {_SETTLE_TIMEOUT_S:.0f} s "
                            "after the faults")
        died = _dead_clients(workload)
        killed = workload.stop_producers()
        if killed:
            print(f"chaos: producers killed at the deadline (their unsettled records stay indeterminate): "
                  f"{', '.join(killed)}")
        time.sleep(_CATCH_UP_S)
        workload.stop_consumers()
        problems += [f"client {name} exited {code} before the end of the campaign" for name, code in died]
        drained_now = drain(cluster.bootstrap(), topics, out / "history", timeout_s=_DRAIN_TIMEOUT_S)
        drained.update(drained_now.complete_partitions())
        print(f"chaos: drained {sum(drained_now.values())} records; {len(drained_now.complete)} of "
              f"{len(drained_now)} partitions read to their end", flush=True)
        problems += [f"the final drain did not read {what} (within {_DRAIN_TIMEOUT_S:.0f} s)"
                     for what in drained_now.incomplete()]
    except KeyboardInterrupt:
        print("chaos: interrupted; stopping everything", file=sys.stderr)
        raise
    finally:
        with uninterruptible():  # the cleanup must finish
            if workload is not None:
                workload.close()
            attempt("closing the cluster", cluster.close)
    return problems


def _dead_clients(workload: Workload) -> list[tuple[str, int | None]]:
    """The client processes that are no longer running before being told to stop, and their exit
    codes: a producer or group member that died took its share of the history with it."""
    return [(name, process.exitcode) for name, process in {**workload.producers, **workload.consumers}.items()
            if not process.is_alive()]


def start_cluster(cluster: ChaosCluster, topics: dict[str, dict[str, Any]], options: CampaignOptions) -> None:
    """Start every broker, create the topics and wait until each partition is led with a full ISR."""
    cluster.start_all()
    for name, spec in topics.items():
        cluster.create_topic(name, int(spec["partitions"]), replication_factor=options.replication_factor,
                             min_insync_replicas=options.min_insync_replicas)
    cluster.wait_in_sync(list(topics), 120.0)


def _verify(nemesis: Nemesis, cluster: ChaosCluster, fault: Fault, problems: list[str]) -> None:
    """Check that ``fault`` took effect; a fault that did not is a problem (the run goes on)."""
    try:
        logger.info("[%s on %s] verified: %s", fault.nemesis, fault.target, nemesis.verify(cluster, fault))
    except Exception as e:  # NemesisError, or the check itself failed: either way not verified
        if not fault.evidence:
            fault.evidence = f"NOT VERIFIED: {e!r}"
        logger.warning("[%s on %s] %s", fault.nemesis, fault.target, fault.evidence)
        problems.append(f"fault {fault.nemesis} on {fault.target} did not take effect: {fault.evidence}")
        print(f"chaos: {fault.nemesis} on {fault.target}: {fault.evidence}", flush=True)


#: healed first in a mixed step: the other heals (a broker started again) need the network
_NETWORK_NEMESES = ("split", "isolate-leader")


def _run_schedule(cluster: ChaosCluster, steps: list[Step], topics: dict[str, dict[str, Any]], seed: int,
                  faults_path: Path, pause_s: float, faults: list[Fault], problems: list[str]) -> None:
    """Each step at its time, or ``pause_s`` after the previous step recovered when that ran
    late: inject (and verify), hold, heal, then wait until every partition is led with a full
    ISR again (bounded; the time is the faults' ``recovered_s``) so that one step's effects do
    not run into the next one's unreported.  A mixed step injects its second nemesis a third of
    the hold in, away from the first one's target, and heals both together.  The faults in
    progress when this is interrupted are healed and written too."""
    rng = random.Random(f"{seed}/targets")  # not the schedule's stream
    nemeses: dict[str, Nemesis] = {name: NEMESES[name]() for s in steps for name in s.nemeses}
    started = time.monotonic()
    not_before = started
    with faults_path.open("a") as written:
        for number, step in enumerate(steps, 1):
            wait_s = max(started + step.at_s, not_before) - time.monotonic()
            if wait_s > 0:
                time.sleep(wait_s)
            held: list[Fault] = []
            try:
                for k, name in enumerate(step.nemeses):
                    if k:
                        time.sleep(step.hold_s / 3)
                    fault = nemeses[name].inject(cluster, rng, list(topics), avoid={f.target for f in held})
                    fault.step, fault.mixed = number, step.name if step.mixed else ""
                    held.append(fault)
                    print(f"chaos: [{number}/{len(steps)}] t={time.monotonic() - started:6.1f} s  "
                          f"{fault.nemesis} {fault.target}: {fault.detail} (step {step.name}, hold "
                          f"{step.hold_s:.1f} s)", flush=True)
                    _verify(nemeses[name], cluster, fault, problems)
                time.sleep(step.hold_s * (2 / 3 if step.mixed else 1))
            finally:
                try:
                    _heal_step(cluster, nemeses, held)
                    if held and all(f.healed for f in held):
                        _recover(cluster, topics, held, problems)
                finally:  # a heal that raised leaves its fault unhealed (end None), and says so
                    for fault in held:
                        faults.append(fault)
                        written.write(json.dumps(dataclasses.asdict(fault)) + "\n")
                    written.flush()
                    not_before = time.monotonic() + pause_s


def _heal_step(cluster: ChaosCluster, nemeses: dict[str, Nemesis], held: list[Fault]) -> None:
    """Heal a step's faults, the network's first, then in the order they were injected; every
    one is tried, and the first error raised afterwards."""
    error: BaseException | None = None
    for fault in sorted(held, key=lambda f: f.nemesis not in _NETWORK_NEMESES):
        try:
            nemeses[fault.nemesis].heal(cluster, fault)
        except Exception as e:  # the step's other faults are still healed
            logger.exception("healing %s on %s failed", fault.nemesis, fault.target)
            error = error or e
    if error is not None:
        raise error


def _recover(cluster: ChaosCluster, topics: dict[str, dict[str, Any]], held: list[Fault],
             problems: list[str]) -> None:
    """Wait (at most :data:`_RECOVERY_TIMEOUT_S`) until every partition is led with a full ISR;
    the seconds it took go to each fault's ``recovered_s``; a timeout is a problem."""
    try:
        took_s = cluster.wait_in_sync(list(topics), _RECOVERY_TIMEOUT_S)
    except RuntimeError as e:
        what = " + ".join(f"{f.nemesis} on {f.target}" for f in held)
        logger.warning("after %s: %s", what, e)
        problems.append(f"after {what}: {str(e).splitlines()[0][:300]}")
        print(f"chaos: after {what}: partitions not back to a full ISR within {_RECOVERY_TIMEOUT_S:.0f} s",
              flush=True)
        return
    for fault in held:
        fault.recovered_s = round(took_s, 3)
    logger.info("step %d: full ISR %.1f s after the heal", held[0].step, took_s)


def heal_everything(cluster: ChaosCluster) -> None:
    """Whatever a fault may have left behind: the network joined, cut hosts healed, paused
    brokers continued, disks freed, the clock back, every ZooKeeper server and broker running;
    then every broker serving (a nemesis heals its own fault; this is the safety net).  Every
    action is tried; RuntimeError lists those that failed."""
    assert cluster.ensemble is not None
    ensemble = cluster.ensemble
    actions: list[tuple[str, Any]] = [("joining the network", cluster.network.join)]
    actions += [(f"healing host {name}", lambda name=name: cluster.network.heal(name))
                for name in cluster.network.hosts]
    actions += [(f"resuming broker {b}", lambda b=b: cluster.resume(b)) for b in cluster.paused()]
    actions += [(f"freeing broker {b}'s disk", lambda b=b: cluster.free_disk(b)) for b in cluster.broker_ids]
    clocked = cluster.faketime_broker
    if clocked is not None:
        actions.append(("setting the clock back", lambda: cluster.set_clock_offset(clocked, 0)))
    actions += [(f"restarting ZooKeeper server {i}", lambda i=i: ensemble.restart(i))
                for i in range(1, ensemble.size + 1) if i not in ensemble.alive()]
    actions += [(f"starting broker {b}", lambda b=b: cluster.start(b))
                for b in cluster.broker_ids if b not in cluster.alive()]
    failed = []
    for what, action in actions:
        if what.startswith(("restarting", "starting")):
            logger.warning("after the faults: %s (it was down)", what)
        try:
            action()
        except Exception as e:  # the others are still tried
            logger.exception("after the faults: %s failed", what)
            failed.append(f"{what}: {e!r}")
    for broker_id in cluster.broker_ids:
        try:
            cluster.wait_serving(broker_id, 120.0)
        except RuntimeError as e:
            failed.append(str(e).splitlines()[0])
    if failed:
        raise RuntimeError("; ".join(failed))


def unavailable(options: CampaignOptions | None = None) -> str | None:
    """Why this machine cannot run the campaign (``ChaosCluster.unavailable()``, or no
    libfaketime while the ``clock`` nemesis is asked for), or None."""
    reason = ChaosCluster.unavailable()
    if reason is None and (options is None or "clock" in options.nemeses) and faketime_available() is None:
        reason = "the clock nemesis needs libfaketime (on Debian: apt-get install faketime)"
    return reason


def wait_full_isr(cluster: ChaosCluster, topics: dict[str, dict[str, Any]], timeout_s: float) -> bool:
    """Wait until every partition of ``topics`` has a leader and an ISR of all its replicas; False
    (logged and printed: the drain goes on, and the checker reports what it finds) when
    ``timeout_s`` passed first."""
    try:
        took_s = cluster.wait_in_sync(list(topics), timeout_s)
    except RuntimeError as e:
        logger.warning("%s", e)
        print(f"chaos: {e}", flush=True)
        return False
    logger.info("every partition led with a full ISR %.1f s after the heal", took_s)
    return True

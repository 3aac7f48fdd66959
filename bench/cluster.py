"""A replicated cluster for benchmarks: a ZooKeeper of its own and several ``hpbroker serve``
processes on loopback, each with its own data directory, ports and log, in one directory.

``LocalCluster(root, zookeeper_connect, broker_settings)``: brokers ``0 .. n-1`` started with
:meth:`LocalCluster.start` (each keeps its ports and data directory across restarts), stopped with
:meth:`~LocalCluster.stop` (SIGTERM: the broker closes its ZooKeeper session and exits) or
:meth:`~LocalCluster.kill` (SIGKILL to the arbiter and every worker at once: a machine gone).
The broker settings go to a ``[broker]`` table of each broker's configuration file, with
``broker_id`` and ``zookeeper``.  Only processes this module started are signalled, by pid.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from bench.brokers import free_port_block

__all__ = ["BrokerNode", "LocalCluster"]

_START_TIMEOUT_S = 60.0
_STOP_TIMEOUT_S = 30.0
_FORKED = re.compile(r"forked worker slot=(\d+) pid=(\d+)")


class BrokerNode:
    """One running broker process; its log is ``log_path``."""

    def __init__(self, argv: list[str], log_path: Path, workers: int) -> None:
        self.log_path = log_path
        self.workers = workers
        self._log_file = open(log_path, "wb")  # noqa: SIM115 - closed in wait()
        self.process = subprocess.Popen(argv, stdout=self._log_file, stderr=subprocess.STDOUT)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_serving(self, timeout_s: float = _START_TIMEOUT_S) -> None:
        """Return once the arbiter logged that every worker serves; RuntimeError if it exits first
        or takes longer than ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        wanted = f"all {self.workers} workers serving"
        while wanted not in self.log():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the broker did not start (exit status {self.process.poll()}); "
                                   f"its log ends:\n{self.log()[-3000:]}")
            time.sleep(0.05)

    def worker_pids(self) -> list[int]:
        """The latest worker forked into each slot, from the arbiter's log."""
        return list({int(m[1]): int(m[2]) for m in _FORKED.finditer(self.log())}.values())

    def signal(self, signum: int, *, workers: bool) -> None:
        """Send ``signum`` to the arbiter, and first to every worker when ``workers``."""
        for pid in self.worker_pids() if workers else ():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)
        self.process.send_signal(signum)

    def exited(self) -> bool:
        return self.process.poll() is not None

    def wait(self, timeout_s: float = _STOP_TIMEOUT_S) -> int:
        """Wait for the arbiter's exit (SIGKILL after ``timeout_s``); its exit status."""
        try:
            self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self._log_file.close()
        return self.process.returncode


class LocalCluster:
    """Brokers on loopback registered in one ZooKeeper (``zookeeper_connect``, chroot included)."""

    def __init__(self, root: Path, zookeeper_connect: str, settings: dict[str, object], *,
                 workers: int = 1) -> None:
        self.root = root
        self.zookeeper_connect = zookeeper_connect
        self.settings = settings
        self.workers = workers
        self.nodes: dict[int, BrokerNode] = {}
        self.ports: dict[int, int] = {}
        self._starts = 0

    def data_dir(self, broker_id: int) -> Path:
        return self.root / f"data-{broker_id}"

    def start(self, broker_id: int, *, wait: bool = True) -> BrokerNode:
        """Start broker ``broker_id`` (again: same ports and data); returns once it serves."""
        if broker_id in self.nodes:
            raise RuntimeError(f"broker {broker_id} is running")
        config = self.root / f"broker-{broker_id}.toml"
        lines = [f"broker_id = {broker_id}", f'zookeeper = "{self.zookeeper_connect}"']
        lines += [f"{key} = {str(value).lower() if isinstance(value, bool) else value}"
                  for key, value in self.settings.items()]
        config.write_text("[broker]\n" + "\n".join(lines) + "\n")
        if broker_id not in self.ports:
            self.ports[broker_id] = free_port_block(self.workers + 1)
        port = self.ports[broker_id]
        self._starts += 1
        argv = [sys.executable, "-m", "hpbroker.cli", "serve", "--host", "127.0.0.1", "--port", str(port),
                "--fetch-port", str(port + 1), "--workers", str(self.workers),
                "--data-dir", str(self.data_dir(broker_id)), "--config", str(config)]
        node = BrokerNode(argv, self.root / f"broker-{broker_id}-{self._starts}.log", self.workers)
        self.nodes[broker_id] = node
        if wait:
            node.wait_serving()
        return node

    def bootstrap(self, *broker_ids: int) -> str:
        """``host:port,...`` of ``broker_ids`` (default: every running broker), in that order."""
        ids = broker_ids or tuple(sorted(self.nodes))
        return ",".join(f"127.0.0.1:{self.ports[b]}" for b in ids)

    def kill(self, broker_id: int) -> BrokerNode:
        """SIGKILL the broker's workers and arbiter (not waited for: see :meth:`BrokerNode.wait`)."""
        node = self.nodes.pop(broker_id)
        node.signal(signal.SIGKILL, workers=True)
        return node

    def terminate(self, broker_id: int) -> BrokerNode:
        """SIGTERM the broker's arbiter: a graceful stop (not waited for)."""
        node = self.nodes.pop(broker_id)
        node.signal(signal.SIGTERM, workers=False)
        return node

    def close(self) -> None:
        """Stop every running broker (SIGTERM, then SIGKILL after a deadline)."""
        nodes = list(self.nodes.values())
        self.nodes.clear()
        for node in nodes:
            node.signal(signal.SIGTERM, workers=False)
        for node in nodes:
            node.wait()

"""What producer and consumer processes share: their link to the runner, and the clock.

The runner starts each worker with the ``spawn`` method (ZeroMQ contexts are not fork-safe) and a
:class:`WorkerLink`.  A worker builds its client, puts ``{"kind": "ready"}`` on the queue and
waits for the start event; the runner sets it once every worker is ready, after writing the common
start time ``t0`` (wall clock, seconds since the epoch) into a shared value.  Workers then report
at the ticks ``t0 + k * interval_s`` (``{"kind": "progress", "tick": k, ...}``: counts of that
interval only) and finish with ``{"kind": "done", ...}`` or ``{"kind": "failed", "error": ...}``.
The stop event asks them to finish early (Ctrl-C, or the consumers have read everything).

Workers ignore SIGINT: a Ctrl-C in the terminal reaches the whole process group, and the runner
alone decides what it means.
"""

from __future__ import annotations

import logging
import re
import signal
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["ClientLogCounter", "WorkerLink", "run_worker"]

_START_TIMEOUT_S = 120.0


@dataclass
class WorkerLink:
    """The runner's side of a worker: its queue, start and stop events, and the start time."""

    queue: Any  # multiprocessing Queue of messages to the runner
    start: Any  # multiprocessing Event
    stop: Any  # multiprocessing Event
    t0: Any  # multiprocessing Value("d"): the common start, wall-clock seconds

    def put(self, role: str, index: int, kind: str, **fields: Any) -> None:
        self.queue.put({"role": role, "index": index, "kind": kind, **fields})

    def wait_for_start(self) -> float | None:
        """Wait for the start event (or stop); the common start time as ``time.monotonic()``
        seconds, or None when stopped first."""
        deadline = time.monotonic() + _START_TIMEOUT_S
        while not self.start.wait(0.05):
            if self.stop.is_set() or time.monotonic() > deadline:
                return None
        return time.monotonic() - (time.time() - self.t0.value)


def run_worker(role: str, index: int, link: WorkerLink, body: Callable[[], None]) -> None:
    """Run ``body`` and report its failure, if any, to the runner."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        body()
    except BaseException as e:  # reported, then the process ends
        link.put(role, index, "failed", error=f"{type(e).__name__}: {e}", traceback=traceback.format_exc())


class ClientLogCounter(logging.Handler):
    """Counts what the producer's log says about delivery: failed records and retries.

    The client reports both through its logger (``hpbroker.client.producer``): a failure as an
    ERROR record "<n> records to <topic-partition> failed: <error>", a retry as a DEBUG record
    "... retry in <ms> ms after <error>".  The public API has no counters for them."""

    _FAILED = re.compile(r"\] (\d+) records to \S+ failed")

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.failed_records = 0
        self.retries = 0
        self.first_error: str | None = None

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = record.getMessage()
        except Exception:  # a malformed record is not ours to break on
            return
        if record.levelno >= logging.ERROR:
            match = self._FAILED.search(message)
            if match:
                self.failed_records += int(match.group(1))
                if self.first_error is None:
                    self.first_error = message
        elif "retry in" in message:
            self.retries += 1

    def attach(self) -> None:
        logger = logging.getLogger("hpbroker.client.producer")
        logger.setLevel(logging.DEBUG)  # the client logs retries at DEBUG, once per retry
        logger.addHandler(self)

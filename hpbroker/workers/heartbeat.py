"""Worker heartbeats: a file per slot whose every change says "alive" and whose content says what
the worker serves.

``<run_dir>/worker-<slot>.json``, replaced atomically (write ``worker-<slot>.json.tmp``, one name
per slot so that a worker killed while writing leaves nothing its successor does not replace,
then rename) by the worker every ``heartbeat_interval_ms``; not fsynced (it lives and dies with
the broker).  Content::

    {"slot": 0, "pid": 1234, "time_ms": 1700000000000, "ready": true,
     "partitions": [{"topic": "orders", "partition": 3,
                     "log_start_offset": 0, "high_watermark": 51234}, ...]}

A partition of a replicated topic (``hpbroker.workers.replication``) adds its role: ``"role":
"leader" | "follower" | "none"`` (``null`` while it awaits its first role), ``"leader"``,
``"leader_epoch"``, ``"replicas"``, ``"isr"`` (on the leader, the ISR it holds) and
``"log_end_offset"`` (its own flushed end); its ``high_watermark`` is the replicated high
watermark (on a follower, the leader's as last heard, capped by its own flushed end).

``time_ms`` is the worker's wall clock when it wrote: informational (logs, tools), never
compared with another clock by the broker.

The arbiter watches the file for liveness (``hpbroker.workers.liveness``: it notes, on its
monotonic clock, when the file last *changed*; it never compares the file's times with its wall
clock, so a wall-clock step neither ages nor freshens a heartbeat) and reads its content to
answer metadata requests with each partition's offsets (at most one heartbeat old).

Liveness never needs free space.  When the content cannot be written (the run directory, by
default ``<data_dir>/.run``, shares the data's filesystem, and a full disk makes the write fail
with ``ENOSPC``), the worker removes its partial ``.tmp`` (giving back what it took) and only
refreshes the file's mtime with ``utime``, which allocates nothing, creating the file empty if it
is missing (an inode, no data block).  The arbiter, which looks only at whether the file changed
(its mtime did), still sees a live worker; metadata shows that worker's offsets as of its last
complete write (none, for an empty file) until writing works again.  A worker that is really
stuck touches nothing and is aborted as before.  When the broker serves metrics, the worker writes
its measurements at the same moment to a sibling file (``hpbroker.workers.stats``), so that this
one stays small for the metadata path.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from typing import Any

__all__ = ["heartbeat_path", "read_heartbeat", "touch", "write_heartbeat"]


def heartbeat_path(run_dir: str, slot: int) -> str:
    return os.path.join(run_dir, f"worker-{slot}.json")


def write_heartbeat(run_dir: str, slot: int, *, ready: bool,
                    partitions: list[dict[str, Any]]) -> OSError | None:
    """Replace the slot's heartbeat file (called by the worker, from its own loop); None when it
    did.  When the content cannot be written, only the mtime is refreshed (module docstring) and
    the error that stopped the content is returned.  Raises OSError only when even that failed."""
    path = heartbeat_path(run_dir, slot)
    body = {"slot": slot, "pid": os.getpid(), "time_ms": time.time_ns() // 1_000_000, "ready": ready,
            "partitions": partitions}
    tmp = f"{path}.tmp"  # one per slot: a slot has one process at a time
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(body, f, separators=(",", ":"))
        os.replace(tmp, path)
    except OSError as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        touch(path)
        return e
    return None


def touch(path: str) -> None:
    """Set ``path``'s mtime to now, creating it empty if it is missing: needs no free space."""
    try:
        os.utime(path)
    except FileNotFoundError:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644))


def read_heartbeat(run_dir: str, slot: int) -> tuple[float, dict[str, Any] | None]:
    """(wall-clock age in seconds, content) of the slot's heartbeat; (inf, None) if there is none
    yet.  Content that does not parse reads as None with its age still valid.

    The age is ``time.time()`` minus the file's mtime, at least 0: informational (tests, tools),
    wrong by the size of any wall-clock step since the last write.  Liveness is not judged by it
    (``hpbroker.workers.liveness`` watches for changes on the monotonic clock)."""
    path = heartbeat_path(run_dir, slot)
    try:
        age = max(0.0, time.time() - os.stat(path).st_mtime)
    except OSError:
        return float("inf"), None
    try:
        with open(path, encoding="utf-8") as f:
            content = json.load(f)
    except (OSError, ValueError):
        return age, None
    return age, content if isinstance(content, dict) else None

"""A process whose wall clock can be stepped while it runs: libfaketime (Debian's ``faketime``).

:func:`environment` gives the variables a child process needs: ``LD_PRELOAD`` of libfaketime,
which reads the offset from ``timestamp_file`` at every call (``FAKETIME_NO_CACHE=1``), and moves
only the wall clock, as an NTP step does (``FAKETIME_DONT_FAKE_MONOTONIC=1``).
:func:`set_offset` writes that file: ``+3600`` is an hour ahead of the host, ``-120`` two minutes
behind, ``+0`` the host's time.  The file is replaced by a rename, so the process reads the old
offset or the new one, never half of one.

libfaketime 0.9.10 (Debian 12) answers EINVAL to the absolute monotonic ``clock_nanosleep`` that
Python's ``time.sleep`` makes once the monotonic clock is not faked (poll, select, epoll, locks
and condition waits are unaffected).  :func:`environment` therefore also writes a
``sitecustomize.py`` into ``site_dir`` and puts that directory first on ``PYTHONPATH``: it makes
``time.sleep`` wait in ``select`` until its monotonic deadline, so the process meets the clock
step, not a failure of the tool that makes it.

Used by the chaos suite's clock nemesis (:mod:`chaos.cluster`) and by tests that step a broker's
clock.  Nothing here touches the host's clock.
"""

from __future__ import annotations

import glob
import os
from pathlib import Path

__all__ = ["SITECUSTOMIZE", "environment", "library", "set_offset"]

_LIBRARY_GLOBS = ("/usr/lib/*/faketime/libfaketime.so.1", "/usr/lib/faketime/libfaketime.so.1",
                  "/usr/local/lib/faketime/libfaketime.so.1", "/usr/lib64/faketime/libfaketime.so.1")

#: The ``sitecustomize`` of a process under libfaketime (module docstring): time.sleep in select().
SITECUSTOMIZE = '''"""Written by chaos.faketime for a process under libfaketime: time.sleep waits in
select() until its monotonic deadline (libfaketime 0.9.10 fails the absolute monotonic clock_nanosleep)."""
import select as _select
import time as _time


def _sleep(seconds):
    if seconds < 0:
        raise ValueError("sleep length must be non-negative")
    deadline = _time.monotonic() + seconds
    while (left := deadline - _time.monotonic()) > 0:
        _select.select([], [], [], left)


_time.sleep = _sleep
'''


def library() -> str | None:
    """The path of libfaketime (``libfaketime.so.1``), or None when it is not installed."""
    for pattern in _LIBRARY_GLOBS:
        for path in sorted(glob.glob(pattern)):
            if os.path.isfile(path):
                return path
    return None


def set_offset(timestamp_file: Path, seconds: float) -> None:
    """Make the wall clock of the processes reading ``timestamp_file`` ``seconds`` (rounded) from
    the host's (0: the host's time)."""
    temporary = timestamp_file.with_name(timestamp_file.name + ".new")
    temporary.write_text(f"{round(seconds):+d}\n")
    os.replace(temporary, timestamp_file)


def environment(site_dir: Path, timestamp_file: Path, *,
                base: dict[str, str] | None = None) -> dict[str, str]:
    """The variables (added to ``base``, default empty) that run a Python process under
    libfaketime with its offset in ``timestamp_file`` (written as ``+0`` when missing); writes
    ``site_dir/sitecustomize.py``.  RuntimeError when libfaketime is not installed."""
    path = library()
    if path is None:
        raise RuntimeError("libfaketime is not installed (on Debian: apt-get install faketime)")
    site_dir.mkdir(parents=True, exist_ok=True)
    (site_dir / "sitecustomize.py").write_text(SITECUSTOMIZE)
    if not timestamp_file.exists():
        set_offset(timestamp_file, 0)
    env = dict(base or {})
    inherited = env.get("PYTHONPATH", os.environ.get("PYTHONPATH"))
    python_path = os.pathsep.join(filter(None, (str(site_dir), inherited)))
    env.update({"LD_PRELOAD": path, "FAKETIME_TIMESTAMP_FILE": str(timestamp_file), "FAKETIME_NO_CACHE": "1",
                "FAKETIME_DONT_FAKE_MONOTONIC": "1", "PYTHONPATH": python_path})
    return env

"""The process's own figures (hpbroker.metrics.process): its start time as the kernel recorded it,
its CPU time finer than clock ticks."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from hpbroker.metrics.process import cpu_seconds, start_time_seconds


def fake_proc(root, stat: str, proc_stat: str) -> str:
    os.makedirs(root / "42")
    (root / "42" / "stat").write_text(stat)
    (root / "stat").write_text(proc_stat)
    return str(root)


def test_the_start_time_is_the_boot_time_plus_the_start_ticks(tmp_path):
    ticks = os.sysconf("SC_CLK_TCK")
    fields = ["S"] + ["0"] * 18 + [str(123 * ticks + ticks // 2)] + ["0"] * 30  # starttime: field 22
    proc = fake_proc(tmp_path, f"42 (a) (b c) {' '.join(fields)}\n",  # a command name with ") (" in it
                     "cpu  1 2 3\nintr 5\nbtime 1700000000\nprocesses 9\n")
    assert start_time_seconds(42, proc=proc) == 1700000000 + 123.5


def test_no_proc_or_a_malformed_one_gives_none(tmp_path):
    assert start_time_seconds(42, proc=str(tmp_path / "none")) is None
    assert start_time_seconds(42, proc=fake_proc(tmp_path / "bad", "42 (x) S 1 2\n", "btime 17\n")) is None
    fields = " ".join(["S"] + ["0"] * 40)
    no_btime = fake_proc(tmp_path / "nobtime", f"42 (x) {fields}\n", "cpu 1\n")
    assert start_time_seconds(42, proc=no_btime) is None


def test_a_process_started_now_is_seen_starting_now():
    before = time.time()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        started = start_time_seconds(child.pid)
    finally:
        child.kill()
        child.wait()
    assert started is not None
    assert int(before) - 1 <= started <= time.time() + 1  # the boot time is given in whole seconds
    own = start_time_seconds()
    assert own is not None and own <= before


def test_cpu_time_counts_a_millisecond_of_work():
    before = cpu_seconds()
    spin_until = time.perf_counter() + 0.002
    while time.perf_counter() < spin_until:
        pass
    assert cpu_seconds() > before

"""``hpbroker check DATA_DIR``: verify a stopped broker's data directory, reading only.

The topic store (``topics.json``) must load; then every partition directory (``<topic>-<N>``) is
checked by ``hpbroker.io.verify``: batch framing, CRCs and records, offsets contiguous within and
across segments, offset index entries at real batch starts with the right offsets, time index
entries increasing and at indexed offsets, the recovery-point checkpoint and clean-shutdown
marker sane.  One line per partition, ``OK`` or its problems (file, position, offset) on the lines
below, then a summary.  A partition that topics.json lists but that has no directory is a
problem: whatever it held is gone.  What a crash leaves and the next open repairs (a torn tail in
the last segment of a log not closed cleanly, a clean-shutdown marker cut short) is a note, shown
with ``--verbose``, as are other harmless findings.

The broker must be stopped: its data directory's ``.lock`` held by a running broker makes the
check refuse (exit status 2), and holding it meanwhile keeps a broker from starting on the
directory mid-check.  ``--force`` checks a live directory anyway, where appends in flight may
show as problems.  Exit status: 0 when everything is valid, 1 when anything is not, 2 when the
check cannot run (no such directory, a file it cannot read: the message names it).
"""

from __future__ import annotations

import argparse
import os
import sys

_DELETING_SUFFIX = ".deleting"  # a partition directory on its way out (hpbroker.workers.partitions)


def register(sub: argparse._SubParsersAction) -> None:
    check = sub.add_parser("check", help="verify the segments and indexes of a stopped broker's data")
    check.add_argument("data_dir", metavar="DATA_DIR", help="the broker's data_dir")
    check.add_argument("--force", action="store_true",
                       help="check even while a broker holds the directory (results may be wrong)")
    check.add_argument("--verbose", "-v", action="store_true", help="also print notes on harmless findings")
    check.set_defaults(run=_run)


def _run(args: argparse.Namespace) -> int:
    from hpbroker.io.verify import lock_holder

    data_dir = args.data_dir
    if not os.path.isdir(data_dir):
        print(f"hpbroker check: {data_dir} is not a directory", file=sys.stderr)
        return 2
    fd = -1
    try:
        fd, holder = lock_holder(data_dir)
        if holder is not None:
            if not args.force:
                print(f"hpbroker check: {data_dir} is in use by a running broker (process {holder}); stop "
                      f"it first, or pass --force to check anyway", file=sys.stderr)
                return 2
            print(f"warning: {data_dir} is in use by process {holder}: what it writes meanwhile may show "
                  f"as problems", file=sys.stderr)
        return check_data_dir(data_dir, force=args.force, verbose=args.verbose)
    except OSError as e:
        print(f"hpbroker check: cannot check {data_dir}: {e.filename or data_dir}: {e.strerror or e}",
              file=sys.stderr)
        return 2
    finally:
        if fd >= 0:
            os.close(fd)


def check_data_dir(data_dir: str, *, force: bool = False, verbose: bool = False, out=None) -> int:
    """Check and print (module docstring); returns the exit status.  Raises OSError when a file
    or directory cannot be read."""
    from hpbroker.broker.topics import TopicStore
    from hpbroker.errors import StorageError
    from hpbroker.io.verify import PartitionReport, Problem, check_partition

    out = out if out is not None else sys.stdout
    failures = 0
    try:
        topics = {t.name: t for t in TopicStore(data_dir).topics(include_deleting=True)}
    except StorageError as e:
        if isinstance(e.__cause__, OSError):
            raise e.__cause__ from None
        print(f"topics.json: {e.message}", file=out)
        topics, failures = {}, 1
    found = _partition_directories(data_dir)
    listed = {f"{t.name}-{p}": (t.name, p) for t in topics.values() if not t.deleting
              for p in range(t.partitions)}
    every = {**listed, **found}
    reports = []
    for name, (topic, partition) in sorted(every.items()):
        if name in found:
            report = check_partition(os.path.join(data_dir, name), name=name, ignore_lock=force)
        else:
            report = PartitionReport(name)
            report.problems.append(Problem(
                f"{name}/", -1, -1, "missing: topics.json lists the partition but it has no directory: "
                "removed with whatever it held, or never opened by its worker (a create that timed out); "
                "the broker creates it empty when it opens it"))
        known = topics.get(topic)
        if known is None:
            report.notes.append(f"topic {topic!r} is not in topics.json")
        elif partition >= known.partitions:
            report.notes.append(f"topic {topic!r} has {known.partitions} partitions in topics.json")
        elif known.deleting:
            report.notes.append(f"topic {topic!r} is being deleted")
        reports.append(report)
        _print_report(report, out, verbose)
    if verbose:
        for leftover in sorted(n for n in os.listdir(data_dir) if n.endswith(_DELETING_SUFFIX)):
            print(f"note: {leftover}: a deleted partition not yet removed (removed at the next delete)",
                  file=out)
    bad = sum(not r.ok for r in reports)
    problems = sum(len(r.problems) for r in reports)
    segments = sum(r.segments for r in reports)
    size = sum(r.size_in_bytes for r in reports)
    print(f"checked {len(reports)} partitions of {len({t for t, _ in every.values()})} topics "
          f"({segments} segments, {size} bytes): {len(reports) - bad} OK, {bad} with {problems} problems"
          + ("; topics.json unreadable" if failures else ""), file=out)
    return 1 if bad or failures else 0


def _partition_directories(data_dir: str) -> dict[str, tuple[str, int]]:
    """``<topic>-<N>`` directories: name -> (topic, partition)."""
    found = {}
    for name in os.listdir(data_dir):
        topic, dash, number = name.rpartition("-")
        if dash and topic and number.isdigit() and number.isascii() \
                and os.path.isdir(os.path.join(data_dir, name)):
            found[name] = (topic, int(number))
    return found


def _print_report(report, out, verbose: bool) -> None:
    if report.ok:
        offsets = (f"offsets {report.log_start_offset}..{report.log_end_offset - 1}"
                   if report.log_end_offset > report.log_start_offset else "empty")
        print(f"{report.name}: OK ({report.segments} segments, {report.batches} batches, {offsets}, "
              f"{report.size_in_bytes} bytes)", file=out)
    else:
        counts = ""
        if report.segments:
            counts = (f" ({report.segments} segments, {report.batches} valid batches, "
                      f"{report.size_in_bytes} bytes)")
        print(f"{report.name}: {len(report.problems)} PROBLEMS{counts}", file=out)
        for problem in report.problems:
            print(f"  {problem}", file=out)
    if verbose:
        for note in report.notes:
            print(f"  note: {note}", file=out)

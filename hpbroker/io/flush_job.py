"""One group commit in flight: :class:`FlushJob`, made by the partition log (hpbroker.io.log,
``begin_flush``) and run on a flusher thread; its I/O is the native
:class:`~hpbroker.io._writer.WriteJob`.  It touches no state of the log: the log applies its
result (``complete_flush``)."""

from __future__ import annotations

from hpbroker.io._writer import WriteJob
from hpbroker.io.segment import PendingBatch, Segment

__all__ = ["FlushJob"]


class FlushJob:
    """One group commit in flight: the batches pending when :meth:`PartitionLog.begin_flush` was
    called, written by :meth:`run` on any thread.

    The I/O is a native :class:`~hpbroker.io._writer.WriteJob` (one ``writev``, then
    ``fdatasync`` when ``fsync``, all without the GIL, so the owner goes on validating and
    appending meanwhile and a flusher never waits for the GIL between the two); it touches no
    state of the log.  Hand it to a :class:`~hpbroker.io._writer.WriterThread` with
    ``writer.submit(job.io)``, or call :meth:`run` from a thread of your own.  The owner applies
    the result with :meth:`PartitionLog.complete_flush`.

    Several jobs may be in flight; they write in the order they were begun because each one,
    once claimed, first waits for the job begun before it (and writes nothing if that one failed).

    A job runs at most once: whoever calls :meth:`run` first *claims* it (pending -> running ->
    done); a later call does nothing.  The owner never waits for a job nobody has claimed: when
    it needs the result (a roll, :meth:`PartitionLog.flush`, close) it runs the job itself, and
    it waits only for a job some thread is actually running.  So a job queued on a writer that
    stopped costs nothing but the pipelining.  A job cancelled by closing an abandoned or
    offline log never runs; nor does one a write failure dropped (``dropped``: its records are
    never acknowledged).
    """

    __slots__ = ("segment", "batches", "fsync", "records", "size", "io", "applied", "dropped")

    def __init__(self, segment: Segment, batches: list[PendingBatch], fsync: bool, records: int, size: int,
                 previous: FlushJob | None) -> None:
        self.segment = segment
        self.batches = batches
        self.fsync = fsync
        self.records = records
        self.size = size
        self.io = WriteJob(segment.log.fd, segment.buffers(batches), fsync,
                           previous.io if previous is not None else None)
        self.applied = False  # set by the log once it has taken the result in
        self.dropped = False  # set with applied when a write failure dropped it unwritten

    def __repr__(self) -> str:
        return (f"FlushJob({self.segment.path}, batches={len(self.batches)}, records={self.records}, "
                f"size={self.size}, done={self.done}, applied={self.applied})")

    def run(self) -> None:
        """Write (and sync) the batches here, unless the job was claimed already: then do nothing."""
        self.io.run()

    @property
    def done(self) -> bool:
        return self.io.done

    def wait(self) -> None:
        """Block until the job is done (whoever runs it)."""
        self.io.wait()

    @property
    def written(self) -> int:
        return self.io.written

    @property
    def error(self) -> OSError | None:
        return self.io.error

    @property
    def write_ns(self) -> int:
        """Nanoseconds its ``writev`` calls took (measured in the native job; 0 until done)."""
        return self.io.write_ns

    @property
    def sync_ns(self) -> int:
        """Nanoseconds its ``fdatasync`` took (0 until done, and without ``fsync``)."""
        return self.io.sync_ns

    def cancel(self) -> None:
        """Make sure the job never runs (its descriptor is about to be closed), unless it was
        claimed already; either way it is done once this returns (never close a descriptor a
        job is writing to)."""
        self.io.cancel()

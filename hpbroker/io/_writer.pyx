# cython: language_level=3
"""Group commits that never need the GIL: :class:`WriteJob` and :class:`WriterThread`.

Why native: a Python flusher thread has to take the GIL back after every ``writev`` and
``fdatasync``, and on a busy owner that hand-off costs a thread wake-up each time (tens of
microseconds on a virtual machine), as much as writing the megabyte.  Here the whole job, from
the first ``writev`` to the ``fdatasync``, runs in C; the owner learns a job is done from an
atomic flag, and its event loop from one byte written to a pipe.

A :class:`WriteJob` holds its buffers (a Python buffer view of each, released only once the job
is done or cancelled, never while a thread may still write from them).  Rules, from
``hpbroker/_csrc/group_commit.h``: a job runs at most once, whoever calls :meth:`WriteJob.run`
first (the :class:`WriterThread` or the owner); a job made ``after`` another waits for it and
writes nothing if it failed; a job dropped while pending is cancelled first.

Who calls what: the log's owner makes jobs and submits them; the writer thread runs them; only
the owner reads their results.  The thread is started by the constructor, so make one after
``fork()``, in the process that uses it.
"""

from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.mem cimport PyMem_Calloc, PyMem_Free
from libc.stdint cimport int64_t



cdef extern from "group_commit.h":
    ctypedef struct hpb_job:
        pass
    ctypedef struct hpb_writer:
        pass
    ctypedef void (*hpb_trace_fn)(const char *operation, int fd, void *arg) noexcept
    enum:
        HPB_RAN
        HPB_CANCELLED
        HPB_PREVIOUS_FAILED
    hpb_job *hpb_job_new(int fd, int fsync, int iovcnt) nogil
    void hpb_job_set_buffer(hpb_job *job, int i, void *base, size_t len) nogil
    void hpb_job_set_previous(hpb_job *job, hpb_job *previous) nogil
    int hpb_job_run(hpb_job *job) nogil
    int hpb_job_cancel(hpb_job *job) nogil
    void hpb_job_wait(hpb_job *job) nogil
    int hpb_job_done(const hpb_job *job) nogil
    size_t hpb_job_written(const hpb_job *job) nogil
    int hpb_job_errno(const hpb_job *job) nogil
    int hpb_job_outcome(const hpb_job *job) nogil
    int64_t hpb_job_write_ns(const hpb_job *job) nogil
    int64_t hpb_job_sync_ns(const hpb_job *job) nogil
    void hpb_job_decref(hpb_job *job) nogil
    hpb_writer *hpb_writer_start(int notify_fd, int *error) nogil
    int hpb_writer_submit(hpb_writer *writer, hpb_job *job) nogil
    int hpb_writer_take_notification(hpb_writer *writer) nogil
    int hpb_writer_notified(const hpb_writer *writer) nogil
    void hpb_writer_request_stop(hpb_writer *writer, int drain) nogil
    void hpb_writer_stop(hpb_writer *writer, int drain) nogil
    void hpb_writer_free(hpb_writer *writer) nogil
    void hpb_set_trace(hpb_trace_fn fn, void *arg) nogil

import errno
import os

__all__ = ["WriteJob", "WriterThread", "set_trace"]

RAN = HPB_RAN
CANCELLED = HPB_CANCELLED
PREVIOUS_FAILED = HPB_PREVIOUS_FAILED


cdef class WriteJob:
    """``buffers`` written in order to ``fd`` (one ``writev`` per IOV_MAX buffers, resumed after
    short writes), then ``fdatasync(fd)`` when ``fsync``; after the job ``after``, if given."""

    cdef hpb_job *_job
    cdef Py_buffer *_views
    cdef Py_ssize_t _held

    def __cinit__(self, int fd, buffers, bint fsync, WriteJob after=None):
        cdef Py_ssize_t n = len(buffers), i
        if n > 0x7FFFFFFF:
            raise ValueError(f"{n} buffers are too many for one job")
        self._job = hpb_job_new(fd, fsync, <int>n)
        self._views = <Py_buffer *>PyMem_Calloc(max(n, 1), sizeof(Py_buffer))
        if self._job is NULL or self._views is NULL:
            raise MemoryError()
        for i in range(n):
            PyObject_GetBuffer(buffers[i], &self._views[i], PyBUF_SIMPLE)
            self._held = i + 1
            hpb_job_set_buffer(self._job, <int>i, self._views[i].buf, <size_t>self._views[i].len)
        if after is not None:
            hpb_job_set_previous(self._job, after._job)

    def __dealloc__(self):
        cdef Py_ssize_t i
        if self._job is not NULL:
            with nogil:
                hpb_job_cancel(self._job)  # never release a buffer a thread may be writing from
        if self._views is not NULL:
            for i in range(self._held):
                PyBuffer_Release(&self._views[i])
            PyMem_Free(self._views)
        if self._job is not NULL:
            hpb_job_decref(self._job)

    def run(self):
        """Run the job on this thread, without the GIL, unless someone claimed it already (then
        return at once, False)."""
        cdef int ran
        with nogil:
            ran = hpb_job_run(self._job)
        return bool(ran)

    def cancel(self):
        """Make sure the job never writes: True if it was cancelled unrun; False if someone had
        claimed it, in which case it is done once this returns."""
        cdef int cancelled
        with nogil:
            cancelled = hpb_job_cancel(self._job)
        return bool(cancelled)

    def wait(self):
        """Block (without the GIL) until the job is done."""
        with nogil:
            hpb_job_wait(self._job)

    @property
    def done(self):
        return bool(hpb_job_done(self._job))

    @property
    def written(self):
        """Bytes written so far; final once ``done``."""
        return hpb_job_written(self._job)

    @property
    def write_ns(self):
        """Nanoseconds the job's ``writev`` calls took, measured on the thread that ran it; 0
        until it is ``done`` (and when it wrote nothing)."""
        return hpb_job_write_ns(self._job) if hpb_job_done(self._job) else 0

    @property
    def sync_ns(self):
        """Nanoseconds its ``fdatasync`` took; 0 until ``done``, and for a job without one."""
        return hpb_job_sync_ns(self._job) if hpb_job_done(self._job) else 0

    @property
    def error(self):
        """None, or the OSError that stopped the job (ECANCELED when it was cancelled or an
        earlier job failed).  Meaningful once ``done``."""
        cdef int code = hpb_job_errno(self._job)
        cdef int outcome = hpb_job_outcome(self._job)
        if code == 0:
            return None
        if outcome == HPB_PREVIOUS_FAILED:
            return OSError(errno.ECANCELED, "not written: an earlier flush failed")
        if outcome == HPB_CANCELLED:
            return OSError(errno.ECANCELED, "not written: the job was cancelled before it ran")
        return OSError(code, os.strerror(code))


cdef class WriterThread:
    """A native thread running submitted jobs in FIFO order; after each one it ran, it sets the
    notification flag and, when the flag was clear, writes a byte to ``notify_fd`` (-1: none)."""

    cdef hpb_writer *_writer
    cdef bint _stopped

    def __cinit__(self, int notify_fd=-1):
        cdef int error = 0
        self._writer = hpb_writer_start(notify_fd, &error)
        if self._writer is NULL:
            raise OSError(error, f"cannot start the writer thread: {os.strerror(error)}")

    def __dealloc__(self):
        if self._writer is not NULL:
            if not self._stopped:
                with nogil:
                    hpb_writer_stop(self._writer, 0)
            hpb_writer_free(self._writer)

    def submit(self, WriteJob job not None):
        """Queue ``job``; False (not queued) once the thread is stopping."""
        return hpb_writer_submit(self._writer, job._job) == 0

    def take_notification(self):
        """Whether a job finished since the last call; clears the flag."""
        return bool(hpb_writer_take_notification(self._writer))

    @property
    def notified(self):
        """Whether a job finished since the last :meth:`take_notification`."""
        return bool(hpb_writer_notified(self._writer))

    def request_stop(self, *, bint drain):
        """Ask the thread to stop (as :meth:`stop` says) and return at once, from any thread (the
        writer's own included, e.g. from a trace callback); :meth:`stop` still waits for it.
        Once asked, the thread takes no new job."""
        with nogil:
            hpb_writer_request_stop(self._writer, drain)

    def stop(self, *, bint drain):
        """Stop the thread and wait for it: ``drain`` runs every queued job first; otherwise the
        jobs still queued stay pending, for their owners to run or cancel.  Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        with nogil:
            hpb_writer_stop(self._writer, drain)

    @property
    def stopped(self):
        return bool(self._stopped)


cdef object _trace_callback = None


cdef void _call_trace(const char *operation, int fd, void *arg) noexcept with gil:
    callback = _trace_callback
    if callback is not None:
        try:
            callback(operation.decode(), fd)
        except BaseException:
            pass


def set_trace(callback):
    """Call ``callback(operation, fd)`` after every ``writev``/``fdatasync`` a job makes, on the
    thread that made it (``None`` stops it).  For tests: it takes the GIL on the writer thread."""
    global _trace_callback
    _trace_callback = callback
    if callback is None:
        hpb_set_trace(NULL, NULL)
    else:
        hpb_set_trace(_call_trace, NULL)

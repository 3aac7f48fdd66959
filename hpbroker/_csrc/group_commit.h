/* Group-commit I/O that never needs the GIL: write jobs and a native writer thread.
 *
 * A job is one group commit: an iovec list written to one file descriptor with writev (resumed
 * after short writes, EINTR retried, at most IOV_MAX buffers per call), then, when asked,
 * fdatasync.  A job runs at most once: the first caller of hpb_job_run (the writer thread or the
 * log's owner) claims it, pending -> running -> done.  A job made "after" another waits for that
 * one to be done before it writes, and writes nothing if that one failed (ECANCELED), so jobs of
 * one file land in the order they were made whoever runs them.
 *
 * The writer thread runs the jobs submitted to it in FIFO order.  After each job it ran it sets
 * the notification flag and, if the flag was clear, writes one byte to notify_fd (a non-blocking
 * pipe the owner's event loop polls), so a busy stream of jobs costs one wake-up per loop turn.
 *
 * Jobs are reference counted: the creator holds one reference, the writer's queue one per
 * submission, a later job one on its predecessor until it is claimed.  The buffers behind the
 * iovecs belong to the creator, who must keep them alive until the job is done: it cancels or
 * waits for the job before releasing them (hpb_job_cancel does both).
 *
 * Timing: a job that ran measures, with CLOCK_MONOTONIC on the thread that ran it, the time its
 * writev calls took together and the time its fdatasync took (0 when it made none); they are
 * final once the job is done, and cost two clock reads per call made.
 *
 * Tracing (tests): hpb_set_trace installs a function called after every writev and fdatasync a
 * job makes, on whatever thread made it.
 */
#ifndef HPBROKER_GROUP_COMMIT_H
#define HPBROKER_GROUP_COMMIT_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

typedef struct hpb_job hpb_job;
typedef struct hpb_writer hpb_writer;

/* Why a job wrote nothing although nothing failed in it. */
enum { HPB_RAN = 0, HPB_CANCELLED = 1, HPB_PREVIOUS_FAILED = 2 };

hpb_job *hpb_job_new(int fd, int fsync, int iovcnt);         /* NULL: out of memory */
void hpb_job_set_buffer(hpb_job *job, int i, void *base, size_t len);
void hpb_job_set_previous(hpb_job *job, hpb_job *previous);  /* before the job is run or submitted */
int hpb_job_run(hpb_job *job);     /* 1: ran it here; 0: someone had claimed it (not waited for) */
int hpb_job_cancel(hpb_job *job);  /* 1: cancelled unrun; 0: claimed already, now done (waited) */
void hpb_job_wait(hpb_job *job);
int hpb_job_done(const hpb_job *job);
size_t hpb_job_written(const hpb_job *job);
int hpb_job_errno(const hpb_job *job);    /* 0, or the errno of the failed writev/fdatasync */
int hpb_job_outcome(const hpb_job *job);  /* HPB_RAN, HPB_CANCELLED or HPB_PREVIOUS_FAILED */
int64_t hpb_job_write_ns(const hpb_job *job);  /* ns spent in writev; final once done */
int64_t hpb_job_sync_ns(const hpb_job *job);   /* ns spent in fdatasync; 0 when none */
void hpb_job_incref(hpb_job *job);
void hpb_job_decref(hpb_job *job);

hpb_writer *hpb_writer_start(int notify_fd, int *error);  /* NULL with *error set on failure */
int hpb_writer_submit(hpb_writer *writer, hpb_job *job);  /* 0, or -1 once stopping */
int hpb_writer_take_notification(hpb_writer *writer);     /* the flag, cleared */
int hpb_writer_notified(const hpb_writer *writer);        /* the flag, left as it is */
void hpb_writer_request_stop(hpb_writer *writer, int drain); /* returns at once; any thread */
void hpb_writer_stop(hpb_writer *writer, int drain);      /* joins; drain: run what is queued */
void hpb_writer_free(hpb_writer *writer);                 /* after hpb_writer_stop */

typedef void (*hpb_trace_fn)(const char *operation, int fd, void *arg);
void hpb_set_trace(hpb_trace_fn fn, void *arg);

#endif

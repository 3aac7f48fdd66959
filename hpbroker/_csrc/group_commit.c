/* Group-commit I/O without the GIL; the contract is in group_commit.h. */
#define _GNU_SOURCE
#include "group_commit.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#ifndef IOV_MAX
#define IOV_MAX 1024
#endif

enum { PENDING = 0, RUNNING = 1, DONE = 2 };

struct hpb_job {
    int state;           /* PENDING -> RUNNING -> DONE; atomic */
    int refs;            /* atomic */
    int fd;
    int fsync;
    int iovcnt;
    int error;           /* errno of the failed call, ECANCELED when not written, or 0 */
    int outcome;         /* HPB_RAN, HPB_CANCELLED, HPB_PREVIOUS_FAILED */
    size_t written;
    int64_t write_ns;    /* time in writev, on the thread that ran the job */
    int64_t sync_ns;     /* time in fdatasync */
    hpb_job *previous;   /* referenced until the job is claimed */
    hpb_job *next;       /* the writer's queue */
    pthread_mutex_t mutex;
    pthread_cond_t cond;
    struct iovec iov[];
};

struct hpb_writer {
    pthread_t thread;
    pthread_mutex_t mutex;
    pthread_cond_t cond;
    hpb_job *head, *tail;
    int stopping;        /* 0 running; 1 drain then exit; 2 exit after the current job */
    int notified;        /* atomic */
    int notify_fd;
};

static hpb_trace_fn trace_fn;
static void *trace_arg;

void hpb_set_trace(hpb_trace_fn fn, void *arg)
{
    __atomic_store_n(&trace_arg, arg, __ATOMIC_RELEASE);
    __atomic_store_n(&trace_fn, fn, __ATOMIC_RELEASE);
}

static void trace(const char *operation, int fd)
{
    hpb_trace_fn fn = __atomic_load_n(&trace_fn, __ATOMIC_ACQUIRE);
    if (fn)
        fn(operation, fd, __atomic_load_n(&trace_arg, __ATOMIC_ACQUIRE));
}

/* --- jobs ---------------------------------------------------------------------------------- */

hpb_job *hpb_job_new(int fd, int fsync, int iovcnt)
{
    if (iovcnt < 0)
        return NULL;
    hpb_job *job = calloc(1, sizeof(hpb_job) + (size_t)iovcnt * sizeof(struct iovec));
    if (!job)
        return NULL;
    job->refs = 1;
    job->fd = fd;
    job->fsync = fsync;
    job->iovcnt = iovcnt;
    pthread_mutex_init(&job->mutex, NULL);
    pthread_cond_init(&job->cond, NULL);
    return job;
}

void hpb_job_set_buffer(hpb_job *job, int i, void *base, size_t len)
{
    job->iov[i].iov_base = base;
    job->iov[i].iov_len = len;
}

void hpb_job_set_previous(hpb_job *job, hpb_job *previous)
{
    hpb_job_incref(previous);
    job->previous = previous;
}

void hpb_job_incref(hpb_job *job)
{
    __atomic_add_fetch(&job->refs, 1, __ATOMIC_RELAXED);
}

void hpb_job_decref(hpb_job *job)
{
    if (__atomic_sub_fetch(&job->refs, 1, __ATOMIC_ACQ_REL) != 0)
        return;
    if (job->previous)
        hpb_job_decref(job->previous);
    pthread_mutex_destroy(&job->mutex);
    pthread_cond_destroy(&job->cond);
    free(job);
}

int hpb_job_done(const hpb_job *job)
{
    return __atomic_load_n(&job->state, __ATOMIC_ACQUIRE) == DONE;
}

size_t hpb_job_written(const hpb_job *job) { return job->written; }
int64_t hpb_job_write_ns(const hpb_job *job) { return job->write_ns; }
int64_t hpb_job_sync_ns(const hpb_job *job) { return job->sync_ns; }
int hpb_job_errno(const hpb_job *job) { return job->error; }
int hpb_job_outcome(const hpb_job *job) { return job->outcome; }

void hpb_job_wait(hpb_job *job)
{
    if (hpb_job_done(job))
        return;
    pthread_mutex_lock(&job->mutex);
    while (!hpb_job_done(job))
        pthread_cond_wait(&job->cond, &job->mutex);
    pthread_mutex_unlock(&job->mutex);
}

static int claim(hpb_job *job)
{
    int expected = PENDING;
    return __atomic_compare_exchange_n(&job->state, &expected, RUNNING, 0, __ATOMIC_ACQ_REL,
                                       __ATOMIC_ACQUIRE);
}

static void finish(hpb_job *job)
{
    hpb_job *previous = job->previous;
    job->previous = NULL;
    pthread_mutex_lock(&job->mutex);
    __atomic_store_n(&job->state, DONE, __ATOMIC_RELEASE);
    pthread_cond_broadcast(&job->cond);
    pthread_mutex_unlock(&job->mutex);
    if (previous)
        hpb_job_decref(previous);
}

/* At most this many bytes per writev (or one buffer, if longer: then exactly this many).  One
 * huge write makes the kernel allocate large page-cache folios, which on a virtual machine that
 * hands free memory back to its host can mean host page faults: measured here, 8 MiB writes now
 * and then ran ten times slower than the same bytes written 1 MiB at a time. */
#define WRITE_CHUNK_BYTES ((size_t)1 << 20)

/* How many of the first `left` buffers at `iov` the next writev takes (at least one). */
static int next_chunk(const struct iovec *iov, int left)
{
    size_t bytes = iov[0].iov_len;
    int n = 1;
    while (n < left && n < IOV_MAX && bytes + iov[n].iov_len <= WRITE_CHUNK_BYTES)
        bytes += iov[n++].iov_len;
    return n;
}

/* writev until every byte is out: resumes after a short write, retries EINTR. */
static void write_all(hpb_job *job)
{
    struct iovec *iov = job->iov;
    int left = job->iovcnt;
    for (;;) {
        while (left > 0 && iov->iov_len == 0) {
            iov++;
            left--;
        }
        if (left == 0)
            return;
        int count = next_chunk(iov, left);
        struct iovec part;
        const struct iovec *out = iov;
        if (count == 1 && iov->iov_len > WRITE_CHUNK_BYTES) {
            part.iov_base = iov->iov_base;
            part.iov_len = WRITE_CHUNK_BYTES;
            out = &part;
        }
        ssize_t n = writev(job->fd, out, count);
        trace("writev", job->fd);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            job->error = errno;
            return;
        }
        if (n == 0) {  /* no progress on a non-empty buffer: never loop forever */
            job->error = EIO;
            return;
        }
        job->written += (size_t)n;
        size_t advance = (size_t)n;
        while (left > 0 && advance >= iov->iov_len) {
            advance -= iov->iov_len;
            iov++;
            left--;
        }
        if (left > 0) {
            iov->iov_base = (char *)iov->iov_base + advance;
            iov->iov_len -= advance;
        }
    }
}

static int64_t now_ns(void)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (int64_t)now.tv_sec * 1000000000 + now.tv_nsec;
}

static void run_claimed(hpb_job *job)
{
    hpb_job *previous = job->previous;
    if (previous) {
        hpb_job_wait(previous);
        if (previous->error) {
            job->error = ECANCELED;
            job->outcome = HPB_PREVIOUS_FAILED;
            return;
        }
    }
    int64_t started = now_ns();
    write_all(job);
    int64_t written = now_ns();
    job->write_ns = written - started;
    if (job->error || !job->fsync)
        return;
    int r;
    do {
        r = fdatasync(job->fd);
    } while (r < 0 && errno == EINTR);
    job->sync_ns = now_ns() - written;
    trace("fdatasync", job->fd);
    if (r < 0)
        job->error = errno;
}

int hpb_job_run(hpb_job *job)
{
    if (!claim(job))
        return 0;
    run_claimed(job);
    finish(job);
    return 1;
}

int hpb_job_cancel(hpb_job *job)
{
    if (claim(job)) {
        job->error = ECANCELED;
        job->outcome = HPB_CANCELLED;
        finish(job);
        return 1;
    }
    hpb_job_wait(job);
    return 0;
}

/* --- the writer thread --------------------------------------------------------------------- */

static void notify(hpb_writer *writer)
{
    if (__atomic_exchange_n(&writer->notified, 1, __ATOMIC_ACQ_REL) || writer->notify_fd < 0)
        return;
    ssize_t r;
    do {
        r = write(writer->notify_fd, "", 1);
    } while (r < 0 && errno == EINTR);
    /* EAGAIN: the pipe is full, which wakes the loop just as well. */
}

static void *writer_main(void *arg)
{
    hpb_writer *writer = arg;
    pthread_mutex_lock(&writer->mutex);
    for (;;) {
        while (!writer->head && !writer->stopping)
            pthread_cond_wait(&writer->cond, &writer->mutex);
        if (writer->stopping == 2 || !writer->head)
            break;
        hpb_job *job = writer->head;
        writer->head = job->next;
        if (!writer->head)
            writer->tail = NULL;
        job->next = NULL;
        pthread_mutex_unlock(&writer->mutex);
        int ran = hpb_job_run(job);
        hpb_job_decref(job);
        if (ran)
            notify(writer);
        pthread_mutex_lock(&writer->mutex);
    }
    pthread_mutex_unlock(&writer->mutex);
    return NULL;
}

hpb_writer *hpb_writer_start(int notify_fd, int *error)
{
    hpb_writer *writer = calloc(1, sizeof(hpb_writer));
    if (!writer) {
        *error = ENOMEM;
        return NULL;
    }
    writer->notify_fd = notify_fd;
    pthread_mutex_init(&writer->mutex, NULL);
    pthread_cond_init(&writer->cond, NULL);
    int r = pthread_create(&writer->thread, NULL, writer_main, writer);
    if (r != 0) {
        pthread_mutex_destroy(&writer->mutex);
        pthread_cond_destroy(&writer->cond);
        free(writer);
        *error = r;
        return NULL;
    }
    return writer;
}

int hpb_writer_submit(hpb_writer *writer, hpb_job *job)
{
    pthread_mutex_lock(&writer->mutex);
    if (writer->stopping) {
        pthread_mutex_unlock(&writer->mutex);
        return -1;
    }
    hpb_job_incref(job);
    if (writer->tail)
        writer->tail->next = job;
    else
        writer->head = job;
    writer->tail = job;
    pthread_cond_signal(&writer->cond);
    pthread_mutex_unlock(&writer->mutex);
    return 0;
}

int hpb_writer_take_notification(hpb_writer *writer)
{
    return __atomic_exchange_n(&writer->notified, 0, __ATOMIC_ACQ_REL);
}

int hpb_writer_notified(const hpb_writer *writer)
{
    return __atomic_load_n(&writer->notified, __ATOMIC_ACQUIRE);
}

void hpb_writer_request_stop(hpb_writer *writer, int drain)
{
    pthread_mutex_lock(&writer->mutex);
    if (!writer->stopping || !drain)  /* "exit now" overrides "drain first", never the reverse */
        writer->stopping = drain ? 1 : 2;
    pthread_cond_signal(&writer->cond);
    pthread_mutex_unlock(&writer->mutex);
}

void hpb_writer_stop(hpb_writer *writer, int drain)
{
    hpb_writer_request_stop(writer, drain);
    pthread_join(writer->thread, NULL);
    /* Jobs still queued stay pending: whoever needs one runs it (or cancels it). */
    while (writer->head) {
        hpb_job *job = writer->head;
        writer->head = job->next;
        job->next = NULL;
        hpb_job_decref(job);
    }
    writer->tail = NULL;
}

void hpb_writer_free(hpb_writer *writer)
{
    pthread_mutex_destroy(&writer->mutex);
    pthread_cond_destroy(&writer->cond);
    free(writer);
}

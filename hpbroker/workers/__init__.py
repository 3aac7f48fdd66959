"""The broker's processes: one arbiter, N pre-forked I/O workers.

Processes and sockets::

    clients (DEALER) --tcp--> [front-end ROUTER]  arbiter  [backend ROUTER] <--ipc-- worker 0 (DEALER)
                                                                             <--ipc-- worker 1 (DEALER)
    consumers --tcp--> data port of worker s (fetch_port + s), served by worker s with sendfile

- The **arbiter** (``hpbroker.workers.arbiter``) binds the ZeroMQ front-end and the backend,
  creates every worker's TCP data listening socket before forking (so a respawned worker takes
  over the same socket), forks one worker per *slot*, watches their heartbeats, and relays:
  produce, fetch and list-offsets requests go to the slot that owns the partition
  (``hpbroker.workers.ownership``); metadata, the topic admin requests and InitProducerId are
  the arbiter's own (it owns the topic store, ``hpbroker.broker.topics``, and the producer id
  allocator, ``hpbroker.coord.producer_ids``).  A slot is respawned only after its old
  process has been reaped, so a partition never has two writers (each log also holds a directory
  lock).
- A **worker** (``hpbroker.workers.worker``) owns the partitions of its slot: it opens (and so
  recovers) their logs before it reports ready, appends and flushes with a flusher thread
  (group commit; one without fdatasync on the event loop when nothing else is being written),
  answers produce requests once their records are flushed (an idempotent producer's resent
  batches are deduplicated there, at the partition's single writer:
  ``hpbroker.io.producer_state``), serves fetches over ZeroMQ and on its TCP data port
  (``os.sendfile`` from the segment files), and parks fetches at the log end until new records
  are flushed or their wait runs out (long polling).

Arbiter and workers speak over the backend socket with the small framing of
``hpbroker.workers.backend``.  With ``metrics_port`` set, each worker also writes what it measured
(``hpbroker.workers.stats``) next to its heartbeat, and the arbiter serves it all to Prometheus
(``hpbroker.workers.exporter``).  ZeroMQ contexts are created after ``fork``, in each process.
Imports: workers use storage (``hpbroker.io``), the protocol and the backend framing; nothing
here is imported by storage or by the client.
"""

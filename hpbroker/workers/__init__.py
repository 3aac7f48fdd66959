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

Replication (``hpbroker.workers.replication``; the state machine itself is ``hpbroker.replica``)::

    broker 0                                               broker 1
    producer --acks=-1--> arbiter 0 --relay--> worker 1    worker 2
                                          (leads orders-3)  (follows orders-3)
                                               |  <-- Fetch v1: replica_id 1,  --|
                                               |      epoch E, its flushed end   |
                                               |  --- batches (sendfile), HW --> |  append_replicated,
                                               |                                 |  flush, fetch again
                                               +-- isr_change --> arbiter 0 --> ZooKeeper (state node)
    ZooKeeper state nodes --watch--> arbiter 0, arbiter 1 --replica_role--> their workers

- Each broker's arbiter follows the partition states in ZooKeeper
  (``hpbroker.coord.broker_replication``, on its own thread) and gives its workers a
  ``replica_role`` per replicated partition (``hpbroker.workers.leadership``, framed by
  ``hpbroker.workers.backend``); it also answers metadata with each partition's leader, replicas
  and ISR.  A worker may lead some partitions and follow others.
- A **leader** stamps its epoch into every batch, tracks each follower's flushed end from its
  replica fetches, and computes the replicated high watermark (HW): consumers read below it,
  acks=-1 is answered once it passes the records, and a follower that lags longer than
  ``replica_lag_time_max_ms`` (or catches up again) makes the leader propose an ISR change,
  which the arbiter writes to ZooKeeper; the new state comes back as a role.
- A **follower** refuses clients with NotLeaderOrFollowerError naming the leader, fetches from
  the leader's data port from its flushed end, appends the very bytes it gets and flushes them
  at once; a divergence answer (leader epochs, KIP-101/KIP-320) truncates it first.

Arbiter and workers speak over the backend socket with the small framing of
``hpbroker.workers.backend``.  With ``metrics_port`` set, each worker also writes what it measured
(``hpbroker.workers.stats``) next to its heartbeat, and the arbiter serves it all to Prometheus
(``hpbroker.workers.exporter``).  ZeroMQ contexts are created after ``fork``, in each process.
Imports: workers use storage (``hpbroker.io``), the replica state machine (``hpbroker.replica``),
the protocol and the backend framing; nothing here is imported by storage or by the client.
"""

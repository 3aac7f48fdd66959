"""Replication of a partition between brokers: leader and follower state, divergence, fetching.

Kafka's ZooKeeper-era replication (0.8 – 2.x) with leader epochs (KIP-101, KIP-320): the
controller (``hpbroker.coord.controller``) decides who leads each partition in which leader
epoch and writes it to ZooKeeper; each broker hands its partitions' roles to its worker slots;
this package is what a worker does with a role.  The state machine of one partition on one
broker::

                        role "none" (not a replica here, or no leader)
                  +-------------------------------------------------------+
                  |                                                       |
                  v          role "leader", epoch E                       |
             +--------+ ---------------------------------> +------------------------+
             |  none  |   log.begin_leader_epoch(E)         |  leader in epoch E     |
             +--------+   LeaderState(..., now)             |  replica fetches:      |
                  |                                         |    follower_fetched    |
                  | role "follower",                        |    diverging_epoch     |
                  | epoch E, leader L                       |  HW = high_watermark() |
                  v                                         |  ISR: isr_change() ->  |
   +----------------------------------+                     |    ZooKeeper ->        |
   |  follower of L in epoch E        | <------------------ |    isr_changed()       |
   |  ReplicaFetcher to L's data port |  role "follower"    +------------------------+
   |  fetch(flushed end, E, last ep.) |  (a newer epoch)        ^
   +----------------------------------+ ------------------------+
      |        ^         ^              role "leader" (a newer epoch)
      |        |         |
      | answer |         +--- diverging (epoch, end): truncate_to(truncation_offset(...))
      v        |
   append_replicated(payload) -> flush -> next fetch from the new flushed end
      (offset below the leader's log start: truncate_fully_and_start_at(log start))

A role always comes with its leader epoch; a broker acts only on epochs newer than (or equal
to, for an ISR change) the one it holds, and a leader refuses replica fetches of an older epoch
(FencedLeaderEpochError) or to a broker that does not lead (NotLeaderOrFollowerError).

Modules, one responsibility each:

- ``leader``      :class:`~hpbroker.replica.leader.LeaderState`: follower progress, ISR shrink
                  and expand, the high watermark, the min-ISR check (pure logic)
- ``divergence``  where a follower's log parts from its leader's: the leader's check of a fetch's
                  last epoch and the follower's truncation offset (pure logic)
- ``fetcher``     :class:`~hpbroker.replica.fetcher.ReplicaFetcher`: a follower's non-blocking
                  TCP connection to a leader's data port, on the worker's event loop

Imports: the workers (``hpbroker.workers``) use this package; it imports the protocol, the
errors and storage's leader-epoch cache (``hpbroker.io.leader_epochs``), never the workers,
ZeroMQ or kazoo; storage (``hpbroker.io``) never imports it.
"""

"""Coordination through ZooKeeper (kazoo): which brokers are alive and what they store, which
consumers are in which group, who owns which partition and how far each group has consumed.
``docs/COORDINATION.md`` draws the znode tree and the JSON of every node.

Modules, one responsibility each (imports point down this list):

- ``paths``     every znode path, built here and nowhere else; name checks; the connect string
                (imports no kazoo, so configuration can check a connect string cheaply)
- ``session``   one ZooKeeper session: connect with a bounded wait, log its states, keep its
                ephemeral nodes across session expiry
- ``watches``   children and data watches that re-arm, with cancellable handles
- ``registry``  the broker registry (ephemeral, one node per live broker) and the topic registry
                (persistent topic metadata, a replicated topic's replica assignment), their JSON,
                and watches on them
- ``assignment`` which brokers hold the replicas of a new replicated topic's partitions (Kafka's
                layout: leaders and followers spread evenly; pure computation)
- ``partition_state`` a replicated partition's leader, leader epoch and ISR: its JSON, writes
                conditional on its version and on the controller epoch's, and watches on it
- ``controller`` the controller: one broker elected at a time (ephemeral node, epoch fence) that
                creates replicated partitions' states and elects their leaders as brokers come
                and go, on a thread of its own
- ``broker_replication`` one broker's replication work, on a thread of its own: its controller,
                the states of the replicated partitions followed for its loop, replicated topics
                created, altered and deleted cluster-wide, its leaders' ISR changes written
- ``reassignment`` moving a replicated topic's replicas to other brokers (``hpbroker partitions
                reassign``): new replicas in sync before the old ones leave
- ``cluster``   the cluster as the registries describe it: immutable snapshots kept by watches,
                from which a broker answers metadata for topics other brokers store
- ``member``    one broker's membership: its nodes kept in step with snapshots from the broker's
                loop, on a thread of its own, and its ``cluster`` view
- ``groups``    consumer groups: the consumer, ownership and offset registries, and the range
                assignment every member computes the same way
- ``producer_ids`` idempotent producer ids, handed out from blocks unique cluster-wide (a znode
                replaced by conditional set; standalone, a file in the data directory)
- ``server``    a managed ZooKeeper server process, for the local stack and the tests

Used by the broker (``hpbroker.workers.arbiter``, ``hpbroker.workers.leadership``), the local
stack (``hpbroker.stack``), group consumers (``hpbroker.client.group``, the one client module that
loads kazoo) and the ``hpbroker groups``, ``cluster`` and ``partitions`` commands;
``broker_replication`` checks topic settings with ``hpbroker.broker.topics``; storage
(``hpbroker.io``) never imports it (``producer_ids`` uses storage's file of the ids issued,
``hpbroker.io.producer_state``).  A kazoo client is not fork-safe: make it in the
process that uses it, after any ``fork``.
"""

"""The chaos suite: a real cluster on this machine, faults on a seeded schedule, every
acknowledged record checked afterwards (``python -m chaos``, ``make chaos``, docs/CHAOS.md).

The picture::

    root namespace: the runner, its clients, the bridge
    +------------------------------------------------------------------------------------+
    |  runner (chaos.runner)        producers p-all-0, p-one-0   group c-<topic>-0, -1     |
    |   schedule: seed -> steps      (processes, chaos.workload; each writes history/)    |
    |   nemeses inject / heal            |  acks=all, acks=1           | poll, commit     |
    |        |                           v                             v                 |
    |   bridge 10.A.B.1 ----veth----+------------+------------+-----------+-----------+  |
    +-------------------------------|------------|------------|-----------|-----------|--+
                                    |            |            |           |           |
          namespace per host:      zk1          zk2          zk3         b1   ...    bN
                                ZooKeeper ensemble (quorum 2)     brokers: arbiter + workers,
                                                                  data on a tmpfs each,
                                                                  one under libfaketime

    after the schedule: heal everything -> full ISR -> stop producers -> drain (client "drain")
    history/*.history --read_histories--> check --> report.md, report.json, throughput.svg

Faults (``chaos.nemesis``) act on the namespaces (cut a host, split hosts into groups by
nftables DROP rules), the processes (kill -9, SIGSTOP, a worker killed), the faketime broker's wall
clock and a broker's data tmpfs.  The clients stay in the root namespace and reach every host,
as Jepsen's clients do.

Modules, imports pointing one way: ``cli`` -> ``runner`` -> {``cluster``, ``nemesis``,
``schedule``, ``workload``, ``checker``, ``report``}; ``nemesis`` -> ``cluster`` -> {``netns``,
``zookeeper``, ``faketime``}; ``workload`` and ``checker`` -> ``history``; ``report`` ->
``checker``.  The
suite uses hpbroker's public client API (and ``hpbroker.coord.server`` to find Java and
ZooKeeper); hpbroker never imports it.
"""

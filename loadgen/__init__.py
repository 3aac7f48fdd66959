"""loadgen: hpbroker's load generator, built on the public client API alone.

It runs N producer and M consumer processes against a broker (``produce``, ``consume`` or
``e2e``), paces them to a target rate or lets them run flat out, and reports throughput,
produce-ack and end-to-end latency percentiles, errors and retries; the consumers check every
record they read against what the producers sent (missing, duplicated, out of order), and the
producers write the ground truth of what they sent per time window for a later audit.
docs/LOADGEN.md is the user's guide.

Modules (imports point down this list):

- ``histogram``  the log-linear latency histogram (<= 0.4 % error), vectorised with numpy
- ``payload``    the record header that numbers each record; sizes, bodies, keys
- ``pacing``     the rate controller: chunks against a clock, no drift
- ``tally``      the consumer side's check of what it read
- ``truth``      ground truth windows and their file
- ``config``     ``LoadConfig``, one frozen dataclass of every setting
- ``worker``     what producer and consumer processes share: the link to the runner
- ``producer``, ``consumer``  the worker processes
- ``report``     collecting the workers' figures, the report, its text form
- ``plot``       the SVG/HTML chart
- ``runner``     one run: topic, processes, live progress, outputs
- ``cli``        the ``loadgen`` command

It imports ``hpbroker.Producer``, ``hpbroker.Consumer``, ``hpbroker.TopicPartition`` and
``hpbroker.client.Admin``, and nothing else of hpbroker.
"""

__version__ = "0.1.0"

"""``hpbroker audit``: count the stored records per producer and window against the producers'
monitoring events, on Spark (``hpbroker.spark.audit``; docs/AUDIT.md).

Local mode (``local[*]``) unless ``--master`` names a cluster.  Exit status: 0 when every window
matches, 1 when one does not, 2 when the audit could not run.  Needs the ``spark`` extra and a
Java runtime; nothing of it is loaded before the command runs.
"""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    from hpbroker.spark.audit import add_arguments  # pyspark-free: the job imports Spark when it runs

    audit = sub.add_parser("audit", help="audit topics against the producers' monitoring events (Spark)")
    add_arguments(audit)
    audit.set_defaults(run=_run)


def _run(args: argparse.Namespace) -> int:
    from hpbroker.spark.audit import run

    return run(args)

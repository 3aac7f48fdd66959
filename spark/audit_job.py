"""The audit as a Spark application: stored records per producer and window against the
producers' monitoring events (``hpbroker.spark.audit``; docs/AUDIT.md).

    PYSPARK_PYTHON=.venv/bin/python .venv/bin/spark-submit spark/audit_job.py --bootstrap 127.0.0.1:9092
    .venv/bin/python spark/audit_job.py --bootstrap 127.0.0.1:9092 --output audit-report --format csv

Under spark-submit it runs where spark-submit's ``--master`` says; run by Python, in local mode.
Exit status: 0 when every window matches, 1 when one does not, 2 when the audit could not run.
"""

from __future__ import annotations

import sys

from hpbroker.spark.audit import main

if __name__ == "__main__":
    sys.exit(main(prog="audit_job.py"))

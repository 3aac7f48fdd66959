"""Per-minute counts and top keys and paths of access-log topics, as Parquet tables
(``hpbroker.spark.logs``; docs/AUDIT.md, "The log job").

    PYSPARK_PYTHON=.venv/bin/python .venv/bin/spark-submit spark/log_job.py --topic access-log \
        --output logs-out
    .venv/bin/python spark/log_job.py --bootstrap 127.0.0.1:9092 --topic access-log --output logs-out

Exit status: 0 when the tables were written, 2 when the job could not run.
"""

from __future__ import annotations

import sys

from hpbroker.spark.logs import main

if __name__ == "__main__":
    sys.exit(main(prog="log_job.py"))

"""hpbroker on Apache Spark: a data source that reads topics, and the jobs built on it.

- ``columns``     record batches to Arrow columns (over the compiled ``hpbroker._columnar``)
- ``planning``    which offsets a read covers, resolved once (a snapshot), cut into splits
- ``reading``     one split fetched raw over the data port and decoded into Arrow batches
- ``datasource``  the PySpark Python data source ``hpbroker`` (``spark.read.format("hpbroker")``)
- ``audit``       the audit: records counted per producer and window against the monitoring events
- ``logs``        per-minute counts and top keys of access-log topics

and here, :func:`session`: a SparkSession that can read hpbroker, the ``hpbroker`` source
registered, logs quiet.  Run by ``spark-submit``, it joins the session spark-submit set up (its
``--master``); run by plain Python, it starts one in local mode (``local[*]``) unless told
otherwise.  Spark starts its Python workers with ``$PYSPARK_PYTHON``; unless that is set, it is
set to this interpreter, so the workers import this hpbroker (the virtualenv's), not whatever
``python3`` comes first on the path.

This package is the only part of hpbroker that imports pyspark (``datasource``, ``audit``,
``logs``, and :func:`session` when called); ``columns``, ``planning`` and ``reading`` need pyarrow
alone.  Install the ``spark`` extra (``pip install 'hpbroker[spark]'``) and a Java runtime (17 or
later).
"""

from __future__ import annotations

import importlib
import logging
import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

_EXPORTS = {
    "HPBrokerDataSource": "hpbroker.spark.datasource",
    "RECORD_SCHEMA": "hpbroker.spark.datasource",
}

__all__ = sorted([*_EXPORTS, "describe_error", "session"])


def __getattr__(name: str) -> Any:
    """Import on first use: ``hpbroker.spark.reading`` must not load pyspark."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'hpbroker.spark' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def describe_error(error: BaseException) -> str:
    """One line for a job's failure: for an error Spark relays from a Python worker (its message
    holds the worker's traceback and the JVM's), the last ``SomethingError: message`` line."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    relayed = [line for line in lines if re.match(r"^[\w.]+(Error|Exception): ", line)]
    return relayed[-1] if relayed else f"{type(error).__name__}: {lines[0] if lines else ''}"


#: log4j2 settings that keep Spark's driver at errors only (quiet=True)
QUIET_LOG4J = Path(__file__).resolve().parent / "log4j2-quiet.properties"


def session(master: str | None = None, *, app_name: str = "hpbroker", ui: bool = False, quiet: bool = True,
            config: Mapping[str, str] | None = None):
    """The active SparkSession (or a new one) with the ``hpbroker`` source registered.

    ``master``: the cluster (``local[*]``, ``spark://host:7077``, ...); None: spark-submit's
    ``--master``, else ``local[*]``.  ``ui``: Spark's web UI (off by default).  ``quiet``: only
    errors from Spark's logs.  ``config``: more Spark settings.  Timestamps are shown in UTC
    (``spark.sql.session.timeZone``); in local mode, shuffles have twice as many partitions as
    there are cores (unless configured), not 200."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from hpbroker.spark.datasource import HPBrokerDataSource

    builder = SparkSession.builder.appName(app_name)
    submitted = "PYSPARK_GATEWAY_PORT" in os.environ  # spark-submit started the JVM with its settings
    if master is not None or not submitted:
        builder = builder.master(master or "local[*]")
    builder = builder.config("spark.ui.enabled", "true" if ui else "false")
    builder = builder.config("spark.sql.session.timeZone", "UTC")
    if quiet:
        builder = builder.config("spark.ui.showConsoleProgress", "false")
    if quiet and not submitted:
        builder = builder.config("spark.driver.extraJavaOptions", f"-Dlog4j.configurationFile={QUIET_LOG4J}")
    for key, value in (config or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    context = spark.sparkContext
    if context.master.startswith("local") and not context.getConf().contains("spark.sql.shuffle.partitions"):
        # 200 shuffle partitions (the default) cost far more than they bring on one machine.
        spark.conf.set("spark.sql.shuffle.partitions", str(max(4, 2 * context.defaultParallelism)))
    if quiet:
        spark.sparkContext.setLogLevel("ERROR")
        # py4j logs every connection it closes at INFO, also from __del__ at interpreter exit.
        logging.getLogger("py4j").setLevel(logging.WARNING)
    spark.dataSource.register(HPBrokerDataSource)
    return spark

"""Spark's place in the layout: only hpbroker.spark imports pyspark, and only what runs a Spark job;
the command line and the rest of hpbroker load neither pyspark nor pyarrow."""

from __future__ import annotations

import ast
import pkgutil
import subprocess
import sys

import hpbroker

SPARK_FREE = ["hpbroker.spark", "hpbroker.spark.columns", "hpbroker.spark.planning", "hpbroker.spark.reading",
              "hpbroker.spark.audit", "hpbroker.spark.logs", "hpbroker.cli.audit"]


def imported_after(modules: list[str], prefixes: tuple[str, ...]) -> list[str]:
    """The names starting with ``prefixes`` in sys.modules of a fresh interpreter that imported
    ``modules`` (and built the ``hpbroker`` command's parser)."""
    script = (f"import sys\nfor name in {modules!r}:\n    __import__(name)\n"
              "from hpbroker.cli import build_parser\nbuild_parser()\n"
              f"print(sorted({{m.split('.')[0] for m in sys.modules if m.startswith({prefixes!r})}}))")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                            check=True)
    return ast.literal_eval(result.stdout)


def test_hpbroker_outside_its_spark_package_loads_neither_pyspark_nor_pyarrow():
    modules = [m.name for m in pkgutil.walk_packages(hpbroker.__path__, "hpbroker.")
               if not m.name.startswith(("hpbroker.spark", "hpbroker.cli.__main__"))]
    assert imported_after(modules, ("pyspark", "pyarrow")) == []


def test_the_command_line_and_the_jobs_modules_load_no_spark_until_a_job_runs():
    assert imported_after(SPARK_FREE, ("pyspark",)) == []
    assert imported_after(["hpbroker.spark.datasource"], ("pyspark",)) == ["pyspark"]

"""hpbroker.metrics knows nothing of the broker, and the broker's metrics load no ZooKeeper client
unless ZooKeeper is configured."""

from __future__ import annotations

import ast
import subprocess
import sys


def loaded_after(modules: list[str], prefixes: tuple[str, ...]) -> list[str]:
    script = (f"import sys\nfor name in {modules!r}:\n    __import__(name)\n"
              f"print(sorted(m for m in sys.modules if m.startswith({prefixes!r})))")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                            check=True)
    return ast.literal_eval(result.stdout)


def test_the_metrics_package_imports_only_the_standard_library():
    modules = ["hpbroker.metrics", "hpbroker.metrics.server", "hpbroker.metrics.process"]
    loaded = loaded_after(modules, ("hpbroker", "zmq", "kazoo"))
    assert [m for m in loaded if not m.startswith("hpbroker.metrics")] == ["hpbroker"]


def test_storage_loads_no_metrics_zeromq_or_zookeeper():
    assert loaded_after(["hpbroker.io"], ("hpbroker.metrics", "hpbroker.workers", "zmq", "kazoo")) == []


def test_the_arbiter_and_its_metrics_endpoint_load_no_zookeeper_client():
    modules = ["hpbroker.workers.arbiter", "hpbroker.workers.exporter", "hpbroker.workers.stats"]
    assert loaded_after(modules, ("kazoo", "hpbroker.coord.lag", "hpbroker.coord.session")) == []

"""The client's place in the layout: public names in one list, no storage or broker imports, and
ZooKeeper (kazoo, ``hpbroker.coord``) only in the consumer-group module."""

from __future__ import annotations

import pkgutil
import subprocess
import sys

import hpbroker
import hpbroker.client

GROUP_MODULE = "hpbroker.client.group"  # the one client module that may load ZooKeeper's client


def test_the_package_exports_exactly_the_client_api():
    assert set(hpbroker.client.__all__) == hpbroker._CLIENT_API


def imported_after(modules: list[str], prefixes: tuple[str, ...]) -> str:
    """The sorted names starting with ``prefixes`` in sys.modules of a fresh interpreter that
    imported ``modules``."""
    script = (f"import sys\nfor name in {modules!r}:\n    __import__(name)\n"
              f"print(sorted(m for m in sys.modules if m.startswith({prefixes!r})))")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                            check=True)
    return result.stdout.strip()


def test_client_modules_import_neither_storage_nor_broker_code_nor_zookeeper():
    modules = [f"hpbroker.client.{m.name}" for m in pkgutil.iter_modules(hpbroker.client.__path__)]
    modules = [m for m in modules if m != GROUP_MODULE]
    forbidden = ("hpbroker.io", "hpbroker.workers", "hpbroker.broker", "hpbroker.coord", "kazoo")
    assert imported_after(["hpbroker", "hpbroker.client", *modules], forbidden) == "[]"


def test_only_the_group_module_loads_zookeeper_and_still_no_storage_or_broker_code():
    assert imported_after([GROUP_MODULE], ("hpbroker.io", "hpbroker.workers", "hpbroker.broker")) == "[]"
    assert "kazoo" in imported_after([GROUP_MODULE], ("kazoo",))

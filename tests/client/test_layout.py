"""The client's place in the layout: public names in one list, and no storage or broker imports."""

from __future__ import annotations

import pkgutil
import subprocess
import sys

import hpbroker
import hpbroker.client


def test_the_package_exports_exactly_the_client_api():
    assert set(hpbroker.client.__all__) == hpbroker._CLIENT_API


def test_client_modules_import_neither_storage_nor_broker_code():
    modules = [f"hpbroker.client.{m.name}" for m in pkgutil.iter_modules(hpbroker.client.__path__)]
    script = (f"import sys\nfor name in {modules!r}:\n    __import__(name)\n"
              "print(sorted(m for m in sys.modules if m.startswith(('hpbroker.io', 'hpbroker.workers', "
              "'hpbroker.broker', 'kazoo'))))")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                            check=True)
    assert result.stdout.strip() == "[]"

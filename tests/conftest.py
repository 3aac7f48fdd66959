"""Shared test set-up: refuse to run against anything but the freshly compiled extensions."""

from __future__ import annotations

import importlib.machinery
from pathlib import Path

import pytest

import hpbroker
from hpbroker import _columnar, _core
from hpbroker.io import _writer

REPO_ROOT = Path(__file__).resolve().parent.parent


def pytest_configure(config):
    """A failed build must not pass CI: the compiled modules loaded have to be the extensions
    built in this tree."""
    package_dir = Path(hpbroker.__file__).resolve().parent
    suffixes = tuple(importlib.machinery.EXTENSION_SUFFIXES)
    for module, home in ((_core, package_dir), (_columnar, package_dir), (_writer, package_dir / "io"),
                         (importlib.import_module("hpbroker.client._accumulator"), package_dir / "client")):
        path = Path(module.__file__).resolve()
        if not path.name.endswith(suffixes):
            raise RuntimeError(f"{module.__name__} loaded from {path}, which is not a compiled extension")
        if path.parent != home:
            raise RuntimeError(f"{module.__name__} loaded from {path}, outside the package at {home}")


@pytest.fixture(scope="session")
def zookeeper(tmp_path_factory):
    """One real standalone ZooKeeper on a free loopback port for the whole test session (the
    managed server of ``hpbroker.coord.server``), started only if a test asks for it.  Tests keep
    apart by chroot; a test that stops or restarts ZooKeeper runs a server of its own."""
    from hpbroker.coord.server import ZooKeeperServer

    server = ZooKeeperServer(tmp_path_factory.mktemp("zookeeper"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def chroot(zookeeper):
    """A fresh chroot of the session's ZooKeeper for one test (tests never see each other's
    nodes), removed afterwards."""
    import uuid

    from kazoo.client import KazooClient

    path = f"/test-{uuid.uuid4().hex[:12]}"
    yield path
    admin = KazooClient(zookeeper.connect_string)
    admin.start(timeout=10)
    try:
        admin.delete(path, recursive=True)
    except Exception:
        pass  # never created
    finally:
        admin.stop()
        admin.close()


@pytest.fixture
def no_client_environment(monkeypatch):
    """No client keys from the environment (``HPBROKER_CLIENT_*``): each client of the test has
    the security its arguments give it, whatever the shell running the tests holds."""
    for variable in ("HPBROKER_CLIENT_KEY_FILE", "HPBROKER_CLIENT_SERVER_KEY_FILE", "HPBROKER_CLIENT_CONFIG"):
        monkeypatch.delenv(variable, raising=False)

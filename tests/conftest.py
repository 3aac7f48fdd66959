"""Shared test set-up: refuse to run against anything but the freshly compiled core."""

from __future__ import annotations

import importlib.machinery
from pathlib import Path

import hpbroker
from hpbroker import _core

REPO_ROOT = Path(__file__).resolve().parent.parent


def pytest_configure(config):
    """A failed build must not pass CI: the loaded _core has to be the compiled extension in this tree."""
    core_path = Path(_core.__file__).resolve()
    suffixes = tuple(importlib.machinery.EXTENSION_SUFFIXES)
    if not core_path.name.endswith(suffixes):
        raise RuntimeError(f"hpbroker._core loaded from {core_path}, which is not a compiled extension")
    package_dir = Path(hpbroker.__file__).resolve().parent
    if core_path.parent != package_dir:
        raise RuntimeError(f"hpbroker._core loaded from {core_path}, outside the package at {package_dir}")

"""loadgen uses hpbroker's public client API and nothing else of it."""

from __future__ import annotations

import ast
from pathlib import Path

import loadgen

ALLOWED = {("hpbroker", "Producer"), ("hpbroker", "Consumer"), ("hpbroker", "TopicPartition"),
           ("hpbroker", "RecordColumns"), ("hpbroker.client", "Admin"), ("hpbroker.client", "ClientSecurity"),
           ("hpbroker.client", "resolve_client_security"), ("hpbroker.errors", "HPBrokerError")}


def test_loadgen_imports_only_the_public_client_api():
    used = set()
    for path in Path(loadgen.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                assert not any(a.name.startswith("hpbroker") for a in node.names), path
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("hpbroker"):
                used |= {(node.module, alias.name) for alias in node.names}
    assert used <= ALLOWED, used - ALLOWED

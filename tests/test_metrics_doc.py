"""docs/METRICS.md lists every metric the endpoint serves, with its true type and labels."""

from __future__ import annotations

import re
from pathlib import Path

from hpbroker.workers.exporter import FAMILIES

DOC = Path(__file__).resolve().parent.parent / "docs" / "METRICS.md"


def test_every_metric_is_documented_with_its_type_and_labels():
    rows = {}
    for line in DOC.read_text().split("\n## Every metric\n", 1)[1].splitlines():
        if line.startswith("| `"):
            name, kind, labels, meaning = (cell.strip() for cell in line.strip().strip("|").split("|"))
            rows[name.strip("`")] = (kind, tuple(re.findall(r"`([a-z_]+)`", labels)), meaning)
    assert list(rows) == list(FAMILIES), "the document lists other metrics, or in another order"
    for name, (kind, labels, _help) in FAMILIES.items():
        assert rows[name][:2] == (kind, labels), name
        assert rows[name][2], f"{name} has no meaning"

"""Ground truth for an audit: how many records each producer sent to each topic, per time window.

A record belongs to the window holding its timestamp (the record's own ``timestamp`` field,
milliseconds since the epoch, which loadgen sets to its chunk's send time); windows are
``window_ms`` long and aligned to the epoch, so window ``w`` starts at ``w * window_ms``, and an
audit that counts the stored records by ``record.producer`` and timestamp window must find the same
numbers (less the records the report counts as failed).

The file (``--truth FILE``) is JSON, or CSV when FILE ends in ``.csv``:

JSON::

    {"run_id": "1a2b3c4d", "window_ms": 10000, "total_records": 3000, "total_bytes": 300000,
     "producers": [{"producer": "loadgen-1a2b3c4d-0", "index": 0, "records": 3000, ...}],
     "windows": [{"producer": "loadgen-1a2b3c4d-0", "producer_index": 0, "topic": "t",
                  "window_start_ms": 1714564800000, "window_ms": 10000, "records": 1200,
                  "bytes": 120000}, ...]}

CSV: a header line, then one line per window:
``producer,producer_index,topic,window_start_ms,window_ms,records,bytes``.
"""

from __future__ import annotations

import csv
import json
from collections import defaultdict
from pathlib import Path

__all__ = ["TruthWindows", "truth_document", "write_truth"]

CSV_COLUMNS = ("producer", "producer_index", "topic", "window_start_ms", "window_ms", "records", "bytes")


class TruthWindows:
    """One producer's counts per (topic, window start).  Single thread."""

    def __init__(self, window_ms: int) -> None:
        if window_ms < 1:
            raise ValueError(f"window_ms must be >= 1, got {window_ms}")
        self.window_ms = window_ms
        self.counts: dict[tuple[str, int], list[int]] = defaultdict(lambda: [0, 0])

    def add(self, topic: str, timestamp_ms: int, records: int, nbytes: int) -> None:
        """``records`` records of ``nbytes`` value bytes, all with timestamp ``timestamp_ms``."""
        start = timestamp_ms - timestamp_ms % self.window_ms
        entry = self.counts[topic, start]
        entry[0] += records
        entry[1] += nbytes

    def rows(self, producer: str, producer_index: int) -> list[dict]:
        return [{"producer": producer, "producer_index": producer_index, "topic": topic,
                 "window_start_ms": start, "window_ms": self.window_ms, "records": records, "bytes": nbytes}
                for (topic, start), (records, nbytes) in sorted(self.counts.items())]


def truth_document(run_id: int, window_ms: int, producers: list[dict], rows: list[dict]) -> dict:
    """The JSON document: ``producers`` are the producers' summaries, ``rows`` every window."""
    rows = sorted(rows, key=lambda r: (r["producer_index"], r["topic"], r["window_start_ms"]))
    return {"run_id": f"{run_id:08x}", "window_ms": window_ms,
            "total_records": sum(r["records"] for r in rows), "total_bytes": sum(r["bytes"] for r in rows),
            "producers": producers, "windows": rows}


def write_truth(path: str | Path, document: dict) -> None:
    """Write ``document`` as JSON, or its windows as CSV when ``path`` ends in ``.csv``."""
    path = Path(path)
    if path.suffix.lower() == ".csv":
        with open(path, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=CSV_COLUMNS)
            writer.writeheader()
            for row in document["windows"]:
                writer.writerow({k: row[k] for k in CSV_COLUMNS})
        return
    path.write_text(json.dumps(document, indent=1) + "\n")

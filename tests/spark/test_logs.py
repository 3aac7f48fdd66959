"""The log job on a known input: loadgen-shaped access-log records over three minutes."""

from __future__ import annotations

import collections
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hpbroker.client import Admin, Producer
from hpbroker.spark.logs import LogJobConfig, main, run_log_job
from loadgen.payload import HEADER, MAGIC

pytestmark = pytest.mark.spark

MINUTE_MS = 60_000
BASE_MS = 1_750_000_020_000 - 1_750_000_020_000 % MINUTE_MS + MINUTE_MS  # a minute boundary
METHODS = ("GET", "GET", "POST", "DELETE")
PATHS = ("/api/v1/orders/{}", "/index.html", "/img/products/{}.jpg")
STATUSES = (200, 200, 201, 304, 404, 500, 503)


def _value(i: int) -> bytes:
    """loadgen's 24-byte header, a log line, and (every third record) the start of another that
    is cut off; every tenth record holds no log line at all."""
    header = HEADER.pack(MAGIC, 0, 7, i, 0)
    if i % 10 == 9:
        return header + b"not a log line"
    line = json.dumps({"ts": "2025-06-15T15:07:00.000Z", "method": METHODS[i % 4],
                       "path": PATHS[i % 3].format(i), "status": STATUSES[i % 7], "bytes": i},
                      separators=(",", ":")).encode() + b"\n"
    return header + line + (b'{"ts":"2025-06-15T15:07:01.000Z","method":"PU' if i % 3 == 0 else b"")


def _with_millis(path) -> list[dict]:
    """The rows of a Parquet table with ``minute`` as ms since the epoch (Spark writes UTC)."""
    table = pq.read_table(path)
    minute = table.column("minute").cast(pa.timestamp("ms")).cast(pa.int64())
    return table.set_column(table.schema.get_field_index("minute"), "minute", minute).to_pylist()


def test_per_minute_counts_and_top_keys_of_a_known_input(spark, bootstrap, tmp_path):
    with Admin(bootstrap) as admin:
        admin.create_topic("access", 2)
    expected = collections.defaultdict(collections.Counter)
    keys = collections.Counter()
    with Producer(bootstrap, name="web", audit_topic=None) as producer:
        for i in range(900):
            timestamp = BASE_MS + 200 * i  # 300 records a minute, three minutes
            key = b"user-%d" % (i % 7 if i % 2 else 0)  # user-0 is the most frequent
            producer.send("access", _value(i), key=key, timestamp=timestamp)
            minute = expected[timestamp - timestamp % MINUTE_MS]
            keys[key.decode()] += 1
            minute["records"] += 1
            minute["value_bytes"] += len(_value(i))
            if i % 10 == 9:
                minute["no_status"] += 1
                continue
            minute[f"status_{STATUSES[i % 7] // 100}xx"] += 1
            method = METHODS[i % 4]
            minute["gets" if method == "GET" else "posts" if method == "POST" else "other_methods"] += 1
    written = run_log_job(spark, LogJobConfig(bootstrap, ("access",), str(tmp_path), top=3))
    assert written == {name: str(tmp_path / name) for name in ("per_minute", "top_keys", "top_paths")}
    rows = _with_millis(tmp_path / "per_minute")
    assert [r["minute"] for r in rows] == sorted(expected)
    columns = ("records", "value_bytes", "status_2xx", "status_3xx", "status_4xx", "status_5xx", "no_status",
               "gets", "posts", "other_methods")
    for row in rows:
        counts = expected[row["minute"]]
        assert {c: row[c] for c in columns} == {c: counts[c] for c in columns}
    top_keys = pq.read_table(tmp_path / "top_keys").to_pylist()
    most = sorted(keys.items(), key=lambda kv: (-kv[1], kv[0]))[:3]
    assert [(r["rank"], r["key"], r["records"]) for r in top_keys] == [
        (rank, key, count) for rank, (key, count) in enumerate(most, start=1)]
    paths = {r["path"]: r["records"] for r in pq.read_table(tmp_path / "top_paths").to_pylist()}
    assert paths == {"/api/v1/orders/{id}": 270, "/index.html": 270, "/img/products/{id}.jpg": 270}

    assert main(["--bootstrap", bootstrap, "--topic", "access", "--output", str(tmp_path / "again"),
                 "--from", str(BASE_MS + MINUTE_MS), "--to", str(BASE_MS + 2 * MINUTE_MS)]) == 0
    again = _with_millis(tmp_path / "again" / "per_minute")
    assert [(r["minute"], r["records"]) for r in again] == [(BASE_MS + MINUTE_MS, 300)]
    assert main(["--bootstrap", bootstrap, "--topic", "absent", "--output", str(tmp_path / "none")]) == 2

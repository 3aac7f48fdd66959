"""The columnar decoder (``hpbroker._columnar.ColumnBuilder``, behind the Spark data source):
record batches of 100-byte values into Arrow-shaped column buffers, in one process, the batches
in memory.  Two column sets: what the audit reads (producer, timestamp) and every column."""

from __future__ import annotations

import pytest

from bench.conftest import throughput
from hpbroker._columnar import COLUMNS, ColumnBuilder
from hpbroker.records import CODEC_LZ4, CODEC_NONE, build_batch

BATCHES = 20
RECORDS_PER_BATCH = 5_000
VALUE_BYTES = 100


@pytest.fixture(scope="module", params=[CODEC_NONE, CODEC_LZ4], ids=["none", "lz4"])
def payload(request):
    """BATCHES batches back to back, as a fetch returns them (log-like values: lz4 shrinks them)."""
    batches = []
    for b in range(BATCHES):
        first = b * RECORDS_PER_BATCH
        values = [f"10.0.{i % 256}.{i % 97} GET /api/v1/items/{(first + i) * 7919 % 100000} 200 "
                  .encode().ljust(VALUE_BYTES, b" ") for i in range(RECORDS_PER_BATCH)]
        batch = bytearray(build_batch(values, producer="bench", compression=request.param,
                                      timestamps=1_700_000_000_000))
        batch[0:8] = first.to_bytes(8, "little")  # base_offset, as the broker stamps it
        batches.append(bytes(batch))
    return b"".join(batches)


@pytest.mark.parametrize("columns", [("producer", "timestamp"), COLUMNS],
                         ids=["audit-columns", "all-columns"])
def test_decode_into_columns(benchmark, payload, columns):
    def decode():
        builder = ColumnBuilder(columns, max_records=BATCHES * RECORDS_PER_BATCH)
        position = 0
        while position < len(payload):
            position = builder.add(payload, position)
        return builder.take()

    taken = benchmark(decode)
    assert taken is not None
    records = BATCHES * RECORDS_PER_BATCH
    throughput(benchmark, records=records, nbytes=records * VALUE_BYTES)

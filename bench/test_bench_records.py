"""Record batch core: build, iterate, validate, CRC.  Targets (100-byte values, one process):
build >= 10 M records/s, iteration into Record objects >= 5 M records/s."""

from __future__ import annotations

import os

import pytest

from bench.conftest import throughput
from hpbroker.records import CODEC_LZ4, CODEC_NONE, build_batch, crc32c, decode_records, validate_batches

RECORDS_PER_BATCH = 10_000
VALUE_BYTES = 100
CODECS = pytest.mark.parametrize("codec", [CODEC_NONE, CODEC_LZ4], ids=["none", "lz4"])


def _log_like_values(n: int) -> list[bytes]:
    """Access-log-like lines padded to 100 bytes: compressible like real logs, not constant."""
    out = []
    for i in range(n):
        line = f'10.0.{i % 256}.{i % 97} GET /api/v1/items/{i * 7919 % 100000} 200 {i % 5000}B'.encode()
        out.append(line.ljust(VALUE_BYTES, b" "))
    return out


@pytest.fixture(scope="module")
def random_values():
    return [os.urandom(VALUE_BYTES) for _ in range(RECORDS_PER_BATCH)]


@pytest.mark.parametrize("payload", ["random", "log-like"])
@CODECS
def test_build_batch(benchmark, random_values, codec, payload):
    values = random_values if payload == "random" else _log_like_values(RECORDS_PER_BATCH)
    batch = benchmark(build_batch, values, compression=codec, timestamps=1_700_000_000_000)
    throughput(benchmark, records=RECORDS_PER_BATCH, nbytes=RECORDS_PER_BATCH * VALUE_BYTES)
    benchmark.extra_info["batch_bytes"] = len(batch)


@pytest.mark.parametrize("payload", ["random", "log-like"])
@CODECS
def test_iterate_records(benchmark, random_values, codec, payload):
    values = random_values if payload == "random" else _log_like_values(RECORDS_PER_BATCH)
    batch = build_batch(values, compression=codec)
    records = benchmark(decode_records, batch)
    assert len(records) == RECORDS_PER_BATCH
    throughput(benchmark, records=RECORDS_PER_BATCH, nbytes=RECORDS_PER_BATCH * VALUE_BYTES)


@CODECS
def test_validate_batch_deep(benchmark, random_values, codec):
    batch = build_batch(_log_like_values(RECORDS_PER_BATCH), compression=codec)
    benchmark(validate_batches, batch)
    throughput(benchmark, records=RECORDS_PER_BATCH, nbytes=len(batch))


def test_crc32c_16mib(benchmark):
    data = os.urandom(16 << 20)
    benchmark(crc32c, data)
    throughput(benchmark, nbytes=len(data))

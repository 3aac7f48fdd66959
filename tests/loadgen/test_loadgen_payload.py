"""Record values: the numbering header, sizes, bodies (random or log lines), keys."""

from __future__ import annotations

import json
import random
import struct
from itertools import accumulate

import lz4.frame
import numpy as np
import pytest

from loadgen.payload import (
    _BLOB_BYTES,
    _LOG_LINES,
    HEADER,
    HEADER_BYTES,
    HEADER_DTYPE,
    MAGIC,
    KeyChooser,
    KeySpec,
    PayloadSource,
    SizeSpec,
    log_lines,
)


def test_header_numbers_each_record_of_a_chunk_in_order():
    source = PayloadSource(SizeSpec.parse("100"), "random", producer=3, run_id=0xDEADBEEF, seed=1)
    values, nbytes = source.build(1000, 50, 1_714_564_800_123_456_789)
    assert nbytes == 5000 and all(len(v) == 100 for v in values)
    fields = [HEADER.unpack_from(v) for v in values]
    assert fields[0] == (MAGIC, 3, 0xDEADBEEF, 1000, 1_714_564_800_123_456_789)
    assert [f[3] for f in fields] == list(range(1000, 1050))
    parsed = np.frombuffer(b"".join(v[:HEADER_BYTES] for v in values), dtype=HEADER_DTYPE)
    assert parsed["sequence"].tolist() == list(range(1000, 1050))


class ReferenceValues:
    """What a fixed-size source must build, record by record with struct.pack: header, then the
    body from the blob of the same seed; random bodies follow each other through the repeating
    blob, log bodies each start at the next line (cycling)."""

    def __init__(self, payload: str, size: int, producer: int, run_id: int, seed: int) -> None:
        text_rng = random.Random(seed)
        if payload == "random":
            self.base, self.starts = text_rng.randbytes(_BLOB_BYTES), None
        else:
            lines = log_lines(text_rng, _LOG_LINES)
            self.base = b"".join(lines)
            self.starts = list(accumulate((len(line) for line in lines[:-1]), initial=0))
        self.size, self.producer, self.run_id = size, producer, run_id
        self.body = size - HEADER_BYTES
        self.repeated = self.base * (2 + self.body // len(self.base))
        self.records = 0  # built so far

    def build(self, first_sequence: int, n: int, send_time_ns: int) -> list[bytes]:
        values = []
        for sequence in range(first_sequence, first_sequence + n):
            if self.starts is None:
                position = self.records * self.body % len(self.base)
            else:
                position = self.starts[self.records % len(self.starts)]
            self.records += 1
            header = struct.pack("<2sHIQQ", b"LG", self.producer, self.run_id, sequence, send_time_ns)
            values.append(header + self.repeated[position:position + self.body])
        return values


@pytest.mark.parametrize(("payload", "size", "n", "chunks"), [
    ("random", 100, 1000, 3),
    ("random", 1000, 1500, 4),  # the third chunk runs past the end of the blob's 4 MiB
    ("random", 6024, 1000, 4),  # chunks of 6 MB: past the blob's repeat too
    ("random", 24, 5, 2),
    ("log", 100, 3000, 4),  # the third chunk cycles past the last line
    ("log", 3000, 1000, 10),  # bodies of the last lines run past the end of the blob
    ("log", 25, 3, 2),
])
def test_fixed_size_chunks_are_rows_of_exactly_the_values_built_one_by_one(payload, size, n, chunks):
    source = PayloadSource(SizeSpec.parse(str(size)), payload, producer=7, run_id=0xCAFEF00D, seed=11)
    reference = ReferenceValues(payload, size, producer=7, run_id=0xCAFEF00D, seed=11)
    for chunk in range(chunks):
        send_time_ns = 1_714_564_800_000_000_000 + chunk
        values, nbytes = source.build(5 + chunk * n, n, send_time_ns)
        assert isinstance(values, np.ndarray) and values.dtype == np.uint8 and values.flags.c_contiguous
        assert values.shape == (n, size) and nbytes == n * size
        assert [row.tobytes() for row in values] == reference.build(5 + chunk * n, n, send_time_ns), chunk


def test_variable_size_chunks_stay_lists_of_bytes():
    values, nbytes = PayloadSource(SizeSpec.parse("uniform:24:300"), "log", 0, 1, seed=2).build(0, 100, 0)
    assert isinstance(values, list) and all(type(v) is bytes for v in values)
    assert nbytes == sum(map(len, values))


@pytest.mark.parametrize("spec", ["uniform:24:300", "normal:200:40", "1000"])
@pytest.mark.parametrize("payload", ["random", "log"])
def test_sizes_follow_the_spec_and_bytes_add_up(spec, payload):
    sizes = SizeSpec.parse(spec)
    source = PayloadSource(sizes, payload, 0, 1, seed=2)
    low, high = sizes.bounds()
    total = 0
    for chunk in range(30):
        values, nbytes = source.build(chunk * 1000, 1000, 0)
        assert nbytes == sum(map(len, values))
        assert all(low <= len(v) <= high for v in values)
        total += nbytes
    assert total / 30_000 == pytest.approx(sizes.mean(), rel=0.05)


def test_log_payload_reads_like_access_log_lines_and_compresses():
    source = PayloadSource(SizeSpec.parse("1000"), "log", 0, 1, seed=3)
    values, _ = source.build(0, 2000, 0)
    first_line = values[0][HEADER_BYTES:].tobytes().split(b"\n")[0]
    assert set(json.loads(first_line)) >= {"ts", "ip", "method", "path", "status", "user_agent"}
    body = b"".join(values)
    assert len(lz4.frame.compress(body)) < 0.5 * len(body)


def test_random_payload_does_not_compress_and_bodies_differ():
    source = PayloadSource(SizeSpec.parse("1000"), "random", 0, 1, seed=3)
    values, _ = source.build(0, 2000, 0)
    body = b"".join(values)
    assert len(lz4.frame.compress(body)) > 0.95 * len(body)
    assert len({v[HEADER_BYTES:].tobytes() for v in values}) == 2000


def test_the_smallest_record_is_the_header_alone():
    values, _ = PayloadSource(SizeSpec.parse("24"), "random", 0, 1, seed=0).build(0, 3, 0)
    assert [len(v) for v in values] == [24, 24, 24]


@pytest.mark.parametrize("text", ["23", "uniform:10:5", "normal:100", "pareto:1:2", "x", str(17 << 20)])
def test_bad_size_specs_are_refused(text):
    with pytest.raises(ValueError):
        SizeSpec.parse(text)


def test_uniform_keys_cover_every_key_evenly():
    chooser = KeyChooser(KeySpec.parse("uniform:10"), np.random.default_rng(0))
    keys = chooser.draw(100_000)
    counts = {k: keys.count(k) for k in set(keys)}
    assert set(counts) == {f"key-{i}".encode() for i in range(10)}
    assert min(counts.values()) > 9_000


def test_zipf_keys_favour_the_first_ones():
    chooser = KeyChooser(KeySpec.parse("zipf:1000:1.2"), np.random.default_rng(0))
    indexes = chooser.draw_indexes(200_000)
    assert indexes.min() >= 0 and indexes.max() < 1000
    share_of_first = np.mean(indexes == 0)
    expected = 1 / sum(1 / (i + 1) ** 1.2 for i in range(1000))
    assert share_of_first == pytest.approx(expected, rel=0.05)
    assert np.mean(indexes < 10) > 0.5


def test_no_keys_means_none():
    assert KeyChooser(KeySpec.parse("none"), np.random.default_rng(0)).draw(5) is None


@pytest.mark.parametrize("text", ["uniform", "uniform:0", "zipf:10:0", "zipf:x", "hash:4"])
def test_bad_key_specs_are_refused(text):
    with pytest.raises(ValueError):
        KeySpec.parse(text)

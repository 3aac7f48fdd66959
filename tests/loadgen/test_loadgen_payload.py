"""Record values: the numbering header, sizes, bodies (random or log lines), keys."""

from __future__ import annotations

import json

import lz4.frame
import numpy as np
import pytest

from loadgen.payload import (
    HEADER,
    HEADER_BYTES,
    HEADER_DTYPE,
    MAGIC,
    KeyChooser,
    KeySpec,
    PayloadSource,
    SizeSpec,
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
    first_line = values[0][HEADER_BYTES:].split(b"\n")[0]
    assert set(json.loads(first_line)) >= {"ts", "ip", "method", "path", "status", "user_agent"}
    body = b"".join(values)
    assert len(lz4.frame.compress(body)) < 0.5 * len(body)


def test_random_payload_does_not_compress_and_bodies_differ():
    source = PayloadSource(SizeSpec.parse("1000"), "random", 0, 1, seed=3)
    values, _ = source.build(0, 2000, 0)
    body = b"".join(values)
    assert len(lz4.frame.compress(body)) > 0.95 * len(body)
    assert len({v[HEADER_BYTES:] for v in values}) == 2000


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

"""The consumer side's header gathering: loadgen headers out of a value column, without a loop."""

from __future__ import annotations

import numpy as np

from hpbroker import RecordColumns
from loadgen.consumer import parse_headers
from loadgen.payload import HEADER, HEADER_BYTES, MAGIC


def column(values: list[bytes | None]) -> RecordColumns:
    """Records at offsets 0.. with ``values`` (None: null), laid out as the decoder lays them out."""
    offsets = np.cumsum([0] + [len(v or b"") for v in values]).astype("<i4")
    validity = np.packbits(np.array([v is not None for v in values], dtype=bool), bitorder="little")
    taken = {"offset": bytearray(np.arange(len(values), dtype="<i8").tobytes()),
             "value_offsets": bytearray(offsets.tobytes()),
             "value_data": bytearray(b"".join(v or b"" for v in values)),
             "value_validity": bytearray(validity.tobytes()), "value_nulls": sum(v is None for v in values)}
    return RecordColumns("t", 0, taken)


def value(sequence: int, body: bytes = b"body") -> bytes:
    return HEADER.pack(MAGIC, 3, 77, sequence, 1_000 + sequence) + body


def fields(headers: np.ndarray) -> list[tuple[int, int, int, int]]:
    return [(int(h["producer"]), int(h["run_id"]), int(h["sequence"]), int(h["send_time_ns"]))
            for h in headers]


def test_values_of_one_size_give_every_header():
    values = [value(i) for i in range(5)]
    headers, headerless = parse_headers(column(values), 5)
    assert headerless == 0
    assert fields(headers) == [(3, 77, i, 1_000 + i) for i in range(5)]
    headers, headerless = parse_headers(column(values), 2)
    assert fields(headers) == [(3, 77, 0, 1_000), (3, 77, 1, 1_001)] and headerless == 0


def test_short_and_null_values_count_as_headerless_and_the_rest_keep_their_order():
    values = [value(0, b""), b"short", None, value(1, b"a longer body"), value(2, b"x"), b""]
    headers, headerless = parse_headers(column(values), len(values))
    assert fields(headers) == [(3, 77, 0, 1_000), (3, 77, 1, 1_001), (3, 77, 2, 1_002)]
    assert headerless == 3
    headers, headerless = parse_headers(column(values), 3)
    assert fields(headers) == [(3, 77, 0, 1_000)] and headerless == 2
    assert len(value(0, b"")) == HEADER_BYTES


def test_no_values_give_no_headers():
    headers, headerless = parse_headers(column([]), 0)
    assert headers.size == 0 and headerless == 0

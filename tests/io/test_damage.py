"""Resynchronising after damage (``hpbroker.io.damage.find_next_batch``): the next valid batch is
found past garbage, zeros and hit length fields, in any chunk, never inside a damaged batch
whose length still frames it, and never outside the offsets the damage can have covered."""

from __future__ import annotations

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from storage_helpers import make_batch, stamped

from hpbroker import _core
from hpbroker.io import damage
from hpbroker.io.damage import find_next_batch


def _log(count: int, *, compression: int = _core.CODEC_NONE) -> tuple[bytearray, list[int]]:
    """``count`` stamped batches of 3 records back to back, and the position of each."""
    data, positions = bytearray(), []
    for i in range(count):
        positions.append(len(data))
        data += stamped(make_batch(3, tag=i, compression=compression), 3 * i)
    return data, positions


def _reader(data: bytes | bytearray):
    return lambda position, length: bytes(data[position : position + length])


@pytest.mark.parametrize("compression", [_core.CODEC_NONE, _core.CODEC_LZ4])
def test_a_flipped_payload_byte_resumes_at_the_next_batch(compression):
    data, positions = _log(6, compression=compression)
    data[positions[2] + 60] ^= 0x10
    position, header = find_next_batch(_reader(data), positions[2], len(data), 6, 2**62)
    assert (position, header.base_offset) == (positions[3], 9)


@pytest.mark.parametrize("garbage", [b"\0" * 500, os.urandom(777), b"\xff" * 64])
def test_garbage_over_a_length_field_resumes_at_the_first_batch_after_it(garbage):
    data, positions = _log(20)
    data[positions[1] + 8 : positions[1] + 8 + len(garbage)] = garbage
    first_intact = next(i for i, p in enumerate(positions) if p >= positions[1] + 8 + len(garbage))
    position, header = find_next_batch(_reader(data), positions[1], len(data), 3, 2**62)
    assert (position, header.base_offset) == (positions[first_intact], 3 * first_intact)


def test_a_batch_held_in_a_record_value_is_not_taken_for_the_log_s_own():
    inner = stamped(make_batch(1), 3)  # a value that is itself a batch, with a plausible offset
    outer = bytearray(stamped(_core.build_batch([b"x" * 40 + inner + b"y" * 40]), 3))
    outer[30] ^= 0x01  # the outer batch fails its CRC, but its length still frames it
    after = stamped(make_batch(1), 4)
    data = outer + after
    position, header = find_next_batch(_reader(data), 0, len(data), 3, 2**62)
    assert (position, header.base_offset) == (len(outer), 4)


def test_offsets_outside_the_range_the_damage_can_cover_are_not_taken():
    data, positions = _log(6)
    data[positions[1] + 8 : positions[1] + 12] = b"\xff\xff\xff\x7f"
    assert find_next_batch(_reader(data), positions[1], len(data), 100, 2**62) is None
    assert find_next_batch(_reader(data), positions[1], len(data), 3, 6) is None, "below the next segment"
    assert find_next_batch(_reader(data), positions[1], len(data), 3, 7)[0] == positions[2]


def test_a_batch_cut_by_the_end_is_not_taken():
    data, positions = _log(3)
    data[positions[1] + 8 : positions[1] + 12] = b"\xff\xff\xff\x7f"
    assert find_next_batch(_reader(data), positions[1], len(data) - 1, 3, 2**62) is None


@settings(max_examples=60, deadline=None)
@given(chunk=st.integers(70, 400), where=st.integers(0, 5), garbage=st.binary(min_size=1, max_size=300))
def test_the_result_does_not_depend_on_the_chunk_size(chunk, where, garbage):
    data, positions = _log(8)
    start = positions[where] + 8
    data[start : start + len(garbage)] = garbage
    expected = find_next_batch(_reader(data), positions[where], len(data), 3 * where, 2**62)
    original, damage.RESYNC_CHUNK_BYTES = damage.RESYNC_CHUNK_BYTES, chunk
    try:
        found = find_next_batch(_reader(data), positions[where], len(data), 3 * where, 2**62)
    finally:
        damage.RESYNC_CHUNK_BYTES = original
    assert (found and found[0]) == (expected and expected[0])

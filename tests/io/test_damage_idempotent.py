"""Resynchronising after damage finds idempotent batches too (attributes bit 3 is a valid bit, so
the candidate filter must not skip them), with their producer identity readable."""

from __future__ import annotations

import os

import pytest
from storage_helpers import START_MS, stamped

from hpbroker import _core
from hpbroker.io.damage import find_next_batch


def _idempotent_log(count: int, compression: int) -> tuple[bytearray, list[int]]:
    data, positions = bytearray(), []
    for i in range(count):
        positions.append(len(data))
        batch = _core.build_batch([b"%d:%d" % (i, j) * 10 for j in range(3)], timestamps=START_MS,
                                  compression=compression, producer="idem", producer_id=11,
                                  producer_epoch=2, base_sequence=3 * i)
        data += stamped(batch, 3 * i)
    return data, positions


def _reader(data: bytes | bytearray):
    return lambda position, length: bytes(data[position : position + length])


@pytest.mark.parametrize("compression", [_core.CODEC_NONE, _core.CODEC_LZ4])
def test_garbage_before_idempotent_batches_resumes_at_the_first_intact_one(compression):
    data, positions = _idempotent_log(10, compression)
    garbage = os.urandom(150)
    data[positions[1] + 8 : positions[1] + 8 + len(garbage)] = garbage
    first_intact = next(i for i, p in enumerate(positions) if p >= positions[1] + 8 + len(garbage))
    position, header = find_next_batch(_reader(data), positions[1], len(data), 3, 2**62)
    assert (position, header.base_offset) == (positions[first_intact], 3 * first_intact)
    assert header.idempotent
    whole = _core.read_header(data, position)
    assert (whole.producer_id, whole.producer_epoch, whole.base_sequence) == (11, 2, 3 * first_intact)

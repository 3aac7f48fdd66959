"""OffsetCheckpointFile: one offset in a small file, replaced atomically; bad content reads as None."""

from __future__ import annotations

import os

import pytest

from hpbroker.io.checkpoint import OffsetCheckpointFile


@pytest.mark.parametrize("durable", [True, False])
def test_an_offset_written_reads_back_and_replaces_the_one_before(tmp_path, durable):
    checkpoint = OffsetCheckpointFile(str(tmp_path / "high-watermark-checkpoint"))
    assert checkpoint.read() is None
    checkpoint.write(42, durable=durable)
    checkpoint.write(1042, durable=durable)
    assert checkpoint.read() == 1042
    assert (tmp_path / "high-watermark-checkpoint").read_bytes() == b"0\n1042\n"
    assert os.listdir(tmp_path) == ["high-watermark-checkpoint"]  # no .tmp left behind


@pytest.mark.parametrize("content", [b"", b"0\n", b"1\n5\n", b"0\n-5\n", b"0\n5", b"0\nfive\n", b"0\n5\n6\n"])
def test_a_malformed_file_reads_as_none(tmp_path, content):
    path = tmp_path / "high-watermark-checkpoint"
    path.write_bytes(content)
    assert OffsetCheckpointFile(str(path)).read() is None


def test_a_negative_offset_is_refused(tmp_path):
    with pytest.raises(ValueError, match="negative"):
        OffsetCheckpointFile(str(tmp_path / "x")).write(-1)

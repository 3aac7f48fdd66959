"""``hpbroker dump-log``: lists a segment's batches and catches corruption."""

from __future__ import annotations

import subprocess
import sys

from hpbroker.cli import main
from hpbroker.records import build_batch, stamp_batch


def _segment(tmp_path, batches: int = 3):
    data = bytearray()
    offset = 0
    for i in range(batches):
        batch = bytearray(build_batch([f"value-{i}-{j}".encode() for j in range(4)], producer="cli-test"))
        stamp_batch(batch, 0, offset)
        offset += 4
        data += batch
    path = tmp_path / "00000000000000000000.log"
    path.write_bytes(bytes(data))
    return path


def test_dump_log_lists_every_batch_of_a_valid_segment(tmp_path, capsys):
    path = _segment(tmp_path)
    assert main(["dump-log", str(path), "--records"]) == 0
    out = capsys.readouterr().out
    assert out.count("valid: true") == 3
    assert "baseOffset: 8 lastOffset: 11 count: 4" in out
    assert "value: b'value-2-3'" in out
    assert "3 batches, 12 records, all valid" in out


def test_dump_log_reports_where_corruption_starts(tmp_path, capsys):
    path = _segment(tmp_path)
    data = bytearray(path.read_bytes())
    second_batch = len(data) // 3
    data[second_batch + 40] ^= 0xFF
    path.write_bytes(bytes(data))
    assert main(["dump-log", str(path)]) == 1
    out = capsys.readouterr().out
    assert out.count("valid: true") == 2, "the batches after the bad one are listed too"
    (bad,) = [line for line in out.splitlines() if "valid: false" in line]
    assert f"baseOffset: 4 lastOffset: 7 count: 4 position: {second_batch} " in bad
    assert "valid: false (CRC mismatch: stored 0x" in bad and ", computed 0x" in bad
    assert "NOT VALID" in out


def test_dump_log_reports_a_truncated_tail(tmp_path, capsys):
    path = _segment(tmp_path)
    data = path.read_bytes()
    path.write_bytes(data[:-10])
    assert main(["dump-log", str(path)]) == 1
    out = capsys.readouterr().out
    third = 2 * len(data) // 3
    assert out.count("valid: true") == 2
    assert f"INVALID at position {third}: batch of {len(data) // 3} bytes is cut off after" in out


def test_dump_log_flags_offsets_that_do_not_follow_the_file_name(tmp_path, capsys):
    path = _segment(tmp_path)
    renamed = path.rename(tmp_path / "00000000000000000100.log")
    assert main(["dump-log", str(renamed)]) == 1
    assert "base offset 0, expected 100" in capsys.readouterr().out


def test_dump_log_of_a_missing_file_says_so(tmp_path, capsys):
    assert main(["dump-log", str(tmp_path / "nope.log")]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_console_script_is_installed():
    result = subprocess.run([sys.executable, "-m", "hpbroker.cli", "version"], capture_output=True, text=True)
    assert result.returncode == 0 and result.stdout.startswith("hpbroker ")

"""``hpbroker dump-log`` shows each batch's producer identity (producerId, producerEpoch) next to
its baseSequence, -1 for batches without one."""

from __future__ import annotations

from hpbroker.cli import main
from hpbroker.records import build_batch, stamp_batch


def test_dump_log_shows_the_producer_identity_of_idempotent_batches(tmp_path, capsys):
    plain = bytearray(build_batch([b"a", b"b"], producer="old"))
    idempotent = bytearray(build_batch([b"c", b"d", b"e"], producer="new", producer_id=77, producer_epoch=3,
                                       base_sequence=12))
    stamp_batch(idempotent, 0, 2)
    path = tmp_path / "00000000000000000000.log"
    path.write_bytes(bytes(plain + idempotent))
    assert main(["dump-log", str(path), "--records"]) == 0
    out = capsys.readouterr().out
    assert "producer: 'old' producerId: -1 producerEpoch: -1 baseSequence: -1" in out
    assert "baseOffset: 2 lastOffset: 4 count: 3" in out
    assert "producer: 'new' producerId: 77 producerEpoch: 3 baseSequence: 12" in out
    assert "value: b'e'" in out and "2 batches, 5 records, all valid" in out

"""The interleaved comparison of ``bench.scenarios --idempotence-compare``: run order, percent
changes, and the check that a run's batches are what its variant asked for."""

from __future__ import annotations

import pytest

from bench.idempotence import (
    IDEMPOTENCE_OFF,
    IDEMPOTENCE_ON,
    IDEMPOTENCE_ON_1,
    interleave,
    order,
    relative_change,
)
from bench.scenarios import Bench, main
from hpbroker.records import build_batch


def test_every_round_runs_every_variant_once_rotated():
    assert order(3, 4) == [[0, 1, 2], [1, 2, 0], [2, 0, 1], [0, 1, 2]]
    assert order(2, 3) == [[0, 1], [1, 0], [0, 1]]
    assert order(1, 2) == [[0], [0]]
    with pytest.raises(ValueError):
        order(0, 1)


def test_interleave_measures_in_rotated_order_and_keeps_rounds():
    ran = []

    def measure(variant):
        ran.append(variant.label)
        return {"records_per_s": len(ran)}

    variants = (IDEMPOTENCE_ON, IDEMPOTENCE_ON_1, IDEMPOTENCE_OFF)
    results = interleave(variants, 2, measure)
    on, on_1, off = (v.label for v in variants)
    assert ran == [on, on_1, off, on_1, off, on]
    assert [r["round"] for r in results[on]] == [0, 1]
    assert [r["records_per_s"] for r in results[on]] == [1, 6]
    assert [r["records_per_s"] for r in results[off]] == [3, 5]
    with pytest.raises(ValueError, match="distinct"):
        interleave((IDEMPOTENCE_ON, IDEMPOTENCE_ON), 1, measure)


def test_relative_change_of_medians_and_per_round():
    change = relative_change([97.0, 99.0, 90.0], [100.0, 100.0, 100.0])
    assert change["of_medians"] == pytest.approx(-3.0)
    assert change["paired_median"] == pytest.approx(-3.0)
    assert (change["paired_low"], change["paired_high"]) == (pytest.approx(-10.0), pytest.approx(-1.0))
    # drift between rounds cancels in the paired ratios
    drift = relative_change([98.0, 196.0], [100.0, 200.0])
    assert drift["paired_low"] == drift["paired_high"] == pytest.approx(-2.0)
    with pytest.raises(ValueError):
        relative_change([1.0], [1.0, 2.0])


@pytest.mark.parametrize("idempotent", [True, False])
def test_check_idempotence_reads_the_first_batch_of_each_partition(tmp_path, idempotent):
    identity = {"producer_id": 7, "producer_epoch": 0, "base_sequence": 0} if idempotent else {}
    for partition in range(2):
        directory = tmp_path / "data" / f"t-1-{partition}"
        directory.mkdir(parents=True)
        (directory / f"{0:020d}.log").write_bytes(build_batch([b"v" * 100] * 3, producer="p", **identity))
    bench = Bench(tmp_path, "127.0.0.1:1", 1, 1.0)
    assert bench.idempotent_partitions("t-1") == [idempotent, idempotent]
    bench.check_idempotence("run", "t-1", {"enable_idempotence": idempotent})
    bench.check_idempotence("run", "t-1", {})
    with pytest.raises(RuntimeError, match="idempotent"):
        bench.check_idempotence("run", "t-1", {"enable_idempotence": not idempotent})


def test_idempotence_compare_is_an_option(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "--idempotence-compare" in capsys.readouterr().out

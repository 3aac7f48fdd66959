"""Duplicates in loadgen's report: records read back more than once (same run, producer and
sequence number) are counted and shown as ``duplicates: N``; the producer settings that decide
whether a retry can store a second copy (idempotence, requests in flight, request timeout) are
passed to the client only when given."""

from __future__ import annotations

import pytest

from hpbroker import protocol
from hpbroker.client.connection import BrokerConnection, parse_bootstrap
from hpbroker.records import build_batch, decode_records, scan_batches
from loadgen.cli import build_parser, config_from_args
from loadgen.config import LoadConfig
from loadgen.histogram import Histogram
from loadgen.report import Collector, format_report
from loadgen.runner import run


def store_first_batch_again(bootstrap: str, topic: str, partitions: int) -> tuple[int, int]:
    """Store the records of the first batch of ``topic``'s first partition that has one a second
    time, as a plain batch (no producer identity, so no broker can tell it from new records: what
    a retry without idempotence stores).  Returns ``(partition, records copied)``."""
    connection = BrokerConnection(parse_bootstrap(bootstrap)[0])
    try:
        for partition in range(partitions):
            fetched = connection.call(protocol.FetchRequest(topic, partition, 0, max_bytes=1))
            first = scan_batches(fetched.payload)
            if first.sizes:
                break
        else:
            raise AssertionError(f"{topic} holds no batch")
        records = decode_records(bytes(fetched.payload[:first.sizes[0]]))
        copy = build_batch([r.value for r in records], keys=[r.key for r in records],
                           timestamps=[r.timestamp for r in records], producer=records[0].producer)
        connection.call(protocol.ProduceRequest(topic, partition, payload=copy))
    finally:
        connection.close()
    return partition, len(records)


def test_records_read_back_twice_are_reported_as_duplicates(bootstrap):
    common = {"bootstrap": bootstrap, "topic": "twice", "progress": "off", "interval_s": 0.25}
    produced = run(LoadConfig(workload="produce", create_topic=True, partitions=2, records=4_000,
                              chunk_records=200, **common))
    assert produced["produce"]["failed"] == 0 and produced["duplicates"] is None  # nothing read back
    clean = run(LoadConfig(workload="consume", until_end=True, **common))
    assert clean["duplicates"] == 0 and clean["check"]["ok"]
    assert "duplicates: 0 " in format_report(clean)

    partition, copied = store_first_batch_again(bootstrap, "twice", 2)
    assert copied > 0
    report = run(LoadConfig(workload="consume", until_end=True, consumers=2, **common))
    check = report["check"]
    assert report["duplicates"] == check["duplicated"] == copied
    assert (check["received"], check["distinct"], check["missing"]) == (4_000 + copied, 4_000, 0)
    assert check["per_partition"][str(partition)]["duplicated"] == copied and not check["ok"]
    text = format_report(report)
    assert f"duplicates: {copied:,} " in text and "check: PROBLEMS" in text


@pytest.mark.parametrize(("counts", "total", "shown"), [((5, 3), 8, "deduplicated 8,"),
                                                        ((5, None), 5, "deduplicated 5,"),
                                                        ((None, None), None, "deduplicated -,")])
def test_the_report_sums_the_records_the_broker_deduplicated(counts, total, shown):
    collector = Collector(LoadConfig(workload="produce"), 0x42)
    collector.t0 = 1000.0
    for index, deduplicated in enumerate(counts):
        collector.add({"role": "producer", "index": index, "kind": "done", "name": f"p{index}",
                       "run_id": 0x42,
                       "records": 10, "bytes": 1000, "acked": 10, "failed": 0, "retries": 2,
                       "deduplicated": deduplicated, "first_error": None, "started": 1000.0,
                       "send_ended": 1001.0, "ended": 1001.0, "max_lag_s": 0.0,
                       "ack_latency": Histogram().to_sparse(),
                       "truth": []})
    report = collector.report(partitions=1, topic_created=False, consumers_started=0)
    assert report["produce"]["deduplicated"] == total
    assert [p["deduplicated"] for p in report["produce"]["per_producer"]] == list(counts)
    assert shown in format_report(report)


def test_producer_settings_are_passed_only_when_given():
    assert "enable_idempotence" not in LoadConfig().producer_options()
    assert set(LoadConfig().producer_options()) == {"acks", "linger_ms", "batch_bytes", "compression"}
    args = build_parser().parse_args(["produce", "--idempotence", "off", "--max-in-flight", "1",
                                      "--request-timeout-ms", "1500"])
    options = config_from_args(args).producer_options()
    assert (options["enable_idempotence"], options["max_in_flight_requests_per_partition"],
            options["request_timeout_ms"]) == (False, 1, 1500)
    on = config_from_args(build_parser().parse_args(["produce", "--idempotence", "on"]))
    assert on.enable_idempotence is True and on.to_dict()["enable_idempotence"] is True
    defaults = config_from_args(build_parser().parse_args(["produce"]))
    assert (defaults.enable_idempotence, defaults.max_in_flight, defaults.request_timeout_ms) == (None,) * 3


@pytest.mark.parametrize("changes", [{"enable_idempotence": True, "acks": 0}, {"max_in_flight": 0},
                                     {"max_in_flight": 6}, {"request_timeout_ms": 0},
                                     {"enable_idempotence": "yes"}])
def test_invalid_producer_settings_are_refused(changes):
    with pytest.raises(ValueError):
        LoadConfig(**changes)


def test_idempotence_flag_takes_only_on_or_off():
    with pytest.raises(SystemExit):
        build_parser().parse_args(["produce", "--idempotence", "maybe"])


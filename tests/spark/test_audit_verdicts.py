"""The audit's verdicts on constructed data, in a real broker: a producer killed mid-window (its
events announce fewer records than it stored: unannounced, not duplicate), a record stored twice
(duplicate), both in one window, a duplicate that hides a loss, and records that look alike but
are not the same record.  Batches and events are built by hand and produced as they are, so each
window holds exactly what the test says."""

from __future__ import annotations

import itertools
import time

import pytest

from hpbroker import protocol
from hpbroker.audit.events import AUDIT_TOPIC, MonitoringEvent, encode_event
from hpbroker.client import Admin
from hpbroker.client.connection import BrokerConnection, parse_bootstrap
from hpbroker.records import build_batch
from hpbroker.spark.audit import REPORT_COLUMNS, AuditConfig, format_table, run_audit

pytestmark = pytest.mark.spark

TOPIC = "verdicts"
WINDOW_MS = 1000
NOW_MS = int(time.time() * 1000)
BASE_MS = NOW_MS - NOW_MS % WINDOW_MS - 120_000  # windows two minutes ago: closed
_instances = itertools.count(1)


class Store:
    """Produces hand-built batches and events over one connection."""

    def __init__(self, bootstrap: str) -> None:
        self.connection = BrokerConnection(parse_bootstrap(bootstrap)[0])

    def records(self, producer: str, values: list[bytes], *, partition: int = 0, timestamp: int = BASE_MS,
                keys: list[bytes | None] | None = None, headers: list | None = None,
                timestamps: list[int] | None = None) -> list[tuple]:
        """One plain batch (no producer identity: a broker stores every copy); returns its records
        as (timestamp, key, value, headers) so a test can store them again."""
        stamps = timestamps if timestamps is not None else [timestamp] * len(values)
        batch = build_batch(values, keys=keys, timestamps=stamps, headers=headers, producer=producer)
        self.connection.call(protocol.ProduceRequest(TOPIC, partition, payload=batch))
        return list(zip(stamps, keys or [None] * len(values), values, headers or [None] * len(values),
                        strict=True))

    def again(self, producer: str, records: list[tuple], *, partition: int = 0) -> None:
        """The same records stored once more (what a retry without idempotence stores)."""
        stamps, keys, values, headers = (list(column) for column in zip(*records, strict=True))
        self.records(producer, values, partition=partition, keys=keys, headers=headers, timestamps=stamps)

    def announce(self, producer: str, counts: list[int], window_start_ms: int = BASE_MS) -> None:
        """Events of one producer instance for one window, one per count (a window is announced
        once per publication that counted records in it)."""
        instance = next(_instances)
        values = [encode_event(MonitoringEvent(producer, TOPIC, window_start_ms, WINDOW_MS, count,
                                               instance=instance, sequence=n))[1]
                  for n, count in enumerate(counts)]
        batch = build_batch(values, keys=[TOPIC.encode()] * len(values), producer=producer)
        self.connection.call(protocol.ProduceRequest(AUDIT_TOPIC, 0, payload=batch))

    def close(self) -> None:
        self.connection.close()


def numbered(prefix: str, count: int, start: int = 0) -> list[bytes]:
    return [b"%s %d" % (prefix.encode(), i) for i in range(start, start + count)]


@pytest.fixture(scope="module")
def audited(spark, bootstrap):
    """The constructed windows, audited once: (report, rows by (producer, window_start_ms))."""
    with Admin(bootstrap) as admin:
        admin.create_topic(TOPIC, 2)
        if AUDIT_TOPIC not in admin.list_topics():
            admin.create_topic(AUDIT_TOPIC, 1)
    store = Store(bootstrap)
    try:
        # Killed mid-window: stored 100 records in its first window but published only two events
        # (40 and 20) before it died; its second window was announced whole; its third never.
        store.records("killed", numbered("killed", 60))
        store.records("killed", numbered("killed", 40, 60), partition=1)
        store.announce("killed", [40, 20])
        store.records("killed", numbered("killed-next", 30), timestamp=BASE_MS + WINDOW_MS)
        store.announce("killed", [30], BASE_MS + WINDOW_MS)
        store.records("killed", numbered("killed-last", 25), timestamp=BASE_MS + 2 * WINDOW_MS + 999)
        # A real duplicate: 50 records announced, 10 of them stored again (in the other partition:
        # the same record wherever it lands), keys and headers included.
        doubled = store.records("doubled", numbered("doubled", 50), keys=[b"k%d" % (i % 3) if i % 2 else None
                                                                         for i in range(50)],
                                headers=[[("h", b"%d" % i), ("empty", None)] for i in range(50)])
        store.again("doubled", doubled[:10], partition=1)
        store.announce("doubled", [50])
        # Both: a producer killed after announcing 60 of its 100 records, 10 of which were stored twice.
        both = store.records("both", numbered("both", 100))
        store.again("both", both[90:])
        store.announce("both", [60])
        # A duplicate hiding a loss: 50 announced, 45 stored, 8 of those twice.
        masked = store.records("masked", numbered("masked", 45))
        store.again("masked", masked[:8])
        store.announce("masked", [50])
        # Alike but not the same: one value and timestamp with different headers or keys, one value
        # and key at different timestamps.  20 stored, 18 announced: 2 unannounced, no duplicate.
        store.records("alike", [b"same"] * 6, headers=[[("n", b"%d" % i)] for i in range(6)])
        store.records("alike", [b"same"] * 4, keys=[b"a", b"b", None, b""])
        store.records("alike", [b"same"] * 10, keys=[b"a"] * 10,
                      timestamps=[BASE_MS + 1 + i for i in range(10)])
        store.announce("alike", [18])
        # Matching: 10 stored, 10 announced.
        store.records("clean", numbered("clean", 10))
        store.announce("clean", [10])
    finally:
        store.close()
    report = run_audit(spark, AuditConfig(bootstrap, topics=(TOPIC,)))
    return report, {(row["producer"], row["window_start_ms"]): row for row in report.mismatches}


def split(row: dict) -> tuple:
    return (row["verdict"], row["announced"], row["consumed"], row["difference"], row["duplicates"],
            row["unannounced"], row["missing"])


def test_records_a_killed_producer_never_announced_are_unannounced_not_duplicates(audited):
    _, rows = audited
    #                                           verdict   announced consumed diff dup unann missing
    assert split(rows["killed", BASE_MS]) == ("unannounced", 60, 100, 40, 0, 40, 0)
    assert ("killed", BASE_MS + WINDOW_MS) not in rows  # announced whole: matching
    assert split(rows["killed", BASE_MS + 2 * WINDOW_MS]) == ("unannounced", 0, 25, 25, 0, 25, 0)


def test_a_record_stored_twice_is_a_duplicate(audited):
    _, rows = audited
    assert split(rows["doubled", BASE_MS]) == ("duplicate", 50, 60, 10, 10, 0, 0)


def test_a_window_with_both_says_how_many_of_each(audited):
    _, rows = audited
    assert split(rows["both", BASE_MS]) == ("duplicate", 60, 110, 50, 10, 40, 0)
    assert split(rows["masked", BASE_MS]) == ("duplicate", 50, 53, 3, 8, 0, 5)


def test_records_that_only_look_alike_are_not_duplicates(audited):
    _, rows = audited
    assert split(rows["alike", BASE_MS]) == ("unannounced", 18, 20, 2, 0, 2, 0)


def test_the_summary_and_table_count_each_verdict(audited):
    report, rows = audited
    assert set(rows) == {("killed", BASE_MS), ("killed", BASE_MS + 2 * WINDOW_MS), ("doubled", BASE_MS),
                         ("both", BASE_MS), ("masked", BASE_MS), ("alike", BASE_MS)}
    assert (report.windows_checked, report.matching, report.mismatched) == (8, 2, 6)
    assert report.verdicts == {"duplicate": 3, "unannounced": 3}
    assert (report.records_duplicated, report.records_unannounced, report.records_missing) == (28, 107, 5)
    assert not report.ok
    assert "6 mismatched (3 duplicate, 3 unannounced); 408 records counted, 278 announced: 28 duplicate, " \
           "107 unannounced, 5 missing" in report.summary()
    assert all(set(row) == set(REPORT_COLUMNS) for row in report.mismatches)
    header = format_table(report.mismatches).splitlines()[0].split()
    assert header[-4:] == ["duplicates", "unannounced", "missing", "verdict"]

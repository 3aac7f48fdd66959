"""Changing a topic's settings on a real broker (``AlterTopicConfigRequest``, ``Admin.alter_topic``,
``hpbroker topics alter``): refused values change nothing, accepted ones reach the live logs at
once and survive a restart."""

from __future__ import annotations

import os
import signal
import time

import pytest
from harness import Client, start_broker, wait_until

from hpbroker import protocol
from hpbroker.cli import main
from hpbroker.client.admin import Admin
from hpbroker.errors import InvalidConfigError, UnknownTopicOrPartitionError
from hpbroker.records import build_batch, decode_records
from hpbroker.workers.ownership import owner_slot

TOPIC = "metrics"
WORKERS = 2
BATCH = build_batch([b"x" * 200 for _ in range(4)], producer="alter-test")  # about 900 bytes


@pytest.fixture
def broker(tmp_path):
    started = []

    def start(log_name="broker.log", port=None, env=None):
        process, port = start_broker(tmp_path / "data", tmp_path / log_name, workers=WORKERS, port=port,
                                     env={"HPBROKER_RETENTION_CHECK_INTERVAL_MS": "100", **(env or {})})
        started.append(process)
        return process, port

    yield start
    for process in started:
        assert process.stop() == 0, process.log()


def produce(client: Client, partition: int, count: int, timeout_ms: int = 10_000) -> list[int]:
    codes = []
    for _ in range(count):
        request = protocol.ProduceRequest(TOPIC, partition, timeout_ms=timeout_ms, payload=BATCH)
        header, _ = client.request(request, timeout_s=timeout_ms / 1000 + 5)
        codes.append(header.error_code)
    return codes


def segment_files(tmp_path, partition: int) -> list[str]:
    return sorted(p.name for p in (tmp_path / "data" / f"{TOPIC}-{partition}").glob("*.log"))


@pytest.mark.slow
def test_alter_applies_to_live_logs_and_survives_a_restart(tmp_path, broker):
    process, port = broker()
    client = Client(port)
    try:
        with Admin(f"127.0.0.1:{port}") as admin:
            admin.create_topic(TOPIC, 2, {"retention_ms": 3_600_000})
            assert produce(client, 0, 3) == [0, 0, 0]
            assert len(segment_files(tmp_path, 0)) == 1

            admin.alter_topic(TOPIC, {"segment_bytes": 2048, "retention_bytes": 4096})
            assert admin.describe_topic(TOPIC).configs == {
                "retention_bytes": "4096", "retention_ms": "3600000", "segment_bytes": "2048"}
            # The next appends roll at the new size; retention (checked every 100 ms) trims the rest.
            assert produce(client, 0, 12) == [0] * 12
            wait_until(lambda: 2 <= len(segment_files(tmp_path, 0)) <= 4, 10, what="rolled and trimmed")
            start = wait_until(lambda: admin.describe_topic(TOPIC).partitions[0].log_start_offset or None, 10,
                               what="the log start moving")
            assert start > 0

            admin.alter_topic(TOPIC, {"retention_bytes": None, "retention_ms": None})
            assert admin.describe_topic(TOPIC).configs == {"segment_bytes": "2048"}
    finally:
        client.close()
    assert process.stop() == 0, process.log()
    assert "settings changed: retention_bytes=4096, segment_bytes=2048" in process.log()

    again, port = broker("restarted.log", port)
    client = Client(port)
    try:
        with Admin(f"127.0.0.1:{port}") as admin:
            assert admin.describe_topic(TOPIC).configs == {"segment_bytes": "2048"}
        before = len(segment_files(tmp_path, 1))
        assert produce(client, 1, 6) == [0] * 6
        assert len(segment_files(tmp_path, 1)) >= before + 2, "the restarted worker rolls at 2048 bytes"
    finally:
        client.close()


@pytest.mark.slow
def test_a_new_flush_policy_takes_effect_at_once(tmp_path, broker):
    _, port = broker()
    client = Client(port)
    try:
        with Admin(f"127.0.0.1:{port}") as admin:
            admin.create_topic(TOPIC, 1)
            admin.alter_topic(TOPIC, {"flush_ms": 600_000, "flush_messages": 1_000_000})
            # Nothing is flushed now: the produce is not acknowledged within its timeout.
            assert produce(client, 0, 1, timeout_ms=300) == [protocol_error("RequestTimedOutError")]
            header, response = client.request(protocol.FetchRequest(TOPIC, 0, 0, max_wait_ms=0))
            assert header.error_code == 0 and response.high_watermark == 0
            # Back to the broker's default (1 ms): the pending records are flushed at once.
            admin.alter_topic(TOPIC, {"flush_ms": None, "flush_messages": None})

            def flushed():
                header, response = client.request(protocol.FetchRequest(TOPIC, 0, 0, max_wait_ms=0))
                return header.error_code == 0 and response.high_watermark == 4 and response

            response = wait_until(flushed, 5, what="the pending records flushed")
            assert [r.value for r in decode_records(bytes(response.payload))] == [b"x" * 200] * 4
    finally:
        client.close()


# Settings that hold back every acknowledgement: a produce then times out, which shows that the
# worker has them.
NO_FLUSH = [protocol.TopicConfigEntry("flush_ms", "600000"),
            protocol.TopicConfigEntry("flush_messages", "1000000")]


def respawn_stopped(process, slot: int) -> int:
    """Kill the slot's worker and SIGSTOP its successor while it recovers; its pid."""
    old = process.worker_pids()[slot]
    os.kill(old, signal.SIGKILL)
    new = wait_until(lambda: process.worker_pids().get(slot, old) != old and process.worker_pids()[slot],
                     10, 0.001, what="the respawn")
    os.kill(new, signal.SIGSTOP)
    assert f"slot={slot} pid={new} serving" not in process.log(), "ready before it could be stopped"
    return new


@pytest.mark.slow
def test_an_alter_while_an_owner_recovers_is_confirmed_by_the_open_it_gets_when_ready(tmp_path, broker):
    process, port = broker(env={"HPBROKER_ADMIN_TIMEOUT_MS": "5000"})
    creator, alterer = Client(port), Client(port)
    try:
        # 100 logs to open make slot 1's recovery long enough to stop it in the middle.
        header, _ = creator.request(protocol.CreateTopicRequest("bulk", 200), timeout_s=20)
        assert header.error_code == 0
        booting = respawn_stopped(process, 1)
        create = creator.send(protocol.CreateTopicRequest(TOPIC, 2))

        def created():
            _, response = alterer.request(protocol.MetadataRequest([TOPIC]))
            return response.topics[0].error_code == 0

        wait_until(created, 5, what="the topic stored")
        alter = alterer.send(protocol.AlterTopicConfigRequest(TOPIC, NO_FLUSH))
        time.sleep(0.2)
        os.kill(booting, signal.SIGCONT)
        header, _ = creator.receive(protocol.ApiKey.CREATE_TOPIC, create, timeout_s=10)
        assert header.error_code == 0
        header, _ = alterer.receive(protocol.ApiKey.ALTER_TOPIC_CONFIG, alter, timeout_s=10)
        assert header.error_code == 0, header
        partition = next(p for p in range(2) if owner_slot(TOPIC, p, WORKERS) == 1)
        assert produce(creator, partition, 1, timeout_ms=300) == [protocol_error("RequestTimedOutError")]
    finally:
        creator.close()
        alterer.close()


@pytest.mark.slow
def test_a_configure_refused_by_a_busy_worker_is_sent_again(tmp_path, broker):
    process, port = broker(env={"HPBROKER_ADMIN_TIMEOUT_MS": "5000", "HPBROKER_WORKER_TIMEOUT_MS": "60000"})
    client = Client(port)
    try:
        header, _ = client.request(protocol.CreateTopicRequest(TOPIC, 1), timeout_s=10)
        assert header.error_code == 0
        slot = owner_slot(TOPIC, 0, WORKERS)
        stopped = process.worker_pids()[slot]
        os.kill(stopped, signal.SIGSTOP)
        try:
            # Unanswered produces fill the worker's queue: the arbiter cannot hand it the configure.
            small = build_batch([b"y"], producer="alter-test")
            for _ in range(20_000):
                client.send(protocol.ProduceRequest(TOPIC, 0, acks=0, payload=small))
            alter = client.send(protocol.AlterTopicConfigRequest(TOPIC, NO_FLUSH))
            process.wait_for_log(rf"could not send configure to worker slot {slot}", timeout_s=10)
        finally:
            os.kill(stopped, signal.SIGCONT)
        header, _ = client.receive(protocol.ApiKey.ALTER_TOPIC_CONFIG, alter, timeout_s=10)
        assert header.error_code == 0, header
        assert produce(client, 0, 1, timeout_ms=300) == [protocol_error("RequestTimedOutError")]
    finally:
        client.close()


def protocol_error(name: str) -> int:
    from hpbroker import errors

    return getattr(errors, name).code


@pytest.mark.slow
def test_refused_changes_change_nothing_and_say_why(tmp_path, broker, capsys):
    _, port = broker()
    with Admin(f"127.0.0.1:{port}") as admin:
        admin.create_topic(TOPIC, 2, {"retention_ms": 60_000})
        with pytest.raises(InvalidConfigError, match=r"segment_bytes must be in \[512, 2147483647\], got 10"):
            admin.alter_topic(TOPIC, {"retention_ms": 1000, "segment_bytes": 10})
        with pytest.raises(InvalidConfigError, match="unknown topic config 'retention_hours'"):
            admin.alter_topic(TOPIC, {"retention_hours": 1})
        with pytest.raises(InvalidConfigError, match="flush_fsync='maybe' must be true or false"):
            admin.alter_topic(TOPIC, {"flush_fsync": "maybe"})
        with pytest.raises(UnknownTopicOrPartitionError, match="'nothere' does not exist"):
            admin.alter_topic("nothere", {"retention_ms": 1000})
        assert admin.describe_topic(TOPIC).configs == {"retention_ms": "60000"}

    bootstrap = ["--bootstrap", f"127.0.0.1:{port}"]
    assert main(["topics", "alter", TOPIC, "--retention-ms", "-1", "--flush-fsync", "false", *bootstrap]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"altered topic {TOPIC}: retention_ms=-1, flush_fsync=false\n")
    assert "Configs: flush_fsync=false,retention_ms=-1\n" in out
    assert main(["topics", "alter", TOPIC, "--reset", "flush_fsync", *bootstrap]) == 0
    assert "Configs: retention_ms=-1\n" in capsys.readouterr().out
    assert main(["topics", "alter", TOPIC, "--segment-bytes", "1", *bootstrap]) == 1
    assert "invalid configuration: topic config: segment_bytes must be in" in capsys.readouterr().err
    assert main(["topics", "alter", TOPIC, *bootstrap]) == 1
    assert "nothing to change" in capsys.readouterr().err


def test_the_cli_offers_a_flag_for_every_topic_setting():
    import dataclasses

    from hpbroker.cli.topics import TOPIC_SETTINGS
    from hpbroker.io import LogConfig

    assert {f.name: f.type for f in dataclasses.fields(LogConfig)} == \
        {name: kind.__name__ for name, kind in TOPIC_SETTINGS.items()}

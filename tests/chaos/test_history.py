"""The history files: the writer's lines, the reader's arrays, torn and malformed lines."""

from __future__ import annotations

import threading

import pytest

from chaos.history import ACKED, FAILED, INVOKED, HistoryError, HistoryWriter, read_histories
from hpbroker.client.consumer import TopicPartition


def _lines(path):
    return path.read_text(encoding="utf-8").splitlines()


def test_writer_writes_one_tab_separated_line_per_event(tmp_path):
    path = tmp_path / "h" / "p.history"
    with HistoryWriter(path) as w:
        w.invoke("p-all-0", "chaos-all", "p-all-0-1", t=10.5)
        w.ack("p-all-0", "chaos-all", 3, 17, "p-all-0-1", t=10.75)
        w.fail("p-all-0", "chaos-all", "p-all-0-2", "TimeoutError: no answer", t=11.0)
        w.assign("c-0", [TopicPartition("chaos-all", 1), ("chaos-one", 2)], t=12.0)
        w.assign("c-0", [], t=12.5)
        w.poll("c-0", "chaos-all", 1, 4, "p-all-0-9", t=13.0)
    assert _lines(path) == [
        "invoke\t10.5\tp-all-0\tchaos-all\tp-all-0-1",
        "ack\t10.75\tp-all-0\tchaos-all\t3\t17\tp-all-0-1",
        "fail\t11.0\tp-all-0\tchaos-all\tp-all-0-2\tTimeoutError: no answer",
        "assign\t12.0\tc-0\tchaos-all:1,chaos-one:2",
        "assign\t12.5\tc-0\t",
        "poll\t13.0\tc-0\tchaos-all\t1\t4\tp-all-0-9",
    ]


def test_writer_escapes_tabs_and_newlines_in_fields(tmp_path):
    path = tmp_path / "p.history"
    with HistoryWriter(path) as w:
        w.fail("p", "t", "v\t1", "line one\nline\\two\r", t=1.0)
        w.poll("c", "t", 0, 0, "v\t1", t=2.0)
    assert _lines(path)[0] == "fail\t1.0\tp\tt\tv\\t1\tline one\\nline\\\\two\\r"
    history = read_histories(tmp_path)
    th = history.topics["t"]
    assert th.values == ["v\\t1"]
    assert th.flags[0] & FAILED and list(th.poll_value) == [0]


def test_writer_buffers_until_flush(tmp_path):
    path = tmp_path / "p.history"
    w = HistoryWriter(path, buffer_lines=1000, flush_interval_s=3600)
    w.invoke("p", "t", "p-1", t=1.0)
    assert path.read_text() == ""
    w.flush()
    assert len(_lines(path)) == 1
    w.close()
    w.close()  # idempotent
    with pytest.raises(ValueError, match="closed"):
        w.invoke("p", "t", "p-2")


def test_writer_is_thread_safe(tmp_path):
    path = tmp_path / "p.history"
    w = HistoryWriter(path, buffer_lines=7)

    def send(n):
        for i in range(500):
            w.ack("p", "t", n, i, f"p-{n}-{i}")
    threads = [threading.Thread(target=send, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    w.close()
    history = read_histories(tmp_path)
    th = history.topics["t"]
    assert history.lines == 2000 and len(th.values) == 2000
    assert sorted(zip(th.ack_partition, th.ack_offset, strict=True)) == [(n, i) for n in range(4)
                                                                         for i in range(500)]


def test_reader_interns_values_and_keeps_events_per_topic(tmp_path):
    with HistoryWriter(tmp_path / "p.history") as w:
        w.invoke("p", "a", "p-1", t=1.0)
        w.invoke("p", "b", "p-2", t=1.5)
        w.ack("p", "a", 0, 0, "p-1", t=2.0)
        w.fail("p", "b", "p-2", "boom", t=3.0)
    with HistoryWriter(tmp_path / "c.history") as w:
        w.assign("c", "a:0", t=4.0)
        w.poll("c", "a", 0, 0, "p-1", t=5.0)
        w.assign("c", "a:0", t=6.0)
        w.poll("c", "a", 0, 0, "p-1", t=7.0)
    history = read_histories(tmp_path)
    assert history.files == 2 and history.lines == 8 and history.torn_lines == 0
    assert (history.start_s, history.end_s) == (1.0, 7.0)
    a, b = history.topics["a"], history.topics["b"]
    assert a.values == ["p-1"] and a.flags[0] == INVOKED | ACKED and a.invokes == 1
    assert b.flags[b.value_ids["p-2"]] == INVOKED | FAILED and dict(b.fail_errors) == {"boom": 1}
    assert list(a.poll_epoch) == [0, 1] and history.streams == ["c"]
    assert [x.partitions for x in history.assignments] == [(("a", 0),), (("a", 0),)]


def test_same_client_in_two_files_is_two_streams(tmp_path):
    for name in ("c1.history", "c2.history"):
        with HistoryWriter(tmp_path / name) as w:
            w.poll("c", "a", 0, 5, "v", t=1.0)
    history = read_histories(tmp_path)
    assert history.streams == ["c", "c"]
    assert list(history.topics["a"].poll_stream) == [0, 1]


def test_reader_skips_and_counts_a_torn_last_line(tmp_path):
    with HistoryWriter(tmp_path / "p.history") as w:
        w.invoke("p", "t", "p-1", t=1.0)
        w.ack("p", "t", 0, 0, "p-1", t=2.0)
    with open(tmp_path / "p.history", "a") as f:
        f.write("ack\t3.0\tp\tt\t0\t1")  # killed mid-line
    history = read_histories(tmp_path)
    assert history.torn_lines == 1 and history.torn_files == ["p.history"]
    assert history.lines == 2 and list(history.topics["t"].ack_offset) == [0]


def test_reader_skips_a_malformed_complete_last_line(tmp_path):
    (tmp_path / "p.history").write_text("invoke\t1.0\tp\tt\tp-1\nack\t2.0\tp\tt\t0\n")
    history = read_histories(tmp_path)
    assert history.torn_lines == 1 and history.lines == 1


@pytest.mark.parametrize("bad", ["ack\t2.0\tp\tt\t0\n", "ack\tnoon\tp\tt\t0\t1\tv\n",
                                 "poll\t2.0\tc\tt\tx\t1\tv\n", "launch\t2.0\tp\n", "\n",
                                 "assign\t2.0\tc\tt0\n"])
def test_reader_refuses_a_malformed_line_before_the_last(tmp_path, bad):
    (tmp_path / "p.history").write_text("invoke\t1.0\tp\tt\tp-1\n" + bad + "invoke\t3.0\tp\tt\tp-2\n")
    with pytest.raises(HistoryError, match=r"p\.history:2: malformed"):
        read_histories(tmp_path)


def test_reader_refuses_a_missing_directory(tmp_path):
    with pytest.raises(HistoryError, match="no such history directory"):
        read_histories(tmp_path / "absent")


def test_writer_reopening_a_torn_file_cuts_the_torn_line(tmp_path):
    path = tmp_path / "p.history"
    path.write_text("invoke\t1.0\tp\tt\tp-1\nack\t2.0\tp\tt\t0")
    with HistoryWriter(path) as w:
        w.invoke("p", "t", "p-2", t=3.0)
    assert _lines(path) == ["invoke\t1.0\tp\tt\tp-1", "invoke\t3.0\tp\tt\tp-2"]
    assert read_histories(tmp_path).torn_lines == 0


def test_reader_ignores_hidden_files_and_reads_empty_ones(tmp_path):
    (tmp_path / ".lock").write_text("garbage\n")
    (tmp_path / "empty.history").write_text("")
    history = read_histories(tmp_path)
    assert history.files == 1 and history.lines == 0 and history.start_s is None

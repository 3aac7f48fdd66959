"""The history files: what every client of a chaos campaign did, written as it happened.

One file per client process under ``<out>/history/``, UTF-8 text, one event per line, fields
separated by one tab, the first field the kind and the second the wall time (``time.time()``,
float seconds)::

    invoke  <t>  <client>  <topic>  <value>                        before the send
    ack     <t>  <client>  <topic>  <partition>  <offset>  <value>  the send's callback, no error
    fail    <t>  <client>  <topic>  <value>  <error text>           the send's callback, an error
    assign  <t>  <client>  <topic:partition,topic:partition,...>    a consumer's assignment changed
    poll    <t>  <client>  <topic>  <partition>  <offset>  <value>  one record returned by poll

A value is ``<client>-<seq>``, unique per producer.  A ``fail`` is indeterminate: the record may
or may not be in the log.  An ``assign`` (its list may be empty) starts a consumer's polls afresh:
offsets read before it say nothing about the order of those after it.  The final drain reader is
the client ``drain``.  A field's tab, newline, carriage return and backslash are written as
``\\t``, ``\\n``, ``\\r`` and ``\\\\``; the reader keeps fields as written, so equal values compare
equal on both sides.

Invariant: only a file's last line may be incomplete (a client killed mid-write).  The writer
writes whole lines in one ``write`` per flush and, reopening a file whose last line is torn, cuts
that line first; the reader skips a torn or malformed last line and counts it, and refuses any
other malformed line with the file and line number.

:class:`HistoryWriter` is shared by a client's threads (send callbacks run on the producer's I/O
thread).  :func:`read_histories` reads a whole directory into a :class:`History` whose events are
kept per topic in typed arrays, values interned to dense ids, so that the checker can hand them
to numpy without copying: about 75 bytes a line (a value's string and its index weigh most; four
lines a record), so a 30-minute campaign's ten million lines take well under 1 GB.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from array import array
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["ACKED", "FAILED", "INVOKED", "Assignment", "History", "HistoryError", "HistoryWriter",
           "TopicHistory", "read_histories"]

logger = logging.getLogger(__name__)

#: flags per value id in :attr:`TopicHistory.flags`
INVOKED, ACKED, FAILED = 1, 2, 4

_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})
_MAX_ERROR_TEXTS = 200  # distinct fail texts kept per topic; the rest are counted as "(other)"


class HistoryError(ValueError):
    """A history file that cannot be read: the message names the file and the line."""


def _field(value: Any) -> str:
    return str(value).translate(_ESCAPES)


def _assignment_text(assignment: Iterable[Any] | str) -> str:
    if isinstance(assignment, str):
        return _field(assignment)
    parts = []
    for item in assignment:
        if isinstance(item, str):
            parts.append(item)
        else:
            topic, partition = item
            parts.append(f"{topic}:{int(partition)}")
    return _field(",".join(parts))


class HistoryWriter:
    """Appends events to one history file.  Thread-safe; buffered: lines go to the file when
    ``buffer_lines`` are waiting, when ``flush_interval_s`` has passed since the last write to
    the file (checked at each event), at :meth:`flush` and at :meth:`close`.  Each method takes
    the fields of its line in order, the time ``t`` defaulting to now."""

    def __init__(self, path: str | os.PathLike, *, buffer_lines: int = 2000, flush_interval_s: float = 0.5):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._buffer_lines = buffer_lines
        self._flush_interval_s = flush_interval_s
        self._lock = threading.Lock()
        self._pending: list[str] = []
        self._fd: int | None = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._cut_torn_tail()
        self._flushed_at = time.monotonic()

    def _cut_torn_tail(self) -> None:
        size = os.fstat(self._fd).st_size
        if size == 0:
            return
        with open(self.path, "rb") as f:
            f.seek(max(0, size - 65536))
            tail = f.read()
        if tail.endswith(b"\n"):
            return
        cut = tail.rfind(b"\n")
        keep = size - len(tail) + cut + 1 if cut >= 0 else (0 if size <= len(tail) else None)
        if keep is None:
            raise HistoryError(f"{self.path}: last line longer than 64 KiB and torn; not appending to it")
        logger.warning("%s: cutting a torn last line of %d bytes before appending", self.path, size - keep)
        os.ftruncate(self._fd, keep)

    def _add(self, line: str) -> None:
        with self._lock:
            if self._fd is None:
                raise ValueError(f"{self.path}: history writer is closed")
            self._pending.append(line)
            if (len(self._pending) >= self._buffer_lines
                    or time.monotonic() - self._flushed_at >= self._flush_interval_s):
                self._write_pending()

    def _write_pending(self) -> None:
        self._flushed_at = time.monotonic()
        if not self._pending:
            return
        data = "".join(self._pending).encode("utf-8")
        self._pending.clear()
        view = memoryview(data)
        while view:
            written = os.write(self._fd, view)
            view = view[written:]

    def invoke(self, client: str, topic: str, value: str, *, t: float | None = None) -> None:
        self._add(f"invoke\t{time.time() if t is None else t!r}\t{_field(client)}\t{_field(topic)}"
                  f"\t{_field(value)}\n")

    def ack(self, client: str, topic: str, partition: int, offset: int, value: str, *,
            t: float | None = None) -> None:
        self._add(f"ack\t{time.time() if t is None else t!r}\t{_field(client)}\t{_field(topic)}"
                  f"\t{int(partition)}\t{int(offset)}\t{_field(value)}\n")

    def fail(self, client: str, topic: str, value: str, error: str, *, t: float | None = None) -> None:
        self._add(f"fail\t{time.time() if t is None else t!r}\t{_field(client)}\t{_field(topic)}"
                  f"\t{_field(value)}\t{_field(error)}\n")

    def assign(self, client: str, assignment: Iterable[Any] | str, *, t: float | None = None) -> None:
        """``assignment``: ``(topic, partition)`` pairs (a ``TopicPartition`` is one), strings
        ``"topic:partition"``, or the whole list as one such comma-separated string."""
        self._add(f"assign\t{time.time() if t is None else t!r}\t{_field(client)}"
                  f"\t{_assignment_text(assignment)}\n")

    def poll(self, client: str, topic: str, partition: int, offset: int, value: str, *,
             t: float | None = None) -> None:
        self._add(f"poll\t{time.time() if t is None else t!r}\t{_field(client)}\t{_field(topic)}"
                  f"\t{int(partition)}\t{int(offset)}\t{_field(value)}\n")

    def flush(self) -> None:
        with self._lock:
            if self._fd is not None:
                self._write_pending()

    def close(self) -> None:
        """Writes what is buffered and closes the file; idempotent."""
        with self._lock:
            if self._fd is None:
                return
            try:
                self._write_pending()
            finally:
                os.close(self._fd)
                self._fd = None

    def __enter__(self) -> HistoryWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass
class TopicHistory:
    """One topic's events.  Values are interned: ``values[i]`` is the value of id ``i`` and
    ``flags[i]`` its :data:`INVOKED` / :data:`ACKED` / :data:`FAILED` bits.  The ``ack_*``
    arrays hold one entry per ack line, the ``poll_*`` arrays one per poll line, in file order
    (so each client's polls keep their order); ``poll_stream`` indexes :attr:`History.streams`
    and ``poll_epoch`` counts that stream's ``assign`` lines before the poll."""

    topic: str
    values: list[str] = field(default_factory=list)
    value_ids: dict[str, int] = field(default_factory=dict)
    flags: bytearray = field(default_factory=bytearray)
    invokes: int = 0
    ack_time: array = field(default_factory=lambda: array("d"))
    ack_partition: array = field(default_factory=lambda: array("q"))
    ack_offset: array = field(default_factory=lambda: array("q"))
    ack_value: array = field(default_factory=lambda: array("q"))
    fail_time: array = field(default_factory=lambda: array("d"))
    fail_value: array = field(default_factory=lambda: array("q"))
    fail_errors: Counter = field(default_factory=Counter)
    poll_time: array = field(default_factory=lambda: array("d"))
    poll_stream: array = field(default_factory=lambda: array("q"))
    poll_epoch: array = field(default_factory=lambda: array("q"))
    poll_partition: array = field(default_factory=lambda: array("q"))
    poll_offset: array = field(default_factory=lambda: array("q"))
    poll_value: array = field(default_factory=lambda: array("q"))

    def value_id(self, value: str) -> int:
        vid = self.value_ids.get(value)
        if vid is None:
            vid = self.value_ids[value] = len(self.values)
            self.values.append(value)
            self.flags.append(0)
        return vid


@dataclass(frozen=True)
class Assignment:
    """One ``assign`` line: ``partitions`` are ``(topic, partition)`` pairs."""

    t: float
    client: str
    stream: int
    partitions: tuple[tuple[str, int], ...]


@dataclass
class History:
    """Every history file of a directory.  A poll *stream* is one client in one file (a client
    started again under the same name in another file starts a new stream): ``streams[i]`` is
    its client name."""

    topics: dict[str, TopicHistory] = field(default_factory=dict)
    streams: list[str] = field(default_factory=list)
    assignments: list[Assignment] = field(default_factory=list)
    files: int = 0
    lines: int = 0
    torn_lines: int = 0
    torn_files: list[str] = field(default_factory=list)
    start_s: float | None = None
    end_s: float | None = None

    def topic(self, name: str) -> TopicHistory:
        th = self.topics.get(name)
        if th is None:
            th = self.topics[name] = TopicHistory(name)
        return th

    def _span(self, first: float, last: float) -> None:
        self.start_s = first if self.start_s is None else min(self.start_s, first)
        self.end_s = last if self.end_s is None else max(self.end_s, last)


def _parse_assignment(text: str) -> tuple[tuple[str, int], ...]:
    if not text:
        return ()
    pairs = []
    for item in text.split(","):
        topic, colon, partition = item.rpartition(":")
        if not colon or not topic:
            raise ValueError(f"assignment item {item!r} is not topic:partition")
        pairs.append((topic, int(partition)))
    return tuple(pairs)


def read_histories(directory: str | os.PathLike) -> History:
    """Reads every regular file of ``directory`` (names starting with a dot skipped), in name
    order, into one :class:`History`.  Raises :class:`HistoryError` for a malformed line that is
    not its file's last."""
    directory = Path(directory)
    if not directory.is_dir():
        raise HistoryError(f"{directory}: no such history directory")
    history = History()
    for path in sorted(p for p in directory.iterdir() if p.is_file() and not p.name.startswith(".")):
        _read_file(path, history)
    return history


def _read_file(path: Path, history: History) -> None:
    history.files += 1
    streams: dict[str, int] = {}  # client -> stream id, in this file
    stream_names = history.streams
    epoch_of: dict[int, int] = {}  # stream id -> assign lines seen so far
    topics = history.topics
    first_t = last_t = None
    pending_error: str | None = None
    lineno = 0
    with open(path, encoding="utf-8", errors="replace", newline="\n") as f:
        for line in f:
            lineno += 1
            if pending_error is not None:
                raise HistoryError(pending_error)
            if not line.endswith("\n"):
                pending_error = f"{path}:{lineno}: torn line {line[:80]!r}"
                break
            fields = line[:-1].split("\t")
            kind = fields[0]
            try:
                t = float(fields[1])
                if kind == "poll" or kind == "ack":
                    _, _, client, topic, partition, offset, value = fields
                    th = topics.get(topic) or history.topic(topic)
                    vid = th.value_ids.get(value)
                    if vid is None:
                        vid = th.value_id(value)
                    if kind == "poll":
                        sid = streams.get(client)
                        if sid is None:
                            sid = streams[client] = len(stream_names)
                            stream_names.append(client)
                            epoch_of[sid] = 0
                        th.poll_partition.append(int(partition))
                        th.poll_offset.append(int(offset))
                        th.poll_value.append(vid)
                        th.poll_time.append(t)
                        th.poll_stream.append(sid)
                        th.poll_epoch.append(epoch_of[sid])
                    else:
                        th.ack_partition.append(int(partition))
                        th.ack_offset.append(int(offset))
                        th.ack_value.append(vid)
                        th.ack_time.append(t)
                        th.flags[vid] |= ACKED
                elif kind == "invoke":
                    _, _, client, topic, value = fields
                    th = topics.get(topic) or history.topic(topic)
                    th.invokes += 1
                    th.flags[th.value_id(value)] |= INVOKED
                elif kind == "fail":
                    if len(fields) < 6:
                        raise ValueError(f"{len(fields)} fields, fail needs 6")
                    _, _, client, topic, value = fields[:5]
                    error = "\t".join(fields[5:])
                    th = topics.get(topic) or history.topic(topic)
                    vid = th.value_id(value)
                    th.flags[vid] |= FAILED
                    th.fail_value.append(vid)
                    th.fail_time.append(t)
                    if error in th.fail_errors or len(th.fail_errors) < _MAX_ERROR_TEXTS:
                        th.fail_errors[error] += 1
                    else:
                        th.fail_errors["(other)"] += 1
                elif kind == "assign":
                    _, _, client, text = fields
                    sid = streams.get(client)
                    if sid is None:
                        sid = streams[client] = len(stream_names)
                        stream_names.append(client)
                        epoch_of[sid] = 0
                    else:
                        epoch_of[sid] += 1
                    history.assignments.append(Assignment(t, client, sid, _parse_assignment(text)))
                else:
                    raise ValueError(f"unknown kind {kind!r}")
            except (ValueError, IndexError) as e:
                pending_error = f"{path}:{lineno}: malformed {kind!r} line ({e}): {line[:200]!r}"
                continue
            if first_t is None:
                first_t = t
            last_t = t
    history.lines += lineno
    if pending_error is not None:
        history.torn_lines += 1
        history.lines -= 1
        history.torn_files.append(path.name)
        logger.warning("%s", pending_error.replace(": torn line", ": skipping torn last line", 1))
    if first_t is not None:
        history._span(first_t, last_t)

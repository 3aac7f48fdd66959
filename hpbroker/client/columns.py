"""Records as columns: what a consumer made with ``columns=`` hands out instead of record objects.

A :class:`~hpbroker.client.consumer.Consumer` built with ``columns=("timestamp", "value")`` (any
of :data:`COLUMNS`) decodes each fetch response with the compiled columnar decoder
(``hpbroker._columnar.ColumnBuilder``, the one behind the Spark data source) and its ``poll()``
returns one :class:`RecordColumns` per partition: the records of the response as numpy arrays
over a few buffers, built without a Python object per record.  That is the fast path for
applications that process records in bulk (counting, parsing fixed-layout values, handing them to
numpy, pandas or Arrow); record objects (the default) stay the convenient one.

Layout (Apache Arrow's, little-endian; ``n`` records):

==============  ================================================================================
attribute       what
==============  ================================================================================
``offsets``     int64[n], always present (the consumer's position follows it)
``timestamps``  int64[n], ms since the epoch
``producers``   :class:`BinaryColumn` of UTF-8 names (the producer of each record's batch)
``keys``        :class:`BinaryColumn`, null where a record has no key
``values``      :class:`BinaryColumn`, null where a record has no value (a tombstone)
``headers``     :class:`HeadersColumn`
==============  ================================================================================

A :class:`BinaryColumn` is ``offsets`` (int32[n + 1]: item *i* is ``data[offsets[i]:offsets[i +
1]]``), ``data`` (uint8) and a validity bitmap (bit *i* set: item *i* is not null).  A column not
asked for is None.  Every array is a read-only view of buffers that belong to this object alone:
nothing else writes them, and they live as long as any view of them does (``array.copy()`` gives
one to write).

Nothing here loops over records in Python except the per-item conveniences (``column[i]``,
``to_list()``), which are for tests and small results.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from hpbroker._columnar import COLUMNS, ColumnBuilder

__all__ = ["COLUMNS", "BinaryColumn", "HeadersColumn", "RecordColumns", "check_columns", "new_builder"]

# A builder never stops a fetch response short on these: a response is at most 64 MiB of batches
# and the decoder's byte bound is 1 GiB, which only lz4 batches inflating over 16:1 can reach
# (the fetcher then re-fetches from where the decoder stopped).
_BUILDER_MAX_RECORDS = 1 << 40
_BUILDER_MAX_BYTES = (1 << 31) // 2 - 1


def check_columns(columns: Iterable[str]) -> tuple[str, ...]:
    """The columns to decode, in schema order, ``offset`` always included; ValueError for a
    name not in :data:`COLUMNS` or none at all."""
    if isinstance(columns, str):
        raise ValueError(f"columns must be a sequence of names, not the string {columns!r}: "
                         f"e.g. ({columns!r},)")
    wanted = set(columns)
    unknown = wanted - set(COLUMNS)
    if unknown:
        raise ValueError(f"unknown columns {sorted(unknown)}; known: {', '.join(COLUMNS)}")
    if not wanted:
        raise ValueError(f"columns is empty: name at least one of {', '.join(COLUMNS)}")
    wanted.add("offset")
    return tuple(name for name in COLUMNS if name in wanted)


def new_builder(columns: Iterable[str]) -> ColumnBuilder:
    """A decoder for one fetcher: it fills ``columns`` (checked by :func:`check_columns`)."""
    return ColumnBuilder(check_columns(columns), max_records=_BUILDER_MAX_RECORDS,
                         max_bytes=_BUILDER_MAX_BYTES)


class BinaryColumn:
    """A column of byte strings (or UTF-8 text): ``offsets``, ``data``, ``validity``.  Read only."""

    __slots__ = ("_text", "_validity", "data", "null_count", "offsets")

    def __init__(self, offsets: bytearray, data: bytearray, validity: bytearray | None = None,
                 null_count: int = 0, *, text: bool = False) -> None:
        self.offsets: np.ndarray = _read_only(offsets, "<i4")  # n + 1
        self.data: np.ndarray = _read_only(data, np.uint8)
        self._validity = validity
        self.null_count = null_count
        self._text = text

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __repr__(self) -> str:
        return f"BinaryColumn({len(self)} items, {len(self.data)} bytes, {self.null_count} null)"

    @property
    def lengths(self) -> np.ndarray:
        """int32[n]: each item's length in bytes (0 for a null)."""
        return np.diff(self.offsets)

    @property
    def valid(self) -> np.ndarray:
        """bool[n]: True where the item is not null."""
        n = len(self)
        if self._validity is None or self.null_count == 0:
            return np.ones(n, dtype=bool)
        bits = np.unpackbits(np.frombuffer(self._validity, dtype=np.uint8), bitorder="little")
        return bits[:n].astype(bool)

    def __getitem__(self, i: int) -> bytes | str | None:
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"item {i} of a column of {n}")
        i %= n
        if self.null_count and self._validity is not None and not self._validity[i >> 3] & (1 << (i & 7)):
            return None
        item = self.data[self.offsets[i]:self.offsets[i + 1]].tobytes()
        return item.decode("utf-8") if self._text else item

    def to_list(self) -> list[Any]:
        """Every item as bytes (str for text), None for a null: one Python object each."""
        return [self[i] for i in range(len(self))]


class HeadersColumn:
    """Each record's headers: record *i* has headers ``offsets[i]`` to ``offsets[i + 1]`` of the
    flat ``keys`` (UTF-8) and ``values`` (bytes, null for a header without a value)."""

    __slots__ = ("keys", "offsets", "values")

    def __init__(self, offsets: bytearray, keys: BinaryColumn, values: BinaryColumn) -> None:
        self.offsets: np.ndarray = _read_only(offsets, "<i4")
        self.keys = keys
        self.values = values

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __repr__(self) -> str:
        return f"HeadersColumn({len(self)} records, {len(self.keys)} headers)"

    def __getitem__(self, i: int) -> tuple[tuple[str, bytes | None], ...]:
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"record {i} of {n}")
        i %= n
        return tuple((self.keys[h], self.values[h]) for h in range(self.offsets[i], self.offsets[i + 1]))

    def to_list(self) -> list[tuple[tuple[str, bytes | None], ...]]:
        return [self[i] for i in range(len(self))]


class RecordColumns:
    """The records of one partition from one fetch response, as columns (module docstring)."""

    __slots__ = ("headers", "keys", "offsets", "partition", "producers", "timestamps", "topic", "values")

    def __init__(self, topic: str, partition: int, taken: dict[str, Any]) -> None:
        """Wrap what ``ColumnBuilder.take()`` returned (its buffers become this object's)."""
        self.topic = topic
        self.partition = partition
        self.offsets: np.ndarray = _read_only(taken["offset"], "<i8")
        self.timestamps: np.ndarray | None = (_read_only(taken["timestamp"], "<i8")
                                              if "timestamp" in taken else None)
        self.producers = _binary(taken, "producer", text=True)
        self.keys = _binary(taken, "key")
        self.values = _binary(taken, "value")
        self.headers = None
        if "headers_offsets" in taken:
            self.headers = HeadersColumn(taken["headers_offsets"], _binary(taken, "header_key", text=True),
                                         _binary(taken, "header_value"))

    def __len__(self) -> int:
        return len(self.offsets)

    def __repr__(self) -> str:
        span = f"offsets {self.offsets[0]}..{self.offsets[-1]}" if len(self) else "empty"
        return f"RecordColumns({self.topic}-{self.partition}, {len(self)} records, {span})"

    @property
    def next_offset(self) -> int:
        """The offset after the last record (where the consumer's position moves)."""
        if not len(self):
            raise ValueError("no records")
        return int(self.offsets[-1]) + 1


def _read_only(buffer: bytearray, dtype: Any) -> np.ndarray:
    array = np.frombuffer(buffer, dtype=dtype)
    array.flags.writeable = False
    return array


def _binary(taken: dict[str, Any], name: str, *, text: bool = False) -> BinaryColumn | None:
    if name + "_offsets" not in taken:
        return None
    return BinaryColumn(taken[name + "_offsets"], taken[name + "_data"], taken.get(name + "_validity"),
                        taken.get(name + "_nulls", 0), text=text)

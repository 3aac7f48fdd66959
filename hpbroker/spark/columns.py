"""Columns of records as Arrow arrays: the compiled decoder's buffers wrapped, not copied.

:class:`~hpbroker._columnar.ColumnBuilder` (compiled) decodes record batches into plain buffers
laid out as Arrow lays out its arrays; :func:`record_batch` wraps them with ``pyarrow`` into one
``pyarrow.RecordBatch`` of the record schema (:data:`RECORD_FIELDS`), adding the columns that
are the same for every record of a partition (``topic``, ``partition``).  Nothing here loops over
records.  pyarrow only; no Spark.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from hpbroker._columnar import COLUMNS, ColumnBuilder

__all__ = ["ARROW_TYPES", "COLUMNS", "RECORD_FIELDS", "ColumnBuilder", "arrow_schema", "record_batch"]

#: The record schema, Spark's DDL beside each column: what the data source returns.
RECORD_FIELDS = (
    ("topic", "string"),
    ("partition", "int"),
    ("offset", "bigint"),
    ("timestamp", "timestamp"),  # UTC, ms precision (Arrow: timestamp[us, tz=UTC])
    ("producer", "string"),
    ("key", "binary"),
    ("value", "binary"),
    ("headers", "array<struct<key:string,value:binary>>"),
)

_HEADER_TYPE = pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())])
#: Each column's Arrow type, as Spark's Arrow conversion expects it (timestamps in µs, UTC;
#: 32-bit offsets; list elements named "element").
ARROW_TYPES = {
    "topic": pa.string(),
    "partition": pa.int32(),
    "offset": pa.int64(),
    "timestamp": pa.timestamp("us", tz="UTC"),
    "producer": pa.string(),
    "key": pa.binary(),
    "value": pa.binary(),
    "headers": pa.list_(pa.field("element", _HEADER_TYPE)),
}


def arrow_schema(columns: tuple[str, ...] | list[str]) -> pa.Schema:
    """The Arrow schema of ``columns`` (names of :data:`RECORD_FIELDS`), every field nullable."""
    return pa.schema([pa.field(name, ARROW_TYPES[name]) for name in columns])


def record_batch(taken: dict[str, Any], topic: str, partition: int, schema: pa.Schema) -> pa.RecordBatch:
    """The records of one :meth:`ColumnBuilder.take` as a RecordBatch of ``schema`` (whose fields
    are record columns in any order, each typed as ``schema`` says: Spark's own conversion of the
    DDL may name a list's element differently)."""
    n = taken["count"]
    arrays = []
    for field in schema:
        arrays.append(_column(field.name, field.type, taken, n, topic, partition))
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def _column(name: str, arrow_type: pa.DataType, taken: dict[str, Any], n: int, topic: str,
            partition: int) -> pa.Array:
    if name == "topic":
        encoded = topic.encode("utf-8")
        offsets = np.arange(n + 1, dtype=np.int32) * np.int32(len(encoded))
        return pa.Array.from_buffers(arrow_type, n, [None, pa.py_buffer(offsets), pa.py_buffer(encoded * n)])
    if name == "partition":
        numbers = np.full(n, partition, dtype=np.int32)
        return pa.Array.from_buffers(arrow_type, n, [None, pa.py_buffer(numbers)])
    if name == "offset":
        return pa.Array.from_buffers(arrow_type, n, [None, pa.py_buffer(taken["offset"])])
    if name == "timestamp":
        micros = np.frombuffer(taken["timestamp"], dtype=np.int64)
        micros *= 1000  # ms -> µs, in place (the bytearray is ours alone)
        return pa.Array.from_buffers(arrow_type, n, [None, pa.py_buffer(taken["timestamp"])])
    if name == "producer":
        return pa.Array.from_buffers(arrow_type, n, [None, pa.py_buffer(taken["producer_offsets"]),
                                                     pa.py_buffer(taken["producer_data"])])
    if name in ("key", "value"):
        return _binary(arrow_type, n, taken, name)
    if name == "headers":
        element_type = arrow_type.value_type
        count = taken["header_count"]
        keys = pa.Array.from_buffers(element_type.field("key").type, count, [
            None, pa.py_buffer(taken["header_key_offsets"]), pa.py_buffer(taken["header_key_data"])])
        values = _binary(element_type.field("value").type, count, taken, "header_value")
        elements = pa.StructArray.from_arrays([keys, values], fields=list(element_type))
        return pa.Array.from_buffers(arrow_type, n, [None, pa.py_buffer(taken["headers_offsets"])],
                                     children=[elements])
    raise ValueError(f"no record column {name!r}; known: {', '.join(n for n, _ in RECORD_FIELDS)}")


def _binary(arrow_type: pa.DataType, n: int, taken: dict[str, Any], prefix: str) -> pa.Array:
    nulls = taken[prefix + "_nulls"]
    validity = pa.py_buffer(taken[prefix + "_validity"]) if nulls else None
    return pa.Array.from_buffers(arrow_type, n, [validity, pa.py_buffer(taken[prefix + "_offsets"]),
                                                 pa.py_buffer(taken[prefix + "_data"])], null_count=nulls)

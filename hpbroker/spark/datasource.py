"""``spark.read.format("hpbroker")``: a PySpark Python data source reading hpbroker topics.

::

    df = (spark.read.format("hpbroker")
          .option("bootstrap", "127.0.0.1:9092")
          .option("topic", "orders,payments")
          .option("startingOffsets", "earliest")       # or latest, or {"orders": {"0": 42}}
          .option("endingOffsets", "latest")
          .load())

**Schema** (:data:`RECORD_SCHEMA`): ``topic string, partition int, offset bigint, timestamp
timestamp, producer string, key binary, value binary, headers array<struct<key string, value
binary>>``.  ``timestamp`` is the record's timestamp as a Spark timestamp (UTC, exact to the ms:
``unix_millis(timestamp)`` gives the stored ms back); ``producer`` the name in the record's batch
header.  Option ``columns`` (``"topic,producer,timestamp"``), or a user schema naming some of
these fields (``.schema("producer string, timestamp timestamp")``), reads only those columns:
the others are never decoded nor shipped to the JVM.

**Options** (names as in Spark's Kafka source where there is one):

=====================  ==========================================================================
``bootstrap``          the broker's front-end, ``host:port`` (default ``$HPBROKER_BOOTSTRAP``,
                       else ``127.0.0.1:9092``)
``topic``              one topic or several, comma-separated (required)
``startingOffsets``    ``earliest`` (default), ``latest``, or JSON ``{"topic": {"0": 42, "1": -2}}``
                       (-2 earliest, -1 latest; partitions left out start at the earliest)
``endingOffsets``      ``latest`` (default), ``earliest``, or JSON as above (exclusive ends;
                       partitions left out end at the latest)
``startingTimestamp``  instead of ``startingOffsets``: ms since the epoch or ISO 8601; each
                       partition starts at its first record whose timestamp is at least that
``endingTimestamp``    instead of ``endingOffsets``: each partition ends before its first record
                       whose timestamp is at least that (later records with earlier timestamps
                       lie past the end: filter on ``timestamp`` for an exact time range)
``maxRecordsPerSplit`` offsets one Spark task reads at most; longer ranges are split (default
                       2000000)
``columns``            the columns to read, comma-separated (default all)
``failOnDataLoss``     ``true`` (default): a range starting below the log start (retention
                       deleted it) fails the read; ``false``: read on from the log start
``fetchMaxBytes``      bytes one fetch asks for (default 1048576)
``fetchVia``           ``data_port`` (default): fetch over the TCP data ports (``sendfile``; in
                       the clear, also with security on); ``frontend``: through the broker's
                       ZeroMQ front-end, CurveZMQ-encrypted when the broker has security on, at
                       a cost (docs/SECURITY.md, "What it costs")
``keyFile``            a broker with ``security = "curve"``: the client's secret key file
                       (default ``$HPBROKER_CLIENT_KEY_FILE``); read on the driver, the keys
                       travel to the executors with the plan
``serverKeyFile``      the broker's public key file (default ``$HPBROKER_CLIENT_SERVER_KEY_FILE``)
``clientConfig``       a client config file naming both (default ``$HPBROKER_CLIENT_CONFIG``)
``recordsPerBatch``    records per Arrow batch handed to Spark (default 65536)
``timeoutMs``          how long a task may keep failing to reach the partition (default 30000)
=====================  ==========================================================================

**Partitioning.**  One Spark partition (task) per topic partition and offset range, ranges
longer than ``maxRecordsPerSplit`` cut into even pieces: the read scales with the executors.

**A snapshot.**  The offsets are resolved once, when Spark plans the read (the DataFrame's first
action); later actions of the same DataFrame read the same ranges, and records appended meanwhile
are not read.  A new ``load()`` takes a new snapshot.

Each task fetches its range over the partition's TCP data port (``sendfile`` from the segment
files; or, with ``fetchVia`` ``frontend``, through the front-end) and decodes it in compiled
code into Arrow batches (``hpbroker.spark.reading``); nothing is done per record in Python.
Register with ``spark.dataSource.register(HPBrokerDataSource)``, or
use ``hpbroker.spark.session()``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from hpbroker.client.frontend_fetcher import FETCH_VIAS
from hpbroker.errors import InvalidConfigError
from hpbroker.security.client import resolve_client_security
from hpbroker.spark.planning import OffsetRange, OffsetSpec, parse_offsets, plan_read
from hpbroker.spark.reading import ReadConfig, read_range
from hpbroker.timestamps import parse_time_ms

__all__ = ["RECORD_SCHEMA", "HPBrokerDataSource", "HPBrokerReader", "ReadOptions"]

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"
DEFAULT_MAX_RECORDS_PER_SPLIT = 2_000_000

#: Every column the source can return, in this order.
RECORD_SCHEMA = StructType([
    StructField("topic", StringType()),
    StructField("partition", IntegerType()),
    StructField("offset", LongType()),
    StructField("timestamp", TimestampType()),
    StructField("producer", StringType()),
    StructField("key", BinaryType()),
    StructField("value", BinaryType()),
    StructField("headers", ArrayType(StructType([StructField("key", StringType()),
                                                 StructField("value", BinaryType())]))),
])
_TYPES = {field.name: field.dataType for field in RECORD_SCHEMA.fields}


class ReadOptions:
    """The source's options, parsed and checked (ValueError names the option)."""

    def __init__(self, options: Mapping[str, str]) -> None:
        get = {key.lower(): value for key, value in options.items()}.get
        self.bootstrap = get("bootstrap") or os.environ.get("HPBROKER_BOOTSTRAP", DEFAULT_BOOTSTRAP)
        self.topics = [t.strip() for t in (get("topic") or get("topics") or "").split(",") if t.strip()]
        if not self.topics:
            raise ValueError("option topic is required: one topic, or several separated by commas")
        self.starting = _spec(get("startingoffsets"), get("startingtimestamp"), "earliest", "starting")
        self.ending = _spec(get("endingoffsets"), get("endingtimestamp"), "latest", "ending")
        self.max_records_per_split = _int(get("maxrecordspersplit"), DEFAULT_MAX_RECORDS_PER_SPLIT,
                                          "maxRecordsPerSplit", 1)
        columns = get("columns")
        self.columns = None if not columns else [c.strip() for c in columns.split(",") if c.strip()]
        if self.columns is not None:
            unknown = [c for c in self.columns if c not in _TYPES]
            if unknown or not self.columns:
                raise ValueError(f"option columns {columns!r}: unknown {unknown}; known: {', '.join(_TYPES)}")
        defaults = ReadConfig()
        fail = (get("failondataloss") or "true").strip().lower()
        if fail not in ("true", "false"):
            raise ValueError(f"option failOnDataLoss {fail!r}: expected true or false")
        try:
            security = resolve_client_security(key_file=get("keyfile"), server_key_file=get("serverkeyfile"),
                                               config_file=get("clientconfig"))
        except InvalidConfigError as e:
            raise ValueError(f"options keyFile, serverKeyFile, clientConfig: {e.message}") from None
        fetch_via = (get("fetchvia") or "data_port").strip().lower()
        if fetch_via not in FETCH_VIAS:
            raise ValueError(f"option fetchVia {fetch_via!r}: expected {' or '.join(FETCH_VIAS)}")
        self.read_config = ReadConfig(
            fetch_max_bytes=_int(get("fetchmaxbytes"), defaults.fetch_max_bytes, "fetchMaxBytes", 1024),
            records_per_batch=_int(get("recordsperbatch"), defaults.records_per_batch, "recordsPerBatch", 1),
            timeout_ms=_int(get("timeoutms"), defaults.timeout_ms, "timeoutMs", 1),
            fail_on_data_loss=fail == "true", security=security, fetch_via=fetch_via)


def _spec(offsets: str | None, timestamp: str | None, default: str, what: str) -> OffsetSpec:
    if offsets and timestamp:
        raise ValueError(f"options {what}Offsets and {what}Timestamp exclude each other")
    if timestamp:
        return OffsetSpec("timestamp", timestamp_ms=parse_time_ms(timestamp, f"option {what}Timestamp"))
    return parse_offsets(offsets, default, f"option {what}Offsets")


def _int(text: str | None, default: int, name: str, low: int) -> int:
    if text is None or not str(text).strip():
        return default
    try:
        value = int(str(text).strip())
    except ValueError:
        raise ValueError(f"option {name} {text!r}: expected an integer") from None
    if value < low:
        raise ValueError(f"option {name} must be >= {low}, got {value}")
    return value


class HPBrokerDataSource(DataSource):
    """The ``hpbroker`` format (module docstring)."""

    @classmethod
    def name(cls) -> str:
        return "hpbroker"

    def schema(self) -> StructType:
        columns = ReadOptions(self.options).columns
        if columns is None:
            return RECORD_SCHEMA
        return StructType([field for field in RECORD_SCHEMA.fields if field.name in columns])

    def reader(self, schema: StructType) -> HPBrokerReader:
        return HPBrokerReader(schema, ReadOptions(self.options))


class _Split(InputPartition):
    """One Spark partition: an offset range (None: the read is empty)."""

    def __init__(self, value: OffsetRange | None) -> None:
        super().__init__(value)


class HPBrokerReader(DataSourceReader):
    """Plans the splits on the driver, reads each on an executor."""

    def __init__(self, schema: StructType, options: ReadOptions) -> None:
        for field in schema.fields:
            expected = _TYPES.get(field.name)
            if expected is None or field.dataType != expected:
                raise ValueError(f"schema field {field.name} {field.dataType.simpleString()}: the hpbroker "
                                 f"source returns {RECORD_SCHEMA.simpleString()} (any subset of these "
                                 "fields)")
        self.schema = schema
        self.options = options

    def partitions(self) -> list[InputPartition]:
        options = self.options
        splits = plan_read(options.bootstrap, options.topics, options.starting, options.ending,
                           options.max_records_per_split, timeout_ms=options.read_config.timeout_ms,
                           security=options.read_config.security)
        return [_Split(split) for split in splits] or [_Split(None)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        split = partition.value
        if split is None:
            return
        schema = to_arrow_schema(self.schema, timezone="UTC")
        yield from read_range(self.options.bootstrap, split, schema, self.options.read_config)

"""Reading one split: its offset range fetched raw over the data port, decoded into Arrow batches.

What a Spark task runs (``hpbroker.spark.datasource``), and what tests and benchmarks can run
without Spark::

    data port --sendfile--> PartitionFetcher(raw=True): framing and CRCs checked
              --> ColumnBuilder (compiled): records of [start, end) into column buffers
              --> pyarrow.RecordBatch (hpbroker.spark.columns), every records_per_batch records

- **The range.**  A fetch starts at the batch holding the offset asked for, so the first batch
  may begin before the range: its earlier records are checked, not kept; a batch across the
  range's end keeps the records before it.  The fetcher pipelines (the next fetch is on the wire
  while a response is decoded) and the read ends once a response reaches ``end``.
- **Offsets without records** (none today: logs are never compacted) are simply not there: the
  range's records are those stored with offsets in it.
- **Data loss.**  When the range starts below the log start (retention deleted the segments),
  ``fail_on_data_loss`` (default) raises OffsetOutOfRangeError naming what is gone; otherwise
  the read goes on from the log start.
- **Corruption.**  A batch that fails its CRC, or whose records do not decode, raises
  CorruptRecordError naming topic, partition and offset, after the records before it.
- **Security.**  Against a broker with ``security = "curve"`` the metadata is asked as the
  CurveZMQ client ``ReadConfig.security`` (default: the environment's or client config file's,
  ``hpbroker.security.client.resolve_client_security``), and the data connection presents a
  fetch token asked over the same kind of connection (``hpbroker.client.fetch_tokens``).
- **The encrypted fetch path.**  With ``ReadConfig.fetch_via = "frontend"`` (the source's option
  ``fetchVia``) the split is fetched through the partition leader's ZeroMQ front-end
  (``hpbroker.client.frontend_fetcher``): CurveZMQ-encrypted when the broker has security on, no
  fetch token, no ``sendfile`` (docs/SECURITY.md, "What it costs").
- **Faults.**  A lost connection, or a partition not (yet) served, is retried with backoff
  (metadata asked again, in case the partition moved) until it has failed for ``timeout_ms``.
"""

from __future__ import annotations

import select
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa
import zmq

from hpbroker.client.connection import BrokerAddress, BrokerConnection, parse_bootstrap
from hpbroker.client.fetch_tokens import FetchTokens
from hpbroker.client.fetcher import CompletedFetch, FetchConfig, PartitionFetcher
from hpbroker.client.frontend_fetcher import FETCH_VIAS, FrontendConnections, FrontendFetcher
from hpbroker.client.metadata import ClusterMetadata
from hpbroker.errors import (
    BrokerNotAvailableError,
    CorruptRecordError,
    HPBrokerError,
    InvalidConfigError,
    OffsetOutOfRangeError,
    PartitionNotAvailableError,
    error_for_code,
)
from hpbroker.spark.columns import COLUMNS, ColumnBuilder, record_batch
from hpbroker.spark.planning import OffsetRange

if TYPE_CHECKING:
    from hpbroker.security.client import ClientSecurity

__all__ = ["ReadConfig", "read_range"]

_BACKOFF_S = (0.05, 0.1, 0.2, 0.5, 1.0)


@dataclass(frozen=True, slots=True)
class ReadConfig:
    """How a split is read; validated on construction."""

    #: bytes of batches one fetch asks for.  Default 1 MiB.
    fetch_max_bytes: int = 1 << 20
    #: records per Arrow batch handed to Spark (a batch may hold more: whole record batches are
    #: added at once).  Default 65536.
    records_per_batch: int = 65_536
    #: ms a split may keep failing (broker unreachable, partition not served) before it fails.
    timeout_ms: int = 30_000
    #: raise when the range starts below the log start (records deleted); else skip them.
    fail_on_data_loss: bool = True
    #: the client's key pair and the broker's public key; None: the environment's, if any.
    security: ClientSecurity | None = None
    #: where fetches go: "data_port" (the TCP data ports, sendfile) or "frontend" (the broker's
    #: ZeroMQ front-end, CurveZMQ-encrypted with security on).
    fetch_via: str = "data_port"

    def __post_init__(self) -> None:
        if self.fetch_via not in FETCH_VIAS:
            raise InvalidConfigError(f"fetch_via must be one of {FETCH_VIAS}, got {self.fetch_via!r}")
        for name, low in (("fetch_max_bytes", 1024), ("records_per_batch", 1), ("timeout_ms", 1)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise InvalidConfigError(f"{name} must be an integer >= {low}, got {value!r}")


def read_range(bootstrap: str, split: OffsetRange, schema: pa.Schema,
               config: ReadConfig | None = None) -> Iterator[pa.RecordBatch]:
    """The records of ``split`` as RecordBatches of ``schema`` (fields named after the record
    columns, ``hpbroker.spark.columns.RECORD_FIELDS``, in any order and number)."""
    config = config or ReadConfig()
    columns = [field.name for field in schema if field.name in COLUMNS]
    builder = ColumnBuilder(columns, max_records=config.records_per_batch)
    fetches = _RangeFetches(bootstrap, split, config)
    try:
        for fetch_offset, payload in fetches:
            position = 0
            while position < len(payload):
                try:
                    position = builder.add(payload, position, split.start, split.end, verify_crc=False)
                except CorruptRecordError as e:
                    raise _corrupt(split, fetch_offset, e) from None
                if builder.full:
                    yield record_batch(builder.take(), split.topic, split.partition, schema)
    finally:
        fetches.close()
    if builder.count:
        yield record_batch(builder.take(), split.topic, split.partition, schema)


def _corrupt(split: OffsetRange, fetch_offset: int, e: CorruptRecordError) -> CorruptRecordError:
    error = CorruptRecordError(f"corrupt record batch in {split.topic}-{split.partition}, in the response "
                               f"to a fetch from offset {fetch_offset}: {e.message}")
    error.topic, error.partition, error.offset = split.topic, split.partition, fetch_offset  # type: ignore[attr-defined]
    return error


class _RangeFetches:
    """The raw payloads of a split's fetches, ``(fetch_offset, payload)``, until ``end``; each
    payload holds until the next one is asked for."""

    def __init__(self, bootstrap: str, split: OffsetRange, config: ReadConfig) -> None:
        self.bootstrap = bootstrap
        self.split = split
        self.config = config
        self.fetch_config = FetchConfig(max_partition_fetch_bytes=config.fetch_max_bytes, fetch_max_wait_ms=0,
                                        request_timeout_ms=config.timeout_ms)
        self.fetcher: PartitionFetcher | None = None
        self.failing_since: float | None = None
        self.attempts = 0
        self.security = _security(config)
        self._token_connection: BrokerConnection | None = None  # what fetch tokens are asked over
        self._tokens = FetchTokens(self.security, self._connect_for_tokens,
                                   timeout_s=config.timeout_ms / 1000)
        self._frontends: FrontendConnections | None = None  # fetch_via "frontend"

    def __iter__(self) -> Iterator[tuple[int, memoryview | bytes]]:
        offset, end = self.split.start, self.split.end
        while offset < end:
            completed = self._fetch(offset)
            if completed is None:
                continue  # failed and backed off: try again
            if completed.payload:
                self.failing_since, self.attempts = None, 0
                yield offset, completed.payload
                offset = max(offset, completed.next_offset)
            if completed.error is not None:
                offset = self._after_error(offset, completed)
            elif not completed.payload:
                self._failed(BrokerNotAvailableError(
                    f"{self.split}: the partition holds no record at offset {offset} (high watermark "
                    f"{completed.high_watermark}, log start {completed.log_start_offset})"))

    def _fetch(self, offset: int) -> CompletedFetch | None:
        """The response to a fetch from ``offset`` (sent now unless already on its way), or None
        after a failure (backed off)."""
        try:
            fetcher = self.fetcher or self._connect()
            if fetcher.in_flight and fetcher.fetch_offset != offset:
                fetcher.disconnect()  # its answer is for another offset (after a skip)
            if not fetcher.in_flight:
                fetcher.fetch(offset)
            deadline = time.monotonic() + self.config.timeout_ms / 1000
            while True:
                _wait(fetcher, max(0.0, min(1.0, deadline - time.monotonic())))
                completed = fetcher.receive()
                if completed is not None:
                    assert isinstance(completed, CompletedFetch)
                    return completed
                if time.monotonic() > deadline:
                    raise BrokerNotAvailableError(f"no answer from {fetcher.host}:{fetcher.port} to "
                                                  f"{fetcher.waiting_for()}")
        except (OSError, HPBrokerError) as e:
            if isinstance(e, HPBrokerError) and not e.retriable:
                raise
            self._forget_fetcher()
            self._failed(e if isinstance(e, HPBrokerError) else BrokerNotAvailableError(
                f"{self.split}: data connection failed: {e}"))
            return None

    def _connect(self) -> PartitionFetcher:
        """A raw fetcher for the data port the metadata names for the partition now."""
        split = self.split
        metadata = ClusterMetadata.for_bootstrap(parse_bootstrap(self.bootstrap), client_id="hpbroker-spark",
                                                 connect_timeout_s=min(5.0, self.config.timeout_ms / 1000),
                                                 timeout_s=self.config.timeout_ms / 1000,
                                                 security=self.security)
        try:  # the first bootstrap address that answers
            info = metadata.partition(split.topic, split.partition, refresh=True)
            answered = metadata.connection.address
            if info.error_code == 0 and self.config.fetch_via == "frontend":
                leader = metadata.leader_address(split.topic, split.partition) or answered
        finally:
            metadata.close()
        if info.error_code or not info.fetch_port:
            raise error_for_code(info.error_code or PartitionNotAvailableError.code,
                                 f"{split.topic}-{split.partition} is not being served (error "
                                 f"{info.error_code})")
        if self.config.fetch_via == "frontend":
            if self._frontends is None:
                connect_timeout_s = min(5.0, self.config.timeout_ms / 1000)
                self._frontends = FrontendConnections(client_id="hpbroker-spark", security=self.security,
                                                      connect_timeout_s=connect_timeout_s)
            self.fetcher = FrontendFetcher(split.topic, split.partition, self._frontends, leader,
                                           self.fetch_config, "hpbroker-spark", raw=True)
            return self.fetcher
        token = None
        if self.security is not None:
            tokens = self._tokens
            token = lambda fresh=False: tokens.token_for(answered, fresh=fresh)  # noqa: E731
        self.fetcher = PartitionFetcher(split.topic, split.partition, info.host, info.fetch_port,
                                        self.fetch_config, "hpbroker-spark", raw=True, token=token)
        return self.fetcher

    def _connect_for_tokens(self, address: BrokerAddress) -> BrokerConnection:
        connection = self._token_connection
        if connection is None or connection.address != address:
            if connection is not None:
                connection.close()
            connection = self._token_connection = BrokerConnection(
                address, client_id="hpbroker-spark",
                connect_timeout_s=min(5.0, self.config.timeout_ms / 1000), security=self.security)
        return connection

    def _after_error(self, offset: int, completed: CompletedFetch) -> int:
        """Where to go on after a response that ended in an error (or raise it)."""
        error = completed.error
        assert error is not None
        if isinstance(error, OffsetOutOfRangeError) and offset < error.log_start_offset:
            if self.config.fail_on_data_loss:
                raise OffsetOutOfRangeError(
                    f"{self.split}: offsets {offset} up to {error.log_start_offset} are no longer stored "
                    f"(the log starts at {error.log_start_offset}); failOnDataLoss=false reads on from there",
                    error.log_start_offset, error.log_end_offset)
            return min(error.log_start_offset, self.split.end)
        if error.retriable and not isinstance(error, CorruptRecordError):
            self._forget_fetcher()
            self._failed(error)
            return offset
        raise error

    def _failed(self, error: HPBrokerError) -> None:
        """Back off before the next try, or raise ``error`` once failing for ``timeout_ms``."""
        now = time.monotonic()
        if self.failing_since is None:
            self.failing_since, self.attempts = now, 0
        self.attempts += 1
        if (now - self.failing_since) * 1000 >= self.config.timeout_ms:
            raise type(error)(f"{error.message}; gave up on {self.split} after {self.attempts} attempts in "
                              f"{now - self.failing_since:.1f} s")
        time.sleep(_BACKOFF_S[min(self.attempts, len(_BACKOFF_S)) - 1])

    def _forget_fetcher(self) -> None:
        if self.fetcher is not None:
            self.fetcher.close()
            self.fetcher = None

    def close(self) -> None:
        self._forget_fetcher()
        if self._frontends is not None:
            self._frontends.close()
            self._frontends = None
        if self._token_connection is not None:
            self._token_connection.close()
            self._token_connection = None


def _wait(fetcher: PartitionFetcher, timeout_s: float) -> None:
    """Sleep until ``fetcher``'s answer may have arrived, at most ``timeout_s``."""
    if not isinstance(fetcher, FrontendFetcher):
        select.select([fetcher], [], [], timeout_s)
    elif fetcher.in_flight and not fetcher.answered:
        poller = zmq.Poller()
        for pollable in fetcher.pollables():
            poller.register(pollable, zmq.POLLIN)
        poller.poll(int(timeout_s * 1000))


def _security(config: ReadConfig) -> ClientSecurity | None:
    if config.security is not None:
        return config.security
    from hpbroker.security.client import resolve_client_security

    return resolve_client_security()

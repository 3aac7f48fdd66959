"""The client library: what applications use to produce to and consume from hpbroker.

Public API (also importable from ``hpbroker``): :class:`Producer`, :class:`Consumer`,
:func:`create_message_streams`, :class:`TopicPartition`, :class:`ConsumerRecord`,
:class:`RecordMetadata`, :class:`RecordColumns`, :class:`Admin`.

Modules, one responsibility each (imports point down this list):

- ``connection``    one ZeroMQ request/response channel to a broker's front-end, by correlation id
- ``metadata``      topics, partitions and the data port serving each, refreshed on demand
                    (or without blocking, for the consumer's fetch loop)
- ``partitioner``   which partition a record goes to: a stable hash of the key, or spread evenly
- ``_accumulator``  compiled: per-partition batch building behind ``Producer.send``
- ``backoff``       the retry backoff formula
- ``producer_config`` the producer's settings (ProducerConfig) and RecordMetadata
- ``produce_request`` one partition's ProduceRequest until settled, and telling its records' outcomes
- ``idempotence``   the idempotent producer's rules: per-partition windows, the producer id's lifecycle
- ``idempotent_sending`` the producer I/O thread's idempotent half: InitProducerId, windows, outcomes
- ``appended_lookup`` without idempotence: whether an attempt of unknown outcome was appended
- ``producer``      the batching producer: linger, in-flight requests, retries, futures
- ``columns``       records as numpy columns (a consumer made with ``columns=``), decoded by the
                    compiled columnar decoder (``hpbroker._columnar``)
- ``fetcher``       fetches (and ListOffsets) over a worker's TCP data port, pipelined
- ``consumer``      the pulling consumer
- ``streams``       message streams: a topic's partitions spread over consumers, one per thread
- ``group``         consumer groups through ZooKeeper: rebalancing, the ownership lease, commits
                    (the one client module that imports ``hpbroker.coord`` and kazoo, loaded
                    only when a consumer is given ``group=``)
- ``admin``         create, list, describe and delete topics

The client uses the record format (``hpbroker.records``, ``hpbroker._columnar``), the protocol
(``hpbroker.protocol``), the errors, a client's keys (``hpbroker.security.client``, exported here
as ``ClientSecurity`` and ``resolve_client_security``) and, in ``group`` only, ``hpbroker.coord``;
it never imports storage (``hpbroker.io``) or broker code.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Producer": "hpbroker.client.producer",
    "RecordMetadata": "hpbroker.client.producer",
    "Consumer": "hpbroker.client.consumer",
    "ConsumerRecord": "hpbroker.client.consumer",
    "TopicPartition": "hpbroker.client.consumer",
    "RecordColumns": "hpbroker.client.columns",
    "create_message_streams": "hpbroker.client.streams",
    "Admin": "hpbroker.client.admin",
    "ClientSecurity": "hpbroker.security.client",
    "resolve_client_security": "hpbroker.security.client",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    """Import on first use, so ``import hpbroker`` stays cheap for storage and broker code."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'hpbroker.client' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)

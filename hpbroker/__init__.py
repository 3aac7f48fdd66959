"""hpbroker: a small-footprint Kafka-style log broker.

Layout (imports point down this list, never up):

- ``hpbroker.errors``   the exception table shared by every layer and the wire protocol
- ``hpbroker._core``    compiled record-batch core (Cython): build, scan, validate, decode
- ``hpbroker._columnar`` compiled: record batches decoded into Arrow-shaped column buffers
- ``hpbroker.records``  the public face of the record format over ``_core``
- ``hpbroker.io``       storage: segments, indexes and the partition log (no zmq, no kazoo)
- ``hpbroker.protocol`` the wire protocol, sans I/O: requests and responses to and from bytes
- ``hpbroker.client``   the client library: Producer, Consumer (protocol + records, never storage)
- ``hpbroker.metrics``  Prometheus metrics, sans broker: histogram, text format, HTTP endpoint
- ``hpbroker.broker``, ``hpbroker.workers``  the broker process: config, topics, arbiter, workers
- ``hpbroker.cli``      the ``hpbroker`` command

``Producer``, ``Consumer`` and the rest of ``hpbroker.client``'s public API are importable from
here too (loaded on first use).
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"


_CLIENT_API = frozenset({"Admin", "ClientSecurity", "Consumer", "ConsumerRecord", "Producer", "RecordColumns",
                         "RecordMetadata", "TopicPartition", "create_message_streams",
                         "resolve_client_security"})


def __getattr__(name: str) -> Any:
    if name in _CLIENT_API:
        import hpbroker.client

        return getattr(hpbroker.client, name)
    raise AttributeError(f"module 'hpbroker' has no attribute {name!r}")

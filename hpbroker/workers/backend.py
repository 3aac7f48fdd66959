"""The arbiter <-> worker framing on the backend socket, sans I/O.

The arbiter binds a ROUTER (with ``ROUTER_HANDOVER`` on, so a respawned worker takes over its
slot's identity); each worker connects a DEALER whose routing id is :func:`worker_identity`.
ZeroMQ adds and strips that identity frame on the arbiter's side.  After it, every message
starts with a one-byte *kind* frame:

``RELAY`` (``b"R"``), both ways: ``[b"R", client_identity, head, payload?]``
    A client's request on its way to the owning worker, or the worker's response on its way back.
    ``client_identity`` is the front-end ROUTER's routing id of the client; ``head`` and the
    optional ``payload`` are the protocol frames (``hpbroker.protocol``), relayed untouched.

``CONTROL`` (``b"C"``), both ways: ``[b"C", json]``
    One JSON object with an ``"op"``:

    - arbiter -> worker ``{"op": "open", "id": n, "partitions": [spec, ...]}``: open (creating
      if needed) these partitions; a *spec* is ``{"topic": str, "partition": int, "config":
      {LogConfig field: value}}``.
    - arbiter -> worker ``{"op": "delete", "id": n, "topic": str}``: close the topic's
      partitions this worker has open and delete their directories.
    - worker -> arbiter ``{"op": "ready", "slot": s, "pid": p}``: every partition the worker was
      started with is open (recovered) and it serves requests.
    - worker -> arbiter ``{"op": "ack", "id": n, "error": null | str}``: the control ``n`` is done.

Decoding is strict: anything else raises ``ValueError`` naming what was wrong (the receiving
process logs it and drops the message; only the broker's own processes speak here).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "CONTROL",
    "EXIT_BOOT_FAILED",
    "EXIT_OK",
    "RELAY",
    "Control",
    "PartitionSpec",
    "Relay",
    "decode",
    "encode_control",
    "encode_relay",
    "worker_identity",
]

RELAY = b"R"  # a client request or its response
CONTROL = b"C"  # arbiter <-> worker coordination, JSON

# Worker exit statuses the arbiter acts on (as gunicorn's): a worker that could not boot has its
# slot held back and retried with backoff (hpbroker.workers.slots) instead of respawned in a loop.
EXIT_OK = 0
EXIT_BOOT_FAILED = 3


def worker_identity(slot: int) -> bytes:
    """The backend routing id of the worker in ``slot``."""
    return b"w%d" % slot


@dataclass(frozen=True, slots=True)
class PartitionSpec:
    """A partition a worker must open, with its topic's log settings (LogConfig fields)."""

    topic: str
    partition: int
    config: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"topic": self.topic, "partition": self.partition, "config": dict(self.config)}

    @classmethod
    def from_json(cls, obj: Any) -> PartitionSpec:
        if not isinstance(obj, dict) or not isinstance(obj.get("topic"), str) \
                or not isinstance(obj.get("partition"), int) or not isinstance(obj.get("config", {}), dict):
            raise ValueError(f"not a partition spec: {obj!r}")
        return cls(obj["topic"], obj["partition"], dict(obj.get("config", {})))


@dataclass(frozen=True, slots=True)
class Relay:
    client: bytes
    frames: list[bytes | memoryview]  # the protocol message: [head] or [head, payload]


@dataclass(frozen=True, slots=True)
class Control:
    op: str
    body: dict[str, Any]


def encode_relay(client: bytes, frames: Sequence[bytes | memoryview]) -> list[bytes | memoryview]:
    return [RELAY, client, *frames]


def encode_control(op: str, **body: Any) -> list[bytes]:
    return [CONTROL, json.dumps({"op": op, **body}, separators=(",", ":")).encode("utf-8")]


def decode(frames: Sequence[Any]) -> Relay | Control:
    """Parse a backend message (without the ROUTER's identity frame).  Frames may be bytes,
    memoryviews or zmq.Frame objects (anything with the buffer protocol)."""
    if not frames:
        raise ValueError("empty backend message")
    kind = bytes(memoryview(frames[0]))
    if kind == RELAY:
        if not 3 <= len(frames) <= 4:
            raise ValueError(f"a relay message has 3 or 4 frames, got {len(frames)}")
        return Relay(bytes(memoryview(frames[1])), list(frames[2:]))
    if kind == CONTROL:
        if len(frames) != 2:
            raise ValueError(f"a control message has 2 frames, got {len(frames)}")
        try:
            body = json.loads(bytes(memoryview(frames[1])))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ValueError(f"control message is not JSON: {e}") from None
        if not isinstance(body, dict) or not isinstance(body.get("op"), str):
            raise ValueError(f"control message without an op: {body!r}")
        return Control(body.pop("op"), body)
    raise ValueError(f"unknown backend message kind {kind!r}")

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
      {LogConfig field: value}, "replicated": bool}`` (``replicated`` optional, default false:
      true for a replicated topic's partition, which then refuses every request with
      NotLeaderOrFollowerError until its first ``replica_role`` arrives).
    - arbiter -> worker ``{"op": "delete", "id": n, "topic": str}``: close the topic's
      partitions this worker has open and delete their directories.
    - arbiter -> worker ``{"op": "remove", "id": n, "topic": str, "partitions": [int, ...]}``:
      close these partitions and delete their directories (replicas moved to other brokers).
    - arbiter -> worker ``{"op": "replica_role", "id": n, "topic": t, "partition": p, "role":
      "leader" | "follower" | "none", "leader_epoch": E, "leader": broker_id (-1: none),
      "leader_address": [host, data_port] | null, "replicas": [broker_id, ...], "isr":
      [broker_id, ...], "min_insync_replicas": m, "replica_lag_time_max_ms": L, "leader_port":
      front_end_port | null}``: the partition's role in replication
      (``hpbroker.workers.replication``), sent after the partition is open and again after a
      slot respawns.  ``leader_address`` is the data port of the leader's worker that owns the
      partition (where a follower fetches); ``leader_port`` (optional, default null) the
      leader's front-end port, which a NotLeaderOrFollowerError names to clients (without it
      the error names the leader's broker id only).  Refused (the ack's error) when the epoch
      is older than the partition's current one, when the role names a broker that is not a
      replica, or when the leader's log cannot record the epoch; the same epoch as leader again
      updates the ISR, ``min_insync_replicas`` and ``replica_lag_time_max_ms`` (the arbiter
      sends it again when any of them changed).  A partition never given a role is unreplicated.
    - worker -> arbiter ``{"op": "isr_change", "topic": t, "partition": p, "leader_epoch": E,
      "isr": [broker_id, ...], "from_isr": [broker_id, ...]}``: the leader of a partition proposes
      a new ISR (a follower fell ``replica_lag_time_max_ms`` behind, or caught up), computed from
      the ISR ``from_isr``; not acknowledged: the arbiter writes it to ZooKeeper with a conditional
      update, only while the state still holds ``from_isr``, and the state written comes back as a
      ``replica_role`` of the same epoch.  At most one proposal per partition is outstanding;
      the leader proposes it again when no such role arrived within 5 s.
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
    """A partition a worker must open, with its topic's log settings (LogConfig fields).
    ``replicated``: the partition belongs to a replicated topic, so it serves nothing until the
    arbiter sends its role (``replica_role``)."""

    topic: str
    partition: int
    config: dict[str, Any] = field(default_factory=dict)
    replicated: bool = False

    def to_json(self) -> dict[str, Any]:
        obj = {"topic": self.topic, "partition": self.partition, "config": dict(self.config)}
        if self.replicated:
            obj["replicated"] = True
        return obj

    @classmethod
    def from_json(cls, obj: Any) -> PartitionSpec:
        if not isinstance(obj, dict) or not isinstance(obj.get("topic"), str) \
                or not isinstance(obj.get("partition"), int) or not isinstance(obj.get("config", {}), dict) \
                or not isinstance(obj.get("replicated", False), bool):
            raise ValueError(f"not a partition spec: {obj!r}")
        return cls(obj["topic"], obj["partition"], dict(obj.get("config", {})), obj.get("replicated", False))


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

"""An acks=all producer process for the network partition test: it can run inside a network
namespace (``ip netns exec``), where the test's own process is not.

    python acked_producer.py BOOTSTRAP TOPIC PARTITIONS NAME OUT STOP

Sends ``NAME <n>`` records round-robin over ``PARTITIONS`` (comma-separated partition numbers),
at most ``_WINDOW`` of them unsettled at a time and at most ``_RATE`` a second, until the file
``STOP`` exists or ``_MAX_RECORDS`` were sent; then waits
for the unsettled ones (at most ``_DRAIN_S``) and exits 0.  Every record that settles is one
JSON line in ``OUT``, written and flushed as it settles:
``{"value": str, "partition": p, "offset": o, "at": unix time}`` when acknowledged,
``{"value": str, "error": str, "at": unix time}`` when it failed.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time

from hpbroker.client import Producer

_WINDOW = 100  # records unsettled at once
_MAX_RECORDS = 20_000
_RATE = 1000  # records a second at most: the machine is shared
_DRAIN_S = 40.0
_SETTINGS = {"acks": "all", "request_timeout_ms": 2000, "delivery_timeout_ms": 60_000, "linger_ms": 5,
             "audit_topic": None}


def main(bootstrap: str, topic: str, partitions: list[int], name: str, out_path: str, stop_path: str) -> int:
    window = threading.BoundedSemaphore(_WINDOW)
    lock = threading.Lock()
    with open(out_path, "a", buffering=1) as out:
        def settled(value: str, future) -> None:
            error = future.exception()
            if error is None:
                metadata = future.result()
                line = {"value": value, "partition": metadata.partition, "offset": metadata.offset}
            else:
                line = {"value": value, "error": repr(error)}
            line["at"] = time.time()
            with lock:
                out.write(json.dumps(line) + "\n")
            window.release()

        producer = Producer(bootstrap, name=name, **_SETTINGS)
        try:
            sent, started = 0, time.monotonic()
            while sent < _MAX_RECORDS and not os.path.exists(stop_path):
                ahead_s = sent / _RATE - (time.monotonic() - started)
                if ahead_s > 0:
                    time.sleep(min(ahead_s, 0.1))
                    continue
                if not window.acquire(timeout=0.1):
                    continue
                value = f"{name} {sent}"
                partition = partitions[sent % len(partitions)]
                future = producer.send_future(topic, value.encode(), partition=partition)
                future.add_done_callback(lambda f, v=value: settled(v, f))
                sent += 1
            deadline = time.monotonic() + _DRAIN_S
            for _ in range(_WINDOW):
                if not window.acquire(timeout=max(0.0, deadline - time.monotonic())):
                    break
        finally:
            try:
                producer.close(timeout_s=5)
            except Exception as e:  # the records it failed are in OUT already
                print(f"closing the producer: {e!r}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    bootstrap, topic, partitions, name, out_path, stop_path = sys.argv[1:7]
    sys.exit(main(bootstrap, topic, [int(p) for p in partitions.split(",")], name, out_path, stop_path))

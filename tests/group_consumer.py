"""A consumer-group member as a process of its own, for the group tests.

    python tests/group_consumer.py '<json spec>'

The spec: ``bootstrap``, ``group``, ``topics``, ``zookeeper``, ``out`` (a file), optional
``settings`` (more Consumer settings by name) and ``delay_ms`` (a pause after each record, to
play a slow application).  Every record handed out becomes one JSON line in ``out``,
``{"p": partition, "o": offset, "t": monotonic time of the poll that returned it}`` (written and
flushed before the next poll), and each change of the assignment a line ``{"assignment":
[[topic, partition], ...], "t": ...}``.  SIGTERM closes the consumer (committing, with
auto-commit on) and exits 0.  The log goes to stderr.
"""

from __future__ import annotations

import json
import logging
import signal
import sys
import time

from hpbroker import Consumer


def main() -> int:
    spec = json.loads(sys.argv[1])
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(process)d %(name)s %(levelname)s %(message)s")
    stopping = []
    consumer = Consumer(spec["bootstrap"], group=spec["group"], topics=spec["topics"],
                        zookeeper=spec["zookeeper"], **spec.get("settings", {}))

    def stop(signum, frame):  # only flags: the loop closes the consumer
        stopping.append(signum)
        consumer.wakeup()

    signal.signal(signal.SIGTERM, stop)
    delay_s = spec.get("delay_ms", 0) / 1000
    assignment = None
    with open(spec["out"], "a", buffering=1) as out:
        try:
            while not stopping:
                batches = consumer.poll(timeout_ms=100)
                received = time.monotonic()
                lines = []
                for records in batches.values():
                    for record in records:
                        lines.append(json.dumps({"p": record.partition, "o": record.offset, "t": received}))
                        if delay_s:
                            out.write("\n".join(lines) + "\n")
                            out.flush()
                            lines = []
                            time.sleep(delay_s)
                if lines:
                    out.write("\n".join(lines) + "\n")
                    out.flush()
                now = sorted(consumer.assignment())
                if now != assignment:
                    assignment = now
                    out.write(json.dumps({"assignment": now, "t": time.monotonic()}) + "\n")
                    out.flush()
        finally:
            consumer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Runs an Arbiter whose workers are a small stand-in, for the arbiter's process tests.

Usage: ``python standin_broker.py SPEC_JSON`` where the spec is
``{"config": {BrokerConfig fields}, "modes": {"<slot>": mode}, "marker_dir": path}``.  Modes of a
slot's stand-in worker:

- ``"normal"`` (default): connect, heartbeat, report ready, answer every relayed request with a
  canned response naming its slot and pid, acknowledge every control, stop on SIGTERM;
- ``"boot_fail"``: exit with EXIT_BOOT_FAILED at once;
- ``"boot_fail_while_marked"``: exit with EXIT_BOOT_FAILED at once while the file
  ``<marker_dir>/boot_fail-<slot>`` exists, else normal;
- ``"silent_once"``: the first process in the slot reports ready but never heartbeats; its
  successors are normal;
- ``"crash_after_ready"``: report ready, then exit with status 1;
- ``"no_acks"``: never acknowledge a control;
- ``"never_ready_once"``: the first process in the slot never reports ready;
- ``"stubborn_once"``: the first process in the slot ignores SIGABRT and never heartbeats;
- ``"ignore_term"``: ignore SIGTERM (only SIGKILL stops it).

Each worker also accepts connections on its data listener and writes ``slot=S pid=P\\n`` to them.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import time

import zmq

from hpbroker import protocol
from hpbroker.broker.config import BrokerConfig
from hpbroker.io import LogConfig
from hpbroker.workers import backend
from hpbroker.workers.arbiter import Arbiter
from hpbroker.workers.heartbeat import write_heartbeat


def standin_worker(modes, marker_dir):
    def run(slot, config, partitions, data_listener, backend_address, run_dir):
        mode = modes.get(str(slot), "normal")
        if mode == "boot_fail_while_marked":
            marked = os.path.exists(os.path.join(marker_dir, f"boot_fail-{slot}"))
            mode = "boot_fail" if marked else "normal"
        if mode == "boot_fail":
            print(f"[worker slot={slot}] cannot open partitions: stand-in boot failure", file=sys.stderr)
            return backend.EXIT_BOOT_FAILED
        first = False
        if mode.endswith("_once"):
            marker = os.path.join(marker_dir, f"{mode}-{slot}")
            first = not os.path.exists(marker)
            open(marker, "w").close()
        silent = first and mode in ("silent_once", "stubborn_once")
        if first and mode == "stubborn_once":
            signal.signal(signal.SIGABRT, signal.SIG_IGN)
        stop = []
        signal.signal(signal.SIGTERM, signal.SIG_IGN if mode == "ignore_term" else lambda *_: stop.append(1))
        held = {(p.topic, p.partition): 0 for p in partitions}
        context = zmq.Context()
        dealer = context.socket(zmq.DEALER)
        dealer.setsockopt(zmq.IDENTITY, backend.worker_identity(slot))
        dealer.setsockopt(zmq.LINGER, 1000)
        dealer.connect(backend_address)
        data_listener.setblocking(False)

        def heartbeat():
            if not silent:
                write_heartbeat(run_dir, slot, ready=True, partitions=[
                    {"topic": t, "partition": p, "log_start_offset": 0, "high_watermark": n}
                    for (t, p), n in held.items()])

        heartbeat()
        if not (first and mode == "never_ready_once"):
            dealer.send_multipart(backend.encode_control("ready", slot=slot, pid=os.getpid()))
        if mode == "crash_after_ready":
            time.sleep(0.05)
            return 1
        last_beat = time.monotonic()
        while not stop:
            if dealer.poll(20):
                message = backend.decode(dealer.recv_multipart())
                if isinstance(message, backend.Relay):
                    answer(dealer, slot, held, message)
                elif mode != "no_acks":
                    if message.op == "open":
                        held.update({(p["topic"], p["partition"]): 0 for p in message.body["partitions"]})
                    elif message.op == "delete":
                        held = {k: n for k, n in held.items() if k[0] != message.body["topic"]}
                    dealer.send_multipart(backend.encode_control("ack", id=message.body["id"], error=None))
            try:
                connection, _ = data_listener.accept()
                connection.sendall(b"slot=%d pid=%d\n" % (slot, os.getpid()))
                connection.close()
            except BlockingIOError:
                pass
            if time.monotonic() - last_beat >= config.heartbeat_interval_ms / 1000:
                heartbeat()
                last_beat = time.monotonic()
        dealer.close()
        context.term()
        return backend.EXIT_OK

    return run


def answer(dealer, slot, held, relay):
    header, request = protocol.decode_request(relay.frames)
    key = (request.topic, request.partition)
    if key not in held:
        response, code = protocol.RESPONSE_TYPES[header.api_key](), 6
    elif header.api_key == protocol.ApiKey.PRODUCE:
        held[key] += 1
        response, code = protocol.ProduceResponse(base_offset=slot, log_start_offset=os.getpid()), 0
    elif header.api_key == protocol.ApiKey.FETCH:
        response, code = protocol.FetchResponse(high_watermark=slot, log_start_offset=os.getpid()), 0
    else:
        response, code = protocol.ListOffsetsResponse(offset=slot), 0
    if header.api_key == protocol.ApiKey.PRODUCE and request.acks == 0:
        return
    frames = protocol.encode_response(response, header.correlation_id, code, version=header.api_version)
    dealer.send_multipart(backend.encode_relay(relay.client, frames))


def main():
    spec = json.loads(sys.argv[1])
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    config_fields = dict(spec["config"])
    log = LogConfig(**config_fields.pop("log", {}))
    config = BrokerConfig(**config_fields, log=log)
    worker = standin_worker(spec.get("modes", {}), spec.get("marker_dir", "."))
    arbiter = Arbiter(config, worker_main=worker)
    return arbiter.run()


if __name__ == "__main__":
    sys.exit(main())

"""A real ``hpbroker serve`` for benchmarks: free ports on loopback, its log next to its data."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import zmq

from hpbroker import protocol
from hpbroker.client import ClientSecurity

__all__ = ["free_port_block", "running_broker"]


def free_port_block(count: int) -> int:
    """A base port with ``count`` consecutive free ports after it (best effort)."""
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            base = probe.getsockname()[1]
        if base + count >= 65535:
            continue
        held = []
        try:
            for port in range(base, base + count):
                s = socket.socket()
                held.append(s)
                s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for s in held:
                s.close()
    raise RuntimeError("no block of free ports")


@contextmanager
def running_broker(root: Path, *, workers: int = 2, config_toml: str | None = None,
                   security: ClientSecurity | None = None) -> Iterator[int]:
    """Run a broker with its data under ``root`` until the block ends; yields its front-end port
    once it answers (the data ports follow it).  ``security``: the key it is asked with, for a
    broker whose ``config_toml`` turns security on."""
    base = free_port_block(workers + 1)
    argv = [sys.executable, "-m", "hpbroker.cli", "serve", "--host", "127.0.0.1", "--port", str(base),
            "--fetch-port", str(base + 1), "--workers", str(workers), "--data-dir", str(root / "data")]
    if config_toml is not None:
        (root / "broker.toml").write_text(config_toml)
        argv += ["--config", str(root / "broker.toml")]
    with open(root / "broker.log", "wb") as log:
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        try:
            _wait_until_answering(base, process, security)
            yield base
        finally:
            process.terminate()
            process.wait(timeout=60)


def _wait_until_answering(port: int, process: subprocess.Popen, security: ClientSecurity | None,
                          timeout_s: float = 30.0) -> None:
    context = zmq.Context()
    dealer = context.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    if security is not None:
        security.apply(dealer)
    dealer.connect(f"tcp://127.0.0.1:{port}")
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            dealer.send_multipart(protocol.encode_request(protocol.MetadataRequest([]), 1, "bench"))
            if dealer.poll(500):
                dealer.recv_multipart()
                return
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the broker did not start (exit status {process.poll()})")
    finally:
        dealer.close()
        context.term()

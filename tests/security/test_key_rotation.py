"""Rotating a key under the same name cuts the old key off (a real secured broker): the
identity of a connection is its key's name *and* fingerprint.  After ``alice``'s key is replaced
by a new one named ``alice`` and the broker is sent SIGHUP, a connection made with the old key
is answered 27 on the front-end, a fetch token minted for the old key is refused at the data
port, and the new key is served on both."""

from __future__ import annotations

import shutil
import signal
import socket

import zmq.auth
from curve_probe import Probe, secured_broker
from harness import wait_until

from hpbroker import protocol


def _data_request(sock: socket.socket, message: protocol.Message, correlation_id: int = 1):
    for frame in protocol.frame_tcp(protocol.encode_request(message, correlation_id, "rotation")):
        sock.sendall(bytes(frame))
    decoder = protocol.TcpFrameDecoder(1 << 20)
    sock.settimeout(10)
    while True:
        data = sock.recv(65536)
        if not data:
            return None  # closed
        messages = decoder.feed(data)
        if messages:
            return protocol.decode_response(message.API_KEY, messages[0])


def _authenticate(port: int, token: str):
    with socket.create_connection(("127.0.0.1", port)) as sock:
        return _data_request(sock, protocol.AuthenticateRequest(token))


def test_rotating_a_key_under_the_same_name_cuts_the_old_key_off(tmp_path):
    with secured_broker(tmp_path, super_users="alice", workers=1) as broker:
        keys = broker.keys
        old = broker.probe("alice")  # the old key: think of it as leaked
        header, old_token = old.ask(protocol.FetchTokenRequest())
        assert header.error_code == 0 and old_token.principal == "alice"
        metadata = old.ask(protocol.MetadataRequest([]))[1]
        data_port = metadata.brokers[0].fetch_port
        header, _ = _authenticate(data_port, old_token.token)
        assert header.error_code == 0  # served before the rotation

        # The rotation: a new key pair under the same name replaces the old one; SIGHUP.
        rotated = tmp_path / "rotated"
        rotated.mkdir()
        zmq.auth.create_certificates(str(rotated), "alice")
        shutil.copy(rotated / "alice.key", keys.allowlist / "alice.key")
        broker.process.process.send_signal(signal.SIGHUP)
        broker.process.wait_for_log(r"allowlist reloaded: 3 keys; added alice; removed alice")

        # The old key's open connection: 27, and no more tokens.
        header, _ = old.ask(protocol.FetchTokenRequest())
        assert header.error_code == 27
        assert "no longer on the broker's allowlist" in header.error_message
        assert old.ask(protocol.MetadataRequest([]))[0].error_code == 27
        # Its token, minted before the rotation and not expired, is refused at the data port
        # (once the worker has the new state).
        wait_until(lambda: (_authenticate(data_port, old_token.token) or (None,))[0].error_code == 27,
                   10, interval_s=0.1, what="the old key's token refused at the data port")

        # The new key is served on both.
        new = Probe(broker.context, broker.port, broker.server_key,
                    zmq.auth.load_certificate(str(rotated / "alice.key_secret")))
        new.metadata()
        header, new_token = new.ask(protocol.FetchTokenRequest())
        assert header.error_code == 0 and new_token.principal == "alice"
        header, response = _authenticate(data_port, new_token.token)
        assert header.error_code == 0 and response.principal == "alice"
        for probe in (old, new):
            probe.close()

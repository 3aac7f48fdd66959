"""MetricsServer: GET /metrics and /healthz on a thread of its own; bad paths, failures and slow
clients never stop it."""

from __future__ import annotations

import contextlib
import http.client
import socket
import threading
import time

import pytest

from hpbroker.metrics import CONTENT_TYPE, MetricsServer


@pytest.fixture
def served():
    state = {"text": "# TYPE hpb_up gauge\nhpb_up 1\n", "healthy": (True, "ok: 2 of 2 workers serving"),
             "renders": 0}

    def render() -> str:
        state["renders"] += 1
        if isinstance(state["text"], Exception):
            raise state["text"]
        return state["text"]

    server = MetricsServer("127.0.0.1", 0, render, lambda: state["healthy"], timeout_s=0.5,
                           request_timeout_s=1.0, max_clients=2)
    server.start()
    try:
        yield server, state
    finally:
        server.close()


def get(server: MetricsServer, path: str, method: str = "GET") -> tuple[int, dict[str, str], bytes]:
    connection = http.client.HTTPConnection(*server.address, timeout=5)
    try:
        connection.request(method, path)
        response = connection.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        connection.close()


def test_metrics_are_served_with_the_exposition_content_type(served):
    server, _ = served
    status, headers, body = get(server, "/metrics")
    assert status == 200
    assert headers["Content-Type"] == CONTENT_TYPE == "text/plain; version=0.0.4; charset=utf-8"
    assert body == b"# TYPE hpb_up gauge\nhpb_up 1\n"
    assert int(headers["Content-Length"]) == len(body)
    assert get(server, "/metrics?name[]=hpb_up")[2] == body  # Prometheus may add parameters


def test_other_paths_are_404_other_methods_501_and_the_server_goes_on(served):
    server, state = served
    assert get(server, "/metric")[0] == 404
    assert get(server, "/../etc/passwd")[0] == 404
    assert get(server, "/metrics", method="POST")[0] == 501
    assert get(server, "/")[0] == 200
    before = state["renders"]
    assert get(server, "/metrics")[0] == 200
    assert state["renders"] == before + 1


def test_healthz_says_503_while_unhealthy(served):
    server, state = served
    assert get(server, "/healthz")[:3:2] == (200, b"ok: 2 of 2 workers serving\n")
    state["healthy"] = (False, "1 of 2 workers serving")
    assert get(server, "/healthz")[:3:2] == (503, b"1 of 2 workers serving\n")


def test_a_failing_render_answers_500_and_the_next_scrape_works(served):
    server, state = served
    text = state["text"]
    state["text"] = RuntimeError("boom")
    assert get(server, "/metrics")[0] == 500
    state["text"] = text
    assert get(server, "/metrics")[0] == 200


def scrape_when_a_slot_frees(server: MetricsServer, timeout_s: float = 30) -> int:
    """The status of the first scrape served: beyond max_clients a connection is closed
    unanswered until a slot frees.  ``timeout_s`` is generous: the behaviour is under test, not
    how fast a loaded machine gets there."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return get(server, "/metrics")[0]
        except (ConnectionError, http.client.HTTPException):
            assert time.monotonic() < deadline, "no slot freed"
            time.sleep(0.05)


def test_silent_clients_are_dropped_and_never_stop_a_scrape(served):
    server, _ = served
    silent = [socket.create_connection(server.address) for _ in range(2)]  # max_clients, saying nothing
    try:
        assert scrape_when_a_slot_frees(server) == 200
        for sock in silent:
            sock.settimeout(30)
            assert sock.recv(1) == b""  # closed by the server (timeout_s 0.5), not by the test
    finally:
        for sock in silent:
            sock.close()


def closed_by_the_server(sock: socket.socket) -> bool:
    try:
        return sock.recv(1024, socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except ConnectionError:
        return True


def test_clients_trickling_their_request_are_dropped_at_the_request_deadline(served):
    server, _ = served
    trickling = [socket.create_connection(server.address) for _ in range(2)]  # max_clients
    request = b"GET /metrics HTTP/1.0\r\nX-Padding: " + b"x" * 300 + b"\r\n\r\n"
    try:
        sent = 0
        while not all(closed_by_the_server(sock) for sock in trickling):
            assert sent < len(request), "the whole request was sent: no deadline dropped the clients"
            for sock in trickling:  # a byte every 0.1 s: never silent for timeout_s (0.5 s)
                with contextlib.suppress(OSError):
                    sock.send(request[sent:sent + 1])
            sent += 1
            time.sleep(0.1)
        assert scrape_when_a_slot_frees(server) == 200
    finally:
        for sock in trickling:
            sock.close()


def test_a_request_sent_slowly_but_in_time_is_answered(served):
    server, _ = served
    with socket.create_connection(server.address) as sock:
        for piece in (b"GET /metr", b"ics HTTP/1.0\r\n", b"Host: x\r\n", b"\r\n"):
            sock.sendall(piece)
            time.sleep(0.05)
        sock.settimeout(10)
        answer = sock.makefile("rb").read()
    assert answer.startswith(b"HTTP/1.0 200 ") and answer.endswith(b"hpb_up 1\n")


def test_many_scrapes_at_once_all_get_an_answer_or_a_closed_connection(served):
    server, _ = served
    results: list[object] = []

    def scrape() -> None:
        try:
            results.append(get(server, "/metrics")[0])
        except (ConnectionError, http.client.HTTPException) as e:
            results.append(type(e))

    threads = [threading.Thread(target=scrape) for _ in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert len(results) == 20 and 200 in results
    assert get(server, "/metrics")[0] == 200


def test_a_port_in_use_fails_in_the_constructor():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(OSError):
            MetricsServer("127.0.0.1", taken.getsockname()[1], lambda: "")


def test_close_releases_the_port():
    server = MetricsServer("127.0.0.1", 0, lambda: "")
    server.start()
    port = server.address[1]
    server.close()
    server.close()
    again = MetricsServer("127.0.0.1", port, lambda: "")
    again.close()

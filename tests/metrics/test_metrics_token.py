"""The metrics endpoint's bearer token: /metrics only for a request that presents it; /healthz
stays open; the token file's errors are clear."""

from __future__ import annotations

import http.client
import os

import pytest

from hpbroker.errors import InvalidConfigError
from hpbroker.metrics import MetricsServer
from hpbroker.metrics.server import load_metrics_token

TOKEN = "0123456789abcdef0123456789abcdef"


@pytest.fixture
def guarded():
    renders = []

    def render() -> str:
        renders.append(1)
        return "# TYPE hpb_up gauge\nhpb_up 1\n"

    server = MetricsServer("127.0.0.1", 0, render, timeout_s=2, token=TOKEN)
    server.start()
    try:
        yield server, renders
    finally:
        server.close()


def get(server: MetricsServer, path: str, headers: dict[str, str] | None = None):
    connection = http.client.HTTPConnection(*server.address, timeout=5)
    try:
        connection.request("GET", path, headers=headers or {})
        response = connection.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        connection.close()


def test_metrics_need_the_bearer_token(guarded):
    server, renders = guarded
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Bearer {TOKEN}x"},
                    {"Authorization": f"Basic {TOKEN}"}, {"Authorization": TOKEN},
                    {"Authorization": f"Bearer {TOKEN[:-1]}"}):
        status, response_headers, body = get(server, "/metrics", headers)
        assert status == 401, headers
        assert response_headers["WWW-Authenticate"] == 'Bearer realm="hpbroker"'
        assert b"hpb_up" not in body
    assert renders == []  # nothing was rendered for them
    status, _, body = get(server, "/metrics", {"Authorization": f"Bearer {TOKEN}"})
    assert status == 200 and body == b"# TYPE hpb_up gauge\nhpb_up 1\n"
    assert get(server, "/metrics", {"Authorization": f"bearer  {TOKEN} "})[0] == 200  # scheme any case


def test_health_stays_open_with_a_token(guarded):
    server, _ = guarded
    assert get(server, "/healthz")[0] == 200


def test_without_a_token_metrics_are_open_as_before():
    server = MetricsServer("127.0.0.1", 0, lambda: "hpb_up 1\n")
    server.start()
    try:
        assert get(server, "/metrics")[0] == 200
        assert get(server, "/metrics", {"Authorization": "Bearer anything"})[0] == 200
    finally:
        server.close()


def test_load_metrics_token(tmp_path):
    path = tmp_path / "token"
    path.write_text(f"  {TOKEN}\n")
    assert load_metrics_token(path) == TOKEN
    with pytest.raises(InvalidConfigError, match="no such file"):
        load_metrics_token(tmp_path / "missing")
    for content, message in (("", "empty"), ("\n  \n", "empty"), ("short", "at least 16"),
                             ("has a space in the middle", "printable ASCII without spaces"),
                             (f"{TOKEN}\n{TOKEN}\n", "printable ASCII without spaces"),
                             ("x" * 5000, "larger than")):
        path.write_text(content)
        with pytest.raises(InvalidConfigError, match=message) as raised:
            load_metrics_token(path)
        assert str(path) in str(raised.value)
    if os.geteuid() != 0:
        path.write_text(TOKEN)
        path.chmod(0)
        with pytest.raises(InvalidConfigError, match="cannot read it"):
            load_metrics_token(path)


def test_a_brokers_metrics_endpoint_takes_its_token_from_metrics_token_file(tmp_path):
    from hpbroker.broker.config import BrokerConfig
    from hpbroker.workers.exporter import MetricsEndpoint

    (tmp_path / "metrics.token").write_text(TOKEN + "\n")
    config = BrokerConfig(data_dir=str(tmp_path), host="127.0.0.1",
                          metrics_token_file=str(tmp_path / "metrics.token"))
    endpoint = MetricsEndpoint(config, str(tmp_path), dict)
    try:
        endpoint.start()
        host, port = endpoint.address
        connection = http.client.HTTPConnection(host, port, timeout=5)
        try:
            connection.request("GET", "/metrics")
            assert connection.getresponse().status == 401
        finally:
            connection.close()
        connection = http.client.HTTPConnection(host, port, timeout=5)
        try:
            connection.request("GET", "/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
            response = connection.getresponse()
            assert response.status == 200 and b"hpbroker_" in response.read()
        finally:
            connection.close()
    finally:
        endpoint.close()
    (tmp_path / "metrics.token").write_text("")
    with pytest.raises(InvalidConfigError, match="metrics token file .*: empty"):
        MetricsEndpoint(config, str(tmp_path), dict)

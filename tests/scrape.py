"""Scraping a broker's /metrics in tests: fetch, parse strictly (Prometheus text format 0.0.4), look up."""

from __future__ import annotations

import http.client
import math
import re
from collections import defaultdict
from dataclasses import dataclass

_SAMPLE = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\[\\"n])*)"(?:,|$)')
_UNESCAPE = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}


@dataclass
class Scrape:
    """Samples by (series name, labels); the TYPE of each family."""

    samples: dict[tuple[str, frozenset[tuple[str, str]]], float]
    types: dict[str, str]

    def series(self, name: str, **labels: object) -> dict[frozenset[tuple[str, str]], float]:
        """Every series of ``name`` whose labels include ``labels``."""
        wanted = {(k, str(v)) for k, v in labels.items()}
        return {key: value for (n, key), value in self.samples.items() if n == name and wanted <= key}

    def value(self, name: str, **labels: object) -> float | None:
        """The one series of ``name`` with exactly these labels, or None."""
        return self.samples.get((name, frozenset((k, str(v)) for k, v in labels.items())))

    def total(self, name: str, **labels: object) -> float:
        return sum(self.series(name, **labels).values())


def get(port: int, path: str = "/metrics", host: str = "127.0.0.1") -> tuple[int, dict[str, str], str]:
    connection = http.client.HTTPConnection(host, port, timeout=10)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        return response.status, dict(response.getheaders()), response.read().decode()
    finally:
        connection.close()


def scrape(port: int) -> Scrape:
    status, headers, text = get(port)
    assert status == 200, (status, text)
    assert headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
    return parse(text)


def parse(text: str) -> Scrape:
    """The exposition, checked: HELP and TYPE once per family and before its samples, every line
    well formed, no series twice, histograms cumulative with +Inf equal to _count."""
    helps: set[str] = set()
    types: dict[str, str] = {}
    samples: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
    assert text.endswith("\n")
    for line in text[:-1].split("\n"):
        if line.startswith("# HELP "):
            name = line.split(" ")[2]
            assert name not in helps, f"HELP of {name} twice"
            helps.add(name)
        elif line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            assert name in helps and name not in types, line
            types[name] = kind
        else:
            match = _SAMPLE.fullmatch(line)
            assert match, f"malformed sample line {line!r}"
            name, label_text, value = match.groups()
            family = name
            if family not in types:
                family = re.sub(r"_(bucket|sum|count)$", "", name)
            assert types.get(family) is not None, f"{name} before its TYPE"
            labels = _labels(label_text or "")
            key = (name, frozenset(labels.items()))
            assert key not in samples, f"series {line!r} twice"
            samples[key] = float(value)
    _check_histograms(samples, types)
    return Scrape(samples, types)


def _labels(text: str) -> dict[str, str]:
    labels: dict[str, str] = {}
    position = 0
    while position < len(text):
        match = _LABEL.match(text, position)
        assert match, f"malformed labels {text!r}"
        value = re.sub(r"\\[\\\"n]", lambda m: _UNESCAPE[m.group(0)], match.group(2))
        assert match.group(1) not in labels
        labels[match.group(1)] = value
        position = match.end()
    return labels


def _check_histograms(samples, types) -> None:
    buckets: dict[tuple[str, frozenset], list[tuple[float, float]]] = defaultdict(list)
    for (name, labels), value in samples.items():
        if name.endswith("_bucket") and types.get(name[:-7]) == "histogram":
            le = dict(labels)["le"]
            buckets[name[:-7], frozenset(kv for kv in labels if kv[0] != "le")].append(
                (math.inf if le == "+Inf" else float(le), value))
    for (family, labels), found in buckets.items():
        found.sort()
        counts = [count for _, count in found]
        assert counts == sorted(counts), f"{family} buckets are not cumulative"
        assert found[-1][0] == math.inf and found[-1][1] == samples[f"{family}_count", labels]
        assert (f"{family}_sum", labels) in samples

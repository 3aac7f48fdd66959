"""``--plot FILE``: throughput and latency over time as a self-contained SVG (or HTML page).

No plotting library and nothing fetched: the SVG is written by hand, two panels over the run's
timeline (records/s produced, acknowledged and consumed; produce-ack and end-to-end latency p50
and p99 in ms, on a log scale).  ``.html`` wraps the same SVG with the report's headline figures.
"""

from __future__ import annotations

import html
import math
from pathlib import Path

__all__ = ["render_svg", "write_plot"]

_WIDTH, _PANEL_HEIGHT, _LEFT, _RIGHT, _TOP, _BOTTOM = 900, 260, 80, 170, 30, 40
_THROUGHPUT = [("produced_per_s", "produced", "#1f77b4"), ("acked_per_s", "acknowledged", "#aec7e8"),
               ("consumed_per_s", "consumed", "#2ca02c")]
_LATENCY = [("ack_p50_ms", "ack p50", "#ff7f0e"), ("ack_p99_ms", "ack p99", "#d62728"),
            ("e2e_p50_ms", "e2e p50", "#9467bd"), ("e2e_p99_ms", "e2e p99", "#8c564b")]


def _nice_ceiling(value: float) -> float:
    if value <= 0:
        return 1.0
    magnitude = 10 ** math.floor(math.log10(value))
    for step in (1, 2, 2.5, 5, 10):
        if value <= step * magnitude:
            return step * magnitude
    return 10 * magnitude


def _format_count(value: float) -> str:
    for unit, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= size:
            return f"{value / size:g}{unit}"
    return f"{value:g}"


def _panel(rows: list[dict], series: list[tuple[str, str, str]], y0: int, title: str, log: bool) -> list[str]:
    width = _WIDTH - _LEFT - _RIGHT
    height = _PANEL_HEIGHT - _TOP - _BOTTOM
    top = y0 + _TOP
    out = [f'<text x="{_LEFT}" y="{y0 + 18}" font-size="14" font-weight="bold">{html.escape(title)}</text>',
           f'<rect x="{_LEFT}" y="{top}" width="{width}" height="{height}" fill="none" stroke="#888"/>']
    t_max = max((r["t_s"] for r in rows), default=1.0) or 1.0
    values = [r[key] for r in rows for key, _, _ in series if r.get(key) is not None and r[key] > 0]
    if log:
        low = 10 ** math.floor(math.log10(min(values))) if values else 0.01
        high = 10 ** math.ceil(math.log10(max(values))) if values else 1.0
        high = max(high, low * 10)

        def y_of(v: float) -> float:
            span = math.log10(high) - math.log10(low)
            return top + height * (1 - (math.log10(v) - math.log10(low)) / span)

        decades = range(round(math.log10(low)), round(math.log10(high)) + 1)
        labels = [(10.0 ** d, f"{10.0 ** d:g}") for d in decades]
    else:
        high = _nice_ceiling(max(values, default=1.0))

        def y_of(v: float) -> float:
            return top + height * (1 - v / high)

        labels = [(high * i / 4, _format_count(high * i / 4)) for i in range(5)]
    for value, label in labels:
        y = y_of(value) if value > 0 or not log else top + height
        out.append(f'<line x1="{_LEFT}" y1="{y:.1f}" x2="{_LEFT + width}" y2="{y:.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{_LEFT - 6}" y="{y + 4:.1f}" font-size="11" text-anchor="end">{label}</text>')
    for i in range(6):
        t = t_max * i / 5
        x = _LEFT + width * t / t_max
        out.append(f'<text x="{x:.1f}" y="{top + height + 16}" font-size="11" '
                   f'text-anchor="middle">{t:.3g} s</text>')
    for n, (key, name, color) in enumerate(series):
        points = [(_LEFT + width * r["t_s"] / t_max, y_of(r[key])) for r in rows
                  if r.get(key) is not None and (r[key] > 0 or not log)]
        if not points:
            continue
        path = " ".join(f"{x:.1f},{y:.1f}" for x, y in points)
        out.append(f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="2"/>')
        ly = top + 14 + 18 * n
        out.append(f'<line x1="{_LEFT + width + 12}" y1="{ly - 4}" x2="{_LEFT + width + 32}" y2="{ly - 4}" '
                   f'stroke="{color}" stroke-width="3"/>')
        out.append(f'<text x="{_LEFT + width + 38}" y="{ly}" font-size="12">{html.escape(name)}</text>')
    return out


def render_svg(report: dict) -> str:
    """The chart of ``report``'s timeline as an SVG document."""
    rows = report.get("timeline", [])
    body = _panel(rows, _THROUGHPUT, 0, "throughput (records/s)", log=False)
    body += _panel(rows, _LATENCY, _PANEL_HEIGHT, "latency (ms, log scale)", log=True)
    height = 2 * _PANEL_HEIGHT
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{_WIDTH}" height="{height}" '
            f'viewBox="0 0 {_WIDTH} {height}" font-family="sans-serif">\n'
            f'<rect width="{_WIDTH}" height="{height}" fill="white"/>\n' + "\n".join(body) + "\n</svg>\n")


def write_plot(path: str | Path, report: dict) -> None:
    """Write the chart to ``path``: an SVG, or an HTML page holding it when ``path`` ends in .html."""
    path = Path(path)
    svg = render_svg(report)
    if path.suffix.lower() not in (".html", ".htm"):
        path.write_text(svg)
        return
    from loadgen.report import format_report

    title = f"loadgen {report['workload']} run {report['run_id']}"
    page = ["<!DOCTYPE html>", '<html><head><meta charset="utf-8">',
            f"<title>{html.escape(title)}</title></head>", '<body style="font-family: sans-serif">',
            f"<h1>{html.escape(title)}</h1>", f"<pre>{html.escape(format_report(report))}</pre>", svg,
            "</body></html>", ""]
    path.write_text("\n".join(page))

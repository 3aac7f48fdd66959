"""The report of a campaign: ``report.md`` for people, ``report.json`` for machines, ``throughput.svg``.

``report.md``: the run's verdict (``meta["verdict"]``, :class:`chaos.verdict.Verdict` as JSON:
OK, FAILED or INCONCLUSIVE, the exit status, the problems met, planned vs injected faults per
nemesis; without it, ``Result.ok("all")`` alone), the command and seed that replay the run, the
problems, the faults planned and injected per nemesis, the totals per topic, an overview with
one row per nemesis, then a table per nemesis (faults
injected; records acknowledged and verified, anomalies by kind and unavailability p50/max per
topic, attributed as ``chaos.checker`` says), the anomalies per acks level with their examples,
and every fault.  ``report.json``:
``{"verdict": ..., "ok": {"all": bool, "1": bool}, "meta": meta, "result": Result.to_json()}``, where
``ok["all"]`` is true only for the verdict OK.
``throughput.svg``: acknowledged records per second per topic in 1 s buckets over the run, each
fault's interval shaded and labelled with its nemesis; written by hand, no plotting library.
"""

from __future__ import annotations

import html
import json
import math
import shlex
from pathlib import Path
from typing import Any

from chaos.checker import ANOMALY_KINDS, FATAL_KINDS, Result

__all__ = ["render_svg", "summary", "write_report"]

_COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf"]
_SHADES = ["#fdd0a2", "#c6dbef", "#c7e9c0", "#dadaeb", "#fcbba1", "#d9d9d9", "#f6e8c3", "#c7eae5"]
_WIDTH, _HEIGHT, _LEFT, _RIGHT, _TOP, _BOTTOM = 1000, 420, 70, 190, 40, 50


def _get(fault: Any, name: str) -> Any:
    return fault.get(name) if isinstance(fault, dict) else getattr(fault, name, None)


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _command(meta: dict) -> str:
    """``meta["replay"]`` (the command that replays the schedule), else ``meta["argv"]``."""
    if meta.get("replay"):
        return str(meta["replay"])
    argv = meta.get("argv")
    if isinstance(argv, (list, tuple)):
        return shlex.join(str(a) for a in argv)
    return str(argv) if argv else "python -m chaos"


def write_report(result: Result, faults: list[Any], meta: dict, out_dir: str | Path) -> dict[str, Path]:
    """Writes the three files into ``out_dir`` (created if need be); returns their paths by kind."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"md": out / "report.md", "json": out / "report.json", "svg": out / "throughput.svg"}
    paths["md"].write_text(_markdown(result, faults, meta), encoding="utf-8")
    verdict = meta.get("verdict")
    ok_all = result.ok("all") if not isinstance(verdict, dict) else verdict.get("verdict") == "OK"
    doc = {"verdict": verdict, "ok": {"all": ok_all, "1": result.ok("1")}, "meta": meta,
           "result": result.to_json()}
    paths["json"].write_text(json.dumps(doc, indent=1, default=str) + "\n", encoding="utf-8")
    paths["svg"].write_text(render_svg(result, faults), encoding="utf-8")
    return paths


def _verdict(result: Result, acks: str) -> str:
    bad = {kind: sum(t.anomalies[kind].count for t in result.topics.values() if t.acks == acks)
           for kind in FATAL_KINDS}
    bad = {k: n for k, n in bad.items() if n}
    if not bad:
        return "OK"
    return "FAILED (" + ", ".join(f"{k} {n}" for k, n in bad.items()) + ")"


def _run_verdict(result: Result, meta: dict | None) -> str:
    """The run's verdict line: ``meta["verdict"]``'s when the runner judged, else acks=all's."""
    verdict = (meta or {}).get("verdict")
    if isinstance(verdict, dict) and verdict.get("line"):
        return str(verdict["line"])
    return f"acks=all: {_verdict(result, 'all')}"


def summary(result: Result, meta: dict | None = None) -> str:
    """A few lines for the terminal: per topic counts and anomalies, faults, the verdict."""
    lines = []
    for t in result.topics.values():
        found = ", ".join(f"{k} {a.count}" for k, a in t.anomalies.items() if a.count) or "none"
        lines.append(f"{t.topic} (acks={t.acks}): {t.attempted} attempted, {t.acknowledged} acknowledged, "
                     f"{t.failed} indeterminate ({t.failed_read} of them read), {t.verified} verified; "
                     f"anomalies: {found}")
    if result.nemeses:
        per = ", ".join(f"{n.nemesis} {n.faults}" for n in result.nemeses.values() if n.faults)
        worst = max(((m, n.nemesis) for n in result.nemeses.values()
                     for m in n.unavailability_max_s.values() if m is not None), default=None)
        lines.append(f"faults: {len(result.faults)} ({per or 'none'})"
                     + (f"; longest unavailability {worst[0]:.1f} s ({worst[1]})" if worst else ""))
    if result.history.get("torn_lines"):
        lines.append(f"history: {result.history['torn_lines']} torn last lines skipped "
                     f"({', '.join(result.history.get('torn_files', []))})")
    lines.append(f"acks=all: {_verdict(result, 'all')}")
    if meta and isinstance(meta.get("verdict"), dict):
        lines.append(f"verdict: {_run_verdict(result, meta)}")
    return "\n".join(lines)


def _table(header: list[str], rows: list[list[Any]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |" for row in rows]
    return out + [""]


def _markdown(result: Result, faults: list[Any], meta: dict) -> str:
    out = [f"# Chaos campaign, seed {meta.get('seed', '?')}", "",
           (f"**Verdict: {_run_verdict(result, meta)}**; " if isinstance(meta.get("verdict"), dict) else "")
           + f"**acks=all: {_verdict(result, 'all')}** (zero lost-write, unseen, inconsistent-offsets and "
           "poll-skip required; acks=1 anomalies are reported below, never hidden)", "",
           f"Replay: `{_command(meta)}`", ""]
    out += _problems(meta)
    facts = [("seed", meta.get("seed")), ("duration s", meta.get("duration_s", meta.get("duration"))),
             ("brokers", meta.get("brokers")), ("nemeses", meta.get("nemeses")),
             ("faults injected", len(result.faults)), ("faults planned", meta.get("planned_faults")),
             ("planted bug (HPBROKER_UNSAFE_ACK_BEFORE_REPLICATION)",
              "ON: acks=all answered before replication" if meta.get("unsafe_ack_before_replication")
              else None),
             ("history", f"{result.history.get('files', 0)} files, {result.history.get('lines', 0)} lines, "
                         f"{result.history.get('torn_lines', 0)} torn last lines skipped")]
    out += _table(["", ""], [[k, ", ".join(map(str, v)) if isinstance(v, (list, tuple)) else v]
                             for k, v in facts if v is not None])
    out += ["## Totals", ""]
    out += _table(["topic", "acks", "attempted", "acknowledged", "indeterminate", "unsettled", "read",
                   "verified", "drained to the end", *ANOMALY_KINDS],
                  [[t.topic, t.acks, t.attempted, t.acknowledged, f"{t.failed} ({t.failed_read} read)",
                    t.unsettled, t.read, t.verified,
                    "-" if t.drained is None else f"{len(t.drained)} of {t.partitions} partitions",
                    *(t.anomalies[k].count for k in ANOMALY_KINDS)]
                   for t in result.topics.values()])
    out += ["## Per nemesis", "",
            "Records and anomalies belong to the fault that started last before them (`none`: before "
            "the first fault). Unavailability: per fault and partition, the longest gap between "
            "acknowledged writes overlapping the fault; p50 and max over them.", ""]
    out += _overview(result)
    for n in result.nemeses.values():
        out += [f"### {n.nemesis}", "", f"Faults injected: {n.faults}", ""]
        out += _table(["topic", "acks", "acknowledged", "verified", *ANOMALY_KINDS,
                       "unavailability p50 s", "max s"],
                      [[name, t.acks, n.acknowledged.get(name, 0), n.verified.get(name, 0),
                        *(n.anomalies.get(name, {}).get(k, 0) for k in ANOMALY_KINDS),
                        _seconds(n.unavailability_p50_s.get(name)),
                        _seconds(n.unavailability_max_s.get(name))]
                       for name, t in result.topics.items()])
    out += ["## Anomalies", ""]
    for acks in sorted({t.acks for t in result.topics.values()}, key=lambda a: (a != "all", a)):
        out += [f"### acks={acks}", ""]
        found = False
        for t in (t for t in result.topics.values() if t.acks == acks):
            for kind, a in t.anomalies.items():
                if a.count:
                    found = True
                    out.append(f"- **{kind}** on `{t.topic}`: {a.count}")
                    out += [f"  - {html.escape(e, quote=False)}" for e in a.examples]
        out += (["none"] if not found else []) + [""]
    out += _faults_section(result, faults)
    out += ["## Throughput", "", "![acknowledged records per second](throughput.svg)", ""]
    return "\n".join(out)


def _problems(meta: dict) -> list[str]:
    """The problems that make a run inconclusive, and the faults planned vs injected per nemesis."""
    verdict = meta.get("verdict")
    if not isinstance(verdict, dict):
        return []
    out = ["## Problems", ""]
    out += [f"- {html.escape(str(p), quote=False)}" for p in verdict.get("problems", [])] or ["none"]
    out += ["", "## Faults planned and injected", ""]
    out += _table(["nemesis", "planned", "injected"],
                  [[name, planned, injected]
                   for name, (planned, injected) in verdict.get("faults", {}).items()])
    return out


def _overview(result: Result) -> list[str]:
    """One row per nemesis: faults, acknowledged/verified and unavailability per topic, anomalies."""
    topics = list(result.topics)
    rows = []
    for n in result.nemeses.values():
        found = "; ".join(f"{topic} {kind} {count}" for topic in topics
                          for kind, count in n.anomalies.get(topic, {}).items() if count) or "none"
        rows.append([n.nemesis, n.faults,
                     *(f"{n.acknowledged.get(t, 0)} / {n.verified.get(t, 0)}" for t in topics), found,
                     *(f"{_seconds(n.unavailability_p50_s.get(t))} / "
                       f"{_seconds(n.unavailability_max_s.get(t))}" for t in topics)])
    if not rows:
        return []
    return _table(["nemesis", "faults", *(f"{t} acknowledged / verified" for t in topics), "anomalies",
                   *(f"{t} unavailability p50 / max s" for t in topics)], rows)


def _faults_section(result: Result, faults: list[Any]) -> list[str]:
    origin = _origin(result, faults)
    worst = {(f.nemesis, f.start): max((s for parts in f.unavailable_s.values() for s in parts.values()),
                                       default=None) for f in result.faults}
    rows = []
    for i, fault in enumerate(sorted(faults, key=lambda f: float(_get(f, "start"))), 1):
        start, end = float(_get(fault, "start")), _get(fault, "end")
        recovered = _get(fault, "recovered_s")
        healed = end is not None and _get(fault, "healed") is not False
        rows.append([i, _get(fault, "mixed") or _get(fault, "nemesis"), _get(fault, "nemesis"),
                     f"`{_get(fault, 'target')}`", f"{start - origin:.1f}",
                     f"{float(end) - start:.1f}" if healed else "not healed",
                     "-" if recovered is None else f"{float(recovered):.1f}",
                     _get(fault, "detail") or "", _get(fault, "evidence") or "-",
                     _seconds(worst.get((_get(fault, "nemesis"), start)))])
    if not rows:
        return ["## Faults", "", "none", ""]
    return ["## Faults", ""] + _table(["#", "step", "nemesis", "target", "at s", "held s", "full ISR after s",
                                       "detail", "verified", "longest unavailability s"], rows)


def _origin(result: Result, faults: list[Any]) -> float:
    candidates = [result.throughput_start_s, result.history.get("start_s")]
    candidates += [float(_get(f, "start")) for f in faults]
    return math.floor(min((c for c in candidates if c is not None), default=0.0))


def _nice_ceiling(value: float) -> float:
    if value <= 0:
        return 1.0
    magnitude = 10 ** math.floor(math.log10(value))
    for step in (1, 2, 2.5, 5, 10):
        if value <= step * magnitude:
            return step * magnitude
    return 10 * magnitude


def render_svg(result: Result, faults: list[Any]) -> str:
    """The throughput chart as one SVG document (see the module docstring)."""
    origin = _origin(result, faults)
    offset = (result.throughput_start_s or origin) - origin
    series = result.throughput
    span = max([offset + len(s) for s in series.values()]
               + [float(_get(f, "end") or _get(f, "start")) - origin for f in faults] + [1.0])
    peak = _nice_ceiling(max((max(s) for s in series.values() if s), default=0))
    width, height = _WIDTH - _LEFT - _RIGHT, _HEIGHT - _TOP - _BOTTOM

    def x_of(t: float) -> float:
        return _LEFT + width * t / span

    def y_of(v: float) -> float:
        return _TOP + height * (1 - v / peak)

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{_WIDTH}" height="{_HEIGHT}" '
           f'viewBox="0 0 {_WIDTH} {_HEIGHT}" font-family="sans-serif">',
           '<rect width="100%" height="100%" fill="white"/>',
           f'<text x="{_LEFT}" y="22" font-size="15" font-weight="bold">Acknowledged records per second, '
           'faults shaded</text>']
    nemeses = list(dict.fromkeys(str(_get(f, "nemesis")) for f in faults))
    shade = {name: _SHADES[i % len(_SHADES)] for i, name in enumerate(nemeses)}
    for fault in faults:
        name, start = str(_get(fault, "nemesis")), float(_get(fault, "start")) - origin
        end = float(_get(fault, "end")) - origin if _get(fault, "end") is not None else span
        x0, x1 = x_of(start), x_of(max(end, start))
        tip = html.escape(f"{name} {_get(fault, 'target')} {start:.1f}-{end:.1f} s "
                          f"{_get(fault, 'detail') or ''}")
        out.append(f'<rect x="{x0:.1f}" y="{_TOP}" width="{max(x1 - x0, 1.0):.1f}" height="{height}" '
                   f'fill="{shade[name]}" opacity="0.7"><title>{tip}</title></rect>')
        out.append(f'<text x="{x0 + 2:.1f}" y="{_TOP + 4}" font-size="9" fill="#555" '
                   f'transform="rotate(90 {x0 + 2:.1f} {_TOP + 4})">{html.escape(name)}</text>')
    for i in range(5):
        value = peak * i / 4
        y = y_of(value)
        out.append(f'<line x1="{_LEFT}" y1="{y:.1f}" x2="{_LEFT + width}" y2="{y:.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{_LEFT - 6}" y="{y + 4:.1f}" font-size="11" text-anchor="end">{value:g}</text>')
    for i in range(7):
        t = span * i / 6
        out.append(f'<text x="{x_of(t):.1f}" y="{_TOP + height + 18}" font-size="11" '
                   f'text-anchor="middle">{t:.0f} s</text>')
    out.append(f'<rect x="{_LEFT}" y="{_TOP}" width="{width}" height="{height}" fill="none" stroke="#888"/>')
    legend_y = _TOP + 10
    for i, (topic, counts) in enumerate(series.items()):
        color = _COLORS[i % len(_COLORS)]
        if counts:
            points = " ".join(f"{x_of(offset + j + 0.5):.1f},{y_of(c):.1f}" for j, c in enumerate(counts))
            out.append(f'<polyline points="{points}" fill="none" stroke="{color}" stroke-width="1.2"/>')
        out.append(f'<line x1="{_WIDTH - _RIGHT + 15}" y1="{legend_y}" x2="{_WIDTH - _RIGHT + 35}" '
                   f'y2="{legend_y}" stroke="{color}" stroke-width="3"/>')
        acks = result.topics[topic].acks if topic in result.topics else "?"
        out.append(f'<text x="{_WIDTH - _RIGHT + 40}" y="{legend_y + 4}" font-size="12">'
                   f'{html.escape(topic)} (acks={html.escape(acks)})</text>')
        legend_y += 18
    if not any(series.values()):
        out.append(f'<text x="{_LEFT + width / 2}" y="{_TOP + height / 2}" font-size="14" '
                   'text-anchor="middle">no acknowledged writes</text>')
    for name in nemeses:
        legend_y += 18
        out.append(f'<rect x="{_WIDTH - _RIGHT + 15}" y="{legend_y - 8}" width="20" height="12" '
                   f'fill="{shade[name]}"/>')
        out.append(f'<text x="{_WIDTH - _RIGHT + 40}" y="{legend_y + 2}" font-size="12">'
                   f'{html.escape(name)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"

"""Timestamps as people type and read them: every timestamp in hpbroker is ms since the epoch.

Shared by the command line and the Spark jobs (``--from``, ``--to-time``, the data source's
``startingTimestamp``); pure, no I/O.
"""

from __future__ import annotations

import datetime as dt
import math
import re

__all__ = ["iso_ms", "parse_time_ms"]


def parse_time_ms(text: str | int, what: str = "time") -> int:
    """``text`` as ms since the epoch: an integer as it is, anything else as ISO 8601 (UTC when
    it names no zone).  ValueError names ``what`` and the text."""
    if isinstance(text, int):
        return text
    text = str(text).strip()
    if re.fullmatch(r"-?[0-9]+", text):
        return int(text)
    try:
        moment = dt.datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"{what} {text!r}: expected ms since the epoch or an ISO 8601 time") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.UTC)
    return math.floor(moment.timestamp() * 1000)  # the millisecond it falls in


def iso_ms(ms: int) -> str:
    """``ms`` since the epoch as ISO 8601 UTC with milliseconds (``2026-01-02T03:04:05.678Z``)."""
    moment = dt.datetime.fromtimestamp(ms / 1000, dt.UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")

"""How the broker's processes log: one line per event on stderr, the same shape everywhere.

Messages carry their context as a prefix in brackets, by convention: ``[arbiter]``, ``[stack]``,
``[zookeeper]``, a partition's ``[orders-3]``; a worker process adds ``[worker=<slot>]`` to every
message it logs (:func:`add_process_context`).  The formatters here merge the leading bracketed
groups into one context, the process's last: ``[orders-3 worker=2]``.

``text`` (the default)::

    2026-05-04T10:15:02.113Z INFO    4711 io.log: [orders-3 worker=2] opened ...

time (UTC, ms), level, process id, logger (without the ``hpbroker.`` prefix), context, message;
a traceback follows on the next lines.  ``json``: one object per line, the traceback included::

    {"time": "2026-05-04T10:15:02.113Z", "level": "INFO", "pid": 4711, "logger": "hpbroker.io.log",
     "context": "orders-3 worker=2", "message": "opened ..."}

Call :func:`setup_logging` once per program, before forking workers (they inherit the handler).
"""

from __future__ import annotations

import json
import logging
import re
import sys
import time
from typing import Any

__all__ = ["LOG_FORMATS", "add_process_context", "setup_logging", "split_context"]

LOG_FORMATS = ("text", "json")
_LEADING_GROUPS = re.compile(r"(?:\[([^\[\]]*)\] ?)+")
_GROUP = re.compile(r"\[([^\[\]]*)\]")
_PROCESS_KEYS = ("worker=",)  # context parts that name the process: they go last


def split_context(message: str) -> tuple[str, str]:
    """``("orders-3 worker=2", "opened ...")`` for ``"[worker=2] [orders-3] opened ..."``: the
    leading bracketed groups, merged (the process's part last), and the rest."""
    match = _LEADING_GROUPS.match(message)
    if match is None:
        return "", message
    groups = _GROUP.findall(match.group(0))
    groups.sort(key=lambda group: group.startswith(_PROCESS_KEYS))
    return " ".join(groups), message[match.end():]


def _timestamp(record: logging.LogRecord) -> str:
    seconds = int(record.created)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{int(record.msecs):03d}Z"


class TextFormatter(logging.Formatter):
    """``time level pid logger: [context] message`` (module docstring)."""

    def format(self, record: logging.LogRecord) -> str:
        context, message = split_context(record.getMessage())
        name = record.name.removeprefix("hpbroker.")
        line = f"{_timestamp(record)} {record.levelname:<7} {record.process} {name}: " \
               f"{f'[{context}] ' if context else ''}{message}"
        details = self._details(record)
        return f"{line}\n{details}" if details else line

    def _details(self, record: logging.LogRecord) -> str:
        parts = []
        if record.exc_info:
            parts.append(self.formatException(record.exc_info))
        if record.stack_info:
            parts.append(self.formatStack(record.stack_info))
        return "\n".join(parts)


class JsonFormatter(TextFormatter):
    """One JSON object per line (module docstring)."""

    def format(self, record: logging.LogRecord) -> str:
        context, message = split_context(record.getMessage())
        event: dict[str, Any] = {"time": _timestamp(record), "level": record.levelname, "pid": record.process,
                                 "logger": record.name, "context": context, "message": message}
        details = self._details(record)
        if details:
            event["exception"] = details
        return json.dumps(event, ensure_ascii=False)


def setup_logging(level: str | int = "INFO", log_format: str = "text") -> None:
    """Send every log record of ``level`` and above to stderr in ``log_format`` (``text`` or
    ``json``), replacing the handlers the root logger had.  kazoo logs only its warnings."""
    if log_format not in LOG_FORMATS:
        raise ValueError(f"log format {log_format!r}: choose one of {', '.join(LOG_FORMATS)}")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    logging.getLogger("kazoo").setLevel(max(logging.WARNING, root.level))


def add_process_context(context: str) -> None:
    """Prefix every message this process logs from now on with ``[context]`` (a worker calls it
    right after the fork: the process is its own, so the record factory may be replaced)."""
    previous = logging.getLogRecordFactory()
    prefix = f"[{context}] "

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = previous(*args, **kwargs)
        if isinstance(record.msg, str):
            record.msg = prefix + record.msg
        return record

    logging.setLogRecordFactory(factory)

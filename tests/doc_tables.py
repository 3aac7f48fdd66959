"""Reading the byte-level facts the docs state (hex dumps, tables), so tests can hold them to the code."""

from __future__ import annotations

import re
from pathlib import Path

DOCS = Path(__file__).resolve().parent.parent / "docs"


def section(doc: str, heading: str) -> str:
    """The text of ``docs/<doc>`` from the line ``heading`` to the next heading of its level."""
    level = heading.split(" ", 1)[0]
    text = (DOCS / doc).read_text().split(f"{heading}\n", 1)[1]
    return re.split(rf"^{level} ", text, maxsplit=1, flags=re.M)[0]


def hex_dumps(doc: str, heading: str) -> list[bytes]:
    """The bytes of each fenced block of the section: every line's leading hex pairs."""
    dumps = []
    for block in re.findall(r"^```\n(.*?)^```", section(doc, heading), flags=re.S | re.M):
        pairs = [m.group(1) for line in block.splitlines()
                 if (m := re.match(r"^\s*((?:[0-9a-f]{2} )*[0-9a-f]{2})(?: {2,}|$)", line))]
        dumps.append(bytes.fromhex("".join(pairs).replace(" ", "")))
    return dumps


def table_rows(doc: str, heading: str, first_column: str | None = None) -> list[list[str]]:
    """The cells of a table of the section (the first one, or the first whose header starts with
    ``first_column``), its header and rule rows left out, backticks removed."""
    tables: list[list[list[str]]] = []
    in_table = False
    for line in section(doc, heading).splitlines():
        if not line.startswith("|"):
            in_table = False
            continue
        if not in_table:
            tables.append([])
            in_table = True
        if not re.match(r"^\|[-:| ]+\|$", line):
            tables[-1].append([cell.strip().strip("`") for cell in line.strip().strip("|").split("|")])
    for rows in tables:
        if first_column is None or rows[0][0] == first_column:
            return rows[1:]
    raise AssertionError(f"no table{'' if first_column is None else ' of ' + first_column} under {heading}")

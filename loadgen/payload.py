"""What loadgen's records hold: a 24-byte header that numbers them, then a body; their keys.

Every value starts with this header (little-endian), so the consumer side can tell who sent a
record, which one it was, and when::

    position  size  field         meaning
    0         2     magic         b"LG": a loadgen record
    2         2     producer      the producer's index in its run (0 .. producers - 1)
    4         4     run_id        random per loadgen run: records of other runs are "foreign"
    8         8     sequence      the producer's number for the record: 0, 1, 2 ... in send order
    16        8     send_time_ns  wall clock (time.time_ns()) when loadgen built the record's chunk

The body follows: consecutive slices of a pre-generated blob, either random bytes (incompressible)
or JSON access-log lines (compressible like real logs; each record starts at a line).  A record of
``size`` bytes has ``size - 24`` bytes of body, so sizes start at :data:`HEADER_BYTES`.

A chunk of fixed-size records is built as one ``(n, size)`` uint8 array, row ``i`` the value of
record ``i`` (headers written through a :data:`HEADER_DTYPE` view, bodies copied as whole
slices of the blob), which ``Producer.send_many`` takes as it is: no Python object per record on
the way.  Variable sizes give a list of bytes.

Sizes and keys are drawn per chunk (numpy, seeded): sizes fixed, uniform or normal; keys none,
uniform over K keys or zipf over K keys.
"""

from __future__ import annotations

import math
import random
import struct
from dataclasses import dataclass
from itertools import accumulate

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

__all__ = ["HEADER", "HEADER_BYTES", "HEADER_DTYPE", "MAGIC", "KeySpec", "PayloadSource", "SizeSpec",
           "log_lines"]

MAGIC = b"LG"
HEADER = struct.Struct("<2sHIQQ")
HEADER_BYTES = HEADER.size  # 24
HEADER_DTYPE = np.dtype([("magic", "<u2"), ("producer", "<u2"), ("run_id", "<u4"), ("sequence", "<u8"),
                         ("send_time_ns", "<u8")])
MAGIC_U16 = int.from_bytes(MAGIC, "little")
MAX_RECORD_BYTES = 16 << 20
_BLOB_BYTES = 4 << 20  # distinct random body bytes before the blob repeats
_LOG_LINES = 8192  # distinct log lines (~2.5 MB) before they repeat
assert HEADER_DTYPE.itemsize == HEADER_BYTES


@dataclass(frozen=True, slots=True)
class SizeSpec:
    """Record (value) sizes in bytes: ``"100"`` (fixed), ``"uniform:MIN:MAX"`` (both included)
    or ``"normal:MEAN:STDDEV"`` (rounded, clipped to [24, MEAN + 6 STDDEV])."""

    kind: str
    a: int
    b: int = 0

    @classmethod
    def parse(cls, text: str) -> SizeSpec:
        parts = str(text).split(":")
        try:
            if len(parts) == 1:
                spec = cls("fixed", int(parts[0]))
            elif parts[0] in ("uniform", "normal") and len(parts) == 3:
                spec = cls(parts[0], int(parts[1]), int(parts[2]))
            else:
                raise ValueError
        except ValueError:
            raise ValueError(f"record size {text!r}: expected N, uniform:MIN:MAX or normal:MEAN:STDDEV") \
                from None
        spec.check()
        return spec

    def check(self) -> None:
        low, high = self.bounds()
        if low < HEADER_BYTES or high > MAX_RECORD_BYTES:
            raise ValueError(f"record size {self}: sizes must lie in [{HEADER_BYTES}, {MAX_RECORD_BYTES}] "
                             f"(loadgen's header takes {HEADER_BYTES} bytes)")
        if self.kind == "uniform" and self.a > self.b:
            raise ValueError(f"record size {self}: MIN > MAX")
        if self.kind == "normal" and self.b < 0:
            raise ValueError(f"record size {self}: negative STDDEV")

    def bounds(self) -> tuple[int, int]:
        """The smallest and largest size this spec can draw."""
        if self.kind == "fixed":
            return self.a, self.a
        if self.kind == "uniform":
            return self.a, self.b
        return max(HEADER_BYTES, self.a - 6 * self.b), self.a + 6 * self.b

    def mean(self) -> float:
        return self.a if self.kind in ("fixed", "normal") else (self.a + self.b) / 2

    def draw(self, rng: np.random.Generator, n: int) -> list[int] | int:
        """``n`` sizes; a fixed spec returns the one size instead of a list."""
        if self.kind == "fixed":
            return self.a
        if self.kind == "uniform":
            return rng.integers(self.a, self.b + 1, n).tolist()
        low, high = self.bounds()
        return np.clip(np.rint(rng.normal(self.a, self.b, n)), low, high).astype(np.int64).tolist()

    def __str__(self) -> str:
        return str(self.a) if self.kind == "fixed" else f"{self.kind}:{self.a}:{self.b}"


@dataclass(frozen=True, slots=True)
class KeySpec:
    """Record keys: ``"none"``, ``"uniform:K"`` (K keys, equally likely) or ``"zipf:K:S"`` (key
    ``i`` of K with probability proportional to ``1 / (i + 1) ** S``; S defaults to 1.1)."""

    kind: str
    count: int = 0
    exponent: float = 1.1

    @classmethod
    def parse(cls, text: str) -> KeySpec:
        parts = str(text).split(":")
        try:
            if parts == ["none"]:
                return cls("none")
            if parts[0] == "uniform" and len(parts) == 2:
                spec = cls("uniform", int(parts[1]))
            elif parts[0] == "zipf" and len(parts) in (2, 3):
                spec = cls("zipf", int(parts[1]), float(parts[2]) if len(parts) == 3 else 1.1)
            else:
                raise ValueError
        except ValueError:
            raise ValueError(f"keys {text!r}: expected none, uniform:K or zipf:K[:S]") from None
        if not 1 <= spec.count <= 10_000_000:
            raise ValueError(f"keys {text!r}: K must be in [1, 10000000]")
        if spec.kind == "zipf" and not 0 < spec.exponent <= 10:
            raise ValueError(f"keys {text!r}: S must be in (0, 10]")
        return spec

    def __str__(self) -> str:
        if self.kind == "none":
            return "none"
        return f"uniform:{self.count}" if self.kind == "uniform" else f"zipf:{self.count}:{self.exponent:g}"


class KeyChooser:
    """Draws keys per chunk: ``key-<i>`` for key number ``i``."""

    def __init__(self, spec: KeySpec, rng: np.random.Generator) -> None:
        self.spec = spec
        self._rng = rng
        self._table = [f"key-{i}".encode() for i in range(spec.count)]
        self._cdf = None
        if spec.kind == "zipf":
            weights = 1.0 / np.arange(1, spec.count + 1, dtype=np.float64) ** spec.exponent
            self._cdf = np.cumsum(weights / weights.sum())
            self._cdf[-1] = 1.0

    def draw_indexes(self, n: int) -> np.ndarray:
        if self.spec.kind == "uniform":
            return self._rng.integers(0, self.spec.count, n)
        return np.searchsorted(self._cdf, self._rng.random(n), side="right")

    def draw(self, n: int) -> list[bytes] | None:
        """``n`` keys, or None for keyless records."""
        if self.spec.kind == "none":
            return None
        table = self._table
        return [table[i] for i in self.draw_indexes(n).tolist()]


_METHODS = ["GET"] * 8 + ["POST", "POST", "PUT", "DELETE"]
_PATHS = ["/", "/index.html", "/api/v1/orders", "/api/v1/orders/{id}", "/api/v1/users/{id}", "/login",
          "/static/js/app.{id}.js", "/static/css/site.css", "/search?q=item{id}", "/cart", "/checkout",
          "/api/v2/inventory/{id}/stock", "/healthz", "/img/products/{id}.jpg"]
_STATUS = [200] * 30 + [201, 204, 301, 302, 304, 304, 400, 401, 403, 404, 404, 404, 500, 502, 503]
_AGENTS = ["Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/124.0",
           "Mozilla/5.0 (Macintosh; Intel Mac OS X 14_4) AppleWebKit/605.1.15 (KHTML, like Gecko) Safari/605",
           "Mozilla/5.0 (Windows NT 10.0; Win64; x64; rv:125.0) Gecko/20100101 Firefox/125.0",
           "curl/8.5.0", "python-requests/2.31.0", "Go-http-client/1.1", "kube-probe/1.29"]
_REFERERS = ["-", "https://www.example.com/", "https://www.example.com/search", "https://news.example.org/"]


def log_lines(rng: random.Random, count: int, start_ms: int = 1_714_564_800_000) -> list[bytes]:
    """``count`` JSON access-log lines (newline-terminated), like a web server's, at ~2 ms apart."""
    lines = []
    t = start_ms
    for _ in range(count):
        t += rng.randint(0, 4)
        seconds, ms = divmod(t, 1000)
        stamp = f"2024-05-01T{seconds // 3600 % 24:02d}:{seconds // 60 % 60:02d}:{seconds % 60:02d}.{ms:03d}Z"
        path = rng.choice(_PATHS).replace("{id}", str(rng.randint(1, 99_999)))
        status = rng.choice(_STATUS)
        line = (f'{{"ts":"{stamp}","host":"web-{rng.randint(1, 12):02d}",'
                f'"ip":"10.{rng.randint(0, 255)}.{rng.randint(0, 255)}.{rng.randint(1, 254)}",'
                f'"method":"{rng.choice(_METHODS)}","path":"{path}","status":{status},'
                f'"bytes":{rng.randint(0, 50_000) if status < 300 else rng.randint(0, 600)},'
                f'"duration_ms":{rng.expovariate(1 / 25):.1f},"referer":"{rng.choice(_REFERERS)}",'
                f'"user_agent":"{rng.choice(_AGENTS)}"}}\n')
        lines.append(line.encode())
    return lines


class PayloadSource:
    """Builds the values of one producer's chunks: header + body, per the module docstring.

    The body of each record is the next slice of a blob (random bytes, or log lines with each
    record starting at a line); the blob repeats after a few MB.  Fixed sizes and variable sizes
    draw the same slices (same positions, same cursor), built as an array or as bytes.  Single
    thread."""

    def __init__(self, sizes: SizeSpec, payload: str, producer: int, run_id: int, seed: int) -> None:
        if payload not in ("random", "log"):
            raise ValueError(f"payload {payload!r}: choose random or log")
        self.sizes = sizes
        self._rng = np.random.default_rng(seed)
        self._producer = producer
        self._run_id = run_id
        max_body = sizes.bounds()[1] - HEADER_BYTES
        text_rng = random.Random(seed)
        if payload == "random":
            base = text_rng.randbytes(_BLOB_BYTES)
            self._starts = None
        else:
            lines = log_lines(text_rng, _LOG_LINES)
            base = b"".join(lines)
            self._starts = list(accumulate((len(line) for line in lines[:-1]), initial=0))
        repeats = math.ceil((max_body + 1) / len(base))
        self._base_len = len(base)
        self._blob = base * (1 + repeats)  # a slice from any position below _base_len fits
        self._blob_array = np.frombuffer(self._blob, np.uint8)
        self._starts_array = None if self._starts is None else np.array(self._starts, np.int64)
        self._windows = None  # (size of the body, every slice of the blob of that size as a row)
        self._cursor = 0
        self._pack = HEADER.pack

    def build(self, first_sequence: int, n: int, send_time_ns: int) -> tuple[np.ndarray | list[bytes], int]:
        """The values of records ``first_sequence .. first_sequence + n - 1``, and their bytes: for
        a fixed size an ``(n, size)`` uint8 array whose row ``i`` is value ``i``, else a list."""
        sizes = self.sizes.draw(self._rng, n)
        if isinstance(sizes, int):
            return self._build_rows(first_sequence, n, sizes, send_time_ns), n * sizes
        blob, pack, producer, run_id = self._blob, self._pack, self._producer, self._run_id
        sequences = range(first_sequence, first_sequence + n)
        bodies = [size - HEADER_BYTES for size in sizes]
        positions = self._positions(n, bodies)
        values = [pack(MAGIC, producer, run_id, s, send_time_ns) + blob[p:p + b]
                  for s, p, b in zip(sequences, positions, bodies, strict=True)]
        return values, sum(sizes)

    def _build_rows(self, first_sequence: int, n: int, size: int, send_time_ns: int) -> np.ndarray:
        """``n`` values of ``size`` bytes as the rows of one array, with no per-record Python work."""
        values = np.empty((n, size), np.uint8)
        header = values[:, :HEADER_BYTES].view(HEADER_DTYPE)[:, 0]  # each row's first 24 bytes
        header["magic"] = MAGIC_U16
        header["producer"] = self._producer
        header["run_id"] = self._run_id
        header["sequence"] = np.arange(first_sequence, first_sequence + n, dtype=np.uint64)
        header["send_time_ns"] = send_time_ns
        bodies = self._bodies(n, size - HEADER_BYTES)
        if size > HEADER_BYTES:
            values[:, HEADER_BYTES:] = bodies
        return values

    def _bodies(self, n: int, body: int) -> np.ndarray:
        """The next ``n`` bodies of ``body`` bytes, as the rows of an array (a view of the blob when
        they lie back to back in it); the same slices :meth:`_positions` gives."""
        blob, cursor = self._blob_array, self._cursor
        starts = self._starts_array
        if starts is None:
            end = cursor + n * body
            self._cursor = end % self._base_len
            if end <= len(blob):  # the blob repeats: a run past _base_len reads the same bytes
                return blob[cursor:end].reshape(n, body)
            positions = (cursor + np.arange(n, dtype=np.int64) * body) % self._base_len
        else:  # log lines: one record per line start, cycling
            self._cursor = (cursor + n) % len(starts)
            if cursor + n <= len(starts):
                positions = starts[cursor:cursor + n]
            else:
                positions = starts[(cursor + np.arange(n, dtype=np.int64)) % len(starts)]
        if self._windows is None or self._windows[0] != body:
            self._windows = body, sliding_window_view(blob, body)  # row p: blob[p:p + body], no copy
        return self._windows[1][positions]

    def _positions(self, n: int, bodies: list[int]) -> list[int]:
        """Where the next ``n`` bodies of variable sizes start in the blob (each below ``_base_len``)."""
        base_len, cursor = self._base_len, self._cursor
        if self._starts is not None:  # log lines: one record per line start, cycling
            starts = self._starts
            self._cursor = (cursor + n) % len(starts)
            if cursor + n <= len(starts):
                return starts[cursor:cursor + n]
            return [starts[(cursor + k) % len(starts)] for k in range(n)]
        self._cursor = (cursor + sum(bodies)) % base_len
        return [p % base_len for p in accumulate(bodies[:-1], initial=cursor)]

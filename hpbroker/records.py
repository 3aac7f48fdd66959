"""The record batch format, public face: build, validate and decode batches.

Everything here is implemented by the compiled module ``hpbroker._core`` (byte layout in
``docs/FORMAT.md``); this module only re-exports it with a loud, actionable error when the
extension was never built, and maps codec names to codec numbers.
"""

from __future__ import annotations

try:
    from hpbroker import _core  # noqa: F401  (imported first for the error below)
except ImportError as exc:  # pragma: no cover - exercised only on a broken install
    raise ImportError(
        "hpbroker's compiled core (hpbroker/_core.pyx) is not built or does not load: "
        f"{exc}. Build it with `make build` (or `python setup.py build_ext --inplace`, "
        "or `pip install -e .`) from the source tree."
    ) from exc

from hpbroker._core import (
    ATTR_IDEMPOTENT,
    CODEC_LZ4,
    CODEC_NONE,
    HEADER_SIZE,
    LOG_OVERHEAD,
    MAGIC,
    NO_PRODUCER_ID,
    PRODUCER_IDENTITY_SIZE,
    BatchBuilder,
    BatchHeader,
    Record,
    ScanResult,
    build_batch,
    crc32c,
    crc32c_hardware_accelerated,
    decode_records,
    iter_records,
    read_header,
    scan_batches,
    stamp_batch,
    validate_batches,
)

__all__ = [
    "ATTR_IDEMPOTENT",
    "CODEC_LZ4",
    "CODEC_NONE",
    "HEADER_SIZE",
    "LOG_OVERHEAD",
    "MAGIC",
    "NO_PRODUCER_ID",
    "PRODUCER_IDENTITY_SIZE",
    "BatchBuilder",
    "BatchHeader",
    "Record",
    "ScanResult",
    "build_batch",
    "codec_for_name",
    "crc32c",
    "crc32c_hardware_accelerated",
    "decode_records",
    "iter_records",
    "read_header",
    "scan_batches",
    "stamp_batch",
    "validate_batches",
]

_CODECS_BY_NAME = {None: CODEC_NONE, "none": CODEC_NONE, "lz4": CODEC_LZ4}


def codec_for_name(name: str | None) -> int:
    """The codec number for ``"lz4"``, ``"none"`` or None; ValueError names the choices otherwise."""
    key = name.lower() if isinstance(name, str) else name
    if key not in _CODECS_BY_NAME:
        raise ValueError(f"unknown compression {name!r}: choose 'lz4' or None")
    return _CODECS_BY_NAME[key]

"""Type stub for the compiled columnar decoder (``hpbroker/_columnar.pyx``)."""

from typing import Any

Buffer = bytes | bytearray | memoryview  # any object with the buffer protocol

#: the columns a builder can fill, in the order of the record schema
COLUMNS: tuple[str, ...]

class ColumnBuilder:
    """Appends the records of whole batches to Arrow-shaped column buffers."""

    max_records: int
    max_bytes: int
    count: int  # records held
    next_offset: int  # the offset after the last batch added (-1 before any)

    def __init__(self, columns: Any = ..., max_records: int = 1 << 20,
                 max_bytes: int = 128 << 20) -> None: ...
    @property
    def columns(self) -> tuple[str, ...]: ...
    @property
    def data_bytes(self) -> int: ...
    @property
    def full(self) -> bool: ...
    def add(self, buf: Buffer, position: int = 0, start_offset: int = 0, end_offset: int = 2**63 - 1, *,
            verify_crc: bool = True) -> int:
        """Decode whole batches from ``position``, keeping the records in ``[start_offset,
        end_offset)``; the position after the last batch decoded.  Raises CorruptRecordError."""
    def take(self) -> dict[str, Any]:
        """The buffers of the records held (see the module docstring); the builder starts empty."""

"""Storage: the partition log and its segments, offset and time indexes, and checkpoint.

Public API: :class:`PartitionLog` (``hpbroker.io.log``, whose docstring states the durability
guarantees), :class:`LogConfig`, and the values they return, :class:`FileSlice` and
:class:`AppendInfo`.  The other modules are the log's parts, one responsibility each:

- ``config``      LogConfig, validated
- ``files``       file names and raw file operations, atomic replacement of small files
- ``logfile``     one ``.log`` file of batches: append, read, walk headers, scan, truncate
- ``index``       the sparse offset index and time index of a segment
- ``segment``     a ``.log`` plus its indexes: the indexing rule, load, recover, read
- ``checkpoint``  the recovery-point checkpoint file, replaced atomically
- ``leader_epochs`` the leader-epoch cache and its file: which leader epoch began at which offset
- ``loader``      opening a directory: cleanup, trusted load or recovery of each segment
- ``producer_state`` the idempotent producers' state: deduplication checks, snapshots, rebuild,
                  the issued producer ids' ceiling file
- ``producer_replay`` re-reading the log's idempotent batch headers for that rebuild
- ``flush_job``   FlushJob: one group commit in flight, run by a flusher, applied by the log
- ``log``         PartitionLog: append (a producer's, a follower's), group-commit flush, roll,
                  read, retention
- ``truncation``  cutting the log back: truncate to an offset, or empty it to start elsewhere
- ``verify``      offline checks of a partition directory, reading only (``hpbroker check``)
- ``_writer``     compiled: group-commit I/O (writev + fdatasync) run without the GIL, and the
                  native writer thread that runs it off the owner's thread

Storage never imports networking (zmq) or coordination (kazoo) code.
"""

from hpbroker.io.config import LogConfig
from hpbroker.io.log import AppendInfo, PartitionLog
from hpbroker.io.logfile import FileSlice

__all__ = ["AppendInfo", "FileSlice", "LogConfig", "PartitionLog"]

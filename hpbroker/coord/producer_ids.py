"""Producer ids for idempotent producers: allocated in blocks, never handed out twice.

A broker hands out producer ids (``InitProducerIdRequest``, docs/PROTOCOL.md) from a *block*
of :data:`BLOCK_SIZE` consecutive ids that it owns alone.  Blocks come from a *block store*
that remembers the newest block taken; a new block starts where it ends, so blocks never
overlap, and the store has it durably before any of its ids is handed out:

- :class:`ZkBlockStore` (a broker configured with ZooKeeper): the znode
  ``<root>/producer-id-block`` (``ZkPaths.producer_id_block``), replaced with a conditional set
  (its version as read), so two brokers racing for a block cannot both get it: the loser reads
  again and takes the next one.  Blocks are unique cluster-wide.
- :class:`FileBlockStore` (standalone): ``<data_dir>/producer-id-block``, replaced atomically
  (tmp, fsync, rename, fsync of the directory).

Both hold the same JSON, ``{"version": 1, "broker": B, "block_start": S, "block_end": E}``
(ids ``S`` .. ``E - 1``, taken by broker ``B``); the first block starts at 0.  A block never
starts below the *floor* the broker's data directory gives (its issued ceiling and its block
file, whichever is higher), so a data directory moved from one store to the other (standalone
to a cluster, or back) does not hand out again the ids it handed out before.

**Allocator.**  :class:`ProducerIdAllocator` takes a fresh block at :meth:`~ProducerIdAllocator.start`
(whatever the old one had left is never handed out: a broker does not know which of its ids it
handed out before a restart), and the next one on its own thread when :data:`PREFETCH_FRACTION`
of the current one is left, so the arbiter's loop never waits for ZooKeeper or a disk: when the
current block runs out before the next has arrived, :meth:`~ProducerIdAllocator.next_id` raises
CoordinationError (retriable, error 17) at once.

**Issued ceiling.**  Workers tell an issued id from one never issued (UnknownProducerIdError,
22) by ``<data_dir>/producer-ids-issued`` (:data:`ISSUED_CEILING_FILE_NAME`; its format, reader
and writer are in ``hpbroker.io.producer_state``, the workers' side), ASCII, two lines, each
ending with a newline: the format version ``0``, then the ceiling in decimal.  Every id below the
ceiling counts as issued.  The allocator writes it atomically (tmp + rename; no fsync: at start
it is rewritten from the durable block) *before* :meth:`~ProducerIdAllocator.next_id`
returns the id, so a worker never meets an id it would call unknown.  The ceiling is one more
than the highest id this broker handed out, at least the start of its first block (every id of
an earlier block is below it).  With ZooKeeper it also covers the blocks the other brokers took
(their ids may reach this broker's partitions): a data watch on the znode raises it to the end of
each block another broker takes, and taking a block raises it to the end of the block replaced.
A watch is asynchronous: an id another broker hands out the very moment it takes a new block may
reach this broker's partitions before the watch fires (a window of milliseconds after each
1000th id of a broker).

Threads: :meth:`~ProducerIdAllocator.next_id` and :meth:`~ProducerIdAllocator.init_producer_id`
are the arbiter loop's; the refill thread and ZooKeeper's watch thread only hand over blocks and
ceilings under the allocator's lock.  Make the allocator in the process that uses it (after
``fork``), and start it with the signals the arbiter's loop handles blocked.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from hpbroker.errors import CoordinationError, HPBrokerError, InvalidRequestError, StorageError
from hpbroker.io.files import replace_atomically
from hpbroker.io.producer_state import ISSUED_CEILING_FILE_NAME, read_issued_ceiling, write_issued_ceiling
from hpbroker.protocol import MAX_PRODUCER_EPOCH, NO_PRODUCER_EPOCH, NO_PRODUCER_ID

if TYPE_CHECKING:
    from kazoo.client import KazooClient

__all__ = [
    "BLOCK_FILE_NAME",
    "BLOCK_SIZE",
    "ISSUED_CEILING_FILE_NAME",
    "PREFETCH_FRACTION",
    "BlockStore",
    "FileBlockStore",
    "ProducerIdAllocator",
    "ProducerIdBlock",
    "ZkBlockStore",
]

logger = logging.getLogger(__name__)

BLOCK_SIZE = 1000  # ids in a block (Kafka's /latest_producer_id_block takes 1000 too)
PREFETCH_FRACTION = 0.1  # the next block is fetched when this much of the current one is left
BLOCK_FILE_NAME = "producer-id-block"  # standalone: the newest block taken, in data_dir
_BLOCK_VERSION = 1  # "version" of a block's JSON
_MAX_PRODUCER_ID = 2**63 - 1
_CONFLICT_ATTEMPTS = 50  # conditional sets lost in a row before a ZooKeeper allocation gives up
_RETRY_S = 1.0  # pause before the refill thread tries a failed allocation again
_JOIN_TIMEOUT_S = 2.0  # how long close() waits for the refill thread


@dataclass(frozen=True, slots=True)
class ProducerIdBlock:
    """Ids ``block_start`` .. ``block_end - 1``, taken by broker ``broker_id``."""

    broker_id: int
    block_start: int
    block_end: int

    def to_json(self) -> bytes:
        return json.dumps({"version": _BLOCK_VERSION, "broker": self.broker_id,
                           "block_start": self.block_start, "block_end": self.block_end}).encode()

    @classmethod
    def from_json(cls, data: bytes, where: str) -> ProducerIdBlock:
        """Parse a stored block; ValueError naming ``where`` when it is not one."""
        try:
            raw = json.loads(data)
            block = cls(raw["broker"], raw["block_start"], raw["block_end"])
            version = raw["version"]
        except (ValueError, TypeError, KeyError) as e:
            raise ValueError(f"{where} does not hold a producer id block: {e!r} in "
                             f"{bytes(data[:200])!r}") from None
        integers = all(type(v) is int for v in (block.broker_id, block.block_start, block.block_end))
        if version != _BLOCK_VERSION or not integers \
                or not 0 <= block.block_start < block.block_end <= _MAX_PRODUCER_ID:
            raise ValueError(f"{where} holds no valid version {_BLOCK_VERSION} producer id block: "
                             f"{bytes(data[:200])!r}")
        return block

def _next_block(previous: ProducerIdBlock | None, broker_id: int, size: int, floor: int) -> ProducerIdBlock:
    """The block a broker takes next: ``size`` ids from the end of ``previous`` (0 when none),
    or from ``floor`` if that is higher."""
    start = max(0 if previous is None else previous.block_end, floor)
    if start > _MAX_PRODUCER_ID - size:
        raise CoordinationError(f"producer ids are exhausted: the next block would start at {start}")
    return ProducerIdBlock(broker_id, start, start + size)


class BlockStore(Protocol):
    """Where the newest block taken is kept (module docstring)."""

    def allocate(self, broker_id: int, size: int, floor: int = 0,
                 ) -> tuple[ProducerIdBlock, ProducerIdBlock | None]:
        """Take the next block for ``broker_id`` (starting at ``floor`` or above), durably, and
        return it with the block it replaced (None for the first).  Blocks; raises
        HPBrokerError when it cannot."""
        ...


class FileBlockStore:
    """A standalone broker's blocks, in ``<data_dir>/producer-id-block``."""

    def __init__(self, data_dir: str) -> None:
        self.path = os.path.join(data_dir, BLOCK_FILE_NAME)

    def read(self) -> ProducerIdBlock | None:
        """The newest block taken; None when none was.  StorageError when the file cannot be
        read or does not parse: ids would risk being handed out twice."""
        try:
            with open(self.path, "rb") as f:
                data = f.read(4096)
        except FileNotFoundError:
            return None
        except OSError as e:
            raise StorageError(f"cannot read {self.path}: {e}") from e
        try:
            return ProducerIdBlock.from_json(data, self.path)
        except ValueError as e:
            raise StorageError(f"{e}; no producer id is handed out until it is repaired (it names the "
                               "newest block of ids taken: write one whose block_end is above every id "
                               "issued)") from None

    def allocate(self, broker_id: int, size: int, floor: int = 0,
                 ) -> tuple[ProducerIdBlock, ProducerIdBlock | None]:
        previous = self.read()
        block = _next_block(previous, broker_id, size, floor)
        try:
            replace_atomically(self.path, block.to_json())
        except OSError as e:
            raise StorageError(f"cannot store producer id block {block.block_start}..{block.block_end - 1} "
                               f"in {self.path}: {e}") from e
        return block, previous


class ZkBlockStore:
    """A cluster's blocks, in one znode replaced with conditional sets (module docstring)."""

    def __init__(self, client: KazooClient, path: str) -> None:
        self.client = client
        self.path = path

    def allocate(self, broker_id: int, size: int, floor: int = 0,
                 ) -> tuple[ProducerIdBlock, ProducerIdBlock | None]:
        from kazoo.exceptions import BadVersionError, KazooException, NodeExistsError, NoNodeError

        for _ in range(_CONFLICT_ATTEMPTS):
            try:
                try:
                    data, stat = self.client.get(self.path)
                except NoNodeError:
                    block = _next_block(None, broker_id, size, floor)
                    self.client.create(self.path, block.to_json(), makepath=True)
                    return block, None
                try:
                    previous = ProducerIdBlock.from_json(data, f"znode {self.path}")
                except ValueError as e:
                    raise CoordinationError(f"{e}; no producer id is handed out until it is "
                                            "repaired") from None
                block = _next_block(previous, broker_id, size, floor)
                self.client.set(self.path, block.to_json(), version=stat.version)
                return block, previous
            except (BadVersionError, NodeExistsError):
                continue  # another broker took a block in between: read it and take the next one
            except KazooException as e:
                raise CoordinationError(f"cannot take a producer id block at {self.path} in ZooKeeper: "
                                        f"{e!r}") from None
        raise CoordinationError(f"lost {_CONFLICT_ATTEMPTS} races in a row for a producer id block at "
                                f"{self.path}")

    def watch(self, on_block: Any) -> Any:
        """Call ``on_block(block)`` (on kazoo's callback thread) with the znode's block now and
        after every change (``hpbroker.coord.watches``: re-armed after reconnections and
        expiry); a value that does not parse is logged and skipped.  Returns the watch, whose
        ``cancel()`` ends it."""
        from hpbroker.coord.watches import watch_data

        def changed(data: bytes | None, _stat: Any) -> None:
            if data is None:
                return
            try:
                on_block(ProducerIdBlock.from_json(data, f"znode {self.path}"))
            except ValueError as e:
                logger.warning("[producer-ids] %s", e)

        return watch_data(self.client, self.path, changed)


def _local_floor(data_dir: str) -> int:
    """The lowest id a new block of this data directory may start at: above every id it handed
    out (its issued ceiling) and every block it took standalone.  Files that cannot be read
    count for nothing (logged; the store's own newest block still applies)."""
    try:
        floor = read_issued_ceiling(data_dir)
    except (OSError, ValueError) as e:
        logger.warning("[producer-ids] the issued ceiling does not count for the next block: %s", e)
        floor = 0
    try:
        block = FileBlockStore(data_dir).read()
    except StorageError:
        block = None
    return max(floor, 0 if block is None else block.block_end)


def _write_issued_ceiling(data_dir: str, ceiling: int) -> None:
    """:func:`hpbroker.io.producer_state.write_issued_ceiling`; StorageError when it cannot."""
    try:
        write_issued_ceiling(data_dir, ceiling)
    except OSError as e:
        raise StorageError(f"cannot write the issued producer id ceiling {ceiling} to "
                           f"{os.path.join(data_dir, ISSUED_CEILING_FILE_NAME)}: {e}") from e


class ProducerIdAllocator:
    """Hands out this broker's producer ids (module docstring).  ``block_size`` and
    ``prefetch_fraction`` are for tests; ``retry_s`` is the refill thread's pause after a
    failure."""

    def __init__(self, data_dir: str, broker_id: int, store: BlockStore, *, block_size: int = BLOCK_SIZE,
                 prefetch_fraction: float = PREFETCH_FRACTION, retry_s: float = _RETRY_S) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be positive, got {block_size}")
        self.data_dir = data_dir
        self.broker_id = broker_id
        self.store = store
        self.block_size = block_size
        self._prefetch_at = int(block_size * prefetch_fraction)  # ids left when the next block is fetched
        self._retry_s = retry_s
        self._lock = threading.Condition()
        self._next_id = 0  # the next id of the current block
        self._block_end = 0  # the end of the current block (== _next_id: none left)
        self._spare: ProducerIdBlock | None = None  # the next block, fetched ahead
        self._refill = False  # the refill thread is asked for a block
        self._failure: str | None = None  # why the last allocation failed
        self._handed_ceiling = 0  # one more than the highest id handed out (at least the first block's start)
        self._foreign_ceiling = 0  # the end of the newest block another broker took
        self._written_ceiling = -1  # the ceiling last written to the file
        self._closing = False
        self._thread: threading.Thread | None = None
        self._watch: Any = None  # the watch on the other brokers' blocks (ZooKeeper only)
        self._floor = 0  # no block starts below it (module docstring), read at start

    # --- life cycle -----------------------------------------------------------------------------

    def start(self) -> None:
        """Take a fresh block now (on the caller's thread), write the ceiling, and start the
        refill thread (and, with ZooKeeper, the watch on the others' blocks).  A first block that
        cannot be taken is logged and left to the refill thread: ids are refused with error 17
        until it comes."""
        self._floor = _local_floor(self.data_dir)
        try:
            self._install(*self.store.allocate(self.broker_id, self.block_size, self._floor))
        except HPBrokerError as e:
            logger.warning("[producer-ids] cannot take a block of producer ids at start (retrying every "
                           "%g s): %s", self._retry_s, e.message)
            with self._lock:
                self._failure = e.message
                self._refill = True
        watch = getattr(self.store, "watch", None)
        if watch is not None:
            self._watch = watch(self._on_block)
        self._thread = threading.Thread(target=self._run, name="hpbroker-producer-ids", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop the refill thread (waiting a little for an allocation in progress).  Idempotent."""
        with self._lock:
            self._closing = True
            self._lock.notify_all()
        if self._watch is not None:
            self._watch.cancel()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(_JOIN_TIMEOUT_S)

    # --- the arbiter's side ---------------------------------------------------------------------

    @property
    def issued_ceiling(self) -> int:
        """Every id below it counts as issued (module docstring)."""
        with self._lock:
            return max(self._handed_ceiling, self._foreign_ceiling)

    def is_issued(self, producer_id: int) -> bool:
        return 0 <= producer_id < self.issued_ceiling

    def next_id(self) -> int:
        """A producer id never handed out before, once the ceiling file covers it.
        CoordinationError when no block is at hand (the refill thread is fetching one),
        StorageError when the ceiling cannot be written (that id is skipped)."""
        with self._lock:
            if self._next_id >= self._block_end and self._spare is not None:
                self._use(self._spare)
                self._spare = None
            if self._next_id >= self._block_end:
                self._ask_refill()
                cause = f": {self._failure}" if self._failure else ""
                raise CoordinationError(f"no producer id available now: broker {self.broker_id} is taking a "
                                        f"new block of ids{cause}; retry")
            producer_id = self._next_id
            self._next_id += 1
            self._handed_ceiling = max(self._handed_ceiling, producer_id + 1)
            if self._block_end - self._next_id <= self._prefetch_at and self._spare is None:
                self._ask_refill()
            self._write_ceiling()
        return producer_id

    def init_producer_id(self, producer_id: int, producer_epoch: int) -> tuple[int, int]:
        """The identity to answer an InitProducerIdRequest with (docs/PROTOCOL.md): a new id
        with epoch 0, or an issued id with its epoch bumped.  InvalidRequestError for a
        combination the protocol refuses; CoordinationError or StorageError from
        :meth:`next_id`."""
        if producer_id == NO_PRODUCER_ID and producer_epoch == NO_PRODUCER_EPOCH:
            return self.next_id(), 0
        if producer_id >= 0 and 0 <= producer_epoch <= MAX_PRODUCER_EPOCH:
            if producer_epoch < MAX_PRODUCER_EPOCH and self.is_issued(producer_id):
                return producer_id, producer_epoch + 1
            return self.next_id(), 0
        raise InvalidRequestError(f"producer id {producer_id} with epoch {producer_epoch}: ask for a new id "
                                  f"with (-1, -1), or for a new epoch with an id >= 0 and its epoch >= 0")

    # --- blocks arriving --------------------------------------------------------------------------

    def _use(self, block: ProducerIdBlock) -> None:
        """Make ``block`` the current one (the lock held)."""
        self._next_id, self._block_end = block.block_start, block.block_end
        self._handed_ceiling = max(self._handed_ceiling, block.block_start)

    def _install(self, block: ProducerIdBlock, previous: ProducerIdBlock | None) -> None:
        """A block the store gave this broker: current if none is left, else the spare; the
        ceiling written if it grew (else :meth:`next_id` writes it before an id goes out)."""
        with self._lock:
            if previous is not None and previous.broker_id != self.broker_id:
                self._foreign_ceiling = max(self._foreign_ceiling, previous.block_end)
            if self._next_id >= self._block_end:
                self._use(block)
            else:
                self._spare = block
            self._failure = None
            self._refill = False
            logger.info("[producer-ids] broker %d took producer ids %d..%d", self.broker_id,
                        block.block_start, block.block_end - 1)
            try:
                self._write_ceiling()
            except StorageError as e:
                logger.warning("[producer-ids] %s", e.message)

    def _on_block(self, block: ProducerIdBlock) -> None:
        """The newest block in ZooKeeper changed (a kazoo thread): another broker's ids count
        as issued here too."""
        if block.broker_id == self.broker_id:
            return
        with self._lock:
            if block.block_end > self._foreign_ceiling:
                self._foreign_ceiling = block.block_end
                try:
                    self._write_ceiling()
                except StorageError as e:
                    logger.warning("[producer-ids] %s", e.message)

    def _write_ceiling(self) -> None:
        """Write the ceiling if it grew (the lock held)."""
        ceiling = max(self._handed_ceiling, self._foreign_ceiling)
        if ceiling != self._written_ceiling:
            _write_issued_ceiling(self.data_dir, ceiling)
            self._written_ceiling = ceiling

    def _ask_refill(self) -> None:
        if not self._refill:
            self._refill = True
            self._lock.notify_all()

    # --- the refill thread ------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._closing and not self._refill:
                    self._lock.wait()
                if self._closing:
                    return
            try:
                self._install(*self.store.allocate(self.broker_id, self.block_size, self._floor))
            except HPBrokerError as e:
                self._failed(e.message)
                continue
            except Exception as e:  # the thread must go on: a later try may work
                logger.exception("[producer-ids] unexpected failure taking a block of producer ids")
                self._failed(repr(e))

    def _failed(self, message: str) -> None:
        with self._lock:
            if self._failure is None:
                logger.warning("[producer-ids] cannot take a block of producer ids (retrying every %g s): %s",
                               self._retry_s, message)
            self._failure = message
            if not self._closing:
                self._lock.wait(self._retry_s)

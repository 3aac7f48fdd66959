"""Topic creation, configuration and deletion, carried out by the workers that own the partitions.

The topic store (``hpbroker.broker.topics``) says which partitions exist; this module keeps the
workers in step with it without ever blocking the arbiter's loop:

- **Assignment.**  Each slot's process is told which partitions to open when it is forked
  (:meth:`TopicAdmin.assign`); later changes reach a serving process as backend controls
  (``open``, ``delete``), each acknowledged by the worker.  ``_assigned[slot]`` is what the
  slot's current process was told to open, so :meth:`TopicAdmin.reconcile` sends exactly the
  difference when a slot becomes ready or the store changes.
- **Creation.**  A topic whose partitions would not fit in the workers' file descriptors is
  refused before anything is saved (``hpbroker.broker.descriptors``: InvalidPartitionsError,
  error 14, naming the limit, what the topic would need and how to raise the limit).  Then the
  topic is persisted first (so a slot forked from now on opens it), then every
  owning slot must confirm: by acknowledging its ``open``, or by reporting ready from a process
  forked with the topic.  The client is answered when all have, or with error 12 after
  ``timeout_s`` (the topic exists by then and its partitions come up as their slots do).
- **Configuration.**  The new settings are persisted first (so a slot forked from now on opens
  the partitions with them), then every owning slot must confirm that its process has them:
  ``_applied[slot]`` is the settings of each topic that the slot's current process was given
  (at its fork, with an ``open``, or with a ``configure``), and :meth:`TopicAdmin.reconcile`
  sends ``configure`` wherever it differs from the store.  A slot confirms by acknowledging an
  ``open`` or a ``configure`` that carried the latest settings, or by reporting ready from a
  process forked with them.  A ``configure`` the worker failed leaves the slot's settings
  unknown, so the next alter or reconcile sends them again.  The client is answered when all
  have, or with error 12 after ``timeout_s``.
- **Retries.**  A control the slot's process cannot take now (its queue is full) is sent again by
  :meth:`TopicAdmin.expire`, which the arbiter calls on every tick, at most every
  ``RETRY_INTERVAL_S``, as long as the slot serves; a slot that goes down and comes back is
  reconciled when it is ready.
- **Moved replicas.**  When a replicated topic's assignment changes (:meth:`TopicAdmin.move_replicas`,
  a reassignment), the replicas newly naming this broker are opened like a creation's, and a slot
  whose process holds a replica no longer naming it is sent ``remove`` (close it, delete its
  directory) once the partition's state names this broker neither leader nor in-sync replica.
- **Deletion.**  The topic is marked ``deleting`` in the store and disappears from the clients'
  view at once; every owning slot is sent ``delete`` (a slot that is down gets it when it is
  ready again, its new process having been given the partitions so that it can delete them), and
  the store forgets the topic once each has acknowledged.  A deletion interrupted by a restart
  resumes at the next start.  The client is answered at the end, or with error 12 after
  ``timeout_s`` while the deletion goes on.

Single-threaded: called only from the arbiter's loop.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hpbroker.broker.descriptors import HOW_TO_RAISE, DescriptorBudget
from hpbroker.broker.topics import Topic, TopicStore
from hpbroker.errors import HPBrokerError, RequestTimedOutError, StorageError
from hpbroker.workers.backend import PartitionSpec
from hpbroker.workers.ownership import owner_slot

__all__ = ["RETRY_INTERVAL_S", "Reply", "TopicAdmin"]

logger = logging.getLogger(__name__)

RETRY_INTERVAL_S = 0.5  # seconds between two attempts to send a slot the controls it refused

# reply(waiter, error or None): answer a client waiting on a create or delete.
Reply = Callable[[Any, HPBrokerError | None], None]
# send_control(slot, op, body) -> whether the control could be handed to the slot's process.
SendControl = Callable[[int, str, dict[str, Any]], bool]


@dataclass(slots=True)
class _Pending:
    """A create or delete still waiting for some slots."""

    waiting: set[int]
    deadline: float  # monotonic; clients still waiting then get error 12
    waiters: list[Any] = field(default_factory=list)  # opaque client handles for Reply
    errors: list[str] = field(default_factory=list)
    sent: set[int] = field(default_factory=set)  # slots with a delete in flight


@dataclass(frozen=True, slots=True)
class _Control:
    slot: int
    op: str
    # topic -> the settings the control carries (those of an open or a configure; empty for a delete)
    configs: dict[str, dict[str, Any]] = field(default_factory=dict)


class TopicAdmin:
    """Creates and deletes topics with the owning workers' help (module docstring)."""

    def __init__(self, store: TopicStore, slots: int, *, send_control: SendControl, reply: Reply,
                 is_serving: Callable[[int], bool], timeout_s: float, max_connections: int = 1024,
                 broker_id: int = 0, released: Callable[[str, int], bool] = lambda topic, partition: True,
                 ) -> None:
        """``max_connections``: the workers' limit on data connections, whose descriptors are
        kept out of the partitions' share (``hpbroker.broker.descriptors``).  ``broker_id``: this
        broker, which stores only the partitions of a replicated topic that name it among their
        replicas (:meth:`Topic.hosts`).  ``released(topic, partition)``: whether a replica moved
        away from this broker may be removed now (the partition's state names it neither leader nor
        in-sync replica any more: until then its records may be the only copy of some)."""
        self._store = store
        self._broker_id = broker_id
        self._released = released
        self._max_connections = max_connections
        self._slots = slots
        self._send_control = send_control
        self._reply = reply
        self._is_serving = is_serving
        self._timeout_s = timeout_s
        self._assigned: list[set[tuple[str, int]]] = [set() for _ in range(slots)]
        # topic -> settings the slot's process was given; None: unknown (a configure failed)
        self._applied: list[dict[str, dict[str, Any] | None]] = [{} for _ in range(slots)]
        self._unsent: set[int] = set()  # slots that refused a control: reconciled again by expire
        self._retry_at = 0.0  # monotonic; expire retries no sooner
        self._controls: dict[int, _Control] = {}
        self._ids = itertools.count(1)
        self._creates: dict[str, _Pending] = {}
        self._alters: dict[str, _Pending] = {}
        self._deletes: dict[str, _Pending] = {}
        for topic in store.topics(include_deleting=True):
            if topic.deleting:  # interrupted by the last stop: resume
                self._deletes[topic.name] = _Pending(self.owners(topic), float("inf"))
        self._warn_if_over_budget()

    def owners(self, topic: Topic) -> set[int]:
        """The slots that own at least one partition of ``topic`` stored here."""
        if topic.replicated:
            return {owner_slot(topic.name, p, self._slots) for p in range(topic.partitions)
                    if topic.hosts(p, self._broker_id)}
        return {owner_slot(topic.name, p, self._slots) for p in range(min(topic.partitions, self._slots))}

    def assigned(self, slot: int) -> set[tuple[str, int]]:
        """The partitions the slot's current process has been told to open (at its fork or with
        an ``open`` sent since), which it has open or is opening: controls about them may follow."""
        return self._assigned[slot]

    def deleting(self) -> list[str]:
        return sorted(self._deletes)

    # --- the slots' life cycle --------------------------------------------------------------------

    def assign(self, slot: int) -> list[PartitionSpec]:
        """The partitions a process about to be forked into ``slot`` must open (recorded as that
        process's assignment)."""
        specs = self._desired(slot)
        self._assigned[slot] = {(s.topic, s.partition) for s in specs}
        self._applied[slot] = {s.topic: dict(s.config) for s in specs}
        return specs

    def slot_ready(self, slot: int) -> None:
        """The slot's process has opened everything it was forked with."""
        forked_with = {topic for topic, _ in self._assigned[slot]}
        for name in list(self._creates):
            if name in forked_with:
                self._confirm_create(name, slot, None)
        for name in list(self._alters):
            if name in forked_with:
                self._confirm_alter(name, slot, None, self._applied[slot].get(name))
        self.reconcile(slot)

    def slot_down(self, slot: int) -> None:
        """The slot's process is gone: its assignment and its unanswered controls with it."""
        self._assigned[slot] = set()
        self._applied[slot] = {}
        self._unsent.discard(slot)
        for control_id in [i for i, c in self._controls.items() if c.slot == slot]:
            del self._controls[control_id]
        for pending in self._deletes.values():
            pending.sent.discard(slot)

    def reconcile(self, slot: int) -> None:
        """Send a serving slot the ``open``, ``configure`` and ``delete`` controls that bring its
        process in step with the store.  A control the process cannot take now is left for
        :meth:`expire` to send."""
        self._unsent.discard(slot)
        if not self._is_serving(slot):
            return
        sent = True
        missing = [s for s in self._desired(slot) if (s.topic, s.partition) not in self._assigned[slot]
                   and s.topic not in self._deletes]
        if missing:
            configs = {s.topic: dict(s.config) for s in missing}
            if self._control(slot, "open", {"partitions": [s.to_json() for s in missing]}, configs):
                self._assigned[slot].update((s.topic, s.partition) for s in missing)
                self._applied[slot].update(configs)
            else:
                sent = False
        applied = self._applied[slot]
        for topic in self._store.topics():
            name = topic.name
            if name in applied and applied[name] != topic.config and name not in self._deletes:
                config = dict(topic.config)
                if self._control(slot, "configure", {"topic": name, "config": config}, {name: config}):
                    applied[name] = config
                else:
                    sent = False
        moved: dict[str, list[int]] = {}  # replicas of this slot's process that moved to other brokers
        for name, number in self._assigned[slot]:
            topic = self._store.get(name)
            if topic is not None and not topic.deleting and not topic.hosts(number, self._broker_id):
                if self._released(name, number):
                    moved.setdefault(name, []).append(number)
                else:
                    sent = False  # kept until the state lets it go: expire() looks again
        for name, numbers in sorted(moved.items()):
            if self._control(slot, "remove", {"topic": name, "partitions": sorted(numbers)}, {name: {}}):
                self._assigned[slot] -= {(name, number) for number in numbers}
            else:
                sent = False
        for name, pending in self._deletes.items():
            if slot in pending.waiting and slot not in pending.sent:
                if self._control(slot, "delete", {"topic": name}, {name: {}}):
                    pending.sent.add(slot)
                else:
                    sent = False
        if not sent:
            self._unsent.add(slot)

    def acked(self, slot: int, control_id: Any, error: Any) -> None:
        """A worker's ``{"op": "ack", "id": ..., "error": ...}``."""
        control = self._controls.pop(control_id, None) if isinstance(control_id, int) else None
        if control is None or control.slot != slot:
            logger.warning("[arbiter] slot %d acknowledged unknown control %r", slot, control_id)
            return
        error_text = None if error is None else str(error)
        if error_text is not None:
            logger.error("[arbiter] slot %d failed %s of %s: %s", slot, control.op,
                         ", ".join(sorted(control.configs)), error_text)
        for name, config in control.configs.items():
            if control.op == "open":
                self._confirm_create(name, slot, error_text)
                self._confirm_alter(name, slot, error_text, config)
            elif control.op == "remove":
                pass  # a moved replica: nobody waits for it (an error is logged above)
            elif control.op == "configure":
                if error_text is not None and self._applied[slot].get(name) == config:
                    self._applied[slot][name] = None  # unknown now: the next reconcile sends it again
                self._confirm_alter(name, slot, error_text, config)
            else:
                self._confirm_delete(name, slot, error_text)

    # --- requests ---------------------------------------------------------------------------------

    def create(self, waiter: Any, name: str, partitions: int, configs: Any, now: float, *,
               replicas: dict[int, tuple[int, ...]] | None = None) -> Topic:
        """Persist a topic and have its owners open it; ``waiter`` (None: nobody) is answered
        when they have.  Validation errors raise at once (nothing is persisted then), among them
        InvalidPartitionsError for a topic that would not fit in the workers' file descriptors.
        ``replicas``: a replicated topic's assignment; only the partitions naming this broker open."""
        topic = self._store.create(name, partitions, configs, admit=self._check_descriptors,
                                   replicas=replicas)
        logger.info("[arbiter] created topic %s with %d partitions%s", name, partitions,
                    f" (config {topic.config})" if topic.config else "")
        pending = _Pending(self.owners(topic), now + self._timeout_s)
        if waiter is not None:
            pending.waiters.append(waiter)
        self._creates[name] = pending
        for slot in sorted(pending.waiting):
            self.reconcile(slot)
        self._finish_create(name)
        return topic

    def move_replicas(self, name: str, replicas: dict[int, tuple[int, ...]]) -> Topic:
        """A replicated topic's assignment changed: persist it, open the replicas now naming this
        broker, remove those that no longer do (backend control ``remove``)."""
        before = self._store.get(name)
        topic = self._store.set_replicas(name, replicas)
        if before is not None and before.replicas != topic.replicas:
            logger.info("[arbiter] topic %s: replicas %s (were %s)", name,
                        {p: list(r) for p, r in topic.replicas.items()},
                        {p: list(r) for p, r in before.replicas.items()})
            for slot in range(self._slots):
                self.reconcile(slot)
        return topic

    def alter(self, waiter: Any, name: str, changes: Any, now: float) -> Topic:
        """Persist new settings for a topic and have its owners apply them to their open logs;
        ``waiter`` is answered when they have.  Validation errors raise at once (nothing is
        persisted then); UnknownTopicOrPartitionError for a topic absent or being deleted."""
        before = self._store.get(name)
        topic = self._store.alter(name, changes)
        if before is not None and before.config != topic.config:
            logger.info("[arbiter] topic %s: settings %s (were %s)", name, topic.config or "broker defaults",
                        before.config or "broker defaults")
        pending = self._alters.get(name)
        if pending is None:
            pending = self._alters[name] = _Pending(set(), now + self._timeout_s)
        pending.waiting = self.owners(topic)  # every owner must have the latest settings
        pending.deadline = now + self._timeout_s
        if waiter is not None:
            pending.waiters.append(waiter)
        for slot in sorted(pending.waiting):
            if self._applied[slot].get(name) == topic.config:
                pending.waiting.discard(slot)
            else:
                self.reconcile(slot)
        self._finish_alter(name)
        return topic

    def delete(self, waiter: Any, name: str, now: float) -> None:
        """Mark a topic deleting and have its owners delete their partitions; raises
        UnknownTopicOrPartitionError for a topic the store does not hold."""
        topic = self._store.mark_deleting(name)
        pending = self._deletes.get(name)
        if pending is None:
            logger.info("[arbiter] deleting topic %s", name)
            pending = self._deletes[name] = _Pending(self.owners(topic), now + self._timeout_s)
            for table in (self._creates, self._alters):
                started = table.pop(name, None)
                for waiter_before in started.waiters if started is not None else ():
                    self._reply(waiter_before, None)  # it was done; the deletion is another story
        pending.deadline = min(pending.deadline, now + self._timeout_s)
        pending.waiters.append(waiter)
        for slot in sorted(pending.waiting):
            self.reconcile(slot)
        self._finish_delete(name)

    def expire(self, now: float) -> None:
        """Send again the controls that serving slots refused (at most every ``RETRY_INTERVAL_S``),
        and answer with error 12 the clients whose create, alter or delete outlived its deadline."""
        if self._unsent and now >= self._retry_at:
            self._retry_at = now + RETRY_INTERVAL_S
            for slot in sorted(self._unsent):
                self.reconcile(slot)
        for kind, table in (("create", self._creates), ("alter", self._alters), ("delete", self._deletes)):
            for name, pending in list(table.items()):
                if now < pending.deadline:
                    continue
                message = (f"{kind} of topic {name!r} did not finish in {self._timeout_s:g} s: "
                           f"waiting for worker slots {sorted(pending.waiting)}; it goes on")
                for waiter in pending.waiters:
                    self._reply(waiter, RequestTimedOutError(message))
                pending.waiters.clear()
                pending.deadline = float("inf")
                if kind != "delete":
                    del table[name]

    def abandon(self) -> None:
        """Forget every waiting client (the broker is stopping)."""
        for pending in (*self._creates.values(), *self._alters.values(), *self._deletes.values()):
            pending.waiters.clear()

    # --- internals --------------------------------------------------------------------------------

    def partitions_per_slot(self, extra: Topic | None = None) -> list[int]:
        """How many partitions each slot holds: of every stored topic (those being deleted too,
        until they are), and of ``extra``."""
        counts = [0] * self._slots
        topics = self._store.topics(include_deleting=True)
        for topic in [*topics, extra] if extra is not None else topics:
            first = owner_slot(topic.name, 0, self._slots)
            for slot in range(self._slots):
                r = (slot - first) % self._slots  # the slot holds partitions r, r + slots, ...
                counts[slot] += max(0, (topic.partitions - r + self._slots - 1) // self._slots)
        return counts

    def _check_descriptors(self, topic: Topic) -> None:
        """Refuse a new topic after which some slot would hold more partitions than its file
        descriptors allow (the soft RLIMIT_NOFILE, read now: the workers inherit it)."""
        budget = DescriptorBudget.current(self._max_connections)
        before, counts = self.partitions_per_slot(), self.partitions_per_slot(topic)
        touched = [slot for slot in range(self._slots) if counts[slot] > before[slot]]
        # Only the slots the new topic adds to: one already over the limit (a lowered limit)
        # must not refuse a topic that lands elsewhere.
        slot = max(touched, key=counts.__getitem__)
        budget.check(topic.name, topic.partitions, slot, counts[slot], self._slots)

    def _warn_if_over_budget(self) -> None:
        """Say at start when the stored topics hold more partitions than the workers can open
        (a lowered limit, or topics created by an older version): the workers serve what fits."""
        budget = DescriptorBudget.current(self._max_connections)
        counts = self.partitions_per_slot()
        if counts and max(counts) > budget.partitions_per_worker:
            over = sum(max(0, c - budget.partitions_per_worker) for c in counts)
            logger.error("[arbiter] the topics hold up to %d partitions per worker but %s: about %d "
                         "partitions will not be opened and answer with error 15 until the limit is "
                         "raised; %s", max(counts), budget.describe(), over, HOW_TO_RAISE)

    def _desired(self, slot: int) -> list[PartitionSpec]:
        """What the slot must hold: its partitions of every topic, except those of deleting
        topics it has already deleted."""
        specs = []
        for topic in self._store.topics(include_deleting=True):
            pending = self._deletes.get(topic.name)
            if topic.deleting and (pending is None or slot not in pending.waiting):
                continue
            first = (slot - owner_slot(topic.name, 0, self._slots)) % self._slots
            specs += [PartitionSpec(topic.name, p, dict(topic.config), topic.replicated)
                      for p in range(first, topic.partitions, self._slots) if topic.hosts(p, self._broker_id)]
        return specs

    def _control(self, slot: int, op: str, body: dict[str, Any], configs: dict[str, dict[str, Any]]) -> bool:
        """Send a control about the topics ``configs`` names (with the settings it carries)."""
        control_id = next(self._ids)
        if not self._send_control(slot, op, {"id": control_id, **body}):
            return False
        self._controls[control_id] = _Control(slot, op, configs)
        return True

    def _confirm_create(self, name: str, slot: int, error: str | None) -> None:
        pending = self._creates.get(name)
        if pending is not None:
            pending.waiting.discard(slot)
            if error is not None:
                pending.errors.append(f"slot {slot}: {error}")
            self._finish_create(name)

    def _finish_create(self, name: str) -> None:
        pending = self._creates[name]
        if pending.waiting:
            return
        del self._creates[name]
        error = StorageError(f"topic {name!r} was created but some partitions did not open: "
                             f"{'; '.join(pending.errors)}") if pending.errors else None
        for waiter in pending.waiters:
            self._reply(waiter, error)

    def _confirm_alter(self, name: str, slot: int, error: str | None, config: dict[str, Any] | None) -> None:
        """``slot``'s process has ``config`` for topic ``name`` (or failed to apply it): that
        confirms a pending alter only if ``config`` is the store's latest."""
        pending, topic = self._alters.get(name), self._store.get(name)
        if pending is None or topic is None or config != topic.config:
            return
        pending.waiting.discard(slot)
        if error is not None:
            pending.errors.append(f"slot {slot}: {error}")
        self._finish_alter(name)

    def _finish_alter(self, name: str) -> None:
        pending = self._alters[name]
        if pending.waiting:
            return
        del self._alters[name]
        error = StorageError(f"topic {name!r}: the new settings are stored, but some partitions did not "
                             f"take them: {'; '.join(pending.errors)}") if pending.errors else None
        for waiter in pending.waiters:
            self._reply(waiter, error)

    def _confirm_delete(self, name: str, slot: int, error: str | None) -> None:
        pending = self._deletes.get(name)
        if pending is None:
            return
        pending.sent.discard(slot)
        if error is None:
            pending.waiting.discard(slot)
            self._assigned[slot] = {(t, p) for t, p in self._assigned[slot] if t != name}
            self._finish_delete(name)
        else:
            pending.errors.append(f"slot {slot}: {error}")
            for waiter in pending.waiters:
                self._reply(waiter, StorageError(f"deleting topic {name!r} failed on slot {slot}: "
                                                 f"{error}; it is retried when the slot restarts"))
            pending.waiters.clear()

    def _finish_delete(self, name: str) -> None:
        pending = self._deletes[name]
        if pending.waiting:
            return
        error: StorageError | None = None
        try:
            self._store.forget(name)
            logger.info("[arbiter] deleted topic %s", name)
        except StorageError as e:  # the store still says "deleting": the next start finishes it
            logger.error("[arbiter] deleted the partitions of topic %s but not the topic: %s", name, e)
            error = e
        del self._deletes[name]
        for waiter in pending.waiters:
            self._reply(waiter, error)

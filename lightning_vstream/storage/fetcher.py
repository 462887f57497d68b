"""Fetching GOP byte ranges: ahead of the decoders on I/O threads, bounded in memory, through the node cache.

A :class:`Unit` is one GOP's byte range of one object version. Decoders ask for units with
:meth:`Fetcher.get` (blocking) and hand them back with :meth:`Fetcher.release`; the plan announces
the units it will need with :meth:`Fetcher.prefetch`, each with the plan clock of its read (its
*due*), and I/O threads fetch them earliest-due first while the bytes held stay under the budget.
Adjacent units are fetched in one request: a stream's next GOPs up to ``merge_limit`` bytes
(8 MiB) when streaming; the GOPs one sample needs when their gaps are under :data:`MERGE_GAP`
(64 KiB), never an unneeded GOP in between. With a :class:`~lightning_vstream.storage.cache.NodeCache`
every unit is looked up there first and written there once fetched.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
import os
import threading
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field

from lightning_vstream.storage.cache import NodeCache
from lightning_vstream.storage.client import Expect, Storage, storage_for
from lightning_vstream.storage.config import StorageConfig
from lightning_vstream.storage.stats import StatsRecorder, StorageStats

__all__ = ["DEFAULT_BUDGET", "MERGE_GAP", "MERGE_LIMIT", "Fetcher", "Unit", "fetcher_for", "group_units"]

log = logging.getLogger("lightning_vstream")

#: Largest gap (bytes of other data, another stream's packets) merged into one request.
MERGE_GAP = 64 * 1024
#: Largest request when streaming: a stream's next GOPs are fetched together up to this many bytes.
MERGE_LIMIT = 8 * 1024 * 1024
#: Bytes a process may hold fetched ahead (prefetched and not yet released), by default.
DEFAULT_BUDGET = 256 * 1000 * 1000
#: I/O threads per process, by default.
DEFAULT_THREADS = 8


@dataclass(frozen=True)
class Unit:
    """One GOP's byte range ``[start, end)`` of the object at ``url``, as the index recorded it (``expect``).

    ``gop`` is the GOP's ordinal in its file (-1: unknown): requests merge units of consecutive GOPs
    only, so a merged request never carries a whole GOP nobody asked for.
    """

    url: str
    start: int
    end: int
    expect: Expect = field(default_factory=Expect)
    gop: int = field(default=-1, compare=False)

    @property
    def size(self) -> int:
        return self.end - self.start

    @property
    def version(self) -> str:
        """The object version the bytes belong to (cache key): its ETag, else its size."""
        if self.expect.etag:
            return self.expect.etag
        return f"size:{self.expect.size}" if self.expect.size is not None else "unknown"


def group_units(units: Sequence[Unit], *, gap: int = MERGE_GAP, limit: int = MERGE_LIMIT) -> list[list[Unit]]:
    """Split ``units`` (of one or more objects) into requests: runs of units of one object, of the same or
    consecutive GOPs, whose gaps are under ``gap`` bytes, each at most ``limit`` bytes (a unit larger
    than ``limit`` is a request of its own).

    Example::

        >>> units = [Unit("s3://b/a", 0, 100), Unit("s3://b/a", 100, 200), Unit("s3://b/a", 10**6, 10**6 + 5)]
        >>> [[(u.start, u.end) for u in group] for group in group_units(units)]
        [[(0, 100), (100, 200)], [(1000000, 1000005)]]
    """
    groups: list[list[Unit]] = []
    for unit in sorted(set(units), key=lambda u: (u.url, u.start)):
        last = groups[-1] if groups else None
        if (
            last is not None
            and last[-1].url == unit.url
            and last[-1].expect == unit.expect
            and 0 <= unit.start - last[-1].end < gap
            and (unit.gop < 0 or last[-1].gop < 0 or unit.gop - last[-1].gop <= 1)
            and unit.end - last[0].start <= limit
        ):
            last.append(unit)
        else:
            groups.append([unit])
    return groups


class _Entry:
    """A unit in memory: its bytes (or the future of them), when the plan needs it, and who holds it."""

    __slots__ = ("counted", "due", "future", "group", "next_use", "pins", "prefetched", "started")

    def __init__(self, due: float, next_use: float | None, prefetched: bool) -> None:
        self.future: Future[memoryview] = Future()
        self.due = due
        self.next_use = next_use
        self.pins = 0
        self.prefetched = prefetched
        self.started = False  # fetched by whoever takes it first: an I/O thread or a decoder
        self.counted = False  # its bytes count against the budget (from the moment it is fetched)
        self.group: list[Unit] | None = None  # the request it is queued in (a decoder that needs it takes it all)


class Fetcher:
    """Fetches units for one process (see the module docs).

    Args:
        storage: How requests are made (retries, counters, named errors).
        cache: The node cache, or None.
        budget: Bytes held fetched ahead at most (units a decoder holds count too).
        threads: I/O threads (started on the first prefetch).
        merge_limit: Largest prefetch request in bytes.

    Example::

        >>> fetcher = fetcher_for(StorageConfig({"anonymous": True}))  # doctest: +SKIP
        >>> unit = Unit("s3://bucket/a.mp4", 48, 600_000)  # doctest: +SKIP
        >>> fetcher.prefetch([unit], due=3); data = fetcher.get(unit); fetcher.release(unit)  # doctest: +SKIP
    """

    def __init__(
        self,
        storage: Storage,
        cache: NodeCache | None = None,
        *,
        budget: int = DEFAULT_BUDGET,
        threads: int = DEFAULT_THREADS,
        merge_limit: int = MERGE_LIMIT,
    ) -> None:
        self.storage = storage
        self.cache = cache
        self.budget = budget
        self.merge_limit = merge_limit
        self.threads = threads
        self.recorder: StatsRecorder = storage.recorder
        if cache is not None:
            cache.stats = self.recorder
        self._cond = threading.Condition()
        self._entries: dict[Unit, _Entry] = {}
        self._queue: list[tuple[float, int, list[Unit]]] = []
        self._seq = itertools.count()
        self._held = 0  # bytes of entries in memory or in flight
        self._workers: list[threading.Thread] = []
        self._closed = False
        self.pid = os.getpid()

    @property
    def stats(self) -> StorageStats:
        return self.recorder.snapshot()

    @property
    def held_bytes(self) -> int:
        """Bytes held now (fetched ahead, being fetched, or held by a decoder)."""
        with self._cond:
            return self._held

    # -- the decoders' side --------------------------------------------------------------------
    def get(self, unit: Unit, *, with_units: Sequence[Unit] = (), next_use: float | None = None) -> memoryview:
        """The bytes of ``unit``, held until :meth:`release` (blocking: fetched now unless fetched ahead).

        ``with_units`` are other units needed now: those not in memory yet are fetched with ``unit``
        in the same requests where their gaps allow (see :func:`group_units`); each must be
        released too once :meth:`get` has returned them.
        """
        wanted = list(dict.fromkeys([unit, *with_units]))
        mine: list[Unit] = []
        with self._cond:
            for u in wanted:
                entry = self._entries.get(u)
                if entry is None:
                    entry = self._entries[u] = _Entry(-math.inf, next_use, prefetched=False)
                if not entry.started:
                    # Announced but not taken by an I/O thread yet: make its planned request here, now.
                    for v in entry.group or [u]:
                        other = self._entries.get(v)
                        if other is not None and not other.started:
                            other.started = True
                            mine.append(v)
                            if not other.counted:
                                other.counted = True
                                self._held += v.size
                if not entry.counted:
                    entry.counted = True
                    self._held += u.size
                entry.pins += 1
            entry = self._entries[unit]
            self._note_peak()
        if entry.prefetched and unit not in mine:
            self.recorder.add(prefetch_hits=1) if entry.future.done() else self.recorder.add(prefetch_waits=1)
        for group in group_units(mine, limit=max(self.merge_limit, sum(u.size for u in mine))):
            try:
                self._fetch(group)
            except BaseException:
                pass  # the units' futures hold the error; it is raised below for the unit asked for
        try:
            return entry.future.result()
        except BaseException:
            self.release(*wanted)
            raise

    def view(self, unit: Unit) -> memoryview:
        """The bytes of a unit already held (through :meth:`get`'s ``with_units``), waiting for them if needed."""
        with self._cond:
            entry = self._entries[unit]
        return entry.future.result()

    def ready(self, unit: Unit) -> bool:
        """True when :meth:`get` would not wait for the network (in memory, or in the node cache)."""
        with self._cond:
            entry = self._entries.get(unit)
            if entry is not None:
                return entry.future.done()
        return self.cache is not None and self.cache.contains(self._key(unit))

    def coming(self, unit: Unit) -> bool:
        """True when :meth:`get` would make no request of its own: in memory, fetched ahead, in the node cache, or a
        local file (read with ``pread``)."""
        if unit.url.startswith("file:"):
            return True
        with self._cond:
            if unit in self._entries:
                return True
        return self.cache is not None and self.cache.contains(self._key(unit))

    def release(self, *units: Unit) -> None:
        """Hand back units from :meth:`get`; a unit nobody holds leaves memory."""
        with self._cond:
            for unit in units:
                entry = self._entries.get(unit)
                if entry is None:
                    continue
                entry.pins -= 1
                if entry.pins <= 0:
                    self._drop(unit)
            self._cond.notify_all()

    def refetch(self, unit: Unit) -> memoryview:
        """The bytes of ``unit`` read again from storage, bypassing memory and the cache (after a checksum failure).

        Replaces the cached copy. The unit stays held as before.
        """
        self.recorder.add(checksum_refetches=1)
        if self.cache is not None:
            self.cache.discard(self._key(unit))
        data, _ = self.storage.read(unit.url, unit.start, unit.end, expect=unit.expect, label="checksum re-read")
        view = memoryview(data)
        if self.cache is not None:
            self.cache.put(self._key(unit), view, priority=None)
        with self._cond:
            entry = self._entries.get(unit)
            if entry is not None:
                entry.future = Future()
                entry.future.set_result(view)
        return view

    # -- the plan's side -----------------------------------------------------------------------
    def prefetch(
        self,
        units: Sequence[Unit],
        *,
        due: float | Sequence[float],
        next_use: Sequence[float | None] | None = None,
    ) -> None:
        """Fetch ``units`` ahead, to be read at plan clock ``due`` (one for all, or one per unit).

        Requests go out earliest due first, within the budget; adjacent units merge into one request
        (see :func:`group_units`). ``next_use`` gives each unit's following planned read (its priority
        in the node cache). Units already in memory or on their way are left as they are.
        """
        fresh: list[Unit] = []
        dues = [float(due)] * len(units) if isinstance(due, (int, float)) else [float(d) for d in due]
        uses = list(next_use) if next_use is not None else [None] * len(units)
        with self._cond:
            if self._closed:
                return
            for unit, when, use in zip(units, dues, uses):
                entry = self._entries.get(unit)
                if entry is not None:
                    entry.due = min(entry.due, when) if entry.prefetched else entry.due
                    continue
                self._entries[unit] = _Entry(when, use, prefetched=True)
                fresh.append(unit)
            for group in group_units(fresh, limit=self.merge_limit):
                for unit in group:
                    self._entries[unit].group = group
                heapq.heappush(self._queue, (min(self._entries[u].due for u in group), next(self._seq), group))
            self._start_workers()
            self._cond.notify_all()

    def forget_before(self, clock: float) -> None:
        """Drop units fetched ahead for reads before ``clock`` that nobody took (the plan moved on)."""
        with self._cond:
            stale = [
                u
                for u, e in self._entries.items()
                if e.prefetched and e.pins == 0 and e.due < clock and e.future.done()
            ]
            for unit in stale:
                self._drop(unit)
            self._cond.notify_all()

    # -- internals -----------------------------------------------------------------------------
    def _drop(self, unit: Unit) -> None:
        entry = self._entries.pop(unit, None)
        if entry is not None and entry.counted:
            self._held -= unit.size

    def _note_peak(self) -> None:
        self.recorder.add(prefetch_peak_bytes=self._held)

    def _key(self, unit: Unit) -> str:
        return NodeCache.key(unit.url, unit.version, unit.start, unit.end)

    def _start_workers(self) -> None:
        if self._workers or self.threads < 1:
            return
        for n in range(self.threads):
            thread = threading.Thread(target=self._work, name=f"vstream-io-{n}", daemon=True)
            thread.start()
            self._workers.append(thread)

    def _work(self) -> None:
        while True:
            with self._cond:
                group = self._next_group()
                if group is None:
                    return
            try:
                self._fetch(group)
            except BaseException:  # the units' futures carry the error to whoever asks for them
                log.debug("prefetching %s failed", group[0].url, exc_info=True)

    def _next_group(self) -> list[Unit] | None:
        """The earliest-due group that fits the budget, waiting for room (call with the lock held)."""
        while not self._closed:
            if self._queue:
                due, _, group = self._queue[0]
                group = [u for u in group if u in self._entries and not self._entries[u].started]
                need = sum(u.size for u in group)
                if not group:
                    heapq.heappop(self._queue)
                    continue
                if self._held + need <= self.budget or self._held == 0 or self._make_room(need, due):
                    heapq.heappop(self._queue)
                    for unit in group:
                        entry = self._entries[unit]
                        entry.started = entry.counted = True
                    self._held += need
                    self._note_peak()
                    return group
            self._cond.wait(timeout=1.0)
        return None

    def _make_room(self, need: int, due: float) -> bool:
        """Drop units fetched ahead for later reads than ``due`` until ``need`` more bytes fit."""
        later = sorted(
            (
                (e.due, u)
                for u, e in self._entries.items()
                if e.prefetched and e.pins == 0 and e.due > due and e.future.done()
            ),
            key=lambda item: item[0],  # by due only: units of one due do not order (comparing them killed the thread)
        )
        while later and self._held + need > self.budget:
            _, unit = later.pop()
            self._drop(unit)
        return self._held + need <= self.budget

    def _fetch(self, group: list[Unit]) -> None:
        """Fetch one group (the cache first, then one request per contiguous run of misses) and settle its futures."""
        pending: list[Unit] = []
        claimed: list[str] = []
        try:
            for unit in group:
                data = self._from_cache(unit)
                if data is not None:
                    self._settle(unit, memoryview(data))
                else:
                    pending.append(unit)
            waiting: list[Unit] = []
            if self.cache is not None:
                for unit in pending:
                    key = self._key(unit)
                    if self.cache.claim(key):
                        claimed.append(key)
                    else:
                        waiting.append(unit)
            mine = [u for u in pending if u not in waiting]
            for run in group_units(mine, limit=max(self.merge_limit, sum(u.size for u in mine))):
                start, end = run[0].start, run[-1].end
                data, _ = self.storage.read(run[0].url, start, end, expect=run[0].expect)
                view = memoryview(data)
                for unit in run:
                    piece = view[unit.start - start : unit.end - start]
                    if self.cache is not None:
                        self.cache.put(self._key(unit), piece, priority=self._entry_use(unit))
                    self._settle(unit, piece)
            for unit in waiting:  # another process on this machine is downloading it
                data = (
                    self.cache.wait_for(self._key(unit), self.storage.policy.deadline_s, size=unit.size)
                    if self.cache
                    else None
                )
                if data is None:
                    data, _ = self.storage.read(unit.url, unit.start, unit.end, expect=unit.expect)
                else:
                    self.recorder.add(cache_hits=1, cache_misses=-1)
                self._settle(unit, memoryview(data))
        except BaseException as err:
            for unit in group:
                self._fail(unit, err)
            raise
        finally:
            if self.cache is not None:
                for key in claimed:
                    self.cache.unclaim(key)

    def _from_cache(self, unit: Unit) -> bytes | None:
        if self.cache is None:
            return None
        data = self.cache.get(self._key(unit), size=unit.size, priority=self._entry_use(unit))
        if data is not None:
            self.recorder.add(cache_hits=1)
            return data
        self.recorder.add(cache_misses=1)
        return None

    def _entry_use(self, unit: Unit) -> float | None:
        with self._cond:
            entry = self._entries.get(unit)
            return entry.next_use if entry is not None else None

    def _settle(self, unit: Unit, data: memoryview) -> None:
        with self._cond:
            entry = self._entries.get(unit)
            if entry is not None and not entry.future.done():
                entry.future.set_result(data)
            self._cond.notify_all()

    def _fail(self, unit: Unit, err: BaseException) -> None:
        with self._cond:
            entry = self._entries.get(unit)
            if entry is not None and not entry.future.done():
                entry.future.set_exception(err)
                if entry.pins == 0:
                    self._drop(unit)  # nobody waits for it: a later get() fetches it afresh
            self._cond.notify_all()

    def close(self) -> None:
        """Stop the I/O threads (a later prefetch starts new ones) and drop what is held."""
        with self._cond:
            self._closed = True
            self._queue.clear()
            self._cond.notify_all()
        for thread in self._workers:
            thread.join(timeout=5.0)
        with self._cond:
            self._workers = []
            self._closed = False
            for unit in [u for u, e in self._entries.items() if e.pins == 0]:
                self._drop(unit)


_FETCHERS: dict[str, Fetcher] = {}
_LOCK = threading.Lock()


def fetcher_for(config: StorageConfig) -> Fetcher:
    """This process's :class:`Fetcher` for ``config`` (created on first use; a forked child makes its own)."""
    key = config.key
    policy = str(config.get("cache_policy", "plan"))
    with _LOCK:
        fetcher = _FETCHERS.get(key)
        if fetcher is not None and fetcher.pid == os.getpid():
            return fetcher
        if fetcher is not None:  # inherited through fork: its threads do not exist here
            _FETCHERS.clear()
        storage = storage_for(config)
        cache = None
        if config.cache_dir is not None:
            cache = NodeCache(config.cache_dir, limit=config.cache_limit, policy=policy)  # type: ignore[arg-type]
        fetcher = Fetcher(
            storage,
            cache,
            budget=int(config.get("prefetch_memory", DEFAULT_BUDGET)),
            threads=int(config.get("io_threads", DEFAULT_THREADS)),
        )
        _FETCHERS[key] = fetcher
        return fetcher

"""The one runner of decoding threads, and the GOP tasks it runs.

:class:`DecodeThreads` is the pool every reader decodes on: named daemon threads, each owning the
decoders it opened (a :class:`~lightning_vstream.decode.decoder_table.DecoderTable`; one decoder is only
ever used by one thread, so decoders need no lock). Readers give it work two ways:

- :meth:`DecodeThreads.run`: one list of jobs per thread, run to the end; the first failure (in the
  order the jobs carry) cancels the jobs not started yet and is raised in the caller once every
  thread has stopped; a run that does not finish within ``timeout`` raises
  :class:`~lightning_vstream.errors.WorkerError`. With ``threads=0`` the jobs run in the caller.
- :meth:`DecodeThreads.start`: one long body per thread, which returns when its owner says so (the
  stream engine's decode threads, one pass of an epoch each).

Threads start on first use (constructors are cheap), start again in a process forked after that,
and stop when :meth:`DecodeThreads.close` is called, when the pool is garbage-collected, or at
interpreter exit (a daemon thread still inside FFmpeg or torch when the interpreter finalizes is
ended by ``pthread_exit``, which aborts the process if it unwinds through C++ frames).

:class:`GopExecutor` runs GOP tasks (planned by :mod:`lightning_vstream.decode.gops`) on it: tasks
are assigned up front (:func:`~lightning_vstream.decode.gops.assign_tasks`: longest first, to the
least-loaded thread, preferring one that already has the stream open), so a run is deterministic;
each thread keeps a small LRU of decoders per stream between runs. Every task reaches its decoder
in one place (:meth:`GopExecutor._decode`): there the GPU's batch reader
(:class:`~lightning_vstream.decode.nvdec.decoder.NvGopDecoder`) and the CPU's per-sample reads (any frame
decoder, :func:`frames_decoder_tasks`) decode a GOP from its keyframe to its last wanted frame, and
only the wanted frames reach the caller.

Not run here: the storage fetcher's I/O threads (:mod:`lightning_vstream.storage.fetcher`), which
block on sockets rather than decoders.
"""

from __future__ import annotations

import atexit
import functools
import inspect
import logging
import os
import threading
import weakref
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from lightning_vstream.decode.counters import DecodeStats
from lightning_vstream.decode.decoder_table import DecoderTable
from lightning_vstream.decode.gops import GopTask, assign_tasks
from lightning_vstream.errors import ConfigurationError, WorkerError

__all__ = ["DecodeThreads", "Emit", "GopExecutor", "Into", "TaskDecoder", "ThreadSlot", "frames_decoder_tasks"]

log = logging.getLogger("lightning_vstream")

#: Called by a decoder for every wanted frame of a task: ``emit(frame_index, frame)``.
Emit = Callable[[int, Any], None]
#: Where a wanted frame may be decoded into directly, when the caller has its memory: ``into(frame_index)``.
Into = Callable[[int], Any]


class TaskDecoder(Protocol):
    """What the executor needs from a decoder of one stream."""

    def decode_gop(self, task: GopTask, emit: Emit) -> None:
        """Decode ``task`` from its keyframe; call ``emit(index, frame)`` for each wanted frame, ascending."""
        ...

    def close(self) -> None:
        """Release the decoder (it may be handed to another stream of the same format)."""
        ...


class _FrameDecoderTasks:
    """Adapts a :class:`~lightning_vstream.decode.base.FrameDecoder` (PyAV, images) to :class:`TaskDecoder`.

    ``get`` decodes forward within a GOP and jumps to the keyframe otherwise, and converts only the
    frame it returns, so a task costs one pass over its GOP prefix. Where the caller gives memory for
    a frame (``into``) and the decoder writes into memory given (``get(index, out=...)``), the frame
    is decoded straight into it.
    """

    def __init__(self, decoder: Any) -> None:
        self.decoder = decoder
        self._takes_out = _takes_out(type(decoder))

    def decode_gop(self, task: GopTask, emit: Emit, into: Into | None = None) -> None:
        expect = getattr(self.decoder, "expect", None)
        if expect is not None:
            expect(task.frames)  # pictures no wanted frame needs are not decoded
        get = self.decoder.get
        for index in task.frames:
            out = into(index) if into is not None and self._takes_out else None
            emit(index, get(index) if out is None else get(index, out=out))

    @property
    def frames_decoded(self) -> int:
        return int(self.decoder.frames_decoded)

    @property
    def seeks(self) -> int:
        return int(getattr(self.decoder, "seeks", 0))

    def close(self) -> None:
        self.decoder.close()


#: Whether each decoder class's ``get`` takes ``out`` (looked up once per class, not per frame).
_TAKES_OUT: dict[type, bool] = {}


def _takes_out(cls: type) -> bool:
    known = _TAKES_OUT.get(cls)
    if known is None:
        try:
            known = "out" in inspect.signature(cls.get).parameters  # type: ignore[attr-defined]
        except (AttributeError, TypeError, ValueError):
            known = False
        _TAKES_OUT[cls] = known
    return known


def frames_decoder_tasks(decoder: Any) -> TaskDecoder:
    """Wrap a frame decoder (``get(index)`` / ``close()``) as a :class:`TaskDecoder`."""
    return _FrameDecoderTasks(decoder)


# -- the runner ---------------------------------------------------------------------------------
@dataclass
class ThreadSlot:
    """What one decoding thread owns: its number in the pool and the decoders it opened."""

    number: int
    decoders: DecoderTable


#: A job: run in a thread with that thread's slot.
Job = Callable[[ThreadSlot], None]


@dataclass
class _Run:
    pending: int
    stop_at_error: bool = True
    errors: list[tuple[int, BaseException]] = field(default_factory=list)
    cancel: threading.Event = field(default_factory=threading.Event)
    done: threading.Condition = field(default_factory=threading.Condition)
    finished: int = 0  # jobs done


class _Worker:
    """A decoding thread, its slot and its job list. It holds no reference to its pool, so a pool dropped
    without :meth:`DecodeThreads.close` is still collected (and its threads stopped)."""

    def __init__(self, slot: ThreadSlot, name: str, *, thread: bool = True) -> None:
        self.slot = slot
        self.jobs: list[Job] = []
        self.wake = threading.Condition()
        self.stop = False
        self.thread: threading.Thread | None = None
        if thread:
            self.thread = threading.Thread(target=self._loop, name=f"{name}-{slot.number}", daemon=True)
            self.thread.start()

    def submit(self, job: Job) -> None:
        with self.wake:
            self.jobs.append(job)
            self.wake.notify()

    def _loop(self) -> None:
        while True:
            with self.wake:
                while not self.jobs and not self.stop:
                    self.wake.wait()
                if not self.jobs:  # stopped and idle
                    break
                job = self.jobs.pop(0)
            job(self.slot)
            del job
        self.slot.decoders.close_all()  # in the thread that used them


def _stop(workers: list[_Worker], timeout: float | None) -> list[threading.Thread]:
    """Tell ``workers`` to stop after their current job, wait ``timeout`` for each; the threads still running."""
    for worker in workers:
        with worker.wake:
            worker.stop = True
            worker.wake.notify()
    alive = []
    for worker in workers:
        thread = worker.thread
        if thread is None:
            worker.slot.decoders.close_all()
        elif thread is not threading.current_thread():
            thread.join(timeout=timeout)
            if thread.is_alive():
                alive.append(thread)
    return alive


# Live pools, stopped at interpreter exit (see the module docs).
_LIVE: weakref.WeakSet[DecodeThreads] = weakref.WeakSet()
_EXIT_HOOK: list[bool] = []


def _stop_live_pools() -> None:
    for pool in list(_LIVE):
        pool.close(timeout=60.0)


class DecodeThreads:
    """The pool of decoding threads every reader runs on (see the module docs).

    Args:
        threads: Decoding threads; 0 runs every job in the caller (one slot of decoders).
        name: Thread name prefix (threads are ``<name>-<number>``).
        decoders_per_thread: Decoders each thread keeps open (LRU); None: no bound.
        stop: Makes the bodies given to :meth:`start` return (called by :meth:`close` first); held weakly
            when it is a bound method.

    Example::

        >>> pool = DecodeThreads(threads=2, name="demo")
        >>> seen = []
        >>> pool.run([[(0, lambda slot: seen.append(slot.number))], [(1, lambda slot: seen.append(slot.number))]])
        >>> sorted(seen), pool.close()
        ([0, 1], [])
    """

    def __init__(
        self,
        *,
        threads: int,
        name: str,
        decoders_per_thread: int | None = None,
        stop: Callable[[], None] | None = None,
    ) -> None:
        self.count = threads
        self.name = name
        self.decoders_per_thread = decoders_per_thread
        self._stop_fn: Any = weakref.WeakMethod(stop) if inspect.ismethod(stop) else (lambda: stop)
        self._workers: list[_Worker] = []
        self._finalizer: weakref.finalize | None = None
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._retired = DecodeStats()  # counts of the decoder tables of threads stopped so far
        #: Jobs that ran to the end in :meth:`run`.
        self.jobs_run = 0

    # -- threads ---------------------------------------------------------------------------
    def _started(self) -> list[_Worker]:
        """The workers, started (again, in a process forked since they were)."""
        with self._lock:
            if os.getpid() != self._pid:  # forked: the parent's threads do not exist here
                self._workers, self._finalizer, self._pid = [], None, os.getpid()
            if not self._workers:
                inline = self.count == 0
                self._workers = [
                    _Worker(ThreadSlot(n, DecoderTable(limit=self.decoders_per_thread)), self.name, thread=not inline)
                    for n in range(max(1, self.count))
                ]
                if not inline:
                    self._finalizer = weakref.finalize(self, _stop, list(self._workers), 60.0)
                    _LIVE.add(self)
                    if not _EXIT_HOOK:
                        atexit.register(_stop_live_pools)
                        _EXIT_HOOK.append(True)
            return self._workers

    @property
    def slots(self) -> list[ThreadSlot]:
        """Each thread's slot (empty before the first job and after :meth:`close`)."""
        return [worker.slot for worker in self._workers]

    @property
    def threads(self) -> list[threading.Thread]:
        """The live threads (empty before the first job and after :meth:`close`)."""
        return [w.thread for w in self._workers if w.thread is not None]

    def start(self, body: Job) -> None:
        """Run ``body`` once on every thread (a body runs until its owner's ``stop`` makes it return)."""
        for worker in self._started():
            worker.submit(body)

    def run(
        self,
        work: Sequence[Sequence[tuple[int, Job]]],
        *,
        timeout: float | None = None,
        stalled: Callable[[int, int, int], str] | None = None,
        cancel_on_error: bool = True,
    ) -> None:
        """Run ``work[n]`` (``(order, job)`` pairs) on thread ``n``, in that order; return when all is done.

        Args:
            work: One job list per thread (with ``threads=0``, all run in the caller, list after list).
            timeout: Seconds to wait for the threads (None: no limit).
            stalled: ``stalled(threads not finished, threads busy, jobs done)`` -> the timeout's message.
            cancel_on_error: The first failure skips the jobs not started yet; False runs every job
                (what was opened and decoded then does not depend on which thread failed first).

        Raises:
            WorkerError: The jobs did not finish within ``timeout`` (a decoder hung); the threads are
                told to stop after their current job.
            BaseException: The first failure (by ``order``) of any job, after every thread has stopped;
                jobs not started by then are skipped.
        """
        workers = self._started()
        busy = [(n, jobs) for n, jobs in enumerate(work) if jobs]
        if not busy:
            return
        run = _Run(pending=len(busy), stop_at_error=cancel_on_error)
        if self.count == 0:
            self._work(run, [job for jobs in work for job in jobs], workers[0].slot)
        else:
            for n, jobs in busy:
                workers[n].submit(functools.partial(self._work, run, list(jobs)))
            with run.done:
                if not run.done.wait_for(lambda: not run.pending, timeout=timeout):
                    run.cancel.set()
                    message = stalled(run.pending, len(busy), run.finished) if stalled is not None else ""
                    raise WorkerError(
                        message
                        or f"{run.pending} of {len(busy)} decoding threads did not finish within timeout={timeout:g} s."
                    )
        self.jobs_run += run.finished
        if run.errors:
            run.errors.sort(key=lambda e: e[0])
            raise run.errors[0][1]

    @staticmethod
    def _work(run: _Run, jobs: list[tuple[int, Job]], slot: ThreadSlot) -> None:
        try:
            for order, job in jobs:
                if run.cancel.is_set():
                    break
                try:
                    job(slot)
                except BaseException as err:
                    with run.done:
                        run.errors.append((order, err))
                    if run.stop_at_error:
                        run.cancel.set()
                        break
                    continue
                with run.done:
                    run.finished += 1
        finally:
            with run.done:
                run.pending -= 1
                run.done.notify_all()

    # -- counters and shutdown -------------------------------------------------------------
    def counts(self) -> DecodeStats:
        """Frames decoded, seeks, decoders opened and packets left out by every thread so far (stopped ones included)."""
        return sum((slot.decoders.counts() for slot in self.slots), self._retired)

    def close(self, timeout: float | None = None) -> list[threading.Thread]:
        """Stop the threads after their current job (the owner's bodies first) and close their decoders.

        Returns the threads still running after ``timeout`` seconds each (None: waits for every one);
        the pool starts new threads when used again.
        """
        stop = self._stop_fn()
        if stop is not None:
            stop()
        with self._lock:
            workers, self._workers = self._workers, []
            if self._finalizer is not None:
                self._finalizer.detach()
                self._finalizer = None
        alive = _stop(workers, timeout)
        self._retired = sum((worker.slot.decoders.counts() for worker in workers), self._retired)
        return alive

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.update(_workers=[], _lock=None, _finalizer=None, _stop_fn=lambda: None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()


# -- GOP tasks on the runner ---------------------------------------------------------------------
class GopExecutor:
    """Decodes the GOP tasks of a sample or batch on ``workers`` threads, each with its own decoders.

    Threads start on the first :meth:`run` (the constructor is cheap) and are restarted in a
    process forked after that. Each thread keeps up to ``max_open_per_worker`` decoders open (LRU
    by stream); a decoder that raised is closed and dropped. With ``workers=0`` tasks run in the
    calling thread (one decoder table), for use inside DataLoader worker processes.

    Args:
        open_decoder: ``open_decoder(task)`` returns a :class:`TaskDecoder` for ``task.source``
            (called in the thread that will use it).
        workers: Decoding threads; 0 runs in the caller.
        max_open_per_worker: Open decoders each thread keeps.
        max_open_sources: Streams with a decoder open in any thread, kept after each run (the least
            recently used are closed in every thread); None: only the per-thread bound.
        name: Thread name prefix.

    Example::

        >>> from lightning_vstream.decode.cpu.pyav import PyAVDecoder
        >>> executor = GopExecutor(lambda task: frames_decoder_tasks(PyAVDecoder(task.source, info=task.info)),
        ...                        workers=4)
        >>> frames = {}
        >>> executor.run(planner.tasks(), lambda task, index, frame, target: frames.__setitem__(target, frame))
        ... # doctest: +SKIP
        >>> executor.close()
    """

    def __init__(
        self,
        open_decoder: Callable[[GopTask], TaskDecoder],
        *,
        workers: int = 4,
        max_open_per_worker: int = 4,
        max_open_sources: int | None = None,
        name: str = "vstream-gop",
    ) -> None:
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 0:
            raise ConfigurationError(f"workers={workers!r} must be an integer >= 0 (0 decodes in the calling thread).")
        if isinstance(max_open_per_worker, bool) or not isinstance(max_open_per_worker, int) or max_open_per_worker < 1:
            raise ConfigurationError(f"max_open_per_worker={max_open_per_worker!r} must be a positive integer.")
        self.open_decoder = open_decoder
        self.workers = workers
        self.max_open_per_worker = max_open_per_worker
        self.max_open_sources = max_open_sources
        self.pool = DecodeThreads(threads=workers, name=name, decoders_per_thread=max_open_per_worker)
        self._lock = threading.Lock()
        self._used: dict[Hashable, int] = {}  # stream -> the run that last used it
        self._runs = 0

    def run(
        self,
        tasks: Sequence[GopTask],
        deliver: Callable[[GopTask, int, Any, Hashable], None],
        *,
        into: Callable[[GopTask, int], Any] | None = None,
        timeout: float | None = None,
        cancel_on_error: bool = True,
    ) -> None:
        """Decode every task; ``deliver(task, frame_index, frame, target)`` once per target.

        ``deliver`` runs in the thread that decoded the frame; different calls write to different
        targets, so they need no lock. Returns when every task is done.

        Args:
            tasks: The GOP tasks.
            deliver: Called once per (frame, target).
            into: ``into(task, frame_index)``: memory the frame may be decoded into directly (its first
                target's), for decoders that write into memory given; ``deliver`` then sees that memory.
            timeout: Seconds to wait for the threads (None: no limit).
            cancel_on_error: The first failure skips the tasks not started yet (False: every task runs).

        Raises:
            WorkerError: The tasks did not finish within ``timeout`` (a decoder hung); the threads
                are told to stop after their current task.
            BaseException: The first failure (in plan order) of any task, after every thread has
                stopped; tasks not started by then are skipped.
        """
        tasks = list(tasks)
        if not tasks:
            return
        plan = [tasks] if self.workers == 0 else assign_tasks(tasks, self.workers)
        work = [[(task.order, functools.partial(self._task, task, deliver, into)) for task in mine] for mine in plan]

        def stalled(pending: int, busy: int, done: int) -> str:
            return (
                f"{pending} of {busy} GOP decoding threads did not finish within timeout={timeout:g} s "
                f"({done} of {len(tasks)} GOP tasks done); a decoder may be hung or a file stalled on a slow file "
                "system. Raise the timeout, or check the device (`vstream doctor`)."
            )

        try:
            self.pool.run(work, timeout=timeout, stalled=stalled, cancel_on_error=cancel_on_error)
        finally:
            self._runs += 1
            for task in tasks:
                self._used[task.source] = self._runs
            self._trim()

    def _task(
        self,
        task: GopTask,
        deliver: Callable[[GopTask, int, Any, Hashable], None],
        into: Callable[[GopTask, int], Any] | None,
        slot: ThreadSlot,
    ) -> None:
        decoder = slot.decoders.get(task.source, functools.partial(self.open_decoder, task))
        try:
            self._decode(decoder, task, deliver, into)
        except BaseException:
            slot.decoders.drop(task.source)  # a decoder that raised is not used again
            raise

    @staticmethod
    def _decode(
        decoder: TaskDecoder,
        task: GopTask,
        deliver: Callable[[GopTask, int, Any, Hashable], None],
        into: Callable[[GopTask, int], Any] | None,
    ) -> None:
        """Decode one GOP task: the one place every task reaches its decoder."""

        def emit(index: int, frame: Any) -> None:
            for target in task.targets[task.frames.index(index)]:
                deliver(task, index, frame, target)

        if into is not None and isinstance(decoder, _FrameDecoderTasks):
            decoder.decode_gop(task, emit, functools.partial(into, task))
        else:
            decoder.decode_gop(task, emit)

    def _trim(self) -> None:
        """Keep decoders of at most ``max_open_sources`` streams, the least recently used closed (threads idle)."""
        limit = self.max_open_sources
        if limit is None:
            return
        open_now = {source for slot in self.pool.slots for source in slot.decoders.keys()}  # noqa: SIM118
        for source in sorted(open_now, key=lambda s: self._used.get(s, 0))[: max(0, len(open_now) - limit)]:
            self.drop(source)

    def drop(self, source: Hashable) -> None:
        """Close every thread's decoder of ``source`` (between runs)."""
        for slot in self.pool.slots:
            slot.decoders.drop(source)
        self._used.pop(source, None)

    # -- counters and shutdown -------------------------------------------------------------
    @property
    def opened(self) -> int:
        """Decoders opened so far."""
        return self.pool.counts().files_opened

    @property
    def frames_decoded(self) -> int:
        """Frames decoded by every decoder so far."""
        return self.pool.counts().frames_decoded

    @property
    def tasks_run(self) -> int:
        """Tasks decoded to the end so far."""
        return self.pool.jobs_run

    @property
    def threads(self) -> list[threading.Thread]:
        """The live decoding threads (empty before the first run and after :meth:`close`)."""
        return self.pool.threads

    def open_sources(self) -> dict[int, list[Hashable]]:
        """The streams each thread has a decoder open for (least recently used first)."""
        return {slot.number: slot.decoders.keys() for slot in self.pool.slots}

    def __len__(self) -> int:
        """Streams with a decoder open in any thread."""
        return len({source for slot in self.pool.slots for source in slot.decoders.keys()})  # noqa: SIM118

    def close(self) -> None:
        """Stop the threads (after their current task) and close every decoder; reusable afterwards."""
        self.pool.close()
        self._used.clear()

    def __enter__(self) -> GopExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_lock"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

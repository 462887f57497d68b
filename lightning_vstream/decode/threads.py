"""Running GOP tasks (see :mod:`lightning_vstream.decode.gops`) on decoding threads, on any device.

:class:`GopExecutor` runs the tasks of a batch on worker threads, each owning its decoders (one
decoder is only ever used by one thread). Tasks are
assigned up front (:func:`~lightning_vstream.decode.gops.assign_tasks`: longest first, to the
least-loaded worker, preferring one that already has the stream open), so a run is deterministic;
each worker keeps a small LRU of open decoders per stream between runs. The first failure cancels
the tasks not yet started and is raised in the caller once every worker has stopped; no thread is
left running. Decoders are made by a caller-supplied factory: NVDEC decoders for the GPU's batch
reader (:mod:`lightning_vstream.clips.gpu_reader`), any frame decoder through :func:`frames_decoder_tasks`.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from lightning_vstream.decode.gops import GopTask, assign_tasks
from lightning_vstream.errors import ConfigurationError, WorkerError

if TYPE_CHECKING:
    pass

__all__ = ["Emit", "GopExecutor", "TaskDecoder", "frames_decoder_tasks"]

#: Called by a decoder for every wanted frame of a task: ``emit(frame_index, frame)``.
Emit = Callable[[int, Any], None]


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

    ``get`` decodes forward within a GOP and jumps to the keyframe otherwise, and converts only
    the frame it returns, so a task costs one pass over its GOP prefix.
    """

    def __init__(self, decoder: Any) -> None:
        self.decoder = decoder

    def decode_gop(self, task: GopTask, emit: Emit) -> None:
        for index in task.frames:
            emit(index, self.decoder.get(index))

    @property
    def frames_decoded(self) -> int:
        return int(self.decoder.frames_decoded)

    def close(self) -> None:
        self.decoder.close()


def frames_decoder_tasks(decoder: Any) -> TaskDecoder:
    """Wrap a frame decoder (``get(index)`` / ``close()``) as a :class:`TaskDecoder`."""
    return _FrameDecoderTasks(decoder)


@dataclass
class _Run:
    pending: int
    errors: list[tuple[int, BaseException]] = field(default_factory=list)
    cancel: threading.Event = field(default_factory=threading.Event)
    done: threading.Condition = field(default_factory=threading.Condition)
    decoded_tasks: int = 0


class _Worker:
    """A decoding thread and the decoders it owns. It holds no reference to its executor, so an
    executor dropped without :meth:`GopExecutor.close` is still collected (and its threads stopped)."""

    def __init__(self, number: int, name: str, *, thread: bool = True) -> None:
        self.number = number
        self.decoders: OrderedDict[Hashable, TaskDecoder] = OrderedDict()
        self.jobs: list[Callable[[], None]] = []
        self.wake = threading.Condition()
        self.stop = False
        self.thread: threading.Thread | None = None
        if thread:
            self.thread = threading.Thread(target=self._loop, name=f"{name}-{number}", daemon=True)
            self.thread.start()

    def submit(self, job: Callable[[], None]) -> None:
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
            job()
            del job
        self.close_decoders()

    def drop(self, source: Hashable) -> None:
        decoder = self.decoders.pop(source, None)
        if decoder is not None:
            with contextlib.suppress(Exception):  # a broken decoder's close must not hide the real error
                decoder.close()

    def close_decoders(self) -> None:
        while self.decoders:
            self.drop(next(iter(self.decoders)))


def _stop_workers(workers: list[_Worker]) -> None:
    for worker in workers:
        with worker.wake:
            worker.stop = True
            worker.wake.notify()
    for worker in workers:
        if worker.thread is not None and worker.thread is not threading.current_thread():
            worker.thread.join()
    for worker in workers:
        if worker.thread is None:
            worker.close_decoders()


class GopExecutor:
    """Decodes the GOP tasks of a batch on ``workers`` threads, each with its own decoders.

    Threads start on the first :meth:`run` (the constructor is cheap) and are restarted in a
    process forked after that. Each worker keeps up to ``max_open_per_worker`` decoders open (LRU
    by stream); a decoder that raised is closed and dropped. With ``workers=0`` tasks run in the
    calling thread (one decoder cache), for use inside DataLoader worker processes.

    Args:
        open_decoder: ``open_decoder(task)`` returns a :class:`TaskDecoder` for ``task.source``
            (called in the worker thread that will use it).
        workers: Decoding threads; 0 runs in the caller.
        max_open_per_worker: Open decoders each worker keeps.
        name: Thread name prefix.

    Example::

        >>> from lightning_vstream.decode.cpu import PyAVDecoder
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
        name: str = "vstream-gop",
    ) -> None:
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 0:
            raise ConfigurationError(f"workers={workers!r} must be an integer >= 0 (0 decodes in the calling thread).")
        if isinstance(max_open_per_worker, bool) or not isinstance(max_open_per_worker, int) or max_open_per_worker < 1:
            raise ConfigurationError(f"max_open_per_worker={max_open_per_worker!r} must be a positive integer.")
        self.open_decoder = open_decoder
        self.workers = workers
        self.max_open_per_worker = max_open_per_worker
        self.name = name
        self._threads: list[_Worker] = []
        self._inline: _Worker | None = None
        self._finalizer: weakref.finalize | None = None
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self.opened = 0
        self.tasks_run = 0

    # -- running ------------------------------------------------------------------------------
    def run(
        self,
        tasks: Sequence[GopTask],
        deliver: Callable[[GopTask, int, Any, Hashable], None],
        *,
        timeout: float | None = None,
    ) -> None:
        """Decode every task; ``deliver(task, frame_index, frame, target)`` once per target.

        ``deliver`` runs in the worker thread that decoded the frame; different calls write to
        different targets, so they need no lock. Returns when every task is done.

        Args:
            tasks: The GOP tasks.
            deliver: Called once per (frame, target).
            timeout: Seconds to wait for the workers (None: no limit).

        Raises:
            WorkerError: The tasks did not finish within ``timeout`` (a decoder hung); the workers
                are told to stop after their current task.
            BaseException: The first failure (in plan order) of any task, after every worker
                has stopped; tasks not started by then are skipped.
        """
        tasks = list(tasks)
        if not tasks:
            return
        with self._lock:
            if os.getpid() != self._pid:  # forked: the parent's threads do not exist here
                self._threads, self._inline, self._finalizer, self._pid = [], None, None, os.getpid()
            if self.workers == 0:
                if self._inline is None:
                    self._inline = _Worker(0, self.name, thread=False)
                plan = [tasks]
            else:
                if not self._threads:
                    self._threads = [_Worker(n, self.name) for n in range(self.workers)]
                    self._finalizer = weakref.finalize(self, _stop_workers, list(self._threads))
                plan = assign_tasks(tasks, self.workers)
        busy = [(w, t) for w, t in enumerate(plan) if t]
        run = _Run(pending=len(busy))

        def emit_for(task: GopTask) -> Emit:
            def emit(index: int, frame: Any) -> None:
                for target in task.targets[task.frames.index(index)]:
                    deliver(task, index, frame, target)

            return emit

        if self._inline is not None and self.workers == 0:
            self._work(self._inline, run, tasks, emit_for)
        else:
            for w, worker_tasks in busy:
                worker = self._threads[w]
                worker.submit(functools.partial(self._work, worker, run, worker_tasks, emit_for))
            with run.done:
                if not run.done.wait_for(lambda: not run.pending, timeout=timeout):
                    run.cancel.set()
                    raise WorkerError(
                        f"{run.pending} of {len(busy)} GOP decoding threads did not finish within timeout={timeout:g} s "
                        f"({run.decoded_tasks} of {len(tasks)} GOP tasks done); a decoder may be hung or a file stalled "
                        "on a slow file system. Raise the timeout, or check the device (`vstream doctor`)."
                    )
        self.tasks_run += run.decoded_tasks
        if run.errors:
            run.errors.sort(key=lambda e: e[0])
            raise run.errors[0][1]

    def _work(self, worker: _Worker, run: _Run, tasks: list[GopTask], emit_for: Callable[[GopTask], Emit]) -> None:
        try:
            for task in tasks:
                if run.cancel.is_set():
                    break
                decoder = None
                try:
                    decoder = self._decoder(worker, task)
                    decoder.decode_gop(task, emit_for(task))
                    with run.done:
                        run.decoded_tasks += 1
                except BaseException as err:
                    if decoder is not None:
                        worker.drop(task.source)
                    with run.done:
                        run.errors.append((task.order, err))
                    run.cancel.set()
                    break
        finally:
            with run.done:
                run.pending -= 1
                run.done.notify_all()

    def _decoder(self, worker: _Worker, task: GopTask) -> TaskDecoder:
        decoder = worker.decoders.get(task.source)
        if decoder is not None:
            worker.decoders.move_to_end(task.source)
            return decoder
        decoder = self.open_decoder(task)
        with self._lock:
            self.opened += 1
        worker.decoders[task.source] = decoder
        while len(worker.decoders) > self.max_open_per_worker:
            _, old = worker.decoders.popitem(last=False)
            old.close()
        return decoder

    # -- introspection and shutdown -----------------------------------------------------------
    @property
    def threads(self) -> list[threading.Thread]:
        """The live worker threads (empty before the first run and after :meth:`close`)."""
        return [w.thread for w in self._threads if w.thread is not None]

    def open_decoders(self) -> dict[int, list[Hashable]]:
        """Streams each worker has a decoder open for (LRU order, most recent last)."""
        workers = self._threads if self.workers else ([self._inline] if self._inline else [])
        return {w.number: list(w.decoders) for w in workers}

    def close(self) -> None:
        """Stop the threads (after their current task) and close every decoder; reusable afterwards."""
        with self._lock:
            workers = self._threads + ([self._inline] if self._inline is not None else [])
            self._threads, self._inline = [], None
            if self._finalizer is not None:
                self._finalizer.detach()
                self._finalizer = None
        _stop_workers(workers)

    def __enter__(self) -> GopExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.update(_threads=[], _inline=None, _lock=None, _finalizer=None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

"""The stream engine: one consumer of the stream plan, whichever executor decodes it.

Both ways of streaming deliver a step the same way: the executor decodes the step's camera frames
(threads of the training process, :class:`~lightning_vstream.stream.thread_executor.ThreadExecutor`;
or worker processes of a DataLoader, :class:`~lightning_vstream.stream.worker_executor.WorkerExecutor`)
and hands over a :class:`StepResult`; the engine then decides which slots deliver a frame (the
sampler's ledger of skips), gives up the segments whose reads failed, counts the step once, and
builds its batch (:class:`~lightning_vstream.stream.batch.StepAssembler`). Decoder counters are kept
here too, as of the last batch handed out, so work done for steps not delivered yet is left out.

An executor is small: :meth:`Executor.run` yields the batches of an epoch from a step on, calling
back :meth:`StreamEngine.assemble` for each step inside its own error handling (so a failure while a
batch is built stops the executor's threads or processes as a failed read does), and
:meth:`Executor.close` stops what a run left behind.
"""

from __future__ import annotations

import abc
import threading
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from lightning_vstream.decode.counters import DecodeStats

if TYPE_CHECKING:
    from lightning_vstream.stream.batch import Frames, StepAssembler, StreamBatch
    from lightning_vstream.stream.parts import ReadFailure
    from lightning_vstream.stream.sampler import StreamSampler
    from lightning_vstream.stream.schedule import SlotRead

__all__ = ["Executor", "StepResult", "StreamEngine"]


def _no_failures(valid: list[bool]) -> list[ReadFailure]:
    return []


@dataclass
class StepResult:
    """What an executor decoded for one step, handed to :meth:`StreamEngine.assemble`.

    ``frames`` and ``failures`` are called once the engine knows which slots are valid at the step:
    ``failures(valid)`` gives the reads that failed and are not given up yet (the worker loader's
    parts report them; decode threads give up at once and report none), ``frames(valid)`` the
    step's frames per output (``""``: the default one) laid out as the batch delivers them.
    ``counts`` are decoder counters by who decoded (a thread of a run, a worker process): the
    latest of each is what the engine reports.
    """

    reads: Sequence[SlotRead | None]
    shifts: Sequence[int]
    timestamps: np.ndarray  # float64 [slots, cameras]
    frames: Callable[[list[bool]], Mapping[str, Frames]]
    failures: Callable[[list[bool]], list[ReadFailure]] = _no_failures
    counts: Mapping[Hashable, DecodeStats] = field(default_factory=dict)
    annotations: Iterable[tuple[int, Mapping[str, Any]]] = ()
    missing: Iterable[tuple[int, str]] = ()
    geometry: Iterable[tuple[int, Any]] = ()
    output_geometry: Mapping[str, Iterable[tuple[int, Any]]] = field(default_factory=dict)


class Executor(abc.ABC):
    """Decodes the steps of a stream plan for a :class:`StreamEngine`: threads or worker processes.

    ``sampler`` is the plan; ``assembler`` the batch stage the engine uses (executors name the
    streams of a lane with it in their errors, and decode threads give up segments through it).
    """

    sampler: StreamSampler
    assembler: StepAssembler

    @abc.abstractmethod
    def run(self, start: int, assemble: Callable[[int, StepResult], StreamBatch]) -> Iterator[StreamBatch]:
        """The batches of the sampler's epoch from step ``start`` on: each step decoded, then ``assemble``-d."""

    @abc.abstractmethod
    def close(self) -> None:
        """Stop the threads or processes of a run in progress and close their decoders."""


class StreamEngine:
    """The one consumer of a stream plan: what makes a step's decoded frames a batch, and the counters.

    Args:
        executor: What decodes the steps (decode threads, or worker processes).

    Example::

        >>> engine = StreamEngine(ThreadExecutor(index=index, sampler=sampler, device=HostDevice()))  # doctest: +SKIP
        >>> next(iter(engine.run()))["frames"].shape  # doctest: +SKIP
        torch.Size([2, 6, 3, 48, 64])
    """

    def __init__(self, executor: Executor) -> None:
        self.executor = executor
        self.sampler = executor.sampler
        self.assembler = executor.assembler
        #: Decoder counters as of the last batch handed out, by who decoded them (see :class:`StepResult`).
        self.counts: dict[Hashable, DecodeStats] = {}
        self._lock = threading.Lock()

    def run(self, start: int = 0) -> Iterator[StreamBatch]:
        """Yield the batches of the sampler's current epoch from step ``start``, with the skips its ledger holds for
        the pass (:meth:`SkipLedger.begin_pass <lightning_vstream.stream.ledger.SkipLedger.begin_pass>`)."""
        return self.executor.run(start, self.assemble)

    def assemble(self, step: int, result: StepResult) -> StreamBatch:
        """The batch of ``step`` from what the executor decoded: valid slots, skips given up, counters, labels."""
        reads, assembler = result.reads, self.assembler
        with self._lock:  # the decoders' work on the step counts even if the step then fails (a frame's size)
            self.counts.update(result.counts)
        valid = assembler.valid(step, reads)
        cams = self.sampler.num_cameras
        for position, path, error in result.failures(valid):
            slot = position // cams
            read = reads[slot]
            if read is None:
                continue
            valid[slot] = False
            assembler.give_up(step, position, read, result.shifts[slot], path=path, error=error)
        with self._lock:
            assembler.count(step, reads, valid, result.shifts)
            return assembler.batch(
                step,
                reads,
                valid,
                result.frames(valid),
                result.timestamps,
                annotations=result.annotations,
                missing=result.missing,
                geometry=result.geometry,
                output_geometry=result.output_geometry,
            )

    def close(self) -> None:
        """Stop the executor's threads or processes of a run in progress."""
        self.executor.close()

    @property
    def stats(self) -> DecodeStats:
        """Decoding counters of every run so far, as of the last batch handed out, skips included (a new object:
        callers may change it without changing the ledger's)."""
        with self._lock:
            return self.sampler.ledger.stats + sum(self.counts.values(), DecodeStats())

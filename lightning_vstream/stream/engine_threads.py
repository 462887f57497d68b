"""The decode threads of the stream engine, and the state one pass of them shares with the consumer.

:class:`EngineThreads` is the thread half of :class:`~lightning_vstream.stream.engine.StreamEngine`
(which adds the consumer half and the setup): each thread plans the steps it reaches in order
(:meth:`EngineThreads._plan`, once per step, under the run's lock), waits until the consumer lets
it write a step (at most ``prefetch`` ahead, into a batch the consumer released, whose release it
waits for on the host), decodes its camera streams into their rows (:class:`~lightning_vstream.stream.engine_reads.ThreadDecoders`) and records
an event on its own stream. A failed read is raised through the consumer (``on_error="raise"``) or
gives up the slot's clip segment (``"skip"``), as in the worker loader
(:mod:`lightning_vstream.stream.failures`).
"""

from __future__ import annotations

import functools
import math
import threading
from dataclasses import dataclass, field
from typing import Any

import torch

from lightning_vstream.decode.factory import DecoderFactory
from lightning_vstream.index import VideoIndex
from lightning_vstream.profiling import RANGE_ENGINE_STEP, nvtx_range
from lightning_vstream.stream.engine_batches import EngineBatches
from lightning_vstream.stream.engine_device import EngineDevice
from lightning_vstream.stream.engine_reads import ThreadDecoders
from lightning_vstream.stream.failures import FILE_ERRORS, SkipLedger
from lightning_vstream.stream.frame_steps import FrameSteps
from lightning_vstream.stream.resume import SkipHistory
from lightning_vstream.stream.sampler import StreamSampler
from lightning_vstream.stream.schedule import SlotRead

__all__ = ["EngineRun", "EngineThreads", "PlannedStep"]

# The decode range, one per thread and step (a range holds no state between its push and pop).
_STEP_RANGE = nvtx_range(RANGE_ENGINE_STEP)


@dataclass
class PlannedStep:
    """One planned step: its reads, the shifts they were planned with, its batch and what threads add to it."""

    reads: list[SlotRead | None]
    shifts: list[int]
    frames: list[torch.Tensor]  # one tensor [slots * cameras, ...], or one [slots, ...] per camera (per_camera)
    timestamps: list[float]
    annotations: dict[int, Any] = field(default_factory=dict)  # slot -> its frame's annotations
    missing: list[tuple[int, str]] = field(default_factory=list)  # (slot, why its annotation is missing)
    geometry: dict[int, Any] = field(default_factory=dict)  # position -> img_aug_matrix
    outputs: dict[str, list[torch.Tensor]] = field(default_factory=dict)  # per named output: as ``frames``
    output_geometry: dict[str, dict[int, Any]] = field(default_factory=dict)  # per named output: as ``geometry``
    counts: dict[int, tuple[int, int, int, int]] = field(default_factory=dict)  # thread -> its counts after it
    rows: list[torch.Tensor] = field(default_factory=list)  # position -> its row of ``frames``


@dataclass
class EngineRun:
    """State one epoch's threads and consumer share; guarded by ``cond``."""

    start: int
    num_steps: int
    threads: int
    cond: threading.Condition = field(default_factory=threading.Condition)
    steps: dict[int, PlannedStep] = field(default_factory=dict)
    next_plan: int = 0
    requested: int = 0  # the step the consumer asks for (threads decode at most ``prefetch`` steps ahead)
    released: int = 0  # steps before this have given their batch back
    progress: list[int] = field(default_factory=list)  # per thread: the last step it finished
    errors: dict[int, tuple[int, int, BaseException]] = field(default_factory=dict)  # thread -> (step, position, err)
    # (slot, segment) given up -> the step its first failed read belongs to (-1: before this run)
    abandoned: dict[tuple[int, int], int] = field(default_factory=dict)
    changes: dict[tuple[int, int], tuple[int, int] | None] = field(default_factory=dict)  # its shift change
    stopping: bool = False
    timed_out: bool = False
    workers: list[threading.Thread] = field(default_factory=list)  # its decode threads


class EngineThreads:
    """The decode-thread half of :class:`~lightning_vstream.stream.engine.StreamEngine` (see the module docs).

    It holds no state of its own: the engine sets every attribute below.
    """

    index: VideoIndex
    sampler: StreamSampler
    device: EngineDevice
    decoder_factory: DecoderFactory
    steps: FrameSteps
    batches: EngineBatches
    history: SkipHistory
    prefetcher: Any
    outputs: dict[str, Any]
    on_error: str
    prefetch: int
    ring_size: int
    num_threads: int
    _plain: bool
    _decoders_per_thread: int | None
    _streams: list[Any]
    _done_events: list[list[Any]]
    _release_events: list[Any]
    _stats_lock: threading.Lock
    _ledger: SkipLedger

    def _plan(self, run: EngineRun, step: int) -> PlannedStep:
        """The reads and batch of ``step``, planned once and in order (call with ``run.cond`` held)."""
        while run.next_plan <= step:
            s = run.next_plan
            self.sampler.issue(s)  # records the step as issued and applies the shift changes due
            reads, shifts, _ = self.sampler.issued(s)
            frames, outputs, rows = self.batches.of_step(s)
            streams = self.sampler.batch_size * self.sampler.num_cameras
            run.steps[s] = PlannedStep(
                reads,
                shifts,
                frames,
                [math.nan] * streams,
                outputs=outputs,
                output_geometry={name: {} for name in self.outputs},
                rows=rows,
            )
            if self.prefetcher is not None:
                self.prefetcher.observe_slots(self.sampler.epoch, s, reads)
            run.next_plan = s + 1
        return run.steps[step]

    def _may_write(self, run: EngineRun, step: int) -> bool:
        """Whether a thread may write ``step``: at most ``prefetch`` ahead of the consumer (or the run is stopping).

        The bound counts from the step the consumer asks for, never from where the run started,
        so a failure found at step ``f`` is always found before step ``f + prefetch + 1`` is planned.
        """
        return run.stopping or (step <= run.requested + self.prefetch and step < run.released + self.ring_size)

    def _thread_main(self, run: EngineRun, t: int) -> None:
        decoders = ThreadDecoders(self.index, self.decoder_factory, self.steps, self._decoders_per_thread)
        stream = self._streams[t]
        step = run.start
        cams = self.sampler.num_cameras
        positions = range(t, self.sampler.batch_size * cams, self.num_threads)  # this thread's streams
        mine = [(position, *divmod(position, cams)) for position in positions]  # with their slot and camera
        # Frames nothing follows the decoder for take the short way (see _decode_plain).
        plain = self._plain and decoders.limit is None
        at = [-1]  # the stream being read, for the error report
        try:
            with self.device.use(stream):
                for step in range(run.start, run.num_steps):
                    at[0] = -1
                    with run.cond:
                        run.cond.wait_for(functools.partial(self._may_write, run, step))
                        if run.stopping:
                            return
                        planned = self._plan(run, step)
                    # The batch's release, waited for on the host: NVDEC copies frames out on this thread's stream,
                    # which must never wait behind the consumer's work (a stalled copy could give stale frames).
                    self.device.synchronize(self._release_events[step % self.ring_size])
                    with _STEP_RANGE:
                        if plain:
                            self._decode_plain(run, step, planned, decoders, mine, at)
                        else:
                            for position in positions:
                                at[0] = position
                                self._decode_one(run, step, position, planned, decoders)
                    planned.counts[t] = decoders.counts()
                    self.device.record(self._done_events[t][step % self.ring_size], stream)
                    with run.cond:
                        run.progress[t] = step
                        run.cond.notify_all()
        except BaseException as err:
            with run.cond:
                run.errors[t] = (step, at[0], err)
                run.cond.notify_all()
        finally:
            decoders.close_all()

    def _decode_one(
        self, run: EngineRun, step: int, position: int, planned: PlannedStep, decoders: ThreadDecoders
    ) -> None:
        """Decode and write one camera frame of ``step``, with its timestamp, geometry and annotations.

        A failed read is raised (``on_error="raise"``) or gives up the slot's segment (``"skip"``).
        """
        slot, camera = divmod(position, self.sampler.num_cameras)
        read = planned.reads[slot]
        if read is None:
            return
        # Read without the lock: a failure another thread is recording right now only costs a
        # decode whose slot the batch marks invalid anyway.
        if run.abandoned.get((slot, read.segment), step) < step:
            return  # its segment failed at an earlier step: nothing to decode
        # Where the slot's segment starts keys the augmentation draw; nothing else needs it.
        segment_start = self.sampler.schedule().segments[read.segment].start if self.steps.augment is not None else 0
        epoch = self.sampler.epoch
        try:
            info = decoders.write(
                position=position,
                clip=read.clip,
                camera=camera,
                frame=read.frame,
                row=planned.rows[position],
                epoch=epoch,
                segment_start=segment_start,
                outputs={name: self.batches.row(frames, position) for name, frames in planned.outputs.items()},
            )
        except FILE_ERRORS as err:
            self._read_failed(run, step, position, planned, decoders, read, err)
            return
        timestamp = info.timestamp(read.frame)
        planned.timestamps[position] = timestamp
        if self.steps.has_geometry:
            size = (info.height, info.width, epoch, read.clip, segment_start)
            planned.geometry[position] = self.steps.geometry(*size)
            for name, matrix in self.steps.output_geometry(*size).items():
                planned.output_geometry[name][position] = matrix
        if camera == 0 and self.steps.annotations is not None:
            found, why = self.steps.annotate(read.clip, read.frame, timestamp)
            if found is not None:
                planned.annotations[slot] = found
            else:
                planned.missing.append((slot, str(why)))

    def _decode_plain(
        self,
        run: EngineRun,
        step: int,
        planned: PlannedStep,
        decoders: ThreadDecoders,
        mine: list[tuple[int, int, int]],
        at: list[int],
    ) -> None:
        """:meth:`_decode_one` for all of a thread's streams (``(position, slot, camera)``) at ``step``, for
        frames nothing follows the decoder for: no transform left to apply, no augmentation, named output,
        geometry or annotation. Each frame goes from the decoder into its row, and its timestamp is noted
        (:meth:`ThreadDecoders.read_into <lightning_vstream.stream.engine_reads.ThreadDecoders.read_into>`);
        failed reads are handled as there. ``at[0]`` follows the stream being read.
        """
        reads, rows, timestamps = planned.reads, planned.rows, planned.timestamps
        abandoned = run.abandoned
        read_into = decoders.read_into
        for position, slot, camera in mine:
            at[0] = position
            read = reads[slot]
            if read is None:
                continue
            # Read without the lock, as in _decode_one.
            if abandoned and abandoned.get((slot, read.segment), step) < step:
                continue  # its segment failed at an earlier step: nothing to decode
            try:
                timestamps[position] = read_into(position, read.clip, camera, read.frame, rows[position])
            except FILE_ERRORS as err:
                self._read_failed(run, step, position, planned, decoders, read, err)

    def _read_failed(
        self,
        run: EngineRun,
        step: int,
        position: int,
        planned: PlannedStep,
        decoders: ThreadDecoders,
        read: SlotRead,
        err: BaseException,
    ) -> None:
        """A camera read of ``step`` failed: raise (``on_error="raise"``), or give up the slot's segment."""
        if self.on_error == "raise":
            raise err
        if position in decoders.open:
            decoders.close(position)
        decoders.read_errors += 1
        slot, camera = divmod(position, self.sampler.num_cameras)
        self._abandon(run, slot, step, planned.shifts[slot], read, camera, err)

    def _abandon(
        self, run: EngineRun, slot: int, step: int, shift: int, read: SlotRead, camera: int, err: BaseException
    ) -> None:
        """Give up the slot's segment from ``step`` on; the slot moves on ``prefetch + 1`` steps later."""
        key = (slot, read.segment)
        with run.cond:
            known = run.abandoned.get(key)
            if known is None or step < known:
                run.abandoned[key] = step
                change = self.sampler.abandon_from(
                    slot, step, shift, read, step + self.prefetch + 1, replaces=run.changes.get(key)
                )
                run.changes[key] = change
                self.history.found(step, slot, read.segment, change)
            with self._stats_lock:
                if known is None:
                    path = str(self.index.clips[read.clip].cameras[camera].path)
                    self._ledger.clip_skipped(self.index.clips[read.clip].clip_id, read.frame, path, err)

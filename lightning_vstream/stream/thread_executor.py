"""The stream engine's thread executor: decode threads writing each frame once into the batches of a step.

Why threads in the training process: decoding in spawn DataLoader workers keeps about one picture
in flight per process, ships every frame over CUDA IPC and gives each worker a CUDA context of its
own, time-sliced against training. Here ``num_threads`` threads (by default twice the GPU's NVDEC
engines, or one per core available on the CPU) share the training process; PyNvVideoCodec's
``Decode`` and FFmpeg's decoding release the GIL, so the threads decode in parallel.

How a step flows:

- **Streams stay with threads.** Stream ``position = slot * cameras + camera`` always belongs to
  thread ``position % num_threads``, which keeps its decoder while the slot stays on a clip, so
  consecutive steps decode consecutive frames (decode amplification 1.0), in the same plan as the
  worker loader (:class:`~lightning_vstream.stream.sampler.StreamSampler`).
- **A ring of batches.** At most ``prefetch`` steps are decoded ahead of the one the consumer asks
  for. On a GPU the ``prefetch + hold`` batches are allocated once and step ``s`` writes into batch
  ``s % ring``; on the CPU (``buffers="pool"``) every step takes a batch from a pool that reuses
  its memory only once nothing references the batch handed out. Each frame is written once into its
  row (:meth:`NvDecoder.get(..., out=row) <lightning_vstream.decode.nvdec.decoder.NvDecoder.get>`), or copied
  once after the transform. With named ``outputs`` every output has batches of its own (a ring
  each, or one from the pool each per step), and the thread that decodes a frame writes every
  output of it, on its own stream (:meth:`ThreadDecoders.write
  <lightning_vstream.stream.engine_reads.ThreadDecoders.write>`).
- **Events, and no decode stream waits for the consumer.** Each thread records an event on its own
  stream when it has queued a step; the consumer makes its current stream wait on those events.
  When the consumer asks for step ``k`` it releases step ``k - hold`` by recording a release event
  on its stream; the thread that next writes that batch waits for it on the host (the GIL released),
  never on its stream, on which NVDEC copies frames out. A run starts by releasing every batch of
  the ring the same way, so a new epoch never overwrites batches the training step still reads.

Errors are handled as the worker loader handles them (:mod:`lightning_vstream.stream.failures`):
under ``on_error="raise"`` the batches before the failing step are delivered, then the error of
the first failing read (lowest step, then stream) is raised; under ``on_error="skip"`` a slot
whose read failed gives up its clip segment from that step on, and moves on to its next segment
``prefetch + 1`` steps later, whatever the threads had planned when they found the failure, so a
run, and a run resumed from any of its steps, deliver the same batches.

With ``buffers="ring"`` (GPU) batches are views of the ring: a batch stays intact until ``hold``
further batches have been requested (Lightning's loop keeps one batch in prefetch, hence
``hold=2``); ``clone()`` frames to keep them longer.
"""

from __future__ import annotations

import functools
import logging
import math
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import torch

from lightning_vstream.annotations.source import resolve_annotations
from lightning_vstream.decode.counters import DecodeStats
from lightning_vstream.decode.cpu.probe import probe_video
from lightning_vstream.decode.factory import DecoderFactory
from lightning_vstream.decode.threads import DecodeThreads, ThreadSlot
from lightning_vstream.errors import VideoDecodeError, WorkerError
from lightning_vstream.index import VideoIndex
from lightning_vstream.options import DecodeOptions, ErrorOptions, OutputOptions, check_arguments, is_count
from lightning_vstream.profiling import RANGE_COLLATE, RANGE_ENGINE_STEP, RANGE_WAIT, nvtx_range
from lightning_vstream.stream.batch import StepAssembler, StreamBatch
from lightning_vstream.stream.engine import Executor, StepResult
from lightning_vstream.stream.engine_device import EngineDevice
from lightning_vstream.stream.engine_reads import ThreadDecoders
from lightning_vstream.stream.failures import FILE_ERRORS
from lightning_vstream.stream.frame_steps import FrameSteps
from lightning_vstream.stream.memory import EngineBatches
from lightning_vstream.stream.sampler import StreamSampler
from lightning_vstream.stream.schedule import SlotRead

__all__ = ["ThreadExecutor"]

log = logging.getLogger("lightning_vstream")
Buffers = Literal["ring", "pool"]
# The consumer's NVTX ranges, one each per step (a range holds no state between its push and pop).
_WAIT_RANGE = nvtx_range(RANGE_WAIT)
_COLLATE_RANGE = nvtx_range(RANGE_COLLATE)
# The decode range, one per thread and step (a range holds no state between its push and pop).
_STEP_RANGE = nvtx_range(RANGE_ENGINE_STEP)


@dataclass
class _Reading:
    """The camera stream (batch position) a decoding thread is reading, for its error report; -1: none."""

    position: int = -1


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
    counts: dict[int, DecodeStats] = field(default_factory=dict)  # thread -> its counts after it
    rows: list[torch.Tensor] = field(default_factory=list)  # position -> its row of ``frames``


@dataclass
class EngineRun:
    """State one epoch's threads and consumer share; guarded by ``cond``."""

    number: int  # the executor's runs so far, this one included
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
    stopping: bool = False
    timed_out: bool = False


class ThreadExecutor(Executor):
    """Decodes a :class:`StreamSampler`'s plan with threads into batches on one device, for a
    :class:`~lightning_vstream.stream.engine.StreamEngine`.

    Args:
        index: The clips to read.
        sampler: The stream plan (its ``num_parts`` must be 1).
        device: Where batches live and how work is ordered (:class:`~lightning_vstream.stream.engine_device.CudaDevice`
            or :class:`~lightning_vstream.stream.engine_device.HostDevice`).
        decoder_factory: ``(path, info, label) -> decoder`` for one camera stream; its ``get(index, out=None)``
            returns the frame as ``[3, H, W]`` uint8 on ``device``, ordered on the current stream.
        decode: ``camera_frames`` (``"stacked"``: one ``[slots, cameras, 3, H, W]`` tensor;
            ``"per_camera"``: one ``[slots, 3, H_c, W_c]`` tensor per camera) and
            ``max_open_decoders`` (open decoders of the whole engine, shared out among the threads, at
            least one each; None keeps one per camera stream).
        output: ``transform`` is applied to each ``[1, 3, H, W]`` frame on its thread's stream, right
            after decoding; ``outputs`` are named outputs made from each decoded (and augmented) frame
            besides the default one (see :mod:`lightning_vstream.outputs`): each has batches of its own
            (a ring of them with ``buffers="ring"``), written on the same thread and stream as the
            default output. ``annotations`` are delivered next to the frames (see
            :mod:`lightning_vstream.annotations`); ``augment`` is applied before ``transform``, drawn once
            per segment from ``(seed, epoch, clip, segment start)``; ``pad_annotations`` pads ragged
            annotation fields with a mask instead of delivering lists.
        errors: ``on_error="raise"`` re-raises the first failed read's error after the batches before
            it; ``"skip"`` moves the slot to its next clip and marks the batches in between invalid.
            ``timeout``: seconds the consumer waits for a step before raising :class:`WorkerError`
            (0: forever).
        seed: Seed of the augmentation draws.
        num_threads: Decode threads; ``device.default_threads()`` when None.
        prefetch: Steps decoded ahead of the one the consumer asks for.
        hold: Batches the consumer may hold after asking for them (``buffers="ring"``: their memory is not reused).
        decoder_resizes: The factory's decoders are PyAV decoders that resize while converting to RGB as
            :func:`~lightning_vstream.stream.frame_steps.decoder_sizes` plans: to their own size
            (:func:`~lightning_vstream.decode.factory.pyav_factory` with ``size``) and, for the
            outputs that need another one, ``get_sizes``; so a resize-only
            :class:`~lightning_vstream.FrameTransform` has nothing left to do.
        buffers: ``"ring"``: a fixed ring of ``prefetch + hold`` batches (GPU memory, ordered by
            events); ``"pool"``: a batch per step whose memory is reused only once nothing
            references it (CPU memory, safe to keep).
        pin_memory: Allocate pool batches in pinned memory (when CUDA is available).

    Example::

        >>> executor = ThreadExecutor(index=index, sampler=sampler, device=HostDevice(),  # doctest: +SKIP
        ...                           decoder_factory=lambda p, i, label: PyAVDecoder(p, info=i, label=label))
        >>> next(iter(StreamEngine(executor).run()))["frames"].shape  # doctest: +SKIP
        torch.Size([2, 6, 3, 48, 64])
    """

    def __init__(
        self,
        *,
        index: VideoIndex,
        sampler: StreamSampler,
        device: EngineDevice,
        decoder_factory: DecoderFactory,
        decode: DecodeOptions | None = None,
        output: OutputOptions | None = None,
        errors: ErrorOptions | None = None,
        seed: int = 0,
        num_threads: int | None = None,
        prefetch: int = 2,
        hold: int = 2,
        decoder_resizes: bool = False,
        buffers: Buffers = "ring",
        pin_memory: bool = False,
    ) -> None:
        decode = decode or DecodeOptions()
        output = output or OutputOptions()
        errors = errors or ErrorOptions()
        check_arguments(
            "ThreadExecutor",
            {
                "sampler.num_parts": (sampler.num_parts, sampler.num_parts == 1, "1 (the engine plans whole steps)"),
                "prefetch": (prefetch, is_count(prefetch), "an integer >= 1"),
                "hold": (hold, is_count(hold), "an integer >= 1"),
                "num_threads": (num_threads, num_threads is None or is_count(num_threads), "None or an integer >= 1"),
                "buffers": (buffers, buffers in ("ring", "pool"), "'ring' or 'pool'"),
            },
        )
        self.index = index
        self.sampler = sampler
        self.device = device
        self.decoder_factory = decoder_factory
        self.prefetch = prefetch
        self.hold = hold
        #: The option groups, as given.
        self.decode = decode
        self.output = output
        self.errors = errors
        self.buffers = buffers
        self.steps = FrameSteps(
            index=index,
            transform=output.transform,
            augment=output.augment,
            seed=seed,
            annotations=resolve_annotations(output.annotations),
            on_error=errors.on_error,
            decode_device="cpu" if decoder_resizes else "cuda",
            outputs=output.outputs,
        )
        self.assembler = StepAssembler(index, sampler, self.steps, pad_annotations=output.pad_annotations)
        streams = sampler.batch_size * sampler.num_cameras
        self.num_threads = max(1, min(num_threads or device.default_threads(), streams))
        self.ring_size = prefetch + hold
        #: Every frame goes straight from the decoder into its batch row with nothing else to add.
        self._plain = (
            self.steps.direct and not output.outputs and not self.steps.has_geometry and self.steps.annotations is None
        )
        max_open = decode.max_open_decoders
        self._decoders_per_thread = None if max_open is None else max(1, max_open // self.num_threads)
        self.batches = EngineBatches(
            device=device,
            slots=sampler.batch_size,
            cameras=sampler.num_cameras,
            camera_frames=decode.camera_frames,
            buffers=buffers,
            ring_size=self.ring_size,
            pin_memory=pin_memory,
        )
        self._done_events: list[list[Any]] = []
        self._release_events: list[Any] = []
        self._streams: list[Any] = []
        self._stuck: list[threading.Thread] = []  # threads of stopped runs not joined yet
        #: The decode threads (the one runner of :mod:`lightning_vstream.decode.threads`), started for each run.
        self.threads = DecodeThreads(
            threads=self.num_threads,
            name="vstream-decode",
            decoders_per_thread=self._decoders_per_thread,
            stop=self._stop_run,
        )
        self._run: EngineRun | None = None
        self._runs = 0  # runs started: the engine keeps each run's decoder counters by (run, thread)
        # Skips and their counters: the sampler's ledger; a failed slot moves on ``prefetch + 1`` steps later.
        self._ledger = sampler.ledger
        self._ledger.lookahead = prefetch
        #: Announces each planned step's upcoming GOPs (a remote index; set by ``build_engine_loader``).
        self.prefetcher: Any = None

    # -- setup -----------------------------------------------------------------------------
    def frame_shape(self, camera: int = 0) -> tuple[tuple[int, ...], torch.dtype]:
        """Shape and dtype of one frame of ``camera`` in a batch (after augmentation and transform).

        Taken from the first clip whose file of that camera has a frame table (from the index, or
        probed); with ``camera_frames="stacked"`` every camera shares camera 0's.
        """
        height, width = self._file_size(camera)
        return self.steps.frame_shape(height, width, self.device.torch_device)

    def output_shapes(self, camera: int = 0) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        """Shape and dtype of one frame of ``camera`` in each named output (see :meth:`frame_shape`)."""
        if not self.output.outputs:
            return {}
        height, width = self._file_size(camera)
        return self.steps.output_shapes(height, width, self.device.torch_device)

    def _file_size(self, camera: int) -> tuple[int, int]:
        """``(height, width)`` of the first readable file of ``camera``."""
        problems = []
        for clip in self.index.clips:
            stream = clip.cameras[camera]
            try:
                info = stream.info if stream.info is not None else probe_video(stream.path, storage=self.index.storage)
            except FILE_ERRORS as err:
                problems.append(str(err))
                continue
            return info.height, info.width
        listed = "\n".join(f"  {p}" for p in problems[:5])
        raise VideoDecodeError(
            f"no file of camera {self.index.camera_names[camera]!r} can be read, so the batch's frame size is "
            f"unknown:\n{listed}"
        )

    def _allocate(self) -> None:
        if self.batches.shapes:
            return
        cameras = self.sampler.num_cameras if self.decode.camera_frames == "per_camera" else 1
        frame_shapes = [self.frame_shape(camera) for camera in range(cameras)]
        per_camera = [self.output_shapes(camera) for camera in range(cameras)]
        self.batches.allocate(
            frame_shapes, {name: [shapes[name] for shapes in per_camera] for name in self.output.outputs}
        )
        self._streams = [self.device.new_stream() for _ in range(self.num_threads)]
        self._done_events = [[self.device.new_event() for _ in range(self.ring_size)] for _ in range(self.num_threads)]
        self._release_events = [self.device.new_event() for _ in range(self.ring_size)]

    # -- the consumer ----------------------------------------------------------------------
    def run(self, start: int, assemble: Callable[[int, StepResult], StreamBatch]) -> Iterator[StreamBatch]:
        """Yield the batches of the sampler's current epoch from step ``start``, with the skips its ledger holds for
        the pass (:meth:`SkipLedger.begin_pass <lightning_vstream.stream.ledger.SkipLedger.begin_pass>`)."""
        self._allocate()
        if self._run is not None:  # an earlier run whose iterator was left unfinished
            self._shutdown(self._run)
        self._join(60.0)  # threads of an earlier run that was stopped while they were stuck
        sampler = self.sampler
        sampler.start_step = start
        self.steps.forget_draws()
        self._runs += 1
        run = EngineRun(
            number=self._runs,
            start=start,
            num_steps=len(sampler.schedule()),
            threads=self.num_threads,
            next_plan=start,
            requested=start,
            released=start,
            progress=[start - 1] * self.num_threads,
        )
        self._run = run
        # Every batch handed out so far is released once the consumer's work queued up to now is done.
        for event in self._release_events:
            self.device.record(event)
        self.threads.start(functools.partial(self._thread_main, run))
        try:
            for step in range(start, run.num_steps):
                yield self._next_batch(run, step, assemble)
        finally:
            self._shutdown(run)

    def _ready(self, run: EngineRun, step: int) -> bool:
        """Every thread has finished ``step``, or stopped at an error at or before it."""
        return all(
            done >= step or (t in run.errors and run.errors[t][0] <= step) for t, done in enumerate(run.progress)
        )

    def _next_batch(self, run: EngineRun, step: int, assemble: Callable[[int, StepResult], StreamBatch]) -> StreamBatch:
        with run.cond:
            run.requested = step
            if step - self.hold >= run.released:
                # The consumer no longer holds this batch: later writes to it wait for its work so far.
                self.device.record(self._release_events[(step - self.hold) % self.ring_size])
                run.released = step - self.hold + 1
            run.cond.notify_all()
            finished = self._ready(run, step)
            if not finished:
                with _WAIT_RANGE:
                    finished = run.cond.wait_for(
                        functools.partial(self._ready, run, step), timeout=self.errors.timeout or None
                    )
            if not finished:
                run.timed_out = True
                late = [t for t, done in enumerate(run.progress) if done < step]
                raise WorkerError(
                    f"the stream engine produced no batch for step {step} within timeout={self.errors.timeout:g} s: "
                    + "; ".join(f"decode thread {t} did not finish {self._streams_of(run, step, t)}" for t in late)
                    + ". A file may be stalled on a slow file system, or a decoder hangs: check the files named, "
                    "or raise the timeout if decoding is only slow."
                )
            if run.errors:
                failures = sorted((s, p, t) for t, (s, p, _) in run.errors.items() if s <= step)
                if failures:
                    raise run.errors[failures[0][2]][2]
            planned = run.steps.pop(step)
        for events in self._done_events:
            self.device.wait(events[step % self.ring_size])
        with _COLLATE_RANGE:
            return assemble(step, self._result(run, planned))

    def _streams_of(self, run: EngineRun, step: int, t: int) -> str:
        """The camera streams thread ``t`` decodes at ``step``, for errors: slot, camera, clip, frame and file."""
        planned = run.steps.get(step)
        return self.assembler.streams(step, None if planned is None else planned.reads, t, self.num_threads)

    def _result(self, run: EngineRun, planned: PlannedStep) -> StepResult:
        """What the threads decoded for a step, for the engine (failed reads are given up already)."""
        batches, reads = self.batches, planned.reads

        def frames(valid: list[bool]) -> dict[str, Any]:
            laid_out = {"": batches.layout(planned.frames)}
            laid_out.update((name, batches.layout(planned.outputs[name])) for name in self.output.outputs)
            return laid_out

        return StepResult(
            reads=reads,
            shifts=planned.shifts,
            timestamps=np.array(planned.timestamps, dtype=np.float64).reshape(len(reads), -1),
            frames=frames,
            counts={(run.number, thread): counts for thread, counts in planned.counts.items()},
            annotations=planned.annotations.items(),
            missing=planned.missing,
            geometry=planned.geometry.items(),
            output_geometry={name: planned.output_geometry[name].items() for name in self.output.outputs},
        )

    # -- the decode threads ----------------------------------------------------------------
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
                output_geometry={name: {} for name in self.output.outputs},
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

    def _thread_main(self, run: EngineRun, slot: ThreadSlot) -> None:
        t = slot.number
        decoders = ThreadDecoders(
            self.index, self.decoder_factory, self.steps, slot.decoders, stride=self.sampler.frame_stride
        )
        stream = self._streams[t]
        step = run.start
        cams = self.sampler.num_cameras
        positions = range(t, self.sampler.batch_size * cams, self.num_threads)  # this thread's streams
        mine = [(position, *divmod(position, cams)) for position in positions]  # with their slot and camera
        # Frames nothing follows the decoder for take the short way (see _decode_plain).
        plain = self._plain and decoders.limit is None
        reading = _Reading()
        try:
            with self.device.use(stream):
                for step in range(run.start, run.num_steps):
                    reading.position = -1
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
                            self._decode_plain(run, step, planned, decoders, mine, reading)
                        else:
                            for position in positions:
                                reading.position = position
                                self._decode_one(run, step, position, planned, decoders)
                    planned.counts[t] = decoders.counts()
                    self.device.record(self._done_events[t][step % self.ring_size], stream)
                    with run.cond:
                        run.progress[t] = step
                        run.cond.notify_all()
        except BaseException as err:
            with run.cond:
                run.errors[t] = (step, reading.position, err)
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
        # A failure another thread is recording right now only costs a decode whose slot the batch marks
        # invalid anyway.
        if self._ledger.given_up(slot, read.segment, step):
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
        reading: _Reading,
    ) -> None:
        """:meth:`_decode_one` for all of a thread's streams (``(position, slot, camera)``) at ``step``, for
        frames nothing follows the decoder for: no transform left to apply, no augmentation, named output,
        geometry or annotation. Each frame goes from the decoder into its row, and its timestamp is noted
        (:meth:`ThreadDecoders.read_into <lightning_vstream.stream.engine_reads.ThreadDecoders.read_into>`);
        failed reads are handled as there. ``reading`` follows the stream being read.
        """
        reads, rows, timestamps = planned.reads, planned.rows, planned.timestamps
        ledger = self._ledger
        read_into = decoders.read_into
        for position, slot, camera in mine:
            reading.position = position
            read = reads[slot]
            if read is None:
                continue
            # As in _decode_one.
            if ledger.any_given_up and ledger.given_up(slot, read.segment, step):
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
        if self.errors.on_error == "raise":
            raise err
        decoders.close(position)
        decoders.read_errors += 1
        slot, camera = divmod(position, self.sampler.num_cameras)
        path = str(self.index.clips[read.clip].cameras[camera].path)
        self.assembler.give_up(step, position, read, planned.shifts[slot], path=path, error=err)

    def _shutdown(self, run: EngineRun) -> None:
        """Stop the threads of ``run`` (the current run, or an earlier one whose iterator is dropped only now)."""
        with run.cond:
            run.stopping = True
            run.cond.notify_all()
        # After a timeout the threads are stuck in a decoder: do not wait for them here; close()
        # (or the next run) collects them once they return.
        timeout = 0.0 if run.timed_out else 60.0
        self._stuck.extend(self.threads.close(timeout=timeout))
        self._join(timeout)
        if self._run is run:
            self.sampler.start_step = 0
            self._run = None

    def _join(self, timeout: float) -> None:
        """Wait for the threads of stopped runs."""
        alive = []
        for thread in self._stuck:
            thread.join(timeout=timeout)
            if thread.is_alive():
                alive.append(thread)
        if alive and timeout > 0:  # pragma: no cover - a decoder stuck inside a native call
            log.warning(
                "%d decode thread(s) did not stop within %g s; leaving them (daemon) behind", len(alive), timeout
            )
        self._stuck = alive

    def _stop_run(self) -> None:
        """Make the decode threads of the run in progress return (interpreter exit, or :meth:`close`)."""
        run = self._run
        if run is not None:
            with run.cond:
                run.stopping = True
                run.cond.notify_all()

    def close(self) -> None:
        """Stop the threads of a run in progress (their decoders close as they exit)."""
        if self._run is not None:
            self._shutdown(self._run)
        self._join(60.0)

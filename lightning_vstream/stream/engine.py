"""The in-process stream engine: decode threads writing each frame once into a ring of batches.

Why threads in the training process: decoding in spawn DataLoader workers keeps about one picture
in flight per process, ships every frame over CUDA IPC and gives each worker a CUDA context of its
own, time-sliced against training. Here ``num_threads`` threads (by default twice the GPU's NVDEC
engines) share the training process's primary context; PyNvVideoCodec's ``Decode`` releases the
GIL, so they keep every NVDEC engine busy.

How a step flows:

- **Streams stay with threads.** Stream ``position = slot * cameras + camera`` always belongs to
  thread ``position % num_threads``, which keeps its decoder while the slot stays on a clip, so
  consecutive steps decode consecutive frames (decode amplification 1.0), in the same plan as the
  worker loader (:class:`~lightning_vstream.stream.loader.StreamSampler`).
- **A ring of batches.** ``prefetch + hold`` batches are allocated once on the rank's device;
  step ``s`` writes into batch ``s % ring``. Each frame is converted straight into its row
  (:meth:`NvDecoder.get(..., out=row) <lightning_vstream.decode.gpu.NvDecoder.get>`), or written
  once after the transform.
- **Events, not host syncs.** Each thread records an event on its own stream when it has queued a
  step; the consumer makes its current stream wait on those events. When the consumer asks for
  step ``k`` it releases step ``k - hold`` by recording a release event on its stream, which the
  thread that next writes that batch waits for. The host only waits for threads to have *queued*
  their work.

Batches are views of the ring: a batch stays intact until ``hold`` further batches have been
requested (Lightning's loop keeps one batch in prefetch, hence ``hold=2``); ``clone()`` frames to
keep them longer.
"""

from __future__ import annotations

import functools
import logging
import math
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch

from lightning_vstream.decode.base import FrameDecoder, VideoDecodeError, VideoInfo
from lightning_vstream.decode.cpu import probe_video
from lightning_vstream.errors import ConfigurationError, WorkerError
from lightning_vstream.index import VideoIndex
from lightning_vstream.profiling import (
    RANGE_COLLATE,
    RANGE_ENGINE_STEP,
    RANGE_TRANSFORM,
    RANGE_WAIT,
    nvtx_range,
)
from lightning_vstream.stream.devices import EngineDevice
from lightning_vstream.stream.loader import StreamSampler
from lightning_vstream.stream.schedule import SlotRead
from lightning_vstream.stream.worker import DecodeStats

__all__ = ["DecoderFactory", "StreamEngine"]

log = logging.getLogger("lightning_vstream")
DecoderFactory = Callable[["Path | str", "VideoInfo | None", str], FrameDecoder]
OnError = Literal["raise", "skip"]


@dataclass
class _StepPlan:
    reads: list[SlotRead | None]
    shifts: list[int]


@dataclass
class _Run:
    """State one epoch's threads and consumer share; guarded by ``cond``."""

    start: int
    num_steps: int
    cond: threading.Condition = field(default_factory=threading.Condition)
    plans: dict[int, _StepPlan] = field(default_factory=dict)
    next_plan: int = 0
    released: int = 0  # steps start .. released-1 have given their batch back
    done: dict[int, int] = field(default_factory=dict)  # step -> threads finished
    timestamps: dict[int, list[float]] = field(default_factory=dict)
    abandoned: dict[tuple[int, int], int] = field(default_factory=dict)  # (slot, segment) -> first failed step
    error: BaseException | None = None
    stopping: bool = False
    timed_out: bool = False


class StreamEngine:
    """Decodes a :class:`StreamSampler`'s plan with threads into a ring of batches on one device.

    Args:
        index: The clips to read.
        sampler: The stream plan (its ``num_parts`` must be 1).
        device: Where batches live and how work is ordered (:class:`~lightning_vstream.stream.devices.CudaDevice`
            or :class:`~lightning_vstream.stream.devices.HostDevice`).
        decoder_factory: ``(path, info, label) -> decoder`` for one camera stream; its ``get(index, out=None)``
            returns the frame as ``[3, H, W]`` uint8 on ``device``, ordered on the current stream.
        num_threads: Decode threads; ``device.default_threads()`` when None.
        prefetch: Batches decoded ahead of the one the consumer asks for.
        hold: Batches the consumer may hold after asking for them (their memory is not reused).
        transform: Applied to each ``[1, 3, H, W]`` frame on its thread's stream, right after decoding.
        on_error: ``"raise"`` re-raises a decoding error from the thread that met it;
            ``"skip"`` moves the slot to its next clip and marks the batches in between invalid.
        timeout: Seconds the consumer waits for a step before raising :class:`WorkerError` (0: forever).

    Example::

        >>> engine = StreamEngine(index=index, sampler=sampler, device=HostDevice(),  # doctest: +SKIP
        ...                       decoder_factory=lambda p, i, label: PyAVDecoder(p, info=i, label=label))
        >>> next(iter(engine))["frames"].shape  # doctest: +SKIP
        torch.Size([2, 6, 3, 48, 64])
    """

    def __init__(
        self,
        *,
        index: VideoIndex,
        sampler: StreamSampler,
        device: EngineDevice,
        decoder_factory: DecoderFactory,
        num_threads: int | None = None,
        prefetch: int = 2,
        hold: int = 2,
        transform: Callable[[torch.Tensor], torch.Tensor] | None = None,
        on_error: OnError = "raise",
        timeout: float = 300.0,
    ) -> None:
        if sampler.num_parts != 1:
            raise ConfigurationError(f"StreamEngine needs a sampler with num_parts=1, got {sampler.num_parts}.")
        if prefetch < 1 or hold < 1:
            raise ConfigurationError(f"prefetch={prefetch!r} and hold={hold!r} must both be >= 1.")
        if num_threads is not None and num_threads < 1:
            raise ConfigurationError(f"num_threads={num_threads!r} must be >= 1 or None.")
        if on_error not in ("raise", "skip"):
            raise ConfigurationError(f"on_error={on_error!r} is not supported; use 'raise' or 'skip'.")
        self.index = index
        self.sampler = sampler
        self.device = device
        self.decoder_factory = decoder_factory
        self.prefetch = prefetch
        self.hold = hold
        self.transform = transform
        self.on_error = on_error
        self.timeout = timeout
        streams = sampler.batch_size * sampler.num_cameras
        self.num_threads = max(1, min(num_threads or device.default_threads(), streams))
        self.ring_size = prefetch + hold
        self._ring: list[torch.Tensor] = []
        self._done_events: list[list[Any]] = []
        self._release_events: list[Any] = []
        self._streams: list[Any] = []
        self._threads: list[threading.Thread] = []
        self._run: _Run | None = None
        self._stats_lock = threading.Lock()
        self._stats = DecodeStats()
        self._bad_files: set[str] = set()
        #: Slot shifts each step was planned with (for resuming mid-epoch after skipped clips).
        self.shift_log: dict[int, list[int]] = {}
        #: Announces each planned step's upcoming GOPs (a remote index; set by ``build_engine_loader``).
        self.prefetcher: Any = None

    # -- setup -----------------------------------------------------------------------------
    def frame_shape(self) -> tuple[tuple[int, ...], torch.dtype]:
        """Shape and dtype of one camera frame in a batch (after the transform)."""
        camera = self.index.clips[0].cameras[0]
        info = camera.info if camera.info is not None else probe_video(camera.path)
        if self.transform is None:
            return (3, info.height, info.width), torch.uint8
        probe = self.device.empty((1, 3, info.height, info.width), torch.uint8).zero_()
        out = self.transform(probe)
        return tuple(out.shape[1:]), out.dtype

    def _allocate(self) -> None:
        if self._ring:
            return
        shape, dtype = self.frame_shape()
        rows = self.sampler.batch_size * self.sampler.num_cameras
        self._ring = [self.device.empty((rows, *shape), dtype) for _ in range(self.ring_size)]
        self._streams = [self.device.new_stream() for _ in range(self.num_threads)]
        self._done_events = [[self.device.new_event() for _ in range(self.ring_size)] for _ in range(self.num_threads)]
        self._release_events = [self.device.new_event() for _ in range(self.ring_size)]

    # -- the consumer ----------------------------------------------------------------------
    def run(self, start: int = 0) -> Iterator[dict[str, Any]]:
        """Yield the batches of the sampler's current epoch from step ``start``."""
        self._allocate()
        self._join(60.0)  # threads of an earlier run that was stopped while they were stuck
        plan = self.sampler.schedule()
        run = _Run(start=start, num_steps=len(plan), next_plan=start, released=start)
        self.sampler.start_step = start
        self._run = run
        self._threads = [
            threading.Thread(target=self._thread_main, args=(run, t), name=f"vstream-decode-{t}", daemon=True)
            for t in range(self.num_threads)
        ]
        for thread in self._threads:
            thread.start()
        try:
            for step in range(start, run.num_steps):
                yield self._next_batch(run, step)
        finally:
            self._shutdown(run)

    def _next_batch(self, run: _Run, step: int) -> dict[str, Any]:
        with run.cond:
            if step - self.hold >= run.released:
                # The consumer no longer holds this batch: later writes to it wait for its work so far.
                self.device.record(self._release_events[(step - self.hold) % self.ring_size])
                run.released = step - self.hold + 1
                run.cond.notify_all()
            with nvtx_range(RANGE_WAIT):
                finished = run.cond.wait_for(
                    lambda: run.error is not None or run.done.get(step, 0) == self.num_threads,
                    timeout=self.timeout or None,
                )
            if run.error is not None:
                raise run.error
            if not finished:
                run.timed_out = True
                raise WorkerError(
                    f"the stream engine produced no batch for step {step} within timeout={self.timeout:g} s "
                    f"({run.done.get(step, 0)} of {self.num_threads} decode threads done); a file may be stalled on a "
                    "slow file system, or raise the timeout."
                )
            step_plan = run.plans.pop(step)
            timestamps = run.timestamps.pop(step)
            del run.done[step]
            abandoned = dict(run.abandoned)
        self.shift_log[step] = list(step_plan.shifts)
        for old in [s for s in self.shift_log if s < step - 256]:
            del self.shift_log[old]
        slot = step % self.ring_size
        for events in self._done_events:
            self.device.wait(events[slot])
        with nvtx_range(RANGE_COLLATE):
            return self._assemble(step, step_plan, timestamps, abandoned, self._ring[slot])

    def _assemble(
        self,
        step: int,
        plan: _StepPlan,
        timestamps: list[float],
        abandoned: dict[tuple[int, int], int],
        buffer: torch.Tensor,
    ) -> dict[str, Any]:
        cams = self.sampler.num_cameras
        batch_size = self.sampler.batch_size
        reads = plan.reads
        valid = [r is not None and abandoned.get((slot, r.segment), step + 1) > step for slot, r in enumerate(reads)]
        frames = buffer.view(batch_size, cams, *buffer.shape[1:])
        for slot, ok in enumerate(valid):
            if not ok:
                frames[slot].zero_()  # padding and failed slots hold zeros, not stale frames
        with self._stats_lock:
            self._stats.skipped_samples += sum(1 for s, r in enumerate(reads) if r is not None and not valid[s])
        camera_ts = torch.tensor(timestamps, dtype=torch.float64).view(batch_size, cams)
        for slot, ok in enumerate(valid):
            if not ok:
                camera_ts[slot] = math.nan
        labels = [r if ok else None for r, ok in zip(reads, valid)]
        return {
            "frames": frames,
            "clip_id": [self.index.clips[r.clip].clip_id if r is not None else "" for r in labels],
            "frame_index": torch.tensor([r.frame if r is not None else -1 for r in labels], dtype=torch.long),
            "is_first": torch.tensor([r is not None and r.is_first for r in labels], dtype=torch.bool),
            "valid": torch.tensor(valid, dtype=torch.bool),
            "timestamp": camera_ts[:, 0].clone(),
            "camera_timestamp": camera_ts,
            "camera_names": list(self.index.camera_names),
            "epoch": self.sampler.epoch,
            "step": step,
        }

    def _shutdown(self, run: _Run) -> None:
        with run.cond:
            run.stopping = True
            run.cond.notify_all()
        # After a timeout the threads are stuck in a decoder: do not wait for them here; close()
        # (or the next run) collects them once they return.
        self._join(0.0 if run.timed_out else 60.0)
        self.sampler.start_step = 0
        self._run = None

    def _join(self, timeout: float) -> None:
        alive = []
        for thread in self._threads:
            thread.join(timeout=timeout)
            if thread.is_alive():
                alive.append(thread)
        if alive and timeout > 0:  # pragma: no cover - a decoder stuck inside a native call
            log.warning(
                "%d decode thread(s) did not stop within %g s; leaving them (daemon) behind", len(alive), timeout
            )
        self._threads = alive

    def close(self) -> None:
        """Stop the threads of a run in progress (their decoders close as they exit)."""
        if self._run is not None:
            self._shutdown(self._run)
        self._join(60.0)

    # -- the decode threads ----------------------------------------------------------------
    def _plan(self, run: _Run, step: int) -> _StepPlan:
        """The reads of ``step``, planned once and in order (call with ``run.cond`` held)."""
        while run.next_plan <= step:
            s = run.next_plan
            self.sampler.tasks(s)  # records the step as issued, so abandon() affects only later steps
            reads, shifts, _ = self.sampler.issued(s)
            run.plans[s] = _StepPlan(reads, shifts)
            if self.prefetcher is not None:
                self.prefetcher.observe_slots(self.sampler.epoch, s, reads)
            run.timestamps[s] = [math.nan] * (self.sampler.batch_size * self.sampler.num_cameras)
            run.next_plan = s + 1
        return run.plans[step]

    def _may_write(self, run: _Run, step: int) -> bool:
        """Whether a thread may write ``step``: its batch has been released, or the run is stopping."""
        return run.stopping or step < run.released + self.ring_size

    def _thread_main(self, run: _Run, t: int) -> None:
        decoders: dict[int, tuple[int, FrameDecoder]] = {}
        stream = self._streams[t]
        try:
            with self.device.use(stream):
                for step in range(run.start, run.num_steps):
                    with run.cond:
                        run.cond.wait_for(functools.partial(self._may_write, run, step))
                        if run.stopping:
                            return
                        plan = self._plan(run, step)
                    slot_index = step % self.ring_size
                    self.device.wait(self._release_events[slot_index], stream)
                    with nvtx_range(RANGE_ENGINE_STEP):
                        self._decode_step(run, t, step, plan, self._ring[slot_index], decoders)
                    self.device.record(self._done_events[t][slot_index], stream)
                    with run.cond:
                        run.done[step] = run.done.get(step, 0) + 1
                        run.cond.notify_all()
        except BaseException as err:
            with run.cond:
                if run.error is None:
                    run.error = err
                run.cond.notify_all()
        finally:
            for position in list(decoders):
                self._close_decoder(decoders, position)

    def _close_decoder(self, decoders: dict[int, tuple[int, FrameDecoder]], position: int) -> None:
        _, dec = decoders.pop(position)
        with self._stats_lock:
            self._stats.frames_decoded += dec.frames_decoded
            self._stats.seeks += getattr(dec, "seeks", 0)
        try:
            dec.close()
        except Exception:  # closing must not hide the error that ended the run
            log.debug("closing a decoder failed", exc_info=True)

    def _decoder(
        self, decoders: dict[int, tuple[int, FrameDecoder]], position: int, clip_ordinal: int, camera_ordinal: int
    ) -> FrameDecoder:
        entry = decoders.get(position)
        if entry is not None and entry[0] == clip_ordinal:
            return entry[1]
        if entry is not None:
            self._close_decoder(decoders, position)
        clip = self.index.clips[clip_ordinal]
        camera = clip.cameras[camera_ordinal]
        dec = self.decoder_factory(camera.path, camera.info, f"clip {clip.clip_id!r}, camera {camera.name!r}")
        decoders[position] = (clip_ordinal, dec)
        with self._stats_lock:
            self._stats.files_opened += 1
        return dec

    def _decode_step(
        self,
        run: _Run,
        t: int,
        step: int,
        plan: _StepPlan,
        buffer: torch.Tensor,
        decoders: dict[int, tuple[int, FrameDecoder]],
    ) -> None:
        cams = self.sampler.num_cameras
        timestamps = run.timestamps[step]
        for position in range(t, len(plan.reads) * cams, self.num_threads):
            slot, camera = divmod(position, cams)
            read = plan.reads[slot]
            if read is None:
                continue
            with run.cond:
                if run.abandoned.get((slot, read.segment), step + 1) <= step:
                    continue
            try:
                dec = self._decoder(decoders, position, read.clip, camera)
                self._write(dec, read, camera, buffer[position])  # the decoder emits its own NVTX ranges
            except VideoDecodeError as err:
                located = self._located(err, read, camera)
                if self.on_error == "raise":
                    raise located from err
                if position in decoders:
                    self._close_decoder(decoders, position)
                self._abandon(run, slot, step, plan.shifts[slot], read, camera, located)
                continue
            timestamps[position] = dec.info.timestamp(read.frame)
            with self._stats_lock:
                self._stats.frames_delivered += 1

    def _located(self, err: VideoDecodeError, read: SlotRead, camera: int) -> VideoDecodeError:
        """``err``, prefixed with the clip, camera and frame the slot was reading."""
        clip = self.index.clips[read.clip]
        where = f"clip {clip.clip_id!r}, camera {clip.cameras[camera].name!r}, frame {read.frame}"
        if str(err).startswith(where):
            return err
        return VideoDecodeError(f"{where}: {err}")

    def _write(self, dec: FrameDecoder, read: SlotRead, camera: int, row: torch.Tensor) -> None:
        info = dec.info
        if self.transform is None:
            if tuple(row.shape) != (3, info.height, info.width):
                raise self._size_error(read, camera, (3, info.height, info.width), tuple(row.shape))
            dec.get(read.frame, out=row)  # type: ignore[call-arg]
            return
        image = dec.get(read.frame)
        with nvtx_range(RANGE_TRANSFORM):
            image = self.transform(image[None])[0]
        if image.shape != row.shape or image.dtype != row.dtype:
            raise self._size_error(read, camera, tuple(image.shape), tuple(row.shape))
        row.copy_(image)

    def _size_error(self, read: SlotRead, camera: int, got: tuple[int, ...], expected: tuple[int, ...]) -> ValueError:
        clip = self.index.clips[read.clip]
        return ValueError(
            f"clip {clip.clip_id!r}, camera {clip.cameras[camera].name!r} frame {read.frame} is {got} but the batch "
            f"holds {expected} frames; batches stack frames, so configure a resize transform or give every file the "
            "same size."
        )

    def _abandon(
        self, run: _Run, slot: int, step: int, shift: int, read: SlotRead, camera: int, err: VideoDecodeError
    ) -> None:
        path = str(self.index.clips[read.clip].cameras[camera].path)
        with run.cond:
            key = (slot, read.segment)
            first = key not in run.abandoned
            run.abandoned[key] = min(run.abandoned.get(key, step), step)
            if first:
                self.sampler.abandon(slot, step, shift, read)
        with self._stats_lock:
            self._stats.read_errors += 1
            if first:
                self._stats.skipped_clips += 1
            if path not in self._bad_files:
                self._bad_files.add(path)
                self._stats.bad_files = len(self._bad_files)
                log.warning(
                    "skipping clip %r from frame %d on: %s", self.index.clips[read.clip].clip_id, read.frame, err
                )

    # -- counters --------------------------------------------------------------------------
    @property
    def stats(self) -> DecodeStats:
        """Decoding counters of every run so far (decoders still open count when they close)."""
        with self._stats_lock:
            return self._stats + DecodeStats()

"""Main-process side of streaming: the rank-aware sampler and the stream-affine DataLoader.

Why parts: the plain design, where the DataLoader hands consecutive steps to different workers
in turn, decodes about ``num_workers`` times more than it delivers on P-frame streams, because
each worker must decode through the frames the other workers delivered. Here every step is
split into ``num_workers`` parts by camera stream; the sampler emits the parts of each step in
order and PyTorch dispatches indices to workers round-robin, so part ``p`` always reaches
worker ``p``, which keeps decoding the same streams frame after frame. The loader reassembles
the parts into the full batch.

Why a ``DistributedSampler`` subclass: Lightning leaves a loader whose ``sampler`` is a
``DistributedSampler`` alone under DDP (whether or not ``use_distributed_sampler`` is set) and
calls ``set_epoch`` on it at every epoch start. Our sampler shards by rank itself.
"""

from __future__ import annotations

import logging
import math
import multiprocessing.context
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, DistributedSampler

from lightning_vstream.errors import (
    ConfigurationError,
    StepMismatchError,
    VideoDecodeError,
    VStreamError,
    WorkerError,
)
from lightning_vstream.profiling import RANGE_COLLATE, nvtx_range
from lightning_vstream.stream.failures import DecodeStats, SkipLedger, frame_size_error
from lightning_vstream.stream.frames import attach_annotations
from lightning_vstream.stream.resume import (
    STATE_VERSION,
    SkipHistory,
    checked_resume_state,
    no_skips,
    resume_config,
)
from lightning_vstream.stream.schedule import Remainder, SlotRead, StreamSchedule
from lightning_vstream.stream.supervise import (
    STOP_GRACE_S,
    TORCH_WORKER_FAILURE,
    WorkerTimeout,
    dead_workers,
    describe_exit,
    stop_workers,
    watch_workers,
)
from lightning_vstream.stream.worker import StreamDataset, StreamPart, StreamRead, StreamTask

__all__ = ["STATE_VERSION", "StreamDataLoader", "StreamSampler", "checked_resume_state", "resume_config"]

log = logging.getLogger("lightning_vstream")

#: A step's batch buffers, one per output: ``""`` for the default output, else the output's name.
Buffers = dict[str, torch.Tensor]
#: Shape, dtype and device of an output's frames.
Template = tuple[tuple[int, ...], torch.dtype, torch.device]


class StreamSampler(DistributedSampler):
    """Emits :class:`StreamTask` indices: ``num_parts`` per step, for this rank's slots.

    Args:
        clip_lengths: Frame count of every clip, in index order.
        num_cameras: Cameras per clip (streams per slot).
        batch_size: Slots per batch on this rank.
        num_replicas: World size.
        rank: This rank.
        seed: Shuffle seed (same on every rank).
        shuffle: Shuffle segments per epoch.
        segment_length: Split clips into segments of at most this many frames.
        frame_stride: Read every ``frame_stride``-th frame.
        remainder: ``"drop"`` or ``"pad"`` (see :mod:`lightning_vstream.stream.schedule`).
        num_parts: Parts per step (the number of workers, or 1).

    Example::

        >>> sampler = StreamSampler([20, 13, 27], num_cameras=2, batch_size=2, shuffle=False)
        >>> len(sampler), next(iter(sampler)).reads[0]
        (27, StreamRead(position=0, clip=2, camera=0, frame=0, segment=2, segment_start=0))
    """

    def __init__(
        self,
        clip_lengths: list[int],
        *,
        num_cameras: int,
        batch_size: int,
        num_replicas: int = 1,
        rank: int = 0,
        seed: int = 0,
        shuffle: bool = True,
        segment_length: int | None = None,
        frame_stride: int = 1,
        remainder: Remainder = "drop",
        num_parts: int = 1,
    ) -> None:
        if num_parts < 1:
            raise ConfigurationError(f"num_parts={num_parts!r} must be >= 1.")
        super().__init__(range(len(clip_lengths)), num_replicas=num_replicas, rank=rank, shuffle=shuffle, seed=seed)  # type: ignore[arg-type]
        self.clip_lengths = list(clip_lengths)
        self.num_cameras = num_cameras
        self.batch_size = batch_size
        self.segment_length = segment_length
        self.frame_stride = frame_stride
        self.remainder = remainder
        self.num_parts = num_parts
        self.start_step = 0
        self._cache: tuple[int, StreamSchedule] | None = None
        # Per-slot step offsets: a slot whose clip failed (on_error="skip") jumps ahead to its
        # next segment and pads at the end of the epoch, so all ranks keep the same length.
        self.shifts = [0] * batch_size
        #: Shift changes that take effect at a later step: ``(from_step, slot, shift)`` (resume).
        self.pending_shifts: list[tuple[int, int, int]] = []
        #: ``(slot, segment)`` pairs given up in this pass: their reads are not sent to workers.
        self.abandoned: set[tuple[int, int]] = set()
        #: Shape of every frame of the batch once known, per output (``""``: the default output, ``batch["frames"]``;
        #: else a name of ``batch["outputs"]``); sent with each task so workers check it.
        self.frame_shapes: dict[str, tuple[int, ...]] = {}
        self._issued: dict[int, tuple[list[SlotRead | None], list[int], Buffers | None]] = {}
        #: Weak reference to a callable giving each step's batch buffers, per output (None: parts mode).
        self.buffer_factory: weakref.WeakMethod[Callable[[], Buffers | None]] | None = None
        self._next_step = 0
        self.schedule()  # validate the configuration now, not in a worker

    def schedule(self, epoch: int | None = None) -> StreamSchedule:
        """The plan of ``epoch`` (default: the current one) for this rank."""
        epoch = self.epoch if epoch is None else epoch
        if self._cache is None or self._cache[0] != epoch:
            plan = StreamSchedule(
                self.clip_lengths,
                batch_size=self.batch_size,
                world_size=self.num_replicas,
                rank=self.rank,
                seed=self.seed,
                epoch=epoch,
                shuffle=self.shuffle,
                segment_length=self.segment_length,
                frame_stride=self.frame_stride,
                remainder=self.remainder,
            )
            self._cache = (epoch, plan)
        return self._cache[1]

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose plan the next iteration follows."""
        if epoch != self.epoch:
            self.reset_skips()
        self.epoch = epoch

    def reset_skips(self) -> None:
        """Forget the shifts and abandoned segments of skipped clips (a new pass from step 0)."""
        self.shifts = [0] * self.batch_size
        self.pending_shifts = []
        self.abandoned = set()

    def __len__(self) -> int:
        return len(self.schedule()) * self.num_parts

    def reads(self, step: int) -> list[SlotRead | None]:
        """What each slot reads at ``step`` under the current shifts (None: padding)."""
        plan = self.schedule()
        reads: list[SlotRead | None] = []
        for slot, shift in enumerate(self.shifts):
            position = step + shift
            reads.append(plan.read(position, slot) if position < plan.num_steps else None)
        return reads

    def issued(self, step: int) -> tuple[list[SlotRead | None], list[int], Buffers | None]:
        """The reads, shifts and batch buffers ``step`` was issued with (the loader labels batches with them)."""
        return self._issued.pop(step)

    def abandon(self, slot: int, step: int, shift: int, read: SlotRead) -> tuple[int, int] | None:
        """Move ``slot`` past the segment of ``read`` for every step not issued yet.

        ``read`` was issued at ``step`` with the slot's shift ``shift``; steps already issued
        keep their reads (the loader marks them invalid). Returns ``(from_step, new_shift)``, or
        None when the slot had already moved past the segment.
        """
        self.abandoned.add((slot, read.segment))
        segment = self.schedule().segments[read.segment]
        offset = (read.frame - segment.start) // segment.stride
        next_segment = step + shift + segment.length - offset  # plan position of the next segment
        if self._next_step + self.shifts[slot] < next_segment:
            self.shifts[slot] = next_segment - self._next_step
            return self._next_step, self.shifts[slot]
        return None

    def abandon_from(
        self, slot: int, step: int, shift: int, read: SlotRead, from_step: int, *, replaces: tuple[int, int] | None
    ) -> tuple[int, int] | None:
        """Give up the segment of ``read`` and move ``slot`` past it from ``from_step`` on (not issued yet).

        Unlike :meth:`abandon`, when the slot moves on does not depend on how far ahead steps were
        issued when the failure was found (the engine's threads plan steps as they go): steps
        before ``from_step`` keep reading the segment given up, and the loader marks them invalid.
        ``replaces`` is the change an earlier call returned for the same segment (found again at an
        earlier step); it is withdrawn. Returns ``(from_step, new_shift)``, or None when the slot is
        past the segment by then anyway.
        """
        self.abandoned.add((slot, read.segment))
        if replaces is not None:
            self.pending_shifts = [
                c for c in self.pending_shifts if (c[0], c[1], c[2]) != (replaces[0], slot, replaces[1])
            ]
        segment = self.schedule().segments[read.segment]
        offset = (read.frame - segment.start) // segment.stride
        next_segment = step + shift + segment.length - offset  # plan position of the next segment
        current = self.shifts[slot]
        for due, changed, value in sorted(self.pending_shifts):
            if changed == slot and due <= from_step:
                current = value
        if from_step + current < next_segment:
            self.pending_shifts.append((from_step, slot, next_segment - from_step))
            return from_step, next_segment - from_step
        return None

    def issue(self, step: int) -> tuple[list[SlotRead | None], Buffers | None]:
        """Record ``step`` as issued, applying the shift changes due by then: its reads and batch buffers.

        :meth:`tasks` issues a step and splits it into parts; the stream engine, which plans whole
        steps, issues them with this alone and takes them back with :meth:`issued`.
        """
        if self.pending_shifts:
            due = [change for change in self.pending_shifts if change[0] <= step]
            for _, slot, shift in sorted(due):
                self.shifts[slot] = shift
            self.pending_shifts = [change for change in self.pending_shifts if change[0] > step]
        reads = self.reads(step)
        factory = self.buffer_factory() if self.buffer_factory is not None else None
        buffers = factory() if factory is not None else None
        self._issued[step] = (reads, list(self.shifts), buffers)
        self._next_step = step + 1
        return reads, buffers

    def tasks(self, step: int) -> list[StreamTask]:
        """The parts of ``step``: stream ``slot * num_cameras + camera`` goes to part ``position % num_parts``."""
        parts: list[list[StreamRead]] = [[] for _ in range(self.num_parts)]
        reads, buffers = self.issue(step)
        segments = self.schedule().segments
        for slot, read in enumerate(reads):
            if read is None or (slot, read.segment) in self.abandoned:
                continue  # padding, or a clip given up: nothing to decode
            start = segments[read.segment].start
            for camera in range(self.num_cameras):
                position = slot * self.num_cameras + camera
                parts[position % self.num_parts].append(
                    StreamRead(position, read.clip, camera, read.frame, segment=read.segment, segment_start=start)
                )
        buffer = buffers.get("") if buffers is not None else None
        output_buffers = {name: b for name, b in buffers.items() if name} if buffers is not None else None
        output_shapes = {name: shape for name, shape in self.frame_shapes.items() if name}
        return [
            StreamTask(
                self.epoch, step, p, tuple(reads), buffer, self.frame_shapes.get(""), output_buffers, output_shapes
            )
            for p, reads in enumerate(parts)
        ]

    def __iter__(self) -> Iterator[StreamTask]:
        self._issued.clear()
        if self.start_step == 0:
            self.reset_skips()
        for step in range(self.start_step, len(self.schedule())):
            yield from self.tasks(step)


def _identity(item: Any) -> Any:
    return item


class BufferPool:
    """Recycles batch storages once nothing references the batch handed out.

    Allocating (and later unmapping) a fresh shared-memory batch every step costs more than
    decoding on a small machine; a recycled storage is already mapped and paged in. A batch
    counts as free when its base tensor is collected: every view of it (``batch["frames"]``,
    slices, ``.numpy()`` arrays) keeps the base alive, so memory is never reused under a user.
    Only a bare ``untyped_storage()`` kept without any tensor does not count; copy the frames
    (``.clone()``) to keep them that way.

    Args:
        shared: Allocate shared memory (for worker processes) rather than ordinary memory.
        pinned: Allocate pinned (page-locked) memory, for fast copies to a GPU (needs CUDA).
    """

    def __init__(self, *, shared: bool, pinned: bool = False) -> None:
        self.shared = shared
        self.pinned = pinned
        self._free: dict[tuple[tuple[int, ...], torch.dtype], list[torch.UntypedStorage]] = {}
        self.allocated = 0

    def take(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """A tensor of ``shape`` whose storage returns to the pool when the tensor is collected."""
        key = (tuple(shape), dtype)
        free = self._free.setdefault(key, [])
        if free:
            storage = free.pop()
        else:
            nbytes = math.prod(shape) * dtype.itemsize
            # torch's own collate allocates worker batches with _new_shared: shared memory from
            # the start, so handing it to workers and back copies nothing.
            if self.shared:
                storage = torch.UntypedStorage._new_shared(nbytes)
            elif self.pinned:
                storage = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True).untyped_storage()
            else:
                storage = torch.UntypedStorage(nbytes)
            self.allocated += 1
        # The tensor that owns the storage (its ``_base`` is None), so every view made from it,
        # at any depth, keeps this very object alive; the storage returns only when all are gone.
        strides = [1] * len(shape)
        for i in range(len(shape) - 2, -1, -1):
            strides[i] = strides[i + 1] * shape[i + 1]
        root = torch.empty(0, dtype=dtype).set_(storage, 0, tuple(shape), tuple(strides))
        weakref.finalize(root, free.append, storage)
        return root


class StreamDataLoader(DataLoader):
    """DataLoader that assembles stream-affine parts into full streaming batches.

    Each batch is a dict:

    - ``frames``: ``[batch_size, cameras, 3, H, W]`` (uint8 unless a transform changes it)
    - ``clip_id``: list of clip ids (``""`` for padding)
    - ``frame_index``: LongTensor ``[batch_size]`` (-1 for padding)
    - ``is_first``: BoolTensor ``[batch_size]``, True where the slot starts a clip or segment
    - ``valid``: BoolTensor ``[batch_size]``, False for padding (``remainder="pad"``)
    - ``timestamp``: float64 ``[batch_size]`` seconds (first camera; NaN for padding)
    - ``camera_timestamp``: float64 ``[batch_size, cameras]``
    - ``camera_names``: list of camera names
    - ``epoch``, ``step``: the batch's position in the stream plan
    - with the dataset's named outputs, ``outputs``: ``{name: {"frames": ...}}``, laid out like
      ``frames`` (see :mod:`lightning_vstream.outputs`)

    It is stateful: ``state_dict()`` / ``load_state_dict()`` resume mid-epoch at the first batch
    not handed out yet. Lightning saves this state in every checkpoint (it does so for any loader
    with these two methods) and fetches exactly one batch per training step from a loader with a
    length, so the position is the loop's own, with or without ``training_step(dataloader_iter)``.
    A loop of your own that fetches ahead calls :meth:`mark_consumed`.

    Args:
        dataset: The worker-side dataset.
        sampler: The stream sampler; ``sampler.num_parts`` must equal ``max(1, num_workers)``.
        num_workers: Worker processes.
        pin_memory: Allocate assembled batches in pinned memory (when CUDA is available).
        prefetch_factor: Parts each worker prepares ahead.
        persistent_workers: Keep workers (and their open decoders) between epochs.
        multiprocessing_context: ``"spawn"``, ``"fork"``, ``"forkserver"``, a multiprocessing context, or None.
        timeout: Seconds to wait for a worker's part before raising (0 waits forever).
        batch_sampler: Must be None (accepted so Lightning can re-create the loader).
        shuffle: Must be None or False (likewise).

    Example::

        >>> loader = StreamDataLoader(dataset, sampler=sampler, num_workers=2)  # doctest: +SKIP
        >>> batch = next(iter(loader)); batch["frames"].shape  # doctest: +SKIP
        torch.Size([4, 6, 3, 900, 1600])
    """

    def __init__(
        self,
        dataset: StreamDataset,
        *,
        sampler: StreamSampler,
        num_workers: int = 0,
        pin_memory: bool = False,
        prefetch_factor: int | None = None,
        persistent_workers: bool = False,
        multiprocessing_context: str | multiprocessing.context.BaseContext | None = None,
        timeout: float = 0.0,
        batch_sampler: None = None,
        shuffle: bool | None = None,
    ) -> None:
        # batch_sampler and shuffle exist only so that Lightning can re-create the loader (it
        # does so for prediction); the sampler decides both.
        if batch_sampler is not None or shuffle:
            raise ConfigurationError(
                "StreamDataLoader takes neither batch_sampler nor shuffle: the StreamSampler batches and shuffles."
            )
        if sampler.num_parts != max(1, num_workers):
            raise ConfigurationError(
                f"sampler.num_parts={sampler.num_parts} must equal max(1, num_workers)={max(1, num_workers)} "
                "so that every worker always serves the same camera streams."
            )
        super().__init__(
            dataset,
            sampler=sampler,
            batch_size=None,
            collate_fn=_identity,
            num_workers=num_workers,
            pin_memory=False,
            prefetch_factor=prefetch_factor if num_workers > 0 else None,
            persistent_workers=persistent_workers and num_workers > 0,
            multiprocessing_context=multiprocessing_context if num_workers > 0 else None,
            timeout=timeout if num_workers > 0 else 0.0,  # nothing to wait for without workers
        )
        self.pin_output = pin_memory
        self._worker_stats: dict[tuple[int, int], DecodeStats] = {}
        self._yielded: tuple[int, int] | None = None
        self._consumed: tuple[int, int] | None = None
        self._resume: tuple[int, int] | None = None
        self._resume_skips = no_skips(sampler.batch_size)
        # The skips in force when the current pass started, and those found since: enough to
        # rebuild what was in force at any step of the pass (a resume must not see skips found
        # in batches that were prefetched but never consumed).
        self._history = SkipHistory(sampler.batch_size)
        self._history.begin(sampler.epoch, self._resume_skips)
        self._ledger = SkipLedger()
        self._skips = self._ledger.stats
        # Per output ("": the default one), the frames' shape, dtype and device once known; per
        # (output, camera) with camera_frames="per_camera".
        self._templates: dict[str, Template] = {}
        self._camera_templates: dict[tuple[str, int], Template] = {}
        sampler.buffer_factory = weakref.WeakMethod(self._new_buffer)  # no loader <-> sampler cycle
        if dataset.index.storage is not None:  # a remote index: workers fetch ahead by the plan
            from lightning_vstream.stream.prefetch import PlanSpec

            dataset.plan = PlanSpec.of(sampler, dataset.index)
        self._pool = BufferPool(shared=num_workers > 0)

    # -- iteration -------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.sampler.schedule())  # type: ignore[attr-defined]

    def __iter__(self) -> Iterator[dict[str, Any]]:  # type: ignore[override]
        sampler: StreamSampler = self.sampler  # type: ignore[assignment]
        plan = sampler.schedule()
        start = 0
        skips = no_skips(sampler.batch_size)
        if self._resume is not None and self._resume[0] == sampler.epoch:
            start = self._resume[1]
            skips = self._resume_skips
        sampler.start_step = start
        sampler.shifts, sampler.pending_shifts, sampler.abandoned = list(skips[0]), list(skips[1]), set(skips[2])
        self._history.begin(sampler.epoch, skips)
        parts_iter = self._start_workers()
        try:
            for step in range(start, len(plan)):
                parts = [self._receive(parts_iter, step, p) for p in range(sampler.num_parts)]
                with nvtx_range(RANGE_COLLATE):
                    batch = self._assemble(sampler, step, parts)
                self._yielded = (sampler.epoch, step + 1)
                yield batch
        except Exception:
            # Whatever failed, end our workers now: one that stalls and ignores SIGTERM would
            # otherwise keep the process from exiting (multiprocessing joins it at exit).
            self._stop_workers(parts_iter)
            raise
        finally:
            sampler.start_step = 0
        self._resume = None

    def _start_workers(self) -> Iterator[StreamPart]:
        """``iter()`` of the DataLoader, with its workers watched by the loader rather than torch's SIGCHLD handler."""
        try:
            parts_iter = super().__iter__()
            watch_workers(parts_iter, self.timeout)
        except RuntimeError as err:
            # A worker that died while starting, reported by torch's SIGCHLD handler.
            if isinstance(err, VStreamError) or not TORCH_WORKER_FAILURE.search(str(err)):
                raise
            raise WorkerError(f"a decoding worker died while the workers started: {err}") from err
        return parts_iter

    def _receive(self, parts_iter: Iterator[StreamPart], step: int, part: int) -> StreamPart:
        try:
            return next(parts_iter)
        except (ConnectionError, EOFError) as err:
            # A worker that dies while handing over shared memory breaks the connection first.
            raise WorkerError(self._worker_failure(parts_iter, step, part, err, stalled=False)) from err
        except WorkerTimeout as err:
            raise WorkerError(self._worker_failure(parts_iter, step, part, err, stalled=True)) from err
        except RuntimeError as err:
            # torch reports a dead or stalled worker with a bare RuntimeError; errors raised inside
            # the worker (a VideoDecodeError, say) keep their own type and pass through.
            if isinstance(err, VStreamError) or not TORCH_WORKER_FAILURE.search(str(err)):
                raise
            raise WorkerError(
                self._worker_failure(parts_iter, step, part, err, stalled="timed out" in str(err))
            ) from err

    def _worker_failure(self, parts_iter: Any, step: int, part: int, err: BaseException, *, stalled: bool) -> str:
        """The message of a dead or stalled worker: which worker, how it ended, the camera streams it decodes."""
        waiting = f"while the loader waited for part {part} of step {step}"
        if stalled:
            workers = getattr(parts_iter, "_workers", [])
            pid = f" (pid {workers[part].pid})" if part < len(workers) else ""
            return (
                f"decoding worker {part}{pid} sent nothing for timeout={self.timeout:g} s {waiting}; it decodes "
                f"{self._streams(step, part)}. The workers were stopped ({err}). A worker stalls when a file system "
                "stops answering or a decoder hangs: check the files named, or raise `timeout` if decoding is only slow."
            )
        dead = dead_workers(parts_iter, within=STOP_GRACE_S)
        if not dead:
            who = f"a decoding worker broke its connection {waiting} ({type(err).__name__}: {err})"
        else:
            who = "; ".join(
                f"decoding worker {worker} (pid {pid}) {describe_exit(code)} {waiting}; it decodes "
                f"{self._streams(step, worker)}"
                for worker, pid, code in dead
            )
        return (
            f"{who}. The other workers were stopped and the DataLoader cannot continue. A worker is usually killed "
            "for memory: check its memory limit (the kernel log lists OOM kills) and the files named."
        )

    def _streams(self, step: int, part: int, limit: int = 8) -> str:
        """The camera streams part ``part`` reads at ``step``, for errors: slot, camera, clip, frame and file."""
        sampler: StreamSampler = self.sampler  # type: ignore[assignment]
        entry = sampler._issued.get(step)
        if entry is None:
            return "camera streams not known yet"
        cams = sampler.num_cameras
        named = []
        for slot, read in enumerate(entry[0]):
            for camera in range(cams):
                if read is None or (slot * cams + camera) % sampler.num_parts != part:
                    continue
                clip = self.dataset.index.clips[read.clip]  # type: ignore[attr-defined]
                stream = clip.cameras[camera]
                named.append(
                    f"slot {slot} {stream.name} (clip {clip.clip_id!r}, frame {read.frame}, {str(stream.path)!r})"
                )
        if not named:
            return "no camera stream at this step"
        more = f" and {len(named) - limit} more" if len(named) > limit else ""
        return "the camera streams " + ", ".join(named[:limit]) + more

    def _stop_workers(self, parts_iter: Any) -> None:
        """End the worker processes of ``parts_iter`` (terminate, then kill) and close its queues."""
        stop_workers(parts_iter)
        if self._iterator is parts_iter:
            self._iterator = None  # persistent workers: the next epoch starts new ones

    def _assemble(self, sampler: StreamSampler, step: int, parts: list[StreamPart]) -> dict[str, Any]:
        index = self.dataset.index  # type: ignore[attr-defined]
        cams = sampler.num_cameras
        batch_size = sampler.batch_size
        for p, part in enumerate(parts):
            if (part.epoch, part.step, part.part) != (sampler.epoch, step, p):
                raise StepMismatchError(
                    f"expected part {p} of step {step} (epoch {sampler.epoch}) but received part {part.part} of "
                    f"step {part.step} (epoch {part.epoch}); the DataLoader did not keep the sampler's order."
                )
            self._worker_stats[part.worker_key] = part.stats
        reads, shifts, buffers = sampler.issued(step)
        valid = [r is not None and (slot, r.segment) not in sampler.abandoned for slot, r in enumerate(reads)]
        failed = [failure for part in parts for failure in part.failed]
        dataset: StreamDataset = self.dataset  # type: ignore[assignment]
        keys = ["", *dataset.outputs]  # "": the default output (batch["frames"]); then the named outputs
        views = {key: [part.output(key) for part in parts] for key in keys}
        rows: dict[str, dict[int, torch.Tensor]] = {}
        if buffers is None:
            oversized: set[int] = set()
            for key in keys:
                rows[key] = _rows(views[key])
                failed += self._check_sizes(step, reads, rows[key], valid, cams, key, oversized)
        for position, path, error in failed:
            slot = position // cams
            read = reads[slot]
            if read is None:
                continue
            valid[slot] = False
            if (slot, read.segment) in sampler.abandoned:
                continue  # a prefetched read of a clip given up already
            self._history.found(step, slot, read.segment, sampler.abandon(slot, step, shifts[slot], read))
            self._ledger.clip_skipped(index.clips[read.clip].clip_id, read.frame, path, error)
        self._ledger.count_step(
            reads=reads, valid=valid, shifts=shifts, step=step, num_steps=sampler.schedule().num_steps, cameras=cams
        )
        delivered: dict[str, torch.Tensor | list[torch.Tensor]] = {}
        for key in keys:
            if getattr(self.dataset, "camera_frames", "stacked") == "per_camera":
                delivered[key] = self._merge_cameras(step, views[key], valid, cams, batch_size, key)
            elif buffers is not None:
                frames = self._finish_buffer(buffers[key], valid, cams)
                delivered[key] = frames.view(batch_size, cams, *buffers[key].shape[1:])
            else:
                frames, shape = self._merge_parts(step, views[key], rows[key], valid, cams, batch_size, key)
                delivered[key] = frames.view(batch_size, cams, *shape)
        camera_ts = torch.full((batch_size * cams,), math.nan, dtype=torch.float64)
        for part in parts:
            for pos, ts in zip(part.positions, part.timestamps):
                if valid[pos // cams]:
                    camera_ts[pos] = ts
        camera_ts = camera_ts.view(batch_size, cams)
        labels = [r if ok else None for r, ok in zip(reads, valid)]
        batch: dict[str, Any] = {
            "frames": delivered[""],
            "clip_id": [index.clips[r.clip].clip_id if r is not None else "" for r in labels],
            "frame_index": torch.tensor([r.frame if r is not None else -1 for r in labels], dtype=torch.long),
            "is_first": torch.tensor([r is not None and r.is_first for r in labels], dtype=torch.bool),
            "valid": torch.tensor(valid, dtype=torch.bool),
            "timestamp": camera_ts[:, 0].clone(),
            "camera_timestamp": camera_ts,
            "camera_names": list(index.camera_names),
            "epoch": sampler.epoch,
            "step": step,
        }
        if dataset.outputs:
            batch["outputs"] = {name: {"frames": delivered[name]} for name in dataset.outputs}
        if dataset.annotations is not None or dataset.has_geometry:
            self._add_annotations(batch, parts, valid, cams)
        return batch

    def _add_annotations(self, batch: dict[str, Any], parts: list[StreamPart], valid: list[bool], cams: int) -> None:
        """``annotations``, ``has_annotations`` and ``img_aug_matrix`` of a batch (see :mod:`lightning_vstream.annotations`)."""
        dataset: StreamDataset = self.dataset  # type: ignore[assignment]
        attach_annotations(
            batch,
            dataset.steps,
            valid=valid,
            cameras=cams,
            found=[item for part in parts for item in part.annotations.items()],
            missing=[item for part in parts for item in part.missing],
            geometry=[item for part in parts for item in part.geometry.items()],
            pad=dataset.pad_annotations,
            stats=self._skips,
            output_geometry={
                name: [item for part in parts for item in part.output_geometry.get(name, {}).items()]
                for name in dataset.outputs
            },
        )

    def _check_sizes(
        self,
        step: int,
        reads: list[SlotRead | None],
        rows: dict[int, torch.Tensor],
        valid: list[bool],
        cams: int,
        key: str = "",
        found: set[int] | None = None,
    ) -> list[tuple[int, str, str]]:
        """Frames of output ``key`` whose size differs from the batch's, as failures (or raised, under on_error="raise").

        Until the batch size is known (the first steps), the frame at the lowest position sets it.
        ``found`` holds the positions found already in another output (each failed read counts once).
        """
        delivered = sorted(pos for pos in rows if valid[pos // cams])
        if key not in self._templates and delivered:
            first = rows[delivered[0]]
            self._templates[key] = (tuple(first.shape), first.dtype, first.device)
            self.sampler.frame_shapes[key] = tuple(first.shape)  # type: ignore[attr-defined]
        if key not in self._templates:
            return []
        shape, dtype, _ = self._templates[key]
        found = set() if found is None else found
        failed = []
        index = self.dataset.index  # type: ignore[attr-defined]
        for pos in delivered:
            frame = rows[pos]
            if (tuple(frame.shape) == shape and frame.dtype == dtype) or pos in found:
                continue
            read = reads[pos // cams]
            assert read is not None
            err = frame_size_error(
                index,
                read.clip,
                pos % cams,
                read.frame,
                tuple(frame.shape),
                shape,
                got_dtype=frame.dtype if frame.dtype != dtype else None,
                expected_dtype=dtype if frame.dtype != dtype else None,
            )
            if self.dataset.on_error == "raise":  # type: ignore[attr-defined]
                raise err
            self._skips.read_errors += 1
            found.add(pos)
            failed.append((pos, str(index.clips[read.clip].cameras[pos % cams].path), str(err)))
        return failed

    def _finish_buffer(self, buffer: torch.Tensor, valid: list[bool], cams: int) -> torch.Tensor:
        rows = buffer.view(len(valid), cams, *buffer.shape[1:])
        for slot, ok in enumerate(valid):
            if not ok:
                rows[slot].zero_()  # padding and failed slots hold zeros, not stale memory
        if self.pin_output and torch.cuda.is_available():
            return buffer.pin_memory()
        return buffer

    def _merge_parts(
        self,
        step: int,
        parts: list[StreamPart],
        rows: dict[int, torch.Tensor],
        valid: list[bool],
        cams: int,
        batch_size: int,
        key: str = "",
    ) -> tuple[torch.Tensor, tuple[int, ...]]:
        template = self._templates.get(key)
        if template is None:
            raise VideoDecodeError(f"every camera read of step {step} failed; no frame size is known yet to pad with.")
        shape, dtype, device = template
        complete = all(valid)
        only = parts[0].frames if len(parts) == 1 else None
        if complete and isinstance(only, torch.Tensor) and not self.pin_output:
            return only, shape  # one part, every read delivered at the batch's size: no copy
        pin = self.pin_output and device.type == "cpu" and torch.cuda.is_available()
        alloc = torch.empty if complete else torch.zeros  # padding and failed slots stay zero
        frames = alloc((batch_size * cams, *shape), dtype=dtype, device=device, pin_memory=pin)
        for pos, row in rows.items():
            if valid[pos // cams]:
                if device.type == "cpu":
                    frames[pos].numpy()[...] = row.numpy()  # single-threaded memcpy
                else:
                    frames[pos].copy_(row)
        return frames, shape

    def _merge_cameras(
        self, step: int, parts: list[StreamPart], valid: list[bool], cams: int, batch_size: int, key: str = ""
    ) -> list[torch.Tensor]:
        """``camera_frames="per_camera"``: one ``[batch_size, 3, H_c, W_c]`` tensor per camera (of output ``key``)."""
        images = {pos: image for part in parts for pos, image in part.images.items()}
        out = []
        for cam in range(cams):
            sample = next((image for pos, image in images.items() if pos % cams == cam), None)
            if sample is not None:
                self._camera_templates[key, cam] = (tuple(sample.shape), sample.dtype, sample.device)
            template = self._camera_templates.get((key, cam))
            if template is None:
                raise VideoDecodeError(
                    f"every read of camera {cam} failed at step {step}; no frame size is known yet to pad with."
                )
            shape, dtype, device = template
            pin = self.pin_output and device.type == "cpu" and torch.cuda.is_available()
            frames = torch.zeros((batch_size, *shape), dtype=dtype, device=device, pin_memory=pin)
            for slot in range(batch_size):
                image = images.get(slot * cams + cam)
                if image is not None and valid[slot]:
                    frames[slot].copy_(image)
            out.append(frames)
        return out

    def _new_buffer(self) -> Buffers | None:
        """The batches the workers decode straight into, one per output, once the frame sizes are known (CPU only).

        Frames then cross from worker to batch with a single write: no per-part tensors, no
        copy in the main process. The first steps, and GPU decoding, use per-part tensors.
        """
        keys = ["", *self.dataset.outputs]  # type: ignore[attr-defined]
        if any(key not in self._templates or self._templates[key][2].type != "cpu" for key in keys):
            return None
        sampler: StreamSampler = self.sampler  # type: ignore[assignment]
        buffers = {}
        for key in keys:
            shape, dtype, _ = self._templates[key]
            buffers[key] = self._pool.take((sampler.batch_size * sampler.num_cameras, *shape), dtype)
        return buffers

    def close(self) -> None:
        """Shut down persistent workers and close the decoders of this process."""
        # DataLoader keeps the iterator of persistent workers in `_iterator`; dropping it is
        # how its workers are shut down (its __del__ joins them).
        self._iterator = None
        self.dataset.close()  # type: ignore[attr-defined]

    # -- counters --------------------------------------------------------------------------
    @property
    def stats(self) -> DecodeStats:
        """Decoding counters summed over every process that served this loader."""
        total = self._skips
        for stats in self._worker_stats.values():
            total = total + stats
        return total

    # -- resumable state -------------------------------------------------------------------
    def mark_consumed(self, batch: dict[str, Any]) -> None:
        """Record that a loop which fetches batches ahead used ``batch`` (Lightning's loops need not).

        When a loop has taken more batches than it has used, a resume must start after the last
        batch used, not after the last one handed out; the latest mark wins until the next
        ``load_state_dict``.
        """
        self._consumed = (int(batch["epoch"]), int(batch["step"]) + 1)

    def state_dict(self) -> dict[str, Any]:
        """Plain-dict position: the epoch, the first step not yet consumed, and the skips in force there.

        Skips (``on_error="skip"``) are stored as per-slot ``shifts``, ``pending_shifts``
        (``[from_step, slot, shift]``: steps prefetched before a skip was found still read the
        clip given up) and ``abandoned`` (``[slot, segment]``), so that a resumed run delivers
        exactly the batches the interrupted run would have delivered.
        """
        sampler: StreamSampler = self.sampler  # type: ignore[assignment]
        position = self._consumed or self._yielded or (sampler.epoch, self._resume[1] if self._resume else 0)
        return self._history.state_dict(sampler, position)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume at the position of :meth:`state_dict`; the configuration must match."""
        sampler: StreamSampler = self.sampler  # type: ignore[assignment]
        epoch, step, skips = checked_resume_state(state, sampler)
        self._resume = (epoch, step)
        self._resume_skips = skips
        self._history.begin(epoch, skips)
        self._consumed = self._yielded = None
        sampler.set_epoch(epoch)


def _rows(parts: list[StreamPart]) -> dict[int, torch.Tensor]:
    """Each delivered frame of a step by its position (no buffer: frames came in per-part tensors)."""
    rows: dict[int, torch.Tensor] = {}
    for part in parts:
        if part.frames is None:
            continue
        bad = {position for position, _, _ in part.failed}
        for row, pos in enumerate(part.positions):
            frame = part.frames[row]
            if pos not in bad and frame is not None:
                rows[pos] = frame
    return rows

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
import re
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, DistributedSampler

from lightning_vstream.annotations.batch import add_annotations
from lightning_vstream.errors import (
    ConfigurationError,
    ResumeStateError,
    StepMismatchError,
    VideoDecodeError,
    VStreamError,
    WorkerError,
)
from lightning_vstream.profiling import RANGE_COLLATE, nvtx_range
from lightning_vstream.stream.schedule import Remainder, SlotRead, StreamSchedule
from lightning_vstream.stream.worker import (
    DecodeStats,
    StreamDataset,
    StreamPart,
    StreamRead,
    StreamTask,
    frame_size_error,
)

__all__ = ["StreamDataLoader", "StreamSampler"]

STATE_VERSION = 1
#: Seconds a worker gets to exit after SIGTERM, once the loader has failed, before SIGKILL.
STOP_GRACE_S = 2.0
# What torch raises when a worker stalls past the timeout or dies.
_TORCH_WORKER_FAILURE = re.compile(r"DataLoader timed out after|DataLoader worker \(pid.*exited unexpectedly")
log = logging.getLogger("lightning_vstream")

# A skip found while assembling ``step``: (step, slot, segment, (from_step, new_shift) or None).
_Skip = tuple[int, int, int, "tuple[int, int] | None"]
# Per-slot shifts, later shift changes (from_step, slot, shift) and abandoned (slot, segment) pairs.
_Skips = tuple[list[int], list[tuple[int, int, int]], set[tuple[int, int]]]


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
        #: Shape of every frame of the batch once known; sent with each task so workers check it.
        self.frame_shape: tuple[int, ...] | None = None
        self._issued: dict[int, tuple[list[SlotRead | None], list[int], torch.Tensor | None]] = {}
        #: Weak reference to a callable giving each step's batch buffer (None: parts mode).
        self.buffer_factory: weakref.WeakMethod[Callable[[], torch.Tensor | None]] | None = None
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

    def issued(self, step: int) -> tuple[list[SlotRead | None], list[int], torch.Tensor | None]:
        """The reads, shifts and batch buffer ``step`` was issued with (the loader labels batches with them)."""
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

    def tasks(self, step: int) -> list[StreamTask]:
        """The parts of ``step``: stream ``slot * num_cameras + camera`` goes to part ``position % num_parts``."""
        parts: list[list[StreamRead]] = [[] for _ in range(self.num_parts)]
        due = [change for change in self.pending_shifts if change[0] <= step]
        for _, slot, shift in sorted(due):
            self.shifts[slot] = shift
        self.pending_shifts = [change for change in self.pending_shifts if change[0] > step]
        reads = self.reads(step)
        factory = self.buffer_factory() if self.buffer_factory is not None else None
        buffer = factory() if factory is not None else None
        self._issued[step] = (reads, list(self.shifts), buffer)
        self._next_step = step + 1
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
        return [
            StreamTask(self.epoch, step, p, tuple(reads), buffer, self.frame_shape) for p, reads in enumerate(parts)
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
    """

    def __init__(self, *, shared: bool) -> None:
        self.shared = shared
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
            storage = torch.UntypedStorage._new_shared(nbytes) if self.shared else torch.UntypedStorage(nbytes)
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
        no_skips: _Skips = ([0] * sampler.batch_size, [], set())
        self._resume_skips = no_skips
        # The skips in force when the current pass started, and those found since: enough to
        # rebuild what was in force at any step of the pass (a resume must not see skips found
        # in batches that were prefetched but never consumed).
        self._pass_epoch = sampler.epoch
        self._pass_start = no_skips
        self._found: list[_Skip] = []
        self._skips = DecodeStats()
        self._bad_files: set[str] = set()
        self._template: tuple[tuple[int, ...], torch.dtype, torch.device] | None = None
        self._camera_templates: dict[int, tuple[tuple[int, ...], torch.dtype, torch.device]] = {}
        sampler.buffer_factory = weakref.WeakMethod(self._new_buffer)  # no loader <-> sampler cycle
        if dataset.index.storage is not None:  # a remote index: workers fetch ahead by the plan
            from lightning_vstream.stream.prefetch import PlanSpec

            dataset.plan = PlanSpec.of(sampler)
        self._pool = BufferPool(shared=num_workers > 0)

    # -- iteration -------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.sampler.schedule())  # type: ignore[attr-defined]

    def __iter__(self) -> Iterator[dict[str, Any]]:  # type: ignore[override]
        sampler: StreamSampler = self.sampler  # type: ignore[assignment]
        plan = sampler.schedule()
        start = 0
        skips: _Skips = ([0] * sampler.batch_size, [], set())
        if self._resume is not None and self._resume[0] == sampler.epoch:
            start = self._resume[1]
            skips = self._resume_skips
        sampler.start_step = start
        sampler.shifts, sampler.pending_shifts, sampler.abandoned = list(skips[0]), list(skips[1]), set(skips[2])
        self._pass_epoch, self._pass_start, self._found = sampler.epoch, skips, []
        parts_iter = super().__iter__()
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

    def _receive(self, parts_iter: Iterator[StreamPart], step: int, part: int) -> StreamPart:
        try:
            return next(parts_iter)
        except (ConnectionError, EOFError) as err:
            # A worker that dies while handing over shared memory breaks the connection first.
            raise WorkerError(
                f"a decoding worker died while sending part {part} of step {step} ({self._describe(step, part)}); "
                "the DataLoader cannot continue. Check the worker's memory limit and the files it was decoding."
            ) from err
        except RuntimeError as err:
            # torch reports a dead or stalled worker with a bare RuntimeError; errors raised inside
            # the worker (a VideoDecodeError, say) keep their own type and pass through.
            if isinstance(err, VStreamError) or not _TORCH_WORKER_FAILURE.search(str(err)):
                raise
            what = "stalled" if "timed out" in str(err) else "died"
            hint = (
                "A worker stalls when a file system stops answering or a decoder hangs: check the files named, "
                "or raise `timeout` if decoding is only slow."
                if what == "stalled"
                else "A worker is usually killed for memory: check its memory limit (the kernel log lists OOM "
                "kills) and the files named."
            )
            raise WorkerError(
                f"{err} while waiting for part {part} of step {step} ({self._describe(step, part)}): a decoding "
                f"worker {what} and the workers were stopped. {hint}"
            ) from err

    def _describe(self, step: int, part: int) -> str:
        """The reads of one part, for errors: the first named with its file, then a count."""
        sampler: StreamSampler = self.sampler  # type: ignore[assignment]
        entry = sampler._issued.get(step)
        if entry is None:
            return "reads unknown"
        cams = sampler.num_cameras
        positions = [
            slot * cams + camera
            for slot, read in enumerate(entry[0])
            if read is not None
            for camera in range(cams)
            if (slot * cams + camera) % sampler.num_parts == part
        ]
        if not positions:
            return "no reads"
        read = entry[0][positions[0] // cams]
        assert read is not None
        clip = self.dataset.index.clips[read.clip]  # type: ignore[attr-defined]
        camera = clip.cameras[positions[0] % cams]
        more = f", and {len(positions) - 1} more camera reads" if len(positions) > 1 else ""
        return f"clip {clip.clip_id!r}, camera {camera.name!r}, frame {read.frame} ({str(camera.path)!r}){more}"

    def _stop_workers(self, parts_iter: Any) -> None:
        """End the worker processes of ``parts_iter`` (terminate, then kill) and close its queues."""
        workers = list(getattr(parts_iter, "_workers", ()))
        for attempt in range(3):
            try:
                _forget_worker_pids(parts_iter)
                break
            except RuntimeError as err:
                # torch's SIGCHLD handler may report the dying worker before its pid is forgotten.
                if attempt == 2 or not _TORCH_WORKER_FAILURE.search(str(err)):
                    raise
        for worker in workers:
            if worker.is_alive():
                worker.terminate()
        deadline = time.monotonic() + STOP_GRACE_S
        for worker in workers:
            worker.join(timeout=max(0.0, deadline - time.monotonic()))
            if worker.is_alive():
                worker.kill()  # SIGTERM ignored, e.g. a handler inherited from the training script
                worker.join()
        shutdown = getattr(parts_iter, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()  # queues and events; the processes are gone, so nothing waits
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
        reads, shifts, buffer = sampler.issued(step)
        valid = [r is not None and (slot, r.segment) not in sampler.abandoned for slot, r in enumerate(reads)]
        failed = [failure for part in parts for failure in part.failed]
        rows: dict[int, torch.Tensor] = {}
        if buffer is None:
            rows = _rows(parts)
            failed += self._check_sizes(step, reads, rows, valid, cams)
        for position, path, error in failed:
            slot = position // cams
            read = reads[slot]
            if read is None:
                continue
            valid[slot] = False
            if (slot, read.segment) in sampler.abandoned:
                continue  # a prefetched read of a clip given up already
            self._found.append((step, slot, read.segment, sampler.abandon(slot, step, shifts[slot], read)))
            self._skips.skipped_clips += 1
            if path not in self._bad_files:
                self._bad_files.add(path)
                log.warning("skipping clip %r from frame %d on: %s", index.clips[read.clip].clip_id, read.frame, error)
        num_steps = sampler.schedule().num_steps
        # A slot-step is lost to a skip when it holds no frame although it was due one: its read
        # failed or belongs to a clip given up, or (read None) the slot ran past the plan's end
        # because it jumped ahead. Padding the plan itself has is not counted.
        self._skips.skipped_samples += sum(
            1 for slot, r in enumerate(reads) if not valid[slot] and (r is not None or step + shifts[slot] >= num_steps)
        )
        self._skips.frames_delivered += sum(valid) * cams
        self._skips.bad_files = len(self._bad_files)
        delivered: torch.Tensor | list[torch.Tensor]
        if getattr(self.dataset, "camera_frames", "stacked") == "per_camera":
            delivered = self._merge_cameras(step, parts, valid, cams, batch_size)
        elif buffer is not None:
            frames = self._finish_buffer(buffer, valid, cams)
            delivered = frames.view(batch_size, cams, *buffer.shape[1:])
        else:
            frames, shape = self._merge_parts(step, parts, rows, valid, cams, batch_size)
            delivered = frames.view(batch_size, cams, *shape)
        camera_ts = torch.full((batch_size * cams,), math.nan, dtype=torch.float64)
        for part in parts:
            for pos, ts in zip(part.positions, part.timestamps):
                if valid[pos // cams]:
                    camera_ts[pos] = ts
        camera_ts = camera_ts.view(batch_size, cams)
        labels = [r if ok else None for r, ok in zip(reads, valid)]
        batch = {
            "frames": delivered,
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
        dataset: StreamDataset = self.dataset  # type: ignore[assignment]
        if dataset.annotations is not None or dataset.has_geometry:
            self._add_annotations(batch, parts, valid, cams)
        return batch

    def _add_annotations(self, batch: dict[str, Any], parts: list[StreamPart], valid: list[bool], cams: int) -> None:
        """``annotations``, ``has_annotations`` and ``img_aug_matrix`` of a batch (see :mod:`lightning_vstream.annotations`)."""
        dataset: StreamDataset = self.dataset  # type: ignore[assignment]
        slots = len(valid)
        items: list[dict[str, Any] | None] = [None] * slots
        matrices: list[torch.Tensor | None] = [None] * (slots * cams)
        for part in parts:
            for slot, found in part.annotations.items():
                if valid[slot]:
                    items[slot] = {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in found.items()}
            for slot, why in part.missing:
                if valid[slot]:
                    self._skips.missing_annotations += 1
                    if self._skips.missing_annotations <= 3:
                        log.warning("delivering a frame without annotations (has_annotations=False): %s", why)
            for position, matrix in part.geometry.items():
                if valid[position // cams]:
                    matrices[position] = torch.from_numpy(matrix)
        add_annotations(
            batch,
            items if dataset.annotations is not None else None,
            ragged=getattr(dataset.annotations, "ragged", ()),
            pad=dataset.pad_annotations,
            matrices=matrices if dataset.has_geometry else None,
            cameras=cams,
        )

    def _check_sizes(
        self, step: int, reads: list[SlotRead | None], rows: dict[int, torch.Tensor], valid: list[bool], cams: int
    ) -> list[tuple[int, str, str]]:
        """Frames whose size differs from the batch's, as failures (or raised, under on_error="raise").

        Until the batch size is known (the first steps), the frame at the lowest position sets it.
        """
        delivered = sorted(pos for pos in rows if valid[pos // cams])
        if self._template is None and delivered:
            first = rows[delivered[0]]
            self._template = (tuple(first.shape), first.dtype, first.device)
            self.sampler.frame_shape = tuple(first.shape)  # type: ignore[attr-defined]
        if self._template is None:
            return []
        shape, dtype, _ = self._template
        failed = []
        index = self.dataset.index  # type: ignore[attr-defined]
        for pos in delivered:
            frame = rows[pos]
            if tuple(frame.shape) == shape and frame.dtype == dtype:
                continue
            read = reads[pos // cams]
            assert read is not None
            where = StreamRead(pos, read.clip, pos % cams, read.frame, read.segment)
            err = frame_size_error(
                index,
                where,
                tuple(frame.shape),
                shape,
                got_dtype=frame.dtype if frame.dtype != dtype else None,
                expected_dtype=dtype if frame.dtype != dtype else None,
            )
            if self.dataset.on_error == "raise":  # type: ignore[attr-defined]
                raise err
            self._skips.read_errors += 1
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
    ) -> tuple[torch.Tensor, tuple[int, ...]]:
        if self._template is None:
            raise VideoDecodeError(f"every camera read of step {step} failed; no frame size is known yet to pad with.")
        shape, dtype, device = self._template
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
        self, step: int, parts: list[StreamPart], valid: list[bool], cams: int, batch_size: int
    ) -> list[torch.Tensor]:
        """``camera_frames="per_camera"``: one ``[batch_size, 3, H_c, W_c]`` tensor per camera."""
        images = {pos: image for part in parts for pos, image in part.images.items()}
        out = []
        for cam in range(cams):
            sample = next((image for pos, image in images.items() if pos % cams == cam), None)
            if sample is not None:
                self._camera_templates[cam] = (tuple(sample.shape), sample.dtype, sample.device)
            template = self._camera_templates.get(cam)
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

    def _new_buffer(self) -> torch.Tensor | None:
        """A batch the workers decode straight into, once the frame size is known (CPU only).

        Frames then cross from worker to batch with a single write: no per-part tensors, no
        copy in the main process. The first steps, and GPU decoding, use per-part tensors.
        """
        if self._template is None or self._template[2].type != "cpu":
            return None
        shape, dtype, _ = self._template
        sampler: StreamSampler = self.sampler  # type: ignore[assignment]
        return self._pool.take((sampler.batch_size * sampler.num_cameras, *shape), dtype)

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

    def _skips_before(self, step: int) -> _Skips:
        """The skips in force at ``step`` of the current pass, leaving out those found at ``step`` or later."""
        shifts, pending, abandoned = self._pass_start
        shifts, abandoned = list(shifts), set(abandoned)
        changes = list(pending)
        for found_at, slot, segment, change in self._found:
            if found_at < step:
                abandoned.add((slot, segment))
                if change is not None:
                    changes.append((change[0], slot, change[1]))
        later = []
        for from_step, slot, shift in sorted(changes):
            if from_step <= step:
                shifts[slot] = shift
            else:
                later.append((from_step, slot, shift))
        return shifts, later, abandoned

    def state_dict(self) -> dict[str, Any]:
        """Plain-dict position: the epoch, the first step not yet consumed, and the skips in force there.

        Skips (``on_error="skip"``) are stored as per-slot ``shifts``, ``pending_shifts``
        (``[from_step, slot, shift]``: steps prefetched before a skip was found still read the
        clip given up) and ``abandoned`` (``[slot, segment]``), so that a resumed run delivers
        exactly the batches the interrupted run would have delivered.
        """
        sampler: StreamSampler = self.sampler  # type: ignore[assignment]
        position = self._consumed or self._yielded or (sampler.epoch, self._resume[1] if self._resume else 0)
        epoch, step = position
        skips: _Skips = ([0] * sampler.batch_size, [], set())
        if step >= len(sampler.schedule(epoch)):
            epoch, step = epoch + 1, 0
        elif epoch == self._pass_epoch:
            skips = self._skips_before(step)
        shifts, pending, abandoned = skips
        return {
            "version": STATE_VERSION,
            "epoch": epoch,
            "step": step,
            "shifts": list(shifts),
            "pending_shifts": [list(change) for change in pending],
            "abandoned": [list(pair) for pair in sorted(abandoned)],
            **resume_config(self.sampler),  # type: ignore[arg-type]
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume at the position of :meth:`state_dict`; the configuration must match."""
        sampler: StreamSampler = self.sampler  # type: ignore[assignment]
        epoch, step, shifts = checked_resume_state(state, sampler)
        self._resume = (epoch, step)
        pending = [_ints(change, 3, "pending_shifts", sampler.batch_size) for change in state.get("pending_shifts", [])]
        abandoned = {_ints(pair, 2, "abandoned", sampler.batch_size) for pair in state.get("abandoned", [])}
        self._resume_skips = (shifts, pending, abandoned)  # type: ignore[assignment]
        self._pass_epoch, self._pass_start, self._found = self._resume[0], self._resume_skips, []
        self._consumed = self._yielded = None
        sampler.set_epoch(self._resume[0])


def resume_config(sampler: StreamSampler) -> dict[str, Any]:
    """The settings a saved stream position is only valid for (stored in, and checked against, loader states)."""
    return {
        "seed": sampler.seed,
        "shuffle": sampler.shuffle,
        "batch_size": sampler.batch_size,
        "world_size": sampler.num_replicas,
        "num_clips": len(sampler.clip_lengths),
        "total_frames": sum(sampler.clip_lengths),
        "segment_length": sampler.segment_length,
        "frame_stride": sampler.frame_stride,
    }


def checked_resume_state(state: dict[str, Any], sampler: StreamSampler) -> tuple[int, int, list[int]]:
    """The ``(epoch, step, slot shifts)`` of a saved stream loader state, after checking its version and settings.

    Raises:
        ResumeStateError: Another state version, other settings (names the field and both values), or a
            shift list that does not fit ``batch_size``.
    """
    if state.get("version") != STATE_VERSION:
        raise ResumeStateError(
            f"cannot resume: loader state version {state.get('version')!r} is not supported (expected "
            f"{STATE_VERSION}); resume from a checkpoint written by this version of lightning_vstream."
        )
    for key, value in resume_config(sampler).items():
        if key in state and state[key] != value:
            raise ResumeStateError(
                f"cannot resume: the checkpoint's stream loader has {key}={state[key]!r} but this one has "
                f"{key}={value!r}; resume with the same data and loader settings."
            )
    shifts = [int(v) for v in state.get("shifts", [0] * sampler.batch_size)]
    if len(shifts) != sampler.batch_size:
        raise ResumeStateError(
            f"cannot resume: the checkpoint holds {len(shifts)} slot shifts for batch_size={sampler.batch_size}."
        )
    return int(state["epoch"]), int(state["step"]), shifts


def _ints(value: Any, length: int, field: str, batch_size: int) -> tuple[int, ...]:
    """One entry of a saved skip list, checked: ``length`` integers whose slot is below ``batch_size``."""
    try:
        entry = tuple(int(v) for v in value)
    except (TypeError, ValueError):
        entry = ()
    slot = entry[1] if field == "pending_shifts" and len(entry) == length else entry[0] if entry else -1
    if len(entry) != length or not 0 <= slot < batch_size:
        shape = "[from_step, slot, shift]" if field == "pending_shifts" else "[slot, segment]"
        raise ResumeStateError(
            f"cannot resume: the checkpoint's loader state has {field} entry {value!r}; expected {shape} integers "
            f"with 0 <= slot < batch_size={batch_size}. The checkpoint was not written by this loader."
        )
    return entry


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


def _forget_worker_pids(parts_iter: Any) -> None:
    """Take the workers of ``parts_iter`` out of torch's SIGCHLD check, which reports any worker exit as a crash."""
    if not getattr(parts_iter, "_worker_pids_set", False):
        return
    import signal

    from torch.utils.data._utils import signal_handling

    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
    try:
        signal_handling._remove_worker_pids(id(parts_iter))
        parts_iter._worker_pids_set = False
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)

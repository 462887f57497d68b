"""Main-process side of streaming: the stream-affine DataLoader.

Why parts: the plain design, where the DataLoader hands consecutive steps to different workers
in turn, decodes about ``num_workers`` times more than it delivers on P-frame streams, because
each worker must decode through the frames the other workers delivered. Here every step is
split into ``num_workers`` parts by camera stream; the sampler emits the parts of each step in
order and PyTorch dispatches indices to workers round-robin, so part ``p`` always reaches
worker ``p``, which keeps decoding the same streams frame after frame. The loader reassembles
the parts into the full batch (:mod:`lightning_vstream.stream.parts`). The plan and its parts
come from :class:`~lightning_vstream.stream.sampler.StreamSampler`.
"""

from __future__ import annotations

import math
import multiprocessing.context
import weakref
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader

from lightning_vstream.decode.counters import DecodeStats
from lightning_vstream.errors import (
    ConfigurationError,
    StepMismatchError,
    VStreamError,
    WorkerError,
)
from lightning_vstream.profiling import RANGE_COLLATE, nvtx_range
from lightning_vstream.stream.batch import StepAssembler, StreamBatch
from lightning_vstream.stream.failures import frame_size_error
from lightning_vstream.stream.loader_shell import StreamLoaderShell
from lightning_vstream.stream.memory import BufferPool
from lightning_vstream.stream.parts import (
    ReadFailure,
    StreamPart,
    Template,
    finish_buffer,
    frame_rows,
    merge_cameras,
    merge_parts,
)
from lightning_vstream.stream.sampler import Buffers, StreamSampler
from lightning_vstream.stream.schedule import SlotRead
from lightning_vstream.stream.worker import StreamDataset
from lightning_vstream.worker_processes import (
    TORCH_WORKER_FAILURE,
    WorkerTimeout,
    stop_workers,
    watch_workers,
    worker_failure,
)

__all__ = ["StreamDataLoader"]


def _identity(item: Any) -> Any:
    return item


class StreamDataLoader(StreamLoaderShell, DataLoader):  # type: ignore[misc]  # yields batches, not parts
    """DataLoader that assembles stream-affine parts into full streaming batches.

    Each batch is a :class:`~lightning_vstream.StreamBatch` (a dict; its keys are documented in
    ``docs/concepts.md``, "The batch"), the same the thread engine delivers.

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
        # Skips, the resumable position and the skip counters: the sampler's ledger. torch issues at most
        # prefetch_factor steps beyond the one being assembled (2 when None), so a failed slot moves on then.
        self._ledger = sampler.ledger
        self._ledger.lookahead = prefetch_factor if prefetch_factor is not None else 2
        self._skips = self._ledger.stats
        self._assembler = StepAssembler(dataset.index, sampler, dataset.steps, pad_annotations=dataset.pad_annotations)
        # Per output ("": the default one), the frames' shape, dtype and device once known; per
        # (output, camera) with camera_frames="per_camera".
        self._templates: dict[str, Template] = {}
        self._passes: weakref.WeakSet[Any] = weakref.WeakSet()  # worker iterators of passes not finished
        self._camera_templates: dict[str, dict[int, Template]] = {}
        sampler.buffer_factory = weakref.WeakMethod(self._new_buffer)  # no loader <-> sampler cycle
        dataset.frame_stride = sampler.frame_stride
        if dataset.index.storage is not None:  # a remote index: workers fetch ahead by the plan
            from lightning_vstream.stream.schedule import PlanSpec

            dataset.plan = PlanSpec.of(sampler, dataset.index)
        self._pool = BufferPool(shared=num_workers > 0)

    # -- iteration -------------------------------------------------------------------------
    def _run(self, start: int) -> Iterator[StreamBatch]:
        sampler = self._stream_sampler
        plan = sampler.schedule()
        sampler.start_step = start
        parts_iter = self._start_workers()
        if self.num_workers > 0:
            self._passes.add(parts_iter)
        try:
            for step in range(start, len(plan)):
                parts = [self._receive(parts_iter, step, p) for p in range(sampler.num_parts)]
                with nvtx_range(RANGE_COLLATE):
                    batch = self._assemble(sampler, step, parts)
                yield batch
        except Exception:
            # Whatever failed, end our workers now: one that stalls and ignores SIGTERM would
            # otherwise keep the process from exiting (multiprocessing joins it at exit).
            self._stop_workers(parts_iter)
            raise
        finally:
            sampler.start_step = 0

    def _start_workers(self) -> Iterator[StreamPart]:
        """``iter()`` of the DataLoader, with its workers watched by the loader rather than torch's SIGCHLD handler."""
        try:
            parts_iter = DataLoader.__iter__(self)  # the parts, as torch fetches them (not the shell's pass)
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
        return worker_failure(parts_iter, step, part, err, stalled=stalled, timeout=self.timeout, streams=self._streams)

    def _streams(self, step: int, part: int) -> str:
        """The camera streams part ``part`` reads at ``step``, for errors: slot, camera, clip, frame and file."""
        sampler: StreamSampler = self.sampler
        entry = sampler._issued.get(step)
        return self._assembler.streams(step, None if entry is None else entry[0], part, sampler.num_parts)

    def _stop_workers(self, parts_iter: Any) -> None:
        """End the worker processes of ``parts_iter`` (terminate, then kill) and close its queues."""
        stop_workers(parts_iter)
        if self._iterator is parts_iter:
            self._iterator = None  # persistent workers: the next epoch starts new ones

    def _assemble(self, sampler: StreamSampler, step: int, parts: list[StreamPart]) -> StreamBatch:
        dataset: StreamDataset = self.dataset  # type: ignore[assignment]
        cams = sampler.num_cameras
        for p, part in enumerate(parts):
            if (part.epoch, part.step, part.part) != (sampler.epoch, step, p):
                raise StepMismatchError(
                    f"expected part {p} of step {step} (epoch {sampler.epoch}) but received part {part.part} of "
                    f"step {part.step} (epoch {part.epoch}); the DataLoader did not keep the sampler's order."
                )
            self._worker_stats[part.worker] = part.stats
        reads, shifts, buffers = sampler.issued(step)
        assembler = self._assembler
        valid = assembler.valid(step, reads)
        keys = ["", *dataset.outputs]  # "": the default output (batch["frames"]); then the named outputs
        failed = [failure for part in parts for failure in part.failed]
        rows: dict[str, dict[int, torch.Tensor]] = {}
        if buffers is None:
            oversized: set[int] = set()
            for key in keys:
                rows[key] = frame_rows(parts, key)
                failed += self._check_sizes(step, reads, rows[key], valid, cams, key, oversized)
        for position, path, error in failed:
            slot = position // cams
            read = reads[slot]
            if read is None:
                continue
            valid[slot] = False
            assembler.give_up(step, position, read, shifts[slot], path=path, error=error)
        assembler.count(step, reads, valid, shifts)
        frames = {key: self._frames(step, parts, key, buffers, rows.get(key, {}), valid) for key in keys}
        camera_timestamps = np.full((sampler.batch_size, cams), math.nan, dtype=np.float64)
        flat = camera_timestamps.reshape(-1)
        for part in parts:
            flat[part.positions] = part.timestamps
        return assembler.batch(
            step,
            reads,
            valid,
            frames,
            camera_timestamps,
            annotations=[item for part in parts for item in part.annotations.items()],
            missing=[item for part in parts for item in part.missing],
            geometry=[item for part in parts for item in part.frames[""].geometry.items()],
            output_geometry={
                name: [item for part in parts for item in part.frames[name].geometry.items()]
                for name in dataset.outputs
            },
        )

    def _frames(
        self,
        step: int,
        parts: list[StreamPart],
        key: str,
        buffers: Buffers | None,
        rows: dict[int, torch.Tensor],
        valid: list[bool],
    ) -> torch.Tensor | list[torch.Tensor]:
        """The step's frames of output ``key`` as the batch delivers them, from the three ways workers return them
        (see :mod:`lightning_vstream.stream.parts`)."""
        sampler: StreamSampler = self.sampler
        cams, batch_size = sampler.num_cameras, sampler.batch_size
        if self.dataset.camera_frames == "per_camera":  # type: ignore[attr-defined]
            templates = self._camera_templates.setdefault(key, {})
            return merge_cameras(step, parts, key, valid, cams, batch_size, templates, pin=self.pin_output)
        if buffers is not None:
            frames = finish_buffer(buffers[key], pin=self.pin_output)
            return frames.view(batch_size, cams, *buffers[key].shape[1:])
        template = self._templates.get(key)
        merged, shape = merge_parts(step, parts, key, rows, valid, cams, batch_size, template, pin=self.pin_output)
        return merged.view(batch_size, cams, *shape)

    def _check_sizes(
        self,
        step: int,
        reads: list[SlotRead | None],
        rows: dict[int, torch.Tensor],
        valid: list[bool],
        cams: int,
        key: str = "",
        found: set[int] | None = None,
    ) -> list[ReadFailure]:
        """Frames of output ``key`` whose size differs from the batch's, as failures (or raised, under on_error="raise").

        Until the batch size is known (the first steps), the frame at the lowest position sets it.
        ``found`` holds the positions found already in another output (each failed read counts once).
        """
        delivered = sorted(pos for pos in rows if valid[pos // cams])
        if key not in self._templates and delivered:
            first = rows[delivered[0]]
            self._templates[key] = (tuple(first.shape), first.dtype, first.device)
            self.sampler.frame_shapes[key] = tuple(first.shape)
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
                got_dtype=frame.dtype,
                expected_dtype=dtype,
            )
            if self.dataset.on_error == "raise":  # type: ignore[attr-defined]
                raise err
            self._skips.read_errors += 1
            found.add(pos)
            failed.append(ReadFailure(pos, str(index.clips[read.clip].cameras[pos % cams].path), str(err)))
        return failed

    def _new_buffer(self) -> Buffers | None:
        """The batches the workers decode straight into, one per output, once the frame sizes are known (CPU only).

        Frames then cross from worker to batch with a single write: no per-part tensors, no
        copy in the main process. The first steps, and GPU decoding, use per-part tensors.
        """
        keys = ["", *self.dataset.outputs]  # type: ignore[attr-defined]
        if any(key not in self._templates or self._templates[key][2].type != "cpu" for key in keys):
            return None
        sampler: StreamSampler = self.sampler
        buffers = {}
        for key in keys:
            shape, dtype, _ = self._templates[key]
            buffers[key] = self._pool.take((sampler.batch_size * sampler.num_cameras, *shape), dtype)
        return buffers

    def close(self) -> None:
        """Shut down the workers (persistent ones, and those of passes still in progress) and close this process's decoders."""
        for parts_iter in list(self._passes):
            shutdown = getattr(parts_iter, "_shutdown_workers", None)
            if shutdown is not None:
                shutdown()  # tells each worker to stop, joins it, terminates one that does not
        self._passes.clear()
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

    # -- resumable state (the shell's; a remote index's workers fetch by the plan) ----------
    def _follow_plan(self) -> None:
        dataset = self.dataset
        if getattr(dataset, "plan", None) is not None:  # a resume on another world size continues on another plan
            from lightning_vstream.stream.schedule import PlanSpec

            dataset.plan = PlanSpec.of(self._stream_sampler, dataset.index)  # type: ignore[attr-defined]

"""The stream engine's worker executor: a DataLoader's worker processes decode the parts of each step.

Why parts: the plain design, where the DataLoader hands consecutive steps to different workers
in turn, decodes about ``num_workers`` times more than it delivers on P-frame streams, because
each worker must decode through the frames the other workers delivered. Here every step is
split into ``num_workers`` parts by camera stream; the sampler emits the parts of each step in
order and PyTorch dispatches indices to workers round-robin, so part ``p`` always reaches
worker ``p``, which keeps decoding the same streams frame after frame. The executor puts the
parts' frames into the step's tensors (:mod:`lightning_vstream.stream.parts`) and hands them to
the :class:`~lightning_vstream.stream.engine.StreamEngine`, which builds the batch as it does for
decode threads. The plan and its parts come from :class:`~lightning_vstream.stream.sampler.StreamSampler`.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch.utils.data import DataLoader

from lightning_vstream.errors import StepMismatchError, VStreamError, WorkerError
from lightning_vstream.profiling import RANGE_COLLATE, nvtx_range
from lightning_vstream.stream.batch import StepAssembler, StreamBatch
from lightning_vstream.stream.engine import Executor, StepResult
from lightning_vstream.stream.failures import frame_size_error
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
from lightning_vstream.worker_processes import (
    TORCH_WORKER_FAILURE,
    WorkerTimeout,
    stop_workers,
    watch_workers,
    worker_failure,
)

if TYPE_CHECKING:
    from lightning_vstream.stream.worker import StreamDataset

__all__ = ["WorkerExecutor"]


class WorkerExecutor(Executor):
    """Decodes a stream plan's steps in the worker processes of ``loader`` (``num_workers=0``: in this process).

    Args:
        loader: The DataLoader whose workers decode (a
            :class:`~lightning_vstream.stream.worker_loader.StreamDataLoader`): its dataset is a
            :class:`~lightning_vstream.stream.worker.StreamDataset`, its sampler the
            :class:`~lightning_vstream.stream.sampler.StreamSampler` with one part per worker.
        pin_memory: Allocate the steps' frames in pinned memory (when CUDA is available).

    Example::

        >>> engine = StreamEngine(WorkerExecutor(loader))  # doctest: +SKIP
    """

    def __init__(self, loader: DataLoader, *, pin_memory: bool = False) -> None:
        dataset: StreamDataset = loader.dataset  # type: ignore[assignment]
        sampler: StreamSampler = loader.sampler  # type: ignore[assignment]  # torch types it as a Sampler
        self.loader = loader
        self.dataset = dataset
        self.sampler = sampler
        self.pin_output = pin_memory
        self.assembler = StepAssembler(
            dataset.index, sampler, dataset.steps, pad_annotations=dataset.output.pad_annotations
        )
        self._skips = sampler.ledger.stats
        # Per output ("": the default one), the frames' shape, dtype and device once known; per
        # (output, camera) with camera_frames="per_camera".
        self._templates: dict[str, Template] = {}
        self._camera_templates: dict[str, dict[int, Template]] = {}
        self.passes: weakref.WeakSet[Any] = weakref.WeakSet()  # worker iterators of passes not finished
        #: The host batches workers decode into, recycled once nothing references a batch handed out.
        self.pool = BufferPool(shared=loader.num_workers > 0)
        sampler.buffer_factory = weakref.WeakMethod(self._new_buffer)  # no executor <-> sampler cycle

    def run(self, start: int, assemble: Callable[[int, StepResult], StreamBatch]) -> Iterator[StreamBatch]:
        """Yield the batches of the sampler's epoch from step ``start``, the parts of each from the workers."""
        sampler = self.sampler
        plan = sampler.schedule()
        sampler.start_step = start
        parts_iter = self._start_workers()
        if self.loader.num_workers > 0:
            self.passes.add(parts_iter)
        try:
            for step in range(start, len(plan)):
                parts = [self._receive(parts_iter, step, p) for p in range(sampler.num_parts)]
                with nvtx_range(RANGE_COLLATE):
                    batch = assemble(step, self._result(step, parts))
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
            parts_iter = DataLoader.__iter__(self.loader)  # the parts, as torch fetches them (not the loader's pass)
            watch_workers(parts_iter, self.loader.timeout)
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
        return worker_failure(
            parts_iter, step, part, err, stalled=stalled, timeout=self.loader.timeout, streams=self._streams
        )

    def _streams(self, step: int, part: int) -> str:
        """The camera streams part ``part`` reads at ``step``, for errors: slot, camera, clip, frame and file."""
        sampler = self.sampler
        entry = sampler._issued.get(step)
        return self.assembler.streams(step, None if entry is None else entry[0], part, sampler.num_parts)

    def _stop_workers(self, parts_iter: Any) -> None:
        """End the worker processes of ``parts_iter`` (terminate, then kill) and close its queues."""
        stop_workers(parts_iter)
        if self.loader._iterator is parts_iter:
            self.loader._iterator = None  # persistent workers: the next epoch starts new ones

    def _result(self, step: int, parts: list[StreamPart]) -> StepResult:
        """What the workers decoded for ``step``, in the sampler's order, for the engine."""
        sampler, dataset = self.sampler, self.dataset
        cams = sampler.num_cameras
        for p, part in enumerate(parts):
            if (part.epoch, part.step, part.part) != (sampler.epoch, step, p):
                raise StepMismatchError(
                    f"expected part {p} of step {step} (epoch {sampler.epoch}) but received part {part.part} of "
                    f"step {part.step} (epoch {part.epoch}); the DataLoader did not keep the sampler's order."
                )
        reads, shifts, buffers = sampler.issued(step)
        keys = ["", *dataset.output.outputs]  # "": the default output (batch["frames"]); then the named outputs
        rows: dict[str, dict[int, torch.Tensor]] = {}

        def failures(valid: list[bool]) -> list[ReadFailure]:
            failed = [failure for part in parts for failure in part.failed]
            if buffers is None:
                oversized: set[int] = set()
                for key in keys:
                    rows[key] = frame_rows(parts, key)
                    failed += self._check_sizes(step, reads, rows[key], valid, cams, key, oversized)
            return failed

        def frames(valid: list[bool]) -> dict[str, Any]:
            return {key: self._frames(step, parts, key, buffers, rows.get(key, {}), valid) for key in keys}

        camera_timestamps = np.full((sampler.batch_size, cams), math.nan, dtype=np.float64)
        flat = camera_timestamps.reshape(-1)
        for part in parts:
            flat[part.positions] = part.timestamps
        return StepResult(
            reads=reads,
            shifts=shifts,
            timestamps=camera_timestamps,
            frames=frames,
            failures=failures,
            counts={part.worker: part.stats for part in parts},
            annotations=[item for part in parts for item in part.annotations.items()],
            missing=[item for part in parts for item in part.missing],
            geometry=[item for part in parts for item in part.frames[""].geometry.items()],
            output_geometry={
                name: [item for part in parts for item in part.frames[name].geometry.items()]
                for name in dataset.output.outputs
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
        sampler = self.sampler
        cams, batch_size = sampler.num_cameras, sampler.batch_size
        if self.dataset.decode.camera_frames == "per_camera":
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
        index = self.dataset.index
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
            if self.dataset.errors.on_error == "raise":
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
        keys = ["", *self.dataset.output.outputs]
        if any(key not in self._templates or self._templates[key][2].type != "cpu" for key in keys):
            return None
        sampler = self.sampler
        buffers = {}
        for key in keys:
            shape, dtype, _ = self._templates[key]
            buffers[key] = self.pool.take((sampler.batch_size * sampler.num_cameras, *shape), dtype)
        return buffers

    def close(self) -> None:
        """Shut down the workers of passes still in progress and close this process's decoders."""
        for parts_iter in list(self.passes):
            shutdown = getattr(parts_iter, "_shutdown_workers", None)
            if shutdown is not None:
                shutdown()  # tells each worker to stop, joins it, terminates one that does not
        self.passes.clear()
        # DataLoader keeps the iterator of persistent workers in `_iterator`; dropping it is
        # how its workers are shut down (its __del__ joins them).
        self.loader._iterator = None
        self.dataset.close()

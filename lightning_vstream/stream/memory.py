"""Batch memory of the stream loaders: host batches that return to a pool, and the engine's batches on its device.

:class:`BufferPool` recycles host batch storages once nothing references the batch handed out (the
worker loader's shared batches, the engine's CPU batches). :class:`EngineBatches` is the memory the
stream engine writes into: with ``buffers="ring"`` (GPU) ``ring_size`` batches are allocated once
and step ``s`` writes into batch ``s % ring_size``; with ``buffers="pool"`` (CPU) every step takes
a batch from a :class:`BufferPool`. A batch is one frame tensor for all cameras
(``camera_frames="stacked"``) or one per camera (``"per_camera"``), per output; the decode threads
write each frame into its row (:meth:`EngineBatches.row`).
"""

from __future__ import annotations

import math
import weakref

import torch

from lightning_vstream.options import CameraFrames
from lightning_vstream.stream.engine_device import EngineDevice

__all__ = ["BufferPool", "EngineBatches", "FrameShape"]

#: Shape and dtype of one frame of a batch.
FrameShape = tuple[tuple[int, ...], torch.dtype]


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


class EngineBatches:
    """The batches one stream engine writes into (see the module docs).

    Args:
        device: Where ring batches live.
        slots: Slots per batch.
        cameras: Cameras per slot.
        camera_frames: ``"stacked"`` or ``"per_camera"``.
        buffers: ``"ring"`` or ``"pool"``.
        ring_size: Batches in the ring (``buffers="ring"``).
        pin_memory: Allocate pool batches in pinned memory (when CUDA is available).

    Example::

        >>> batches = EngineBatches(device=HostDevice(), slots=2, cameras=3, camera_frames="stacked",  # doctest: +SKIP
        ...                         buffers="pool", ring_size=4, pin_memory=False)
        >>> batches.allocate([((3, 48, 64), torch.uint8)], {})  # doctest: +SKIP
        >>> batches.of_step(0)[0][0].shape  # doctest: +SKIP
        torch.Size([6, 3, 48, 64])
    """

    def __init__(
        self,
        *,
        device: EngineDevice,
        slots: int,
        cameras: int,
        camera_frames: CameraFrames,
        buffers: str,
        ring_size: int,
        pin_memory: bool,
    ) -> None:
        self.device = device
        self.slots = slots
        self.cameras = cameras
        self.camera_frames = camera_frames
        self.buffers = buffers
        self.ring_size = ring_size
        #: Per camera (one for all with ``"stacked"``): the default output's frame shape; empty until allocated.
        self.shapes: list[FrameShape] = []
        self.output_shapes: dict[str, list[FrameShape]] = {}
        self._ring: list[list[torch.Tensor]] = []
        self._ring_rows: list[list[torch.Tensor]] = []  # per ring batch: position -> its row, made once
        self._output_ring: list[dict[str, list[torch.Tensor]]] = []
        self._pool = BufferPool(shared=False, pinned=pin_memory and torch.cuda.is_available())

    def allocate(self, shapes: list[FrameShape], output_shapes: dict[str, list[FrameShape]]) -> None:
        """Fix the frame shapes of every output (per camera) and, with ``buffers="ring"``, allocate the ring."""
        self.shapes = shapes
        self.output_shapes = output_shapes
        if self.buffers == "ring":
            self._ring = [self.new_frames() for _ in range(self.ring_size)]
            self._ring_rows = [self.rows_of(frames) for frames in self._ring]
            self._output_ring = [self.new_outputs() for _ in range(self.ring_size)]

    def of_step(self, step: int) -> tuple[list[torch.Tensor], dict[str, list[torch.Tensor]], list[torch.Tensor]]:
        """The frames of ``step``'s batch, those of each named output, and its rows by position."""
        if self.buffers == "pool":
            frames = self.new_frames()
            return frames, self.new_outputs(), self.rows_of(frames)
        i = step % self.ring_size
        return self._ring[i], self._output_ring[i], self._ring_rows[i]

    def new_outputs(self) -> dict[str, list[torch.Tensor]]:
        """The frame tensors of one batch for each named output."""
        return {name: self.new_frames(shapes) for name, shapes in self.output_shapes.items()}

    def new_frames(self, shapes: list[FrameShape] | None = None) -> list[torch.Tensor]:
        """The frame tensors of one batch (of the default output, or of ``shapes``): one for all cameras, or one
        per camera."""
        slots, cams = self.slots, self.cameras
        shapes = self.shapes if shapes is None else shapes
        if self.camera_frames == "stacked":
            shape, dtype = shapes[0]
            dims: list[FrameShape] = [((slots * cams, *shape), dtype)]
        else:
            dims = [((slots, *shape), dtype) for shape, dtype in shapes]
        if self.buffers == "pool":
            return [self._pool.take(shape, dtype) for shape, dtype in dims]
        return [self.device.empty(shape, dtype) for shape, dtype in dims]

    def row(self, frames: list[torch.Tensor], position: int) -> torch.Tensor:
        """The row of stream ``position`` (``slot * cameras + camera``) in one batch's frames."""
        if self.camera_frames == "stacked":
            return frames[0][position]
        slot, camera = divmod(position, self.cameras)
        return frames[camera][slot]

    def rows_of(self, frames: list[torch.Tensor]) -> list[torch.Tensor]:
        """Every row of one batch's frames, by position (one ``unbind`` per tensor rather than a view per frame)."""
        if self.camera_frames == "stacked":
            return list(frames[0].unbind(0))
        per_camera = [camera_frames.unbind(0) for camera_frames in frames]
        cams = self.cameras
        return [per_camera[position % cams][position // cams] for position in range(self.slots * cams)]

    def layout(self, tensors: list[torch.Tensor]) -> torch.Tensor | list[torch.Tensor]:
        """A batch's frames of one output as delivered: ``[slots, cameras, ...]`` stacked, or one tensor per camera."""
        if self.camera_frames == "stacked":
            first = tensors[0]
            return first.view((self.slots, self.cameras, *first.shape[1:]))
        return list(tensors)

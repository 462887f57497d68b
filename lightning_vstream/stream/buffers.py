"""Batch memory that returns to a pool once nothing references the batch handed out."""

from __future__ import annotations

import math
import weakref

import torch

__all__ = ["BufferPool"]


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

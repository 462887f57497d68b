"""What follows the decoding of a camera frame, the same in DataLoader workers and in engine threads.

:class:`FrameSteps` holds the per-frame work both stream loaders do after a decoder returned a
frame: the geometry augmentation (drawn once per clip segment), the transform, the frame's
``img_aug_matrix`` and the lookup of the slot's annotations. The worker loader
(:class:`~lightning_vstream.stream.worker.StreamDataset`) and the thread engine
(:class:`~lightning_vstream.stream.engine.StreamEngine`) each call it, so their batches agree.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np
import torch

from lightning_vstream.annotations.augment import AugmentParams, GeometryAugment, transform_matrix
from lightning_vstream.annotations.batch import add_annotations
from lightning_vstream.annotations.source import AnnotationSource, annotate
from lightning_vstream.errors import AnnotationError
from lightning_vstream.index import VideoIndex
from lightning_vstream.stream.failures import DecodeStats
from lightning_vstream.transforms import FrameTransform

__all__ = ["FrameSteps", "attach_annotations"]

log = logging.getLogger("lightning_vstream")

#: Augmentation draws kept per process before the cache is emptied.
MAX_DRAWS = 4096


class FrameSteps:
    """Augmentation, transform, geometry and annotations of decoded camera frames.

    Args:
        index: The clips read.
        transform: Applied to every ``[1, 3, H, W]`` frame after the augmentation.
        augment: Geometry augmentation, drawn once per segment from ``(seed, epoch, clip, segment start)``.
        seed: Seed of the augmentation draws.
        annotations: Looked up for the frame of each slot's first camera; None: none.
        on_error: ``"raise"``: a missing annotation raises; ``"skip"``: the frame is delivered without.
        decode_device: ``"cpu"`` when frames are decoded by PyAV: a
            :class:`~lightning_vstream.FrameTransform`'s resize then happens inside the decoder
            (see :attr:`decode_size`), unless an augmentation must see the frame at its own size first.

    Example::

        >>> steps = FrameSteps(index=index, transform=FrameTransform(resize=(450, 800)))  # doctest: +SKIP
        >>> steps.decode_size, steps.direct  # doctest: +SKIP
        ((450, 800), True)
    """

    def __init__(
        self,
        *,
        index: VideoIndex,
        transform: Callable[[torch.Tensor], torch.Tensor] | None = None,
        augment: GeometryAugment | None = None,
        seed: int = 0,
        annotations: AnnotationSource | None = None,
        on_error: str = "raise",
        decode_device: str = "cpu",
    ) -> None:
        self.index = index
        self.transform = transform
        self.augment = augment
        self.seed = seed
        self.annotations = annotations
        self.on_error = on_error
        #: ``(height, width)`` CPU decoders resize to while converting to RGB (None: the file's size).
        self.decode_size = (
            transform.decoder_size()
            if isinstance(transform, FrameTransform) and decode_device == "cpu" and augment is None
            else None
        )
        #: Nothing is left to do after the decoder: a frame can be decoded straight into its batch row.
        self.direct = augment is None and (
            transform is None
            or (self.decode_size is not None and isinstance(transform, FrameTransform) and transform.is_resize_only)
        )
        #: Frames change geometry here (augmentation, or a transform that crops or resizes): batches
        #: carry ``img_aug_matrix``.
        self.has_geometry = augment is not None or any(
            getattr(transform, name, None) is not None for name in ("crop", "resize")
        )
        self._draws: dict[tuple[int, int, int], AugmentParams] = {}

    def frame_shape(self, height: int, width: int, device: torch.device | str = "cpu") -> tuple[tuple[int, ...], Any]:
        """Shape and dtype a ``height x width`` frame has once augmented and transformed."""
        if self.augment is not None:
            height, width = self.augment.output_size
        if self.transform is None:
            return (3, height, width), torch.uint8
        if self.direct and self.decode_size is not None:
            return (3, *self.decode_size), torch.uint8
        out = self.transform(torch.zeros((1, 3, height, width), dtype=torch.uint8, device=device))
        return tuple(out.shape[1:]), out.dtype

    def finish(self, image: torch.Tensor, epoch: int, clip: int, segment_start: int) -> torch.Tensor:
        """Augment, then transform one decoded ``[3, H, W]`` frame."""
        if self.augment is not None:
            image, _ = self.augment.apply(image, self.draw(epoch, clip, segment_start))
        if self.transform is not None:
            image = self.transform(image[None])[0]
        return image

    def draw(self, epoch: int, clip: int, segment_start: int) -> AugmentParams:
        """The augmentation of one clip segment in ``epoch`` (the same for every camera and frame of it)."""
        key = (epoch, clip, segment_start)
        params = self._draws.get(key)
        if params is None:
            assert self.augment is not None
            clip_id = self.index.clips[clip].clip_id
            params = self.augment.draw(seed=self.seed, epoch=epoch, key=f"{clip_id}:{segment_start}")
            if len(self._draws) > MAX_DRAWS:
                self._draws.clear()
            self._draws[key] = params
        return params

    def forget_draws(self) -> None:
        """Drop the cached draws (a new epoch)."""
        self._draws.clear()

    def geometry(self, height: int, width: int, epoch: int, clip: int, segment_start: int) -> Any:
        """``img_aug_matrix`` of a frame of the file's size ``height x width``: the augmentation, then the
        transform's crop / resize (numpy, by value).

        Computed from the file's own frame size, so a resize done inside the decoder counts too.
        """
        matrix = torch.eye(3, dtype=torch.float32)
        if self.augment is not None:
            _, _, full = self.augment.geometry(height, width, self.draw(epoch, clip, segment_start))
            matrix = full.to(torch.float32)
            height, width = self.augment.output_size
        after = transform_matrix(self.transform, height, width)
        if after is not None:
            matrix = (after.double() @ matrix.double()).to(torch.float32)
        return matrix.numpy()  # by value: small tensors would each take a shared-memory segment

    def annotate(self, clip: int, frame: int, timestamp: float) -> tuple[dict[str, Any] | None, str | None]:
        """The annotations of one slot's frame, or ``(None, why)`` when missing under ``on_error="skip"``.

        Small CPU tensors come back as numpy arrays: pickled by value, where torch would give every
        tensor its own shared-memory segment (most of the cost, measured).

        Raises:
            AnnotationError: The annotation is missing and ``on_error="raise"``.
        """
        assert self.annotations is not None
        clip_id = self.index.clips[clip].clip_id
        try:
            found = annotate(self.annotations, clip_id, frame, timestamp, self.index.camera_names)
        except AnnotationError as err:
            if self.on_error == "raise":
                raise
            return None, str(err)
        converted = {
            k: v.numpy() if isinstance(v, torch.Tensor) and v.device.type == "cpu" else v for k, v in found.items()
        }
        return converted, None


def attach_annotations(
    batch: dict[str, Any],
    steps: FrameSteps,
    *,
    valid: list[bool],
    cameras: int,
    found: Iterable[tuple[int, Mapping[str, Any]]],
    missing: Iterable[tuple[int, str]],
    geometry: Iterable[tuple[int, Any]],
    pad: bool,
    stats: DecodeStats,
) -> None:
    """Add ``annotations``, ``has_annotations`` and ``img_aug_matrix`` to a batch (see :mod:`lightning_vstream.annotations`).

    Args:
        batch: The batch, changed in place.
        steps: What was applied to its frames.
        valid: Which slots deliver a frame.
        cameras: Cameras per slot.
        found: ``(slot, annotations)`` of the slots whose annotation was found (numpy arrays or tensors).
        missing: ``(slot, why)`` of the slots whose annotation is missing (``on_error="skip"``).
        geometry: ``(slot * cameras + camera, img_aug_matrix)`` of the frames delivered.
        pad: Pad ragged fields with a mask instead of delivering lists.
        stats: Counts the valid slots delivered without their annotation (``missing_annotations``).
    """
    slots = len(valid)
    items: list[dict[str, Any] | None] = [None] * slots
    matrices: list[torch.Tensor | None] = [None] * (slots * cameras)
    for slot, values in found:
        if valid[slot]:
            items[slot] = {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in values.items()}
    for slot, why in missing:
        if valid[slot]:
            stats.missing_annotations += 1
            if stats.missing_annotations <= 3:
                log.warning("delivering a frame without annotations (has_annotations=False): %s", why)
    for position, matrix in geometry:
        if valid[position // cameras]:
            matrices[position] = torch.from_numpy(matrix) if isinstance(matrix, np.ndarray) else matrix
    add_annotations(
        batch,
        items if steps.annotations is not None else None,
        ragged=getattr(steps.annotations, "ragged", ()),
        pad=pad,
        matrices=matrices if steps.has_geometry else None,
        cameras=cameras,
    )

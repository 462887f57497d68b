"""What follows the decoding of a camera frame, the same in DataLoader workers and in engine threads.

:class:`FrameSteps` holds the per-frame work both stream loaders do after a decoder returned a
frame: the geometry augmentation (drawn once per clip segment), the transform, the frame's
``img_aug_matrix`` and the lookup of the slot's annotations. The worker loader
(:class:`~lightning_vstream.stream.worker.StreamDataset`) and the thread engine
(:class:`~lightning_vstream.stream.engine.StreamEngine`) each call it, so their batches agree.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

import torch

from lightning_vstream.annotations.augment import AugmentParams, GeometryAugment, transform_matrix
from lightning_vstream.annotations.source import AnnotationSource, annotate
from lightning_vstream.errors import AnnotationError
from lightning_vstream.index import VideoIndex
from lightning_vstream.outputs import OutputTransform, apply_output, changes_geometry
from lightning_vstream.transforms import FrameTransform

__all__ = ["FrameSteps", "decoder_sizes"]

log = logging.getLogger("lightning_vstream")

#: Augmentation draws kept per process before the cache is emptied.
MAX_DRAWS = 4096


def decoder_sizes(
    transform: object, outputs: Mapping[str, object] | None, augment: GeometryAugment | None
) -> tuple[tuple[int, int] | None, dict[str, tuple[int, int] | None]]:
    """Where a CPU video decoder's swscale conversion can do each output's resize.

    A :class:`~lightning_vstream.FrameTransform` whose first step is a resize
    (:meth:`~lightning_vstream.FrameTransform.decoder_size`) can take its input from the
    decoder's YUV -> RGB conversion at that size, unless an augmentation must see the frame at
    its own size first. The decoder converts each decoded frame once to its own size (the first
    value: the default output's size when no output needs the file's size, else None) and once
    more to every other size (:meth:`PyAVDecoder.get_sizes <lightning_vstream.decode.cpu.pyav.PyAVDecoder.get_sizes>`).

    Returns:
        The decoder's own size (None: the file's), and per output (``""``: the default output,
        else its name) the size its input is converted to (None: the decoder's frame).

    Example::

        >>> from lightning_vstream.transforms import FrameTransform
        >>> decoder_sizes(FrameTransform(resize=(450, 800)), {"small": FrameTransform(resize=(225, 400))}, None)
        ((450, 800), {'': (450, 800), 'small': (225, 400)})
        >>> decoder_sizes(None, {"small": FrameTransform(resize=(225, 400))}, None)
        (None, {'': None, 'small': (225, 400)})
    """
    transforms = {"": transform, **(outputs or {})}
    sizes = {
        key: t.decoder_size() if isinstance(t, FrameTransform) and augment is None else None
        for key, t in transforms.items()
    }
    own = None if any(size is None for size in sizes.values()) else sizes[""]
    return own, sizes


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
            (see :attr:`decode_size`), unless an augmentation or another output must see the frame
            at its own size first.
        outputs: Named outputs made from the same augmented frame, each with its own transform
            (see :mod:`lightning_vstream.outputs`); ``transform`` makes the default output.

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
        outputs: Mapping[str, OutputTransform] | None = None,
    ) -> None:
        self.index = index
        self.transform = transform
        #: The named outputs besides the default one, in order.
        self.outputs: dict[str, OutputTransform] = dict(outputs or {})
        self.augment = augment
        self.seed = seed
        self.annotations = annotations
        self.on_error = on_error
        own, sizes = decoder_sizes(transform, outputs, augment) if decode_device == "cpu" else (None, {})
        #: ``(height, width)`` CPU decoders resize to while converting to RGB (None: the file's size).
        self.decode_size = own
        #: Per output (``""``: the default one), the size of the decoder's conversion it starts from (None: the
        #: decoder's own frame).
        self.decoder_sizes: dict[str, tuple[int, int] | None] = sizes
        #: The sizes a decoder converts each frame to besides its own (:meth:`PyAVDecoder.get_sizes`).
        self.extra_sizes: tuple[tuple[int, int], ...] = tuple(
            sorted({size for size in sizes.values() if size is not None and size != own})
        )
        #: Nothing is left to do after the decoder: a frame can be decoded straight into its batch row.
        self.direct = augment is None and (
            transform is None
            or (self.decode_size is not None and isinstance(transform, FrameTransform) and transform.is_resize_only)
        )
        #: Frames change geometry here (augmentation, or a transform of any output that crops or
        #: resizes): batches carry ``img_aug_matrix``.
        self.has_geometry = (
            augment is not None
            or changes_geometry(transform)
            or any(changes_geometry(t) for t in self.outputs.values())
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

    def output_shapes(
        self, height: int, width: int, device: torch.device | str = "cpu"
    ) -> dict[str, tuple[tuple[int, ...], Any]]:
        """Shape and dtype of each named output of a ``height x width`` frame."""
        if self.augment is not None:
            height, width = self.augment.output_size
        shapes = {}
        for name, transform in self.outputs.items():
            out = apply_output(transform, torch.zeros((1, 3, height, width), dtype=torch.uint8, device=device))
            shapes[name] = (tuple(out.shape[1:]), out.dtype)
        return shapes

    def augmented(self, image: torch.Tensor, epoch: int, clip: int, segment_start: int) -> torch.Tensor:
        """One decoded ``[3, H, W]`` frame with the segment's augmentation applied (itself without one)."""
        if self.augment is not None:
            image, _ = self.augment.apply(image, self.draw(epoch, clip, segment_start))
        return image

    def transformed(
        self, image: torch.Tensor, converted: Mapping[tuple[int, int], torch.Tensor] | None = None
    ) -> torch.Tensor:
        """The default output of an augmented ``[3, H, W]`` frame (``converted``: the decoder's other sizes of it)."""
        image = self._input("", image, converted)
        if self.transform is not None:
            image = self.transform(image[None])[0]
        return image

    def extra_outputs(
        self, image: torch.Tensor, converted: Mapping[tuple[int, int], torch.Tensor] | None = None
    ) -> dict[str, torch.Tensor]:
        """Every named output of an augmented ``[3, H, W]`` frame (``converted``: the decoder's other sizes of it)."""
        return {
            name: apply_output(transform, self._input(name, image, converted)[None])[0]
            for name, transform in self.outputs.items()
        }

    def _input(
        self, key: str, image: torch.Tensor, converted: Mapping[tuple[int, int], torch.Tensor] | None
    ) -> torch.Tensor:
        """What output ``key`` is made from: the decoder's conversion at its size when there is one, else ``image``.

        The output's transform then finds its frame at the output size already and skips its resize.
        """
        size = self.decoder_sizes.get(key)
        if converted and size is not None and size in converted:
            return converted[size]
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
        return self._geometry(self.transform, height, width, epoch, clip, segment_start)

    def output_geometry(self, height: int, width: int, epoch: int, clip: int, segment_start: int) -> dict[str, Any]:
        """``img_aug_matrix`` of each named output (see :meth:`geometry`): the same augmentation, then its transform."""
        return {
            name: self._geometry(transform, height, width, epoch, clip, segment_start)
            for name, transform in self.outputs.items()
        }

    def _geometry(self, transform: Any, height: int, width: int, epoch: int, clip: int, segment_start: int) -> Any:
        matrix = torch.eye(3, dtype=torch.float32)
        if self.augment is not None:
            _, _, full = self.augment.geometry(height, width, self.draw(epoch, clip, segment_start))
            matrix = full.to(torch.float32)
            height, width = self.augment.output_size
        after = transform_matrix(transform, height, width)
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

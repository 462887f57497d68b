"""Geometry-consistent augmentation: one random resize / crop / flip / rotation per clip.

A streaming model sees a clip frame after frame; if every frame were augmented on its own, the
scene would jump between frames and the temporal memory would learn noise. :class:`GeometryAugment`
draws its parameters once per clip (per segment, on the streaming DataModule; per sample on the
clip DataModule) from ``(seed, epoch, clip, first frame)``, so a whole clip gets the same
transform, the next epoch another one, and a resumed run the same ones again. All cameras of a
clip share the draw (as StreamPETR's ``ResizeCropFlipRotImage`` does).

The batch carries the transform as ``img_aug_matrix`` ``[..., cameras, 3, 3]`` (StreamPETR's
``ida_mat``, mmdet3d's ``img_aug_matrix``): it maps a pixel of the decoded video frame to the
delivered image, in continuous pixel coordinates (pixel ``(i, j)`` covers ``[j, j + 1) x [i, i + 1)``,
so its centre is ``(j + 0.5, i + 0.5)``). The ``intrinsics`` annotation is delivered already
multiplied by it, so projecting with the delivered intrinsics lands on the delivered pixels.

Cameras of different resolutions come out at one ``output_size``: the scale is computed per
camera (``fit="cover"`` keeps the aspect ratio and crops; ``"stretch"`` scales each axis to fit),
so a deterministic ``GeometryAugment(output_size=...)`` is also how a mixed rig is stacked.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal, cast

import torch
import torch.nn.functional as F

from lightning_vstream.errors import ConfigurationError

__all__ = ["AugmentParams", "GeometryAugment", "transform_matrix"]

Fit = Literal["cover", "stretch"]


@dataclass(frozen=True)
class AugmentParams:
    """One draw: scale multiplier, crop position (0..1 of the slack), flip, rotation in degrees."""

    scale: float = 1.0
    crop_x: float = 0.5
    crop_y: float = 0.5
    flip: bool = False
    rotate: float = 0.0


def _pair(name: str, value: object, *, positive: bool) -> tuple[float, float]:
    if isinstance(value, (str, bytes)) or not hasattr(value, "__len__") or len(value) != 2:
        raise ConfigurationError(f"GeometryAugment: {name}={value!r} must be a (low, high) pair of numbers.")
    low, high = (float(v) for v in cast(Sequence[Any], value))
    if low > high or (positive and low <= 0):
        raise ConfigurationError(
            f"GeometryAugment: {name}={value!r} must have low <= high{' and both > 0' if positive else ''}."
        )
    return low, high


@dataclass(frozen=True, kw_only=True)
class GeometryAugment:
    """Resize, crop, flip and rotate every frame of a clip the same way, and report the 3x3 transform.

    Args:
        output_size: ``(height, width)`` of every delivered frame, whatever the camera's size.
        scale: Range of the random factor applied on top of the scale that fits the camera to
            ``output_size``; ``(1.0, 1.0)`` for none.
        flip: Probability of a horizontal flip.
        rotate: Range of the random rotation in degrees (about the output centre).
        random_crop: Crop at a random place of the resized frame; else at its centre.
        fit: ``"cover"``: keep the aspect ratio, scale until the output is covered, crop the rest;
            ``"stretch"``: scale width and height separately to the output size.
        antialias: Low-pass filter when shrinking.

    Raises:
        ConfigurationError: A size or range is invalid.

    Example::

        >>> aug = GeometryAugment(output_size=(32, 48), scale=(0.9, 1.1), flip=0.5)
        >>> params = aug.draw(seed=0, epoch=0, key="scene-0000:0")
        >>> image, matrix = aug.apply(torch.zeros(3, 48, 64, dtype=torch.uint8), params)
        >>> image.shape, matrix.shape
        (torch.Size([3, 32, 48]), torch.Size([3, 3]))
    """

    output_size: tuple[int, int]
    scale: tuple[float, float] = (1.0, 1.0)
    flip: float = 0.0
    rotate: tuple[float, float] = (0.0, 0.0)
    random_crop: bool = True
    fit: Fit = "cover"
    antialias: bool = True

    def __post_init__(self) -> None:
        size = self.output_size
        if (
            isinstance(size, (str, bytes))
            or not hasattr(size, "__len__")
            or len(size) != 2
            or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in size)
        ):
            raise ConfigurationError(
                f"GeometryAugment: output_size={size!r} must be (height, width), positive integers."
            )
        object.__setattr__(self, "output_size", (int(size[0]), int(size[1])))
        object.__setattr__(self, "scale", _pair("scale", self.scale, positive=True))
        object.__setattr__(self, "rotate", _pair("rotate", self.rotate, positive=False))
        if not 0.0 <= float(self.flip) <= 1.0:
            raise ConfigurationError(f"GeometryAugment: flip={self.flip!r} is a probability; use a number in 0..1.")
        if self.fit not in ("cover", "stretch"):
            raise ConfigurationError(f"GeometryAugment: fit={self.fit!r} is not supported; use 'cover' or 'stretch'.")

    @property
    def is_random(self) -> bool:
        """True when draws differ (some range is not a single value, or flips may happen)."""
        return self.scale[0] != self.scale[1] or self.rotate[0] != self.rotate[1] or self.flip > 0 or self.random_crop

    def for_evaluation(self) -> GeometryAugment:
        """The deterministic version for validation and test: mean scale, centre crop, no flip or rotation."""
        mid = (self.scale[0] + self.scale[1]) / 2
        turn = (self.rotate[0] + self.rotate[1]) / 2 if self.rotate[0] == self.rotate[1] else 0.0
        return replace(self, scale=(mid, mid), flip=0.0, rotate=(turn, turn), random_crop=False)

    def draw(self, *, seed: int, epoch: int, key: str) -> AugmentParams:
        """The parameters for ``key`` (clip id and first frame) in ``epoch``; the same on every process and run."""
        digest = hashlib.blake2b(f"{seed}:{epoch}:{key}".encode(), digest_size=8).digest()
        rng = random.Random(int.from_bytes(digest, "little"))
        scale = rng.uniform(*self.scale)
        crop_x, crop_y = (rng.random(), rng.random()) if self.random_crop else (0.5, 0.5)
        flip = rng.random() < self.flip
        angle = rng.uniform(*self.rotate)
        return AugmentParams(scale, crop_x, crop_y, flip, angle)

    def geometry(
        self, height: int, width: int, params: AugmentParams
    ) -> tuple[tuple[int, int], tuple[int, int], torch.Tensor]:
        """``(resized height, width)``, crop ``(top, left)`` and the 3x3 float64 matrix for a ``height x width`` input."""
        out_h, out_w = self.output_size
        if self.fit == "cover":
            sx = sy = max(out_h / height, out_w / width) * params.scale
        else:
            sx, sy = out_w / width * params.scale, out_h / height * params.scale
        new_h, new_w = max(1, round(height * sy)), max(1, round(width * sx))
        top = round(params.crop_y * (new_h - out_h))
        left = round(params.crop_x * (new_w - out_w))
        matrix = torch.tensor(
            [[new_w / width, 0.0, -left], [0.0, new_h / height, -top], [0.0, 0.0, 1.0]], dtype=torch.float64
        )
        if params.flip:
            matrix = torch.tensor([[-1.0, 0.0, out_w], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]], dtype=torch.float64) @ matrix
        if params.rotate:
            matrix = _rotation(params.rotate, out_h, out_w) @ matrix
        return (new_h, new_w), (top, left), matrix

    def apply(self, frames: torch.Tensor, params: AugmentParams) -> tuple[torch.Tensor, torch.Tensor]:
        """Transform uint8 frames ``[..., 3, H, W]`` of one camera on their device.

        Returns:
            The frames ``[..., 3, out_h, out_w]`` uint8 and the float32 ``[3, 3]`` matrix (on the CPU).
        """
        height, width = frames.shape[-2:]
        (new_h, new_w), (top, left), matrix = self.geometry(height, width, params)
        out_h, out_w = self.output_size
        lead = frames.shape[:-3]
        x = frames.reshape(-1, 3, height, width)
        if (new_h, new_w) != (height, width):
            x = _resize(x, (new_h, new_w), antialias=self.antialias and (new_h < height or new_w < width))
        out = x.new_zeros((x.shape[0], 3, out_h, out_w))
        src_top, src_left = max(top, 0), max(left, 0)
        dst_top, dst_left = max(-top, 0), max(-left, 0)
        rows = min(new_h - src_top, out_h - dst_top)
        cols = min(new_w - src_left, out_w - dst_left)
        if rows > 0 and cols > 0:
            out[:, :, dst_top : dst_top + rows, dst_left : dst_left + cols] = x[
                :, :, src_top : src_top + rows, src_left : src_left + cols
            ]
        if params.flip:
            out = out.flip(-1)
        if params.rotate:
            out = _rotate(out, params.rotate)
        return out.reshape(*lead, 3, out_h, out_w), matrix.to(torch.float32)


def transform_matrix(transform: object, height: int, width: int) -> torch.Tensor | None:
    """The 3x3 image transform of a frame transform's ``crop`` and ``resize`` for ``height x width`` input.

    Recognizes :class:`~lightning_vstream.transforms.FrameTransform` (any object with ``crop`` /
    ``resize`` attributes); None when it changes no geometry (other callables are taken to change none).

    Example::

        >>> from lightning_vstream.transforms import FrameTransform
        >>> transform_matrix(FrameTransform(crop=(8, 0, 40, 64), resize=(20, 32)), 48, 64).tolist()[:2]
        [[0.5, 0.0, 0.0], [0.0, 0.5, -4.0]]
    """
    crop = getattr(transform, "crop", None)
    resize = getattr(transform, "resize", None)
    if crop is None and resize is None:
        return None
    top, left, height, width = crop if crop is not None else (0, 0, height, width)
    out_h, out_w = resize if resize is not None else (height, width)
    sx, sy = out_w / width, out_h / height
    return torch.tensor([[sx, 0.0, -left * sx], [0.0, sy, -top * sy], [0.0, 0.0, 1.0]], dtype=torch.float32)


def _resize(frames: torch.Tensor, size: tuple[int, int], *, antialias: bool) -> torch.Tensor:
    """Bilinear resize of uint8 ``[N, 3, H, W]``: torch's uint8 kernel on the CPU (about 3x faster
    than going through float32, measured at 320x180), float32 elsewhere (CUDA has no uint8 bilinear
    kernel)."""
    if frames.device.type == "cpu":
        return F.interpolate(frames, size=size, mode="bilinear", align_corners=False, antialias=antialias)
    out = F.interpolate(frames.float(), size=size, mode="bilinear", align_corners=False, antialias=antialias)
    return out.round_().clamp_(0, 255).to(torch.uint8)


def _rotation(degrees: float, height: int, width: int) -> torch.Tensor:
    """Rotation by ``degrees`` about the image centre, in pixel coordinates (y down)."""
    a = math.radians(degrees)
    c, s = math.cos(a), math.sin(a)
    cx, cy = width / 2, height / 2
    return torch.tensor(
        [[c, -s, cx - c * cx + s * cy], [s, c, cy - s * cx - c * cy], [0.0, 0.0, 1.0]], dtype=torch.float64
    )


def _rotate(frames: torch.Tensor, degrees: float) -> torch.Tensor:
    """Rotate uint8 ``[N, 3, H, W]`` about the centre (bilinear, zeros outside), matching :func:`_rotation`."""
    n, _, height, width = frames.shape
    inverse = torch.linalg.inv(_rotation(degrees, height, width))
    # grid_sample with align_corners=False maps normalized u to pixel x = (u + 1) * W / 2: build the
    # source point of every output pixel centre in pixels, then normalize.
    ys = torch.arange(height, dtype=torch.float64) + 0.5
    xs = torch.arange(width, dtype=torch.float64) + 0.5
    gy, gx = torch.meshgrid(ys, xs, indexing="ij")
    points = torch.stack([gx, gy, torch.ones_like(gx)], dim=-1) @ inverse.T
    grid = torch.stack([points[..., 0] / width * 2 - 1, points[..., 1] / height * 2 - 1], dim=-1)
    grid = grid.to(torch.float32).to(frames.device).expand(n, height, width, 2)
    out = F.grid_sample(frames.float(), grid, mode="bilinear", padding_mode="zeros", align_corners=False)
    return out.round_().clamp_(0, 255).to(torch.uint8)

"""Reading the stamps of delivered outputs, whatever their size, dtype and layout (shared by the outputs tests)."""

from __future__ import annotations

import torch

from lightning_vstream.demos.synth import read_stamp


def as_uint8_chw(image: torch.Tensor) -> torch.Tensor:
    """One delivered frame as uint8 ``[3, H, W]``, whatever the output's dtype (0..1 floats) and layout."""
    image = image.cpu()
    if image.shape[0] != 3 and image.shape[-1] == 3:
        image = image.movedim(-1, 0)
    if image.is_floating_point():
        image = (image.float() * 255).round().clamp(0, 255).to(torch.uint8)
    return image


def stamp_of(image: torch.Tensor, source: tuple[int, int]) -> tuple[int, int, int]:
    """``(clip, camera, frame)`` stamped into a delivered frame of a ``source`` (width, height) video."""
    image = as_uint8_chw(image)
    resized = tuple(image.shape[-2:]) != (source[1], source[0])
    stamp = read_stamp(image, source_size=source if resized else None)
    return stamp.clip, stamp.camera, stamp.frame

"""The parts of a step: what travels between the stream sampler and a worker, and how parts become a batch's frames.

A step's camera streams are split into parts (:class:`~lightning_vstream.stream.sampler.StreamSampler`);
each part is one :class:`StreamTask` of :class:`StreamRead` s, decoded by one worker
(:class:`~lightning_vstream.stream.worker.StreamDataset`) into a :class:`StreamPart`, which the worker
loader (:class:`~lightning_vstream.stream.worker_loader.StreamDataLoader`) puts into the batch.

Workers return their frames in one of three ways, each put into the batch its own way:

- written into the step's shared batch buffer (the CPU once frame sizes are known): the buffer is
  the batch (:func:`finish_buffer` pins it when asked);
- in a tensor per part (the first steps, GPU decoding): :func:`frame_rows` finds every delivered
  frame by position and :func:`merge_parts` copies them into one batch tensor (or hands the single
  part's tensor on when nothing needs copying);
- one frame at a time (``camera_frames="per_camera"``): :func:`merge_cameras` builds one tensor per
  camera.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch

from lightning_vstream.decode.counters import DecodeStats
from lightning_vstream.errors import VideoDecodeError

__all__ = [
    "StreamPart",
    "StreamRead",
    "StreamTask",
    "Template",
    "finish_buffer",
    "frame_rows",
    "merge_cameras",
    "merge_parts",
]


class StreamRead(NamedTuple):
    """One frame of one camera stream: ``position = slot * num_cameras + camera``.

    ``segment`` is the plan's segment the slot reads (-1: unknown); after a failed read, later
    reads of the same stream and segment fail at once instead of reopening the file.
    ``segment_start`` is the first frame of the segment the slot follows (it keys the
    per-clip augmentation draw).
    """

    position: int
    clip: int
    camera: int
    frame: int
    segment: int = -1
    segment_start: int = 0


class StreamTask(NamedTuple):
    """The index the sampler hands to the dataset: one part of one step.

    ``buffer``, when given, is the step's whole batch ``[slots * cameras, ...]`` (in shared
    memory when workers decode): the dataset writes its reads into their rows directly.
    ``frame_shape``, when known, is the shape every frame of the batch has (after the
    transform); a frame of another shape is a :class:`~lightning_vstream.errors.FrameSizeError`.
    ``output_buffers`` and ``output_shapes`` are the same for each named output.
    """

    epoch: int
    step: int
    part: int
    reads: tuple[StreamRead, ...]
    buffer: torch.Tensor | None = None
    frame_shape: tuple[int, ...] | None = None
    output_buffers: Mapping[str, torch.Tensor] | None = None
    output_shapes: Mapping[str, tuple[int, ...]] | None = None


@dataclass
class StreamPart:
    """What a worker returns for one :class:`StreamTask`."""

    epoch: int
    step: int
    part: int
    worker_key: tuple[int, int]
    positions: list[int]
    frames: torch.Tensor | list[torch.Tensor | None] | None  # a list only when frame sizes differ
    timestamps: list[float]
    stats: DecodeStats = field(default_factory=DecodeStats)
    failed: list[tuple[int, str, str]] = field(default_factory=list)  # (position, file, error)
    annotations: dict[int, dict[str, Any]] = field(default_factory=dict)  # slot -> its frame's annotations
    missing: list[tuple[int, str]] = field(default_factory=list)  # (slot, why its annotation is missing)
    geometry: dict[int, Any] = field(default_factory=dict)  # position -> img_aug_matrix [3, 3] (numpy)
    images: dict[int, torch.Tensor] = field(default_factory=dict)  # position -> frame (camera_frames="per_camera")
    # Per named output: what ``frames``, ``images`` and ``geometry`` hold for the default output.
    outputs: dict[str, torch.Tensor | list[torch.Tensor | None] | None] = field(default_factory=dict)
    output_images: dict[str, dict[int, torch.Tensor]] = field(default_factory=dict)
    output_geometry: dict[str, dict[int, Any]] = field(default_factory=dict)

    def output(self, name: str) -> StreamPart:
        """This part as seen by one output: its frames, images and geometry in the default output's fields."""
        if not name:
            return self
        return StreamPart(
            self.epoch,
            self.step,
            self.part,
            self.worker_key,
            self.positions,
            self.outputs.get(name),
            self.timestamps,
            self.stats,
            self.failed,
            geometry=self.output_geometry.get(name, {}),
            images=self.output_images.get(name, {}),
        )


#: Shape, dtype and device of an output's frames.
Template = tuple[tuple[int, ...], torch.dtype, torch.device]


def frame_rows(parts: list[StreamPart]) -> dict[int, torch.Tensor]:
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


def finish_buffer(buffer: torch.Tensor, valid: list[bool], cams: int, *, pin: bool) -> torch.Tensor:
    """A batch the workers wrote into: rows of invalid slots zeroed, pinned when ``pin`` (and CUDA is available)."""
    rows = buffer.view(len(valid), cams, *buffer.shape[1:])
    for slot, ok in enumerate(valid):
        if not ok:
            rows[slot].zero_()  # padding and failed slots hold zeros, not stale memory
    if pin and torch.cuda.is_available():
        return buffer.pin_memory()
    return buffer


def merge_parts(
    step: int,
    parts: list[StreamPart],
    rows: dict[int, torch.Tensor],
    valid: list[bool],
    cams: int,
    batch_size: int,
    template: Template | None,
    *,
    pin: bool,
) -> tuple[torch.Tensor, tuple[int, ...]]:
    """One ``[batch_size * cams, ...]`` tensor of the frames in ``rows`` (see :func:`frame_rows`), and a frame's shape.

    Raises:
        VideoDecodeError: No frame size is known yet (``template`` is None) to pad with.

    Example::

        >>> frames, shape = merge_parts(0, parts, frame_rows(parts), [True, True], 6, 2, template, pin=False)  # doctest: +SKIP
    """
    if template is None:
        raise VideoDecodeError(f"every camera read of step {step} failed; no frame size is known yet to pad with.")
    shape, dtype, device = template
    complete = all(valid)
    only = parts[0].frames if len(parts) == 1 else None
    if complete and isinstance(only, torch.Tensor) and not pin:
        return only, shape  # one part, every read delivered at the batch's size: no copy
    pinned = pin and device.type == "cpu" and torch.cuda.is_available()
    alloc = torch.empty if complete else torch.zeros  # padding and failed slots stay zero
    frames = alloc((batch_size * cams, *shape), dtype=dtype, device=device, pin_memory=pinned)
    for pos, row in rows.items():
        if valid[pos // cams]:
            if device.type == "cpu":
                frames[pos].numpy()[...] = row.numpy()  # single-threaded memcpy
            else:
                frames[pos].copy_(row)
    return frames, shape


def merge_cameras(
    step: int,
    parts: list[StreamPart],
    valid: list[bool],
    cams: int,
    batch_size: int,
    templates: dict[int, Template],
    *,
    pin: bool,
) -> list[torch.Tensor]:
    """``camera_frames="per_camera"``: one ``[batch_size, 3, H_c, W_c]`` tensor per camera.

    ``templates`` holds each camera's frame shape, dtype and device as last seen (updated here), to pad
    a step where every read of a camera failed.
    """
    images = {pos: image for part in parts for pos, image in part.images.items()}
    out = []
    for cam in range(cams):
        sample = next((image for pos, image in images.items() if pos % cams == cam), None)
        if sample is not None:
            templates[cam] = (tuple(sample.shape), sample.dtype, sample.device)
        template = templates.get(cam)
        if template is None:
            raise VideoDecodeError(
                f"every read of camera {cam} failed at step {step}; no frame size is known yet to pad with."
            )
        shape, dtype, device = template
        pinned = pin and device.type == "cpu" and torch.cuda.is_available()
        frames = torch.zeros((batch_size, *shape), dtype=dtype, device=device, pin_memory=pinned)
        for slot in range(batch_size):
            image = images.get(slot * cams + cam)
            if image is not None and valid[slot]:
                frames[slot].copy_(image)
        out.append(frames)
    return out

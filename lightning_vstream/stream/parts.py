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
    "PartFrames",
    "ReadFailure",
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


class ReadFailure(NamedTuple):
    """A camera read of a part that failed (``on_error="skip"``): the stream, its file and the error."""

    position: int
    path: str
    error: str


@dataclass
class PartFrames:
    """One output's frames of a part (``""``: the default output, else a named one).

    Attributes:
        stacked: The part's frames in the order of its reads, one tensor (a list only when frame
            sizes differ; None where a read failed); None when the frames were written into the
            step's shared buffer, or are returned one by one.
        images: Position -> frame, one by one (``camera_frames="per_camera"``).
        geometry: Position -> ``img_aug_matrix`` ``[3, 3]`` (numpy) of the frame.
    """

    stacked: torch.Tensor | list[torch.Tensor | None] | None = None
    images: dict[int, torch.Tensor] = field(default_factory=dict)
    geometry: dict[int, Any] = field(default_factory=dict)


@dataclass
class StreamPart:
    """What a worker returns for one :class:`StreamTask`.

    Attributes:
        epoch: The task's epoch.
        step: The task's step.
        part: The task's part of the step.
        worker: ``(process id, worker id)`` of the process that decoded it (counters are per process).
        positions: The streams read, in the order of the task's reads.
        timestamps: Presentation time of each frame read (NaN where a read failed).
        stats: The counters of the process that decoded it, as they were then.
        failed: The reads that failed (``on_error="skip"``).
        annotations: Slot -> the annotations of its frame (looked up by the part reading camera 0).
        missing: ``(slot, why)`` of the slots whose annotation is missing.
        frames: Per output, the frames.
    """

    epoch: int
    step: int
    part: int
    worker: tuple[int, int]
    positions: list[int]
    timestamps: list[float]
    stats: DecodeStats = field(default_factory=DecodeStats)
    failed: list[ReadFailure] = field(default_factory=list)
    annotations: dict[int, dict[str, Any]] = field(default_factory=dict)
    missing: list[tuple[int, str]] = field(default_factory=list)
    frames: dict[str, PartFrames] = field(default_factory=dict)


#: Shape, dtype and device of an output's frames.
Template = tuple[tuple[int, ...], torch.dtype, torch.device]


def frame_rows(parts: list[StreamPart], key: str) -> dict[int, torch.Tensor]:
    """Each delivered frame of output ``key`` by its position (no buffer: frames came in per-part tensors)."""
    rows: dict[int, torch.Tensor] = {}
    for part in parts:
        stacked = part.frames[key].stacked
        if stacked is None:
            continue
        bad = {failure.position for failure in part.failed}
        for row, pos in enumerate(part.positions):
            frame = stacked[row]
            if pos not in bad and frame is not None:
                rows[pos] = frame
    return rows


def finish_buffer(buffer: torch.Tensor, *, pin: bool) -> torch.Tensor:
    """A batch the workers wrote into, pinned when ``pin`` (and CUDA is available)."""
    if pin and torch.cuda.is_available():
        return buffer.pin_memory()
    return buffer


def merge_parts(
    step: int,
    parts: list[StreamPart],
    key: str,
    rows: dict[int, torch.Tensor],
    valid: list[bool],
    cams: int,
    batch_size: int,
    template: Template | None,
    *,
    pin: bool,
) -> tuple[torch.Tensor, tuple[int, ...]]:
    """One ``[batch_size * cams, ...]`` tensor of output ``key``'s frames in ``rows`` (see :func:`frame_rows`),
    and a frame's shape. Rows of slots that are not valid are left for the batch to zero.

    Raises:
        VideoDecodeError: No frame size is known yet (``template`` is None) to pad with.

    Example::

        >>> frames, shape = merge_parts(0, parts, "", frame_rows(parts, ""), [True, True], 6, 2, template, pin=False)  # doctest: +SKIP
    """
    if template is None:
        raise VideoDecodeError(f"every camera read of step {step} failed; no frame size is known yet to pad with.")
    shape, dtype, device = template
    only = parts[0].frames[key].stacked if len(parts) == 1 else None
    if all(valid) and isinstance(only, torch.Tensor) and not pin:
        return only, shape  # one part, every read delivered at the batch's size: no copy
    pinned = pin and device.type == "cpu" and torch.cuda.is_available()
    frames = torch.empty((batch_size * cams, *shape), dtype=dtype, device=device, pin_memory=pinned)
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
    key: str,
    valid: list[bool],
    cams: int,
    batch_size: int,
    templates: dict[int, Template],
    *,
    pin: bool,
) -> list[torch.Tensor]:
    """``camera_frames="per_camera"``: one ``[batch_size, 3, H_c, W_c]`` tensor of output ``key`` per camera.

    ``templates`` holds each camera's frame shape, dtype and device as last seen (updated here), to pad
    a step where every read of a camera failed. Rows of slots that are not valid are left for the
    batch to zero.
    """
    images = {pos: image for part in parts for pos, image in part.frames[key].images.items()}
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
        frames = torch.empty((batch_size, *shape), dtype=dtype, device=device, pin_memory=pinned)
        for slot in range(batch_size):
            image = images.get(slot * cams + cam)
            if image is not None and valid[slot]:
                frames[slot].copy_(image)
        out.append(frames)
    return out

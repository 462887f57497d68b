"""What travels between the stream sampler and a worker: the reads of one part of a step, and what comes back.

A step's camera streams are split into parts (:class:`~lightning_vstream.stream.sampler.StreamSampler`);
each part is one :class:`StreamTask` of :class:`StreamRead` s, decoded by one worker
(:class:`~lightning_vstream.stream.worker.StreamDataset`) into a :class:`StreamPart`, which the loader
assembles into the batch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch

from lightning_vstream.decode.counters import DecodeStats

__all__ = ["StreamPart", "StreamRead", "StreamTask"]


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

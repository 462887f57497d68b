"""Synthetic annotations for stamped datasets: every value encodes the clip and frame it belongs to.

Written by ``write_dataset(..., annotations=True)`` into ``<root>/annotations/<clip_id>.npz``
(format: :mod:`lightning_vstream.annotations.files`). For clip ``c``, frame ``i`` at ``fps``:

- ``scene_token`` = ``"token-<clip_id>"``; ``class_names`` = ``SYNTH_CLASSES``;
- ``intrinsics`` [C, 3, 3]: focal ``width / 2`` pixels, principal point at the frame centre;
- ``extrinsics`` [C, 4, 4]: sensor-to-ego; camera ``k`` looks along yaw ``k * 60`` degrees from
  ``(1 + 0.1 k, 0, 1.5)`` metres (camera axes x right, y down, z forward);
- ``ego_pose`` [4, 4]: ego-to-global, translation ``(i, c, 0)``;
- ``token`` = ``"<clip_id>:<i>"``; ``is_key_frame`` = ``i % 6 == 0``;
- ``boxes`` [i % 4, 9]: box ``j`` has centre ``(i, c, j)`` and size ``(1, 2, 1.5)``; ``labels`` [i % 4] = ``j % 3``;
- ``timestamp`` = ``i / fps`` and ``frame_index`` = ``i`` (rows for every frame).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np

__all__ = ["SYNTH_CLASSES", "synth_extrinsics", "synth_intrinsics", "write_synthetic_annotations"]

SYNTH_CLASSES = ("car", "pedestrian", "cyclist")


def synth_intrinsics(width: int, height: int) -> np.ndarray:
    """The pinhole matrix of a synthetic camera of ``width x height`` pixels."""
    f = width / 2
    return np.array([[f, 0.0, width / 2], [0.0, f, height / 2], [0.0, 0.0, 1.0]], dtype=np.float32)


def synth_extrinsics(camera: int) -> np.ndarray:
    """Sensor-to-ego transform of synthetic camera ``camera``."""
    to_ego = np.array([[0.0, 0.0, 1.0], [-1.0, 0.0, 0.0], [0.0, -1.0, 0.0]])  # camera x,y,z -> ego axes
    yaw = math.radians(60.0 * camera)
    rz = np.array([[math.cos(yaw), -math.sin(yaw), 0.0], [math.sin(yaw), math.cos(yaw), 0.0], [0.0, 0.0, 1.0]])
    out = np.eye(4)
    out[:3, :3] = rz @ to_ego
    out[:3, 3] = (1.0 + 0.1 * camera, 0.0, 1.5)
    return out.astype(np.float32)


def write_synthetic_annotations(
    folder: Path | str,
    *,
    clip_ids: Sequence[str],
    clip_numbers: Sequence[int],
    camera_names: Sequence[str],
    frame_counts: Sequence[int],
    size: tuple[int, int],
    fps: float,
) -> Path:
    """Write the annotations described above for every clip; returns ``folder``.

    Example::

        >>> write_synthetic_annotations("/tmp/ann", clip_ids=["scene-0000"], clip_numbers=[0],
        ...                             camera_names=["CAM_FRONT"], frame_counts=[4], size=(64, 48),
        ...                             fps=12.0)  # doctest: +SKIP
    """
    from lightning_vstream.annotations.files import write_clip_annotations

    width, height = size
    intrinsics = np.stack([synth_intrinsics(width, height)] * len(camera_names))
    extrinsics = np.stack([synth_extrinsics(k) for k in range(len(camera_names))])
    for clip_id, number, count in zip(clip_ids, clip_numbers, frame_counts, strict=True):
        frames = []
        for i in range(count):
            pose = np.eye(4, dtype=np.float32)
            pose[:3, 3] = (i, number, 0.0)
            boxes = np.zeros((i % 4, 9), dtype=np.float32)
            boxes[:, 0], boxes[:, 1], boxes[:, 2] = i, number, np.arange(i % 4)
            boxes[:, 3:6] = (1.0, 2.0, 1.5)
            frames.append(
                {
                    "frame_index": i,
                    "timestamp": i / fps,
                    "ego_pose": pose,
                    "token": f"{clip_id}:{i}",
                    "is_key_frame": i % 6 == 0,
                    "boxes": boxes,
                    "labels": np.arange(i % 4, dtype=np.int64) % 3,
                }
            )
        write_clip_annotations(
            folder,
            clip_id,
            frames=frames,
            camera_names=list(camera_names),
            clip={"scene_token": f"token-{clip_id}", "class_names": np.array(SYNTH_CLASSES)},
            camera={"intrinsics": intrinsics, "extrinsics": extrinsics},
            ragged=("boxes", "labels"),
        )
    return Path(folder)

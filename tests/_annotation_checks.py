"""Checks shared by the annotation tests and their DDP script: do annotations and geometry match the pixels?"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lightning_vstream.annotations import write_clip_annotations
from lightning_vstream.demos.synth import Stamp, _bits, _cell, clip_number
from lightning_vstream.demos.synth_annotations import synth_intrinsics


def frame_annotation_errors(ann: dict[str, Any], where: str, clip_id: str, frame: int) -> list[str]:
    """``ann`` holds one frame's fields (as written by write_synthetic_annotations); do they encode (clip, frame)?"""
    number = clip_number(clip_id)
    errors = []
    if ann["token"] != f"{clip_id}:{frame}":
        errors.append(f"{where}: token {ann['token']!r} for {clip_id} frame {frame}")
    if ann["scene_token"] != f"token-{clip_id}":
        errors.append(f"{where}: scene_token {ann['scene_token']!r} for {clip_id}")
    pose = ann["ego_pose"]
    if (float(pose[0, 3]), float(pose[1, 3])) != (frame, number):
        errors.append(f"{where}: ego_pose translation {pose[:2, 3].tolist()} for clip {number} frame {frame}")
    boxes = ann["boxes"]
    if boxes.shape[0] != frame % 4 or (boxes.shape[0] and not bool((boxes[:, 0] == frame).all())):
        errors.append(f"{where}: boxes {boxes[:, :2].tolist()} for frame {frame}")
    if bool(ann["is_key_frame"]) != (frame % 6 == 0):
        errors.append(f"{where}: is_key_frame {bool(ann['is_key_frame'])} for frame {frame}")
    return errors


def stream_annotation_errors(batch: dict[str, Any]) -> list[str]:
    """Every valid slot of a streaming batch whose annotations do not encode its clip and frame."""
    errors = []
    ann = batch["annotations"]
    for slot in range(len(batch["clip_id"])):
        if not bool(batch["valid"][slot]):
            continue
        clip_id, frame = batch["clip_id"][slot], int(batch["frame_index"][slot])
        if not bool(batch["has_annotations"][slot]):
            errors.append(f"step {batch['step']} slot {slot}: has_annotations is False")
            continue
        one = {k: ann[k][slot] for k in ("token", "scene_token", "ego_pose", "boxes", "is_key_frame")}
        errors += frame_annotation_errors(one, f"step {batch['step']} slot {slot}", clip_id, frame)
    return errors


def projection_errors(
    frames: torch.Tensor,
    intrinsics: torch.Tensor,
    extrinsics: torch.Tensor,
    clip: int,
    frame: int,
    native: Sequence[tuple[int, int]],
    depth: float = 5.0,
) -> tuple[list[str], int]:
    """Project the centre of every stamp cell through ego space with the delivered calibration.

    For camera ``c`` of native size ``native[c]`` (width, height): the cell centre's viewing ray
    at ``depth`` metres, taken to ego coordinates with the extrinsics, is projected back with the
    delivered intrinsics; the delivered pixel there must be white exactly where the stamp bit is 1.
    Returns the mismatches and the number of points checked.
    """
    errors: list[str] = []
    checked = 0
    height, width = frames.shape[-2:]
    for cam in range(frames.shape[0]):
        w0, h0 = native[cam]
        k0 = torch.from_numpy(synth_intrinsics(w0, h0)).double()
        cell = _cell(w0, h0)
        e = extrinsics[cam].double()
        k = intrinsics[cam].double()
        for i, bit in enumerate(_bits(Stamp(clip, cam, frame))):
            row, col = divmod(i, 8)
            u, v = (col + 0.5) * cell, (row + 0.5) * cell
            ray = torch.linalg.solve(k0, torch.tensor([u, v, 1.0], dtype=torch.float64)) * depth
            ego = e @ torch.cat([ray, torch.ones(1, dtype=torch.float64)])
            cam_point = torch.linalg.solve(e, ego)[:3]
            x, y, z = (k @ cam_point).tolist()
            x, y = x / z, y / z
            if not (1 <= x < width - 1 and 1 <= y < height - 1):
                continue
            checked += 1
            value = frames[cam, :, int(y), int(x)].float().mean().item()
            if (value >= 128) != bool(bit):
                errors.append(f"camera {cam} cell {i} (bit {bit}) projects to ({x:.1f}, {y:.1f}) holding {value:.0f}")
    return errors, checked


def holey_annotations(ann_index: Path, tmp_path: Path) -> Path:
    """A copy of the annotations in which clip scene-0001 lacks its odd frames."""
    folder = tmp_path / "annotations"
    shutil.copytree(ann_index.parent / "annotations", folder)
    with np.load(folder / "scene-0001.npz") as data:
        keep = data["frame_index"] % 2 == 0
        counts = data["frame.boxes.lengths"]
        starts = np.concatenate([[0], np.cumsum(counts)])
        frames = []
        for row in np.nonzero(keep)[0]:
            boxes = data["frame.boxes"][starts[row] : starts[row + 1]]
            labels = data["frame.labels"][starts[row] : starts[row + 1]]
            frames.append(
                {
                    "frame_index": int(data["frame_index"][row]),
                    "ego_pose": data["frame.ego_pose"][row],
                    "token": str(data["frame.token"][row]),
                    "is_key_frame": bool(data["frame.is_key_frame"][row]),
                    "boxes": boxes,
                    "labels": labels,
                }
            )
        write_clip_annotations(
            folder,
            "scene-0001",
            frames=frames,
            camera_names=list(data["camera_names"]),
            clip={"scene_token": str(data["clip.scene_token"]), "class_names": data["clip.class_names"]},
            camera={"intrinsics": data["camera.intrinsics"], "extrinsics": data["camera.extrinsics"]},
            ragged=("boxes", "labels"),
        )
    return folder


#: Camera name -> (width, height) of the rig written by :func:`write_mixed_rig`.
MIXED_SIZES = {"CAM_A": (96, 64), "CAM_B": (128, 72)}


def write_mixed_rig(root: Path) -> Path:
    """Two clips of 6 frames whose two cameras differ in resolution, with calibration only."""
    from lightning_vstream.demos.synth import write_stamped_video
    from lightning_vstream.demos.synth_annotations import synth_extrinsics
    from lightning_vstream.indexing import build_index

    for clip in range(2):
        for cam, (name, size) in enumerate(MIXED_SIZES.items()):
            write_stamped_video(
                root / "videos" / f"scene-{clip:04d}" / f"{name}.mp4", clip=clip, camera=cam, frames=6, size=size, gop=3
            )
        write_clip_annotations(
            root / "annotations",
            f"scene-{clip:04d}",
            camera_names=list(MIXED_SIZES),
            camera={
                "intrinsics": np.stack([synth_intrinsics(*s) for s in MIXED_SIZES.values()]),
                "extrinsics": np.stack([synth_extrinsics(c) for c in range(2)]),
            },
            frames=[{"frame_index": i} for i in range(6)],
        )
    return build_index(root, output=root / "index.json", video_dirs=["videos"], progress=False)

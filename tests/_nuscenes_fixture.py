"""A small synthetic dataset in the nuScenes layout: JSON tables plus stamped camera JPEGs.

``write_nuscenes(root)`` writes ``root/<version>/*.json`` with the real nuScenes field names and
``root/samples/CAM_*/...jpg`` (key frames) and ``root/sweeps/CAM_*/...jpg`` (sweeps). Every image
is stamped with (scene number, camera position in the sorted camera list, capture cycle), so a
test can tell which source image a decoded frame came from.

Timing follows the real rig: capture cycles at about 12 Hz with jitter, the cameras of a cycle a
few milliseconds apart, a key frame (sample) every ``sweeps_between + 1`` cycles, one sweep before
the first sample and one after the last. ``drop`` removes single images (a camera missing a cycle).

Geometry is checkable through the pixels: every image also shows a red marker where a fixed
global landmark (200 m ahead of the camera at its first frame) projects, computed here from the
fixture's own matrices with nuScenes' convention (pixel centres at integer coordinates).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from lightning_vstream.demos.synth import Stamp, draw_stamp

CAMERAS = ("CAM_BACK", "CAM_FRONT", "CAM_FRONT_LEFT")
CATEGORIES = ("vehicle.car", "human.pedestrian.adult", "movable_object.barrier", "animal")
BASE_US = 1_532_402_927_000_123  # a real-looking UNIX time in microseconds (odd, to catch rounding)
PERIOD_US = 83_333


def token(*parts: Any) -> str:
    return hashlib.md5("/".join(str(p) for p in parts).encode()).hexdigest()


def quaternion_z(yaw: float) -> list[float]:
    return [math.cos(yaw / 2), 0.0, 0.0, math.sin(yaw / 2)]


@dataclass
class FixtureInfo:
    root: Path
    version: str
    scenes: list[str]
    cameras: tuple[str, ...]
    dropped: list[tuple[int, str, int]]
    landmarks: dict[tuple[int, str], np.ndarray] = field(default_factory=dict)  # global [x, y, z, 1]
    cycles: dict[int, int] = field(default_factory=dict)  # scene number -> cycles written
    key_cycles: list[int] = field(default_factory=list)


def _camera_rotation(yaw: float, rng: np.random.Generator) -> np.ndarray:
    """Sensor-to-ego rotation of a camera looking along ``yaw`` (x right, y down, z forward), slightly tilted."""
    forward = np.array([math.cos(yaw), math.sin(yaw), 0.0])
    right = np.array([math.sin(yaw), -math.cos(yaw), 0.0])
    base = np.stack([right, [0.0, 0.0, -1.0], forward], axis=1)
    axis = rng.normal(size=3)
    axis /= np.linalg.norm(axis)
    angle = 0.05
    k = np.array([[0, -axis[2], axis[1]], [axis[2], 0, -axis[0]], [-axis[1], axis[0], 0]])
    tilt = np.eye(3) + math.sin(angle) * k + (1 - math.cos(angle)) * k @ k
    return base @ tilt


def _matrix_quaternion(r: np.ndarray) -> list[float]:
    """[w, x, y, z] of a rotation matrix (w > 0 branch suffices for these small-angle-plus-yaw rotations)."""
    w = math.sqrt(max(0.0, 1.0 + r[0, 0] + r[1, 1] + r[2, 2])) / 2
    if w > 1e-3:
        return [w, (r[2, 1] - r[1, 2]) / (4 * w), (r[0, 2] - r[2, 0]) / (4 * w), (r[1, 0] - r[0, 1]) / (4 * w)]
    x = math.sqrt(max(0.0, 1.0 + r[0, 0] - r[1, 1] - r[2, 2])) / 2
    return [(r[2, 1] - r[1, 2]) / (4 * x), x, (r[0, 1] + r[1, 0]) / (4 * x), (r[0, 2] + r[2, 0]) / (4 * x)]


def _pose(translation: list[float], yaw: float) -> np.ndarray:
    out = np.eye(4)
    out[:3, :3] = [[math.cos(yaw), -math.sin(yaw), 0], [math.sin(yaw), math.cos(yaw), 0], [0, 0, 1]]
    out[:3, 3] = translation
    return out


def write_nuscenes(
    root: Path,
    *,
    version: str = "v1.0-mini",
    scenes: int = 2,
    cameras: tuple[str, ...] = CAMERAS,
    samples: int = 3,
    sweeps_between: int = 3,
    size: tuple[int, int] = (256, 96),
    drop: tuple[tuple[int, str, int], ...] = ((1, "CAM_FRONT", 3),),
) -> FixtureInfo:
    """Write the dataset; ``drop`` lists (scene number, camera, cycle) images that are missing."""
    rng = np.random.default_rng(0)
    cams = tuple(sorted(cameras))
    tables: dict[str, list[dict[str, Any]]] = {
        name: []
        for name in (
            "attribute",
            "calibrated_sensor",
            "category",
            "ego_pose",
            "instance",
            "log",
            "map",
            "sample",
            "sample_annotation",
            "sample_data",
            "scene",
            "sensor",
            "visibility",
        )
    }
    for name in CATEGORIES:
        tables["category"].append({"token": token("category", name), "name": name, "description": name})
    tables["visibility"].append({"token": "4", "level": "v80-100", "description": "visibility of whole object"})
    sensors = {c: token("sensor", c) for c in (*cams, "LIDAR_TOP")}
    for channel, tok in sensors.items():
        tables["sensor"].append(
            {"token": tok, "channel": channel, "modality": "lidar" if channel == "LIDAR_TOP" else "camera"}
        )
    cycles_per_scene = 1 + samples + (samples - 1) * sweeps_between + 1
    key_cycles = [1 + m * (sweeps_between + 1) for m in range(samples)]
    width, height = size
    info = FixtureInfo(root, version, [], cams, list(drop), key_cycles=key_cycles)
    for s in range(scenes):
        name = f"scene-{s:04d}"
        info.scenes.append(name)
        info.cycles[s] = cycles_per_scene
        log_tok, scene_tok = token("log", s), token("scene", s)
        tables["log"].append(
            {
                "token": log_tok,
                "logfile": f"n015-2018-07-24-11-22-45+0800-{s}",
                "vehicle": "n015",
                "date_captured": "2018-07-24",
                "location": "singapore-onenorth",
            }
        )
        calib, sensor_to_ego, intrinsic = {}, {}, {}
        for k, cam in enumerate(cams):
            calib[cam] = token("calibrated_sensor", s, cam)
            focal = 50.0 + 3 * k + s
            rotation = _camera_rotation(2 * math.pi * k / len(cams), rng)
            translation = [1.0 + 0.1 * k, 0.25 * k - 0.3, 1.5 + 0.01 * s]
            sensor_to_ego[cam] = np.eye(4)
            sensor_to_ego[cam][:3, :3], sensor_to_ego[cam][:3, 3] = rotation, translation
            # The principal point sits right of the stamp, so the landmark marker stays clear of it.
            intrinsic[cam] = [[focal, 0.0, 176.0 + 0.25 * k], [0.0, focal, height / 2], [0.0, 0.0, 1.0]]
            tables["calibrated_sensor"].append(
                {
                    "token": calib[cam],
                    "sensor_token": sensors[cam],
                    "translation": translation,
                    "rotation": _matrix_quaternion(rotation),
                    "camera_intrinsic": intrinsic[cam],
                }
            )
        calib["LIDAR_TOP"] = token("calibrated_sensor", s, "LIDAR_TOP")
        tables["calibrated_sensor"].append(
            {
                "token": calib["LIDAR_TOP"],
                "sensor_token": sensors["LIDAR_TOP"],
                "translation": [0.9, 0.0, 1.8],
                "rotation": [1.0, 0.0, 0.0, 0.0],
                "camera_intrinsic": [],
            }
        )
        t0 = BASE_US + s * 60_000_000
        cycle_time = [t0 + j * PERIOD_US + int(rng.integers(-400, 400)) for j in range(cycles_per_scene)]
        sample_tokens = [token("sample", s, m) for m in range(samples)]
        for m, j in enumerate(key_cycles):
            tables["sample"].append(
                {
                    "token": sample_tokens[m],
                    "timestamp": cycle_time[j] + 3_000,
                    "scene_token": scene_tok,
                    "prev": sample_tokens[m - 1] if m else "",
                    "next": sample_tokens[m + 1] if m + 1 < samples else "",
                }
            )
            lidar_tok = token("sample_data", s, "LIDAR_TOP", j)
            pose_tok = token("ego_pose", s, "LIDAR_TOP", j)
            tables["ego_pose"].append(
                {
                    "token": pose_tok,
                    "timestamp": cycle_time[j] + 3_000,
                    "translation": [0.0, 0.0, 0.0],
                    "rotation": [1.0, 0.0, 0.0, 0.0],
                }
            )
            tables["sample_data"].append(
                {
                    "token": lidar_tok,
                    "sample_token": sample_tokens[m],
                    "ego_pose_token": pose_tok,
                    "calibrated_sensor_token": calib["LIDAR_TOP"],
                    "timestamp": cycle_time[j] + 3_000,
                    "fileformat": "pcd",
                    "is_key_frame": True,
                    "height": 0,
                    "width": 0,
                    "filename": f"samples/LIDAR_TOP/{lidar_tok}.pcd.bin",
                    "prev": "",
                    "next": "",
                }
            )
        tables["scene"].append(
            {
                "token": scene_tok,
                "log_token": log_tok,
                "nbr_samples": samples,
                "first_sample_token": sample_tokens[0],
                "last_sample_token": sample_tokens[-1],
                "name": name,
                "description": f"synthetic scene {s}",
            }
        )
        for k, cam in enumerate(cams):
            # Grey 8x8 blocks (nothing red, so the landmark marker stands out after compression).
            blocks = np.random.default_rng(s * 10 + k).integers(40, 200, (height // 8, width // 8, 1))
            texture = np.kron(blocks, np.ones((8, 8, 3), dtype=np.int64)).astype(np.uint8)
            records = []
            for j in range(cycles_per_scene):
                if (s, cam, j) in drop:
                    continue
                stamp_us = cycle_time[j] + 7_000 * k + int(rng.integers(0, 300))
                is_key = j in key_cycles
                # A sweep points to the sample that follows it (the last sample after the last one).
                m = next((m for m, kj in enumerate(key_cycles) if kj >= j), samples - 1)
                folder = "samples" if is_key else "sweeps"
                filename = f"{folder}/{cam}/n015-2018-07-24-11-22-45+0800__{cam}__{stamp_us}.jpg"
                image = np.roll(texture, 3 * j, axis=1).copy()
                draw_stamp(image, Stamp(s, k, j))
                t_rel = (stamp_us - t0) / 1e6
                ego_translation = [600.0 + 10.0 * t_rel, 1600.0 + 0.5 * t_rel + s, 0.0]
                ego_yaw = 0.3 + 0.05 * t_rel + s
                camera_to_global = _pose(ego_translation, ego_yaw) @ sensor_to_ego[cam]
                if (s, cam) not in info.landmarks:
                    info.landmarks[(s, cam)] = camera_to_global @ np.array([3.0, -2.0, 200.0, 1.0])
                x, y, z, _ = np.linalg.inv(camera_to_global) @ info.landmarks[(s, cam)]
                u, v, _ = np.asarray(intrinsic[cam]) @ np.array([x / z, y / z, 1.0])
                col, row = round(u), round(v)  # nuScenes' pixel (col, row) has its centre at (col, row)
                assert 100 <= col < width - 3 and 3 <= row < height - 3, (u, v)
                image[row - 2 : row + 3, col - 2 : col + 3] = (255, 0, 0)
                path = root / filename
                path.parent.mkdir(parents=True, exist_ok=True)
                Image.fromarray(image).save(path, quality=95)
                pose_tok = token("ego_pose", s, cam, j)
                tables["ego_pose"].append(
                    {
                        "token": pose_tok,
                        "timestamp": stamp_us,
                        "translation": ego_translation,
                        "rotation": quaternion_z(ego_yaw),
                    }
                )
                records.append(
                    {
                        "token": token("sample_data", s, cam, j),
                        "sample_token": sample_tokens[m],
                        "ego_pose_token": pose_tok,
                        "calibrated_sensor_token": calib[cam],
                        "timestamp": stamp_us,
                        "fileformat": "jpg",
                        "is_key_frame": is_key,
                        "height": height,
                        "width": width,
                        "filename": filename,
                        "prev": "",
                        "next": "",
                    }
                )
            for a, b in itertools.pairwise(records):
                a["next"], b["prev"] = b["token"], a["token"]
            tables["sample_data"].extend(records)
        # Boxes: a car and a pedestrian in every sample, a barrier in the middle one only.
        for i, (category, present) in enumerate(
            (
                (CATEGORIES[0], range(samples)),
                (CATEGORIES[1], range(samples)),
                (CATEGORIES[2], range(samples // 2, samples // 2 + 1)),
            )
        ):
            inst_tok = token("instance", s, i)
            ann_toks = [token("sample_annotation", s, i, m) for m in present]
            tables["instance"].append(
                {
                    "token": inst_tok,
                    "category_token": token("category", category),
                    "nbr_annotations": len(ann_toks),
                    "first_annotation_token": ann_toks[0],
                    "last_annotation_token": ann_toks[-1],
                }
            )
            for n, m in enumerate(present):
                t = (cycle_time[key_cycles[m]] - t0) / 1e6
                tables["sample_annotation"].append(
                    {
                        "token": ann_toks[n],
                        "sample_token": sample_tokens[m],
                        "instance_token": inst_tok,
                        "visibility_token": "4",
                        "attribute_tokens": [],
                        "translation": [610.0 + 4.0 * i + 8.0 * t, 1603.0 - 2.0 * i + s, 0.8 + 0.1 * i],
                        "size": [1.9 - 0.5 * i, 4.5 - 1.5 * i, 1.6 + 0.1 * i],
                        "rotation": quaternion_z(0.2 * i - 1.0 + 0.1 * m),
                        "prev": ann_toks[n - 1] if n else "",
                        "next": ann_toks[n + 1] if n + 1 < len(ann_toks) else "",
                        "num_lidar_pts": 10 * (i + 1),
                        "num_radar_pts": i,
                    }
                )
    folder = root / version
    folder.mkdir(parents=True, exist_ok=True)
    for name, rows in tables.items():
        (folder / f"{name}.json").write_text(json.dumps(rows, indent=0))
    return info

"""Importing nuScenes (or any dataset in its layout) into encoded videos plus annotation files.

``import_nuscenes(DATAROOT, OUT_DIR)`` reads the tables under ``DATAROOT/<version>/`` and the
camera JPEGs under ``DATAROOT/samples/`` and ``DATAROOT/sweeps/``, and writes:

- ``OUT_DIR/videos/<scene name>/<CAM>.mp4``: one video per scene and camera, every frame at its
  ``sample_data.timestamp`` (microseconds, kept exactly: see :mod:`lightning_vstream.encode`);
- ``OUT_DIR/index.json`` and its frame tables;
- ``OUT_DIR/annotations/<scene name>.npz``: calibration, ego poses, boxes, labels and tokens in
  the annotation file format (``docs/training_data.md``), one row per video frame.

Frame ``i`` of every camera of a scene is one **capture cycle** of the rig: the cameras fire one
after another within a few tens of milliseconds, at 12 Hz. Key frames (the annotated samples,
2 Hz) are aligned by their sample; the sweeps between them are matched by their time after their
camera's previous key frame. A cycle that some camera misses (a dropped frame) is left out for
all cameras, so the cameras stay aligned; its gap remains in the presentation times. See
``docs/import_nuscenes.md`` for the fields and their frames of reference.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from lightning_vstream.encode.settings import MAX_KEYFRAME_STRIDE, CameraSource, EncodeSettings, EncodeSummary
from lightning_vstream.errors import ConfigurationError, DatasetImportError
from lightning_vstream.executors import Executor
from lightning_vstream.importers.nuscenes_tables import (
    NuScenesTables,
    box_velocity,
    quaternion_matrix,
    transform_matrix,
    yaw_of,
)
from lightning_vstream.storage.atomic import open_atomic

__all__ = ["NUSCENES_CAMERAS", "NuScenesImport", "import_nuscenes", "key_frame_stride", "scene_cycles"]

#: The six nuScenes cameras, sorted (the index's camera order).
NUSCENES_CAMERAS = ("CAM_BACK", "CAM_BACK_LEFT", "CAM_BACK_RIGHT", "CAM_FRONT", "CAM_FRONT_LEFT", "CAM_FRONT_RIGHT")
ANNOTATION_FORMAT = "lightning_vstream.annotations"
ANNOTATION_VERSION = 1
BOX_FIELDS = ("x", "y", "z", "w", "l", "h", "yaw", "vx", "vy")
_HALF_PIXEL = np.array([[1.0, 0.0, 0.5], [0.0, 1.0, 0.5], [0.0, 0.0, 1.0]])


@dataclass(frozen=True)
class NuScenesImport:
    """What :func:`import_nuscenes` wrote.

    Attributes:
        index: The written index file.
        annotations: The folder of per-scene annotation files.
        scenes: Scene names imported (the clip ids).
        frames: Frames per camera over all scenes (capture cycles kept).
        key_frames: Key frames (annotated samples) over all scenes.
        left_out: Camera images left out because another camera missed their capture cycle.
        encode: The encoding run's summary (speed, sizes, files skipped as already done).
        keyframe_stride: The stride layout the videos were written in (1: the usual layout): every
            ``keyframe_stride``-th frame, counted from each scene's first, is a reference picture.
        key_frames_on_stride: Key frames at a frame index that is a multiple of ``keyframe_stride``:
            those a stream read at ``plan.frame_stride=keyframe_stride`` from a scene's start delivers
            while decoding only reference pictures. Scenes that start with sweeps, and dropped
            cycles, put key frames off the stride.
    """

    index: Path
    annotations: Path
    scenes: tuple[str, ...]
    frames: int
    key_frames: int
    left_out: int
    encode: EncodeSummary
    keyframe_stride: int = 1
    key_frames_on_stride: int = 0


@dataclass(frozen=True)
class _Cycle:
    records: tuple[dict[str, Any], ...]  # one sample_data record per camera
    sample_token: str | None  # set on key cycles


def _camera_records(tables: NuScenesTables, scene: dict[str, Any], cameras: Sequence[str]) -> dict[str, list]:
    found = tables.camera_data_by_scene.get(scene["token"], {})
    per_camera: dict[str, list[dict[str, Any]]] = {c: found.get(c, []) for c in cameras}
    absent = [c for c, records in per_camera.items() if not records]
    if absent:
        raise DatasetImportError(
            f"scene {scene['name']!r} has no sample_data for camera(s) {absent}; the tables hold cameras "
            f"{sorted(set(tables.camera_channels.values()))}. Pass cameras=[...] (--cameras) with cameras the "
            "scene has."
        )
    for channel, records in per_camera.items():
        times = [r["timestamp"] for r in records]
        if any(b <= a for a, b in itertools.pairwise(times)):
            raise DatasetImportError(
                f"scene {scene['name']!r}, camera {channel!r}: two sample_data records share a "
                "timestamp; every image needs its own time."
            )
    return per_camera


def scene_cycles(
    tables: NuScenesTables, scene: dict[str, Any], cameras: Sequence[str], *, key_frames_only: bool = False
) -> tuple[list[_Cycle], int]:
    """The capture cycles of a scene every camera took part in, in time order, and how many images were left out.

    Key cycles come from the samples (each camera's key frame of the sample); each sweep of the
    first camera is matched, in every other camera, to the sweep whose time after that camera's
    latest key frame is nearest to its own (within half a frame interval, one to one). With
    ``key_frames_only``, only key cycles are returned and only key frames count as left out.

    Example::

        >>> tables = NuScenesTables.load("/data/nuscenes", "v1.0-mini")  # doctest: +SKIP
        >>> cycles, left_out = scene_cycles(tables, tables.records("scene")[0], NUSCENES_CAMERAS)  # doctest: +SKIP
        >>> len(cycles), sum(c.sample_token is not None for c in cycles), left_out  # doctest: +SKIP
        (233, 39, 4)
    """
    per_camera = _camera_records(tables, scene, cameras)
    samples = tables.samples_by_scene.get(scene["token"], [])
    key_of = {c: {r["sample_token"]: r for r in rows if r["is_key_frame"]} for c, rows in per_camera.items()}
    key_samples = [s["token"] for s in samples if all(s["token"] in key_of[c] for c in cameras)]
    if not key_samples:
        raise DatasetImportError(
            f"scene {scene['name']!r} has no sample with a key frame from every camera of "
            f"{list(cameras)}; pass --cameras with cameras the scene has key frames for."
        )
    anchors = {c: [key_of[c][s]["timestamp"] for s in key_samples] for c in cameras}
    used_keys = {c: {key_of[c][s]["token"] for s in key_samples} for c in cameras}
    cycles = [_Cycle(tuple(key_of[c][s] for c in cameras), s) for s in key_samples]
    total = sum(sum(1 for r in rows if r["is_key_frame"] or not key_frames_only) for rows in per_camera.values())
    if not key_frames_only:
        ref = cameras[0]
        intervals = np.diff([r["timestamp"] for r in per_camera[ref]])
        tolerance = 0.5 * float(statistics.median(intervals)) if len(intervals) else 0.0

        def segments(camera: str) -> dict[int, list[tuple[int, dict[str, Any]]]]:
            """Sweeps by the key cycle they follow (-1: before the first), with their offset from it."""
            out: dict[int, list[tuple[int, dict[str, Any]]]] = {}
            for record in per_camera[camera]:
                if record["token"] in used_keys[camera]:
                    continue
                seg = int(np.searchsorted(anchors[camera], record["timestamp"], side="right")) - 1
                anchor = anchors[camera][max(seg, 0)]
                out.setdefault(seg, []).append((record["timestamp"] - anchor, record))
            return out

        by_camera = {c: segments(c) for c in cameras}
        for seg, ref_rows in by_camera[ref].items():
            matched: list[list[dict[str, Any] | None]] = [[r] + [None] * (len(cameras) - 1) for _, r in ref_rows]
            for k, camera in enumerate(cameras[1:], start=1):
                rows = by_camera[camera].get(seg, [])
                pairs = sorted(
                    (abs(o - ro), i, j) for i, (ro, _) in enumerate(ref_rows) for j, (o, _) in enumerate(rows)
                )
                taken_i: set[int] = set()
                taken_j: set[int] = set()
                for diff, i, j in pairs:
                    if diff <= tolerance and i not in taken_i and j not in taken_j:
                        matched[i][k] = rows[j][1]
                        taken_i.add(i)
                        taken_j.add(j)
            complete = [tuple(r for r in m if r is not None) for m in matched]
            cycles.extend(_Cycle(m, None) for m in complete if len(m) == len(cameras))
    cycles.sort(key=lambda c: c.records[0]["timestamp"])
    for k, camera in enumerate(cameras):
        times = [c.records[k]["timestamp"] for c in cycles]
        if any(b <= a for a, b in itertools.pairwise(times)):
            raise DatasetImportError(
                f"scene {scene['name']!r}: camera {camera!r}'s images do not follow the first camera's order once "
                "aligned (its timestamps cross another cycle's); check its sample_data timestamps."
            )
    return cycles, total - len(cycles) * len(cameras)


def key_frame_stride(cycles_per_scene: Sequence[Sequence[_Cycle]]) -> int:
    """How many frames apart the key frames mostly are: the most common spacing of consecutive key cycles.

    nuScenes' cameras record about 12 frames a second and its samples come at 2 Hz, so this is 6
    (a dropped cycle makes a spacing of 5 now and then). 1 when every frame is a key frame or a
    scene has one key frame only; at most :data:`~lightning_vstream.encode.settings.MAX_KEYFRAME_STRIDE`.

    Example::

        >>> key, sweep = _Cycle((), "sample-token"), _Cycle((), None)
        >>> key_frame_stride([([key] + [sweep] * 5) * 3 + [key], [sweep, key, sweep, sweep, key]])
        6
    """
    spacings: collections.Counter[int] = collections.Counter()
    for cycles in cycles_per_scene:
        keys = [i for i, cycle in enumerate(cycles) if cycle.sample_token is not None]
        spacings.update(b - a for a, b in itertools.pairwise(keys))
    if not spacings:
        return 1
    most = max(spacings.values())
    return min(min(s for s, n in spacings.items() if n == most), MAX_KEYFRAME_STRIDE)


def _calibration(
    tables: NuScenesTables, scene: dict[str, Any], cameras: Sequence[str], cycles: Sequence[_Cycle]
) -> tuple[np.ndarray, np.ndarray]:
    intrinsics, extrinsics = [], []
    for k, camera in enumerate(cameras):
        tokens = {c.records[k]["calibrated_sensor_token"] for c in cycles}
        if len(tokens) != 1:
            raise DatasetImportError(
                f"scene {scene['name']!r}, camera {camera!r} uses {len(tokens)} calibrations "
                "within one scene; the importer keeps one calibration per clip."
            )
        cs = tables.get("calibrated_sensor", tokens.pop(), referrer=f"scene {scene['name']!r}, camera {camera!r}")
        matrix = np.asarray(cs["camera_intrinsic"], dtype=np.float64)
        if matrix.shape != (3, 3):
            raise DatasetImportError(
                f"calibrated_sensor {cs['token']!r} (camera {camera!r}) has camera_intrinsic of "
                f"shape {matrix.shape}; expected 3x3."
            )
        # nuScenes puts pixel centres at integer coordinates; the package at i + 0.5 (see the augmentation).
        intrinsics.append(_HALF_PIXEL @ matrix)
        extrinsics.append(transform_matrix(cs["translation"], cs["rotation"]))
    return np.stack(intrinsics).astype(np.float32), np.stack(extrinsics).astype(np.float32)


def _pose(tables: NuScenesTables, record: dict[str, Any]) -> np.ndarray:
    pose = tables.get("ego_pose", record["ego_pose_token"], referrer=f"sample_data {record['token']!r}")
    return transform_matrix(pose["translation"], pose["rotation"])


def _boxes(
    tables: NuScenesTables,
    sample_token: str,
    ego_pose: np.ndarray,
    class_index: dict[str, int],
    by_sample: dict[str, list[dict[str, Any]]],
) -> dict[str, np.ndarray]:
    rotation, origin = ego_pose[:3, :3], ego_pose[:3, 3]
    rows, labels, tokens, instances, lidar, radar = [], [], [], [], [], []
    for ann in by_sample.get(sample_token, []):
        where = f"sample_annotation {ann['token']!r}"
        centre = rotation.T @ (np.asarray(ann["translation"], np.float64) - origin)
        yaw = yaw_of(rotation.T @ quaternion_matrix(ann["rotation"]))
        velocity = rotation.T @ np.nan_to_num(box_velocity(tables, ann), nan=0.0)
        width, length, height = (float(v) for v in ann["size"])
        rows.append([*centre, width, length, height, yaw, velocity[0], velocity[1]])
        instance = tables.get("instance", ann["instance_token"], referrer=where)
        category = tables.get("category", instance["category_token"], referrer=f"instance {instance['token']!r}")
        labels.append(class_index[category["name"]])
        tokens.append(ann["token"])
        instances.append(ann["instance_token"])
        lidar.append(int(ann.get("num_lidar_pts", -1)))
        radar.append(int(ann.get("num_radar_pts", -1)))
    return {
        "boxes": np.asarray(rows, np.float32).reshape(-1, len(BOX_FIELDS)),
        "labels": np.asarray(labels, np.int64),
        "box_tokens": np.asarray(tokens, dtype=str).reshape(-1),
        "instance_tokens": np.asarray(instances, dtype=str).reshape(-1),
        "num_lidar_pts": np.asarray(lidar, np.int64),
        "num_radar_pts": np.asarray(radar, np.int64),
    }


_RAGGED = ("boxes", "labels", "box_tokens", "instance_tokens", "num_lidar_pts", "num_radar_pts")


def _scene_annotations(
    tables: NuScenesTables,
    scene: dict[str, Any],
    cameras: Sequence[str],
    cycles: Sequence[_Cycle],
    class_names: Sequence[str],
    by_sample: dict[str, list[dict[str, Any]]],
) -> dict[str, np.ndarray]:
    """The arrays of one scene's annotation file (see the annotation file format)."""
    class_index = {name: i for i, name in enumerate(class_names)}
    intrinsics, extrinsics = _calibration(tables, scene, cameras, cycles)
    ego, cam_ego, tokens, keys, times, sd_tokens = [], [], [], [], [], []
    ragged: dict[str, list[np.ndarray]] = {name: [] for name in _RAGGED}
    empty = _boxes(tables, "", np.eye(4), class_index, {})
    for cycle in cycles:
        poses = [_pose(tables, r) for r in cycle.records]
        ego.append(poses[0])
        cam_ego.append(np.stack(poses))
        times.append(cycle.records[0]["timestamp"] / 1e6)
        sd_tokens.append([r["token"] for r in cycle.records])
        keys.append(cycle.sample_token is not None)
        tokens.append(cycle.sample_token if cycle.sample_token is not None else cycle.records[0]["token"])
        found = _boxes(tables, cycle.sample_token, poses[0], class_index, by_sample) if cycle.sample_token else empty
        for name in _RAGGED:
            ragged[name].append(found[name])
    log = scene.get("log_token", "")
    location = tables.get("log", log)["location"] if log and tables.has("log", log) else ""
    out: dict[str, np.ndarray] = {
        "format": np.array(ANNOTATION_FORMAT),
        "version": np.array(ANNOTATION_VERSION),
        "camera_names": np.array(list(cameras), dtype=str),
        "frame_index": np.arange(len(cycles), dtype=np.int64),
        "timestamp": np.array(times, dtype=np.float64),
        "clip.scene_token": np.array(scene["token"]),
        "clip.scene_name": np.array(scene["name"]),
        "clip.location": np.array(location),
        "clip.class_names": np.array(list(class_names), dtype=str),
        "clip.box_fields": np.array(BOX_FIELDS, dtype=str),
        "camera.intrinsics": intrinsics,
        "camera.extrinsics": extrinsics,
        "frame.ego_pose": np.stack(ego).astype(np.float32),
        "frame.token": np.array(tokens, dtype=str),
        "frame.is_key_frame": np.array(keys, dtype=bool),
        "frame_camera.cam_ego_pose": np.stack(cam_ego).astype(np.float32),
        "frame_camera.sample_data_token": np.array(sd_tokens, dtype=str),
    }
    for name, values in ragged.items():
        out[f"frame.{name}"] = np.concatenate(values, axis=0)
        out[f"frame.{name}.lengths"] = np.array([len(v) for v in values], dtype=np.int64)
    return out


def _write_npz(folder: Path, clip_id: str, arrays: dict[str, np.ndarray]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{clip_id}.npz"
    with open_atomic(path) as f:
        np.savez(f, **arrays)  # type: ignore[arg-type]
    return path


def _chosen_scenes(
    tables: NuScenesTables, scenes: Sequence[str] | None, root: Path, version: str
) -> list[dict[str, Any]]:
    """The records of the scenes to import, by name: those ``scenes`` names (every scene when None).

    Raises:
        ConfigurationError: ``scenes`` names a scene the tables do not list.
        DatasetImportError: The tables list no scene.
    """
    all_scenes = sorted(tables.records("scene"), key=lambda s: s["name"])
    if scenes is not None:
        names = {s["name"] for s in all_scenes}
        unknown = [s for s in scenes if s not in names]
        if unknown:
            raise ConfigurationError(
                f"scenes {unknown} are not in {version} under {str(root)!r}; it has "
                f"{len(names)} scenes, e.g. {sorted(names)[:3]}."
            )
        all_scenes = [s for s in all_scenes if s["name"] in set(scenes)]
    if not all_scenes:
        raise DatasetImportError(f"{version} under {str(root)!r} lists no scenes.")
    return all_scenes


def _stride_settings(settings: EncodeSettings | None, cycles: Sequence[Sequence[_Cycle]]) -> EncodeSettings:
    """``settings`` (the defaults when None) with the key frames' spacing as the keyframe stride, unless it sets one.

    Raises:
        ConfigurationError: The spacing cannot be the videos' keyframe stride (names both ways out).
    """
    settings = settings if settings is not None else EncodeSettings()
    if settings.keyframe_stride is not None:
        return settings
    stride = key_frame_stride(cycles)
    try:
        return dataclasses.replace(settings, keyframe_stride=stride)
    except ConfigurationError as err:
        raise ConfigurationError(
            f"the key frames of these scenes are {stride} frames apart, the keyframe stride the videos take "
            f"unless told otherwise: {err} Or pass keyframe_stride=1 (--keyframe-stride 1) for the usual layout."
        ) from None


def import_nuscenes(
    dataroot: Path | str,
    out_dir: Path | str,
    *,
    version: str = "v1.0-mini",
    scenes: Sequence[str] | None = None,
    cameras: Sequence[str] | None = None,
    key_frames_only: bool = False,
    settings: EncodeSettings | None = None,
    jobs: int = 1,
    executor: Executor = "local",
    threads: int | None = None,
    progress: bool = True,
) -> NuScenesImport:
    """Import a dataset in the nuScenes layout: encoded videos, their index, and annotation files.

    Args:
        dataroot: Folder holding ``<version>/`` (the JSON tables), ``samples/`` and ``sweeps/``.
        out_dir: Output folder (``videos/``, ``index.json``, ``annotations/``).
        version: Table folder name: ``"v1.0-mini"``, ``"v1.0-trainval"``...
        scenes: Scene names to import (all scenes of the tables when None).
        cameras: Camera channels, imported in sorted order (the six ``CAM_*`` when None).
        key_frames_only: Import only key frames (2 Hz), e.g. when the sweeps are not downloaded.
        settings: Codec and rate control of the videos (defaults: :class:`~lightning_vstream.encode.EncodeSettings`).
            Its ``keyframe_stride`` None (the default) takes the stride layout from the data: the spacing of
            the key frames (:func:`key_frame_stride`, 6 on nuScenes; 1 with ``key_frames_only``).
        jobs: Videos encoded in parallel by local processes (1: in this process).
        executor: ``"local"`` (``jobs`` processes) or ``"ray"`` (Ray tasks on the cluster at ``RAY_ADDRESS``
            or a local runtime; ``dataroot`` and ``out_dir`` at the same paths on every worker). The videos
            and the index are the same either way (see :func:`~lightning_vstream.encode.encode_sources`).
        threads: Encoder threads per video (None: see :func:`~lightning_vstream.encode.encode_sources`).
        progress: Show a progress bar while encoding.

    Returns:
        A :class:`NuScenesImport` summary. Running it again skips videos already done and
        rewrites the annotation files.

    Raises:
        DatasetImportError: A table, record or image is missing or inconsistent (names which).
        ConfigurationError: An argument is invalid (an unknown scene, an empty camera list...).
        EncodeError: A video could not be written so that it keeps the source frames and times.

    Example::

        >>> result = import_nuscenes("/data/nuscenes", "/data/nuscenes_video", version="v1.0-mini")  # doctest: +SKIP
        >>> result.index, result.frames, result.key_frames  # doctest: +SKIP
        (PosixPath('/data/nuscenes_video/index.json'), 3962, 404)
    """
    from lightning_vstream.encode.run import check_run_options, encode_sources

    check_run_options(jobs=jobs, executor=executor, threads=threads)
    root = Path(dataroot)
    out_dir = Path(out_dir)
    if isinstance(cameras, str):
        raise ConfigurationError(f"cameras={cameras!r} must be a list of camera channels, not a string.")
    cams = sorted(cameras) if cameras is not None else list(NUSCENES_CAMERAS)
    if not cams or len(set(cams)) != len(cams):
        raise ConfigurationError(f"cameras={cameras!r} must be a non-empty list of distinct camera channels.")
    tables = NuScenesTables.load(root, version)
    all_scenes = _chosen_scenes(tables, scenes, root, version)
    channels = sorted(set(tables.camera_channels.values()))
    unknown = [c for c in cams if c not in channels]
    if cameras is not None and unknown:  # a name the tables do not have (a typo): an argument is wrong, not the data
        raise ConfigurationError(
            f"cameras {unknown} are not camera channels of {version} under {str(root)!r}, which holds {channels}. "
            "Pass cameras=[...] (--cameras) with names from that list."
        )
    class_names = sorted({c["name"] for c in tables.records("category")})
    by_sample: dict[str, list[dict[str, Any]]] = {}
    for ann in tables.records("sample_annotation"):
        by_sample.setdefault(ann["sample_token"], []).append(ann)
    plans: list[tuple[dict[str, Any], list[_Cycle], dict[str, np.ndarray]]] = []
    sources: list[CameraSource] = []
    missing: list[str] = []
    left_out = 0
    for scene in all_scenes:
        cycles, dropped = scene_cycles(tables, scene, cams, key_frames_only=key_frames_only)
        left_out += dropped
        # Annotations are built before encoding, so inconsistent tables fail before any video is written.
        plans.append((scene, cycles, _scene_annotations(tables, scene, cams, cycles, class_names, by_sample)))
        for k, camera in enumerate(cams):
            files = tuple(root / c.records[k]["filename"] for c in cycles)
            missing.extend(str(f) for f in files if not f.is_file())
            sources.append(
                CameraSource(
                    scene["name"], camera, files, tuple(int(c.records[k]["timestamp"]) for c in cycles), (1, 1_000_000)
                )
            )
    if missing:
        raise DatasetImportError(
            f"{len(missing)} camera images listed in {version}/sample_data.json are missing under {str(root)!r}, "
            f"e.g. {missing[:3]}; extract the samples/ and sweeps/ archives there (or pass key_frames_only=True "
            "/ --key-frames-only when only samples/ is present)."
        )
    if left_out and progress:
        print(
            f"vstream import-nuscenes: left out {left_out} camera images whose capture cycle another camera "
            "missed (the cameras stay aligned).",
            file=sys.stderr,
        )
    settings = _stride_settings(settings, [cycles for _, cycles, _ in plans])
    summary = encode_sources(
        sources, out_dir, settings=settings, jobs=jobs, executor=executor, threads=threads, progress=progress
    )
    folder = out_dir / "annotations"
    for scene, _, arrays in plans:
        _write_npz(folder, scene["name"], arrays)
    return NuScenesImport(
        index=summary.index,
        annotations=folder,
        scenes=tuple(s["name"] for s, _, _ in plans),
        frames=sum(len(c) for _, c, _ in plans),
        key_frames=sum(sum(1 for x in c if x.sample_token) for _, c, _ in plans),
        left_out=left_out,
        encode=summary,
        keyframe_stride=settings.stride,
        key_frames_on_stride=sum(
            sum(1 for i, x in enumerate(c) if x.sample_token and i % settings.stride == 0) for _, c, _ in plans
        ),
    )

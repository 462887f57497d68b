"""Reading nuScenes tables (``DATAROOT/<version>/*.json``) and turning their records into matrices.

Only the tables the importer needs are read: ``scene``, ``sample``, ``sample_data``,
``calibrated_sensor``, ``sensor``, ``ego_pose``, ``sample_annotation``, ``instance`` and
``category`` (``log`` when present). Records are looked up by ``token``; every missing table,
field, value of the wrong type (a timestamp that is not an integer, a filename outside the dataroot)
or token raises :class:`~lightning_vstream.errors.DatasetImportError` naming the table,
the record and the fix. Quaternions are ``[w, x, y, z]`` as nuScenes stores them.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any

import numpy as np

from lightning_vstream.errors import ConfigurationError, DatasetImportError

__all__ = ["NuScenesTables", "box_velocity", "quaternion_matrix", "transform_matrix", "yaw_of"]

_REQUIRED = (
    "scene",
    "sample",
    "sample_data",
    "calibrated_sensor",
    "sensor",
    "ego_pose",
    "sample_annotation",
    "instance",
    "category",
)
_FIELDS = {
    "scene": ("token", "name", "first_sample_token"),
    "sample": ("token", "timestamp", "scene_token"),
    "sample_data": (
        "token",
        "sample_token",
        "ego_pose_token",
        "calibrated_sensor_token",
        "filename",
        "timestamp",
        "is_key_frame",
    ),
    "calibrated_sensor": ("token", "sensor_token", "translation", "rotation", "camera_intrinsic"),
    "sensor": ("token", "channel", "modality"),
    "ego_pose": ("token", "translation", "rotation", "timestamp"),
    "sample_annotation": ("token", "sample_token", "instance_token", "translation", "size", "rotation", "prev", "next"),
    "instance": ("token", "category_token"),
    "category": ("token", "name"),
    "log": ("token", "location"),
}

#: What each checked field must hold, and how an error describes it; a field not named here holds a string.
_KINDS: dict[str, tuple[Any, str]] = {
    "timestamp": (lambda v: isinstance(v, int) and not isinstance(v, bool), "an integer (microseconds)"),
    "is_key_frame": (lambda v: isinstance(v, bool), "true or false"),
    "translation": (lambda v: _numbers(v, 3), "a list of 3 numbers"),
    "size": (lambda v: _numbers(v, 3), "a list of 3 numbers"),
    "rotation": (lambda v: _numbers(v, 4), "a list of 4 numbers (a quaternion w, x, y, z)"),
    "camera_intrinsic": (
        lambda v: v == [] or (isinstance(v, list) and len(v) == 3 and all(_numbers(r, 3) for r in v)),
        "a 3x3 list of numbers (or [] for a sensor that is not a camera)",
    ),
    "filename": (
        lambda v: (
            isinstance(v, str)
            and bool(v)
            and not PurePosixPath(v).is_absolute()
            and not PureWindowsPath(v).drive
            and ".." not in PurePosixPath(v.replace("\\", "/")).parts
        ),
        "a path relative to the dataroot, inside it (no '..', not absolute)",
    ),
}


class _MissingFolderError(DatasetImportError, ConfigurationError):
    """The data root or its table folder does not exist: a path on the command line is wrong (exit status 2)."""


def _numbers(value: Any, count: int) -> bool:
    return (
        isinstance(value, list)
        and len(value) == count
        and all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in value)
    )


def _field_error(path: Path, index: int, row: dict[str, Any], field: str) -> str | None:
    """Why ``row[field]`` is not of the kind the importer reads, or None when it is."""
    check, expected = _KINDS.get(field, (lambda v: isinstance(v, str), "a string"))
    if check(row[field]):
        return None
    return (
        f"nuScenes table {str(path)!r} record {index} (token {row.get('token')!r}) field {field!r} holds "
        f"{row[field]!r}; expected {expected}. Extract the table again or fix the record."
    )


def quaternion_matrix(q: Sequence[float]) -> np.ndarray:
    """3x3 rotation matrix (float64) of a unit quaternion ``[w, x, y, z]`` (normalised first).

    Example::

        >>> quaternion_matrix([1, 0, 0, 0]).tolist() == np.eye(3).tolist()
        True
    """
    w, x, y, z = (float(v) for v in q)
    norm = math.sqrt(w * w + x * x + y * y + z * z)
    if not norm > 0:
        raise ConfigurationError(f"quaternion {list(q)!r} has zero length.")
    w, x, y, z = w / norm, x / norm, y / norm, z / norm
    return np.array(
        [
            [1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)],
            [2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)],
            [2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)],
        ]
    )


def transform_matrix(translation: Sequence[float], rotation: Sequence[float]) -> np.ndarray:
    """4x4 homogeneous transform (float64) from a translation and a ``[w, x, y, z]`` rotation."""
    out = np.eye(4)
    out[:3, :3] = quaternion_matrix(rotation)
    out[:3, 3] = np.asarray(translation, dtype=np.float64)
    return out


def yaw_of(rotation: np.ndarray) -> float:
    """Heading about z of a 3x3 rotation: the angle of its x axis in the x-y plane (nuScenes' box yaw)."""
    return math.atan2(float(rotation[1, 0]), float(rotation[0, 0]))


@dataclass
class NuScenesTables:
    """The nuScenes tables the importer reads, indexed by token.

    Args:
        tables: Table name -> list of records, as in the JSON files.
        where: The tables' folder, for error messages.

    Example::

        >>> tables = NuScenesTables.load("/data/nuscenes", "v1.0-mini")  # doctest: +SKIP
        >>> [scene["name"] for scene in tables.records("scene")][:2]  # doctest: +SKIP
        ['scene-0061', 'scene-0103']
    """

    tables: dict[str, list[dict[str, Any]]]
    where: str

    def __post_init__(self) -> None:
        self._by_token = {name: {r["token"]: r for r in rows} for name, rows in self.tables.items()}

    @classmethod
    def load(cls, dataroot: Path | str, version: str) -> NuScenesTables:
        """Read and check the tables under ``dataroot/version``.

        Raises:
            DatasetImportError: The folder or a table is missing, not JSON, or lacks a field.
        """
        root = Path(dataroot)
        folder = root / version
        if not root.is_dir():
            raise _MissingFolderError(
                f"nuScenes folder {str(root)!r} does not exist; pass the folder that holds "
                f"{version}/, samples/ and sweeps/."
            )
        if not folder.is_dir():
            found = sorted(p.name for p in root.iterdir() if p.is_dir() and p.name.startswith("v1.0"))
            raise _MissingFolderError(
                f"{str(root)!r} has no table folder {version!r} (found {found or 'none'}); pass version= (`vstream import-nuscenes "
                "--dataset-version`) with one of those, e.g. v1.0-mini."
            )
        tables: dict[str, list[dict[str, Any]]] = {}
        for name in (*_REQUIRED, "log"):
            path = folder / f"{name}.json"
            if not path.is_file():
                if name == "log":
                    continue
                raise DatasetImportError(
                    f"nuScenes table {str(path)!r} is missing; extract the full metadata "
                    f"archive of {version} into {str(root)!r}."
                )
            try:
                rows = json.loads(path.read_text(encoding="utf-8"))
            except (json.JSONDecodeError, UnicodeDecodeError) as err:
                raise DatasetImportError(
                    f"nuScenes table {str(path)!r} is not valid JSON ({err}); extract it again."
                ) from None
            if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
                raise DatasetImportError(f"nuScenes table {str(path)!r} must hold a JSON list of records.")
            for i, row in enumerate(rows):
                missing = [f for f in _FIELDS[name] if f not in row]
                if missing:
                    raise DatasetImportError(
                        f"nuScenes table {str(path)!r} record {i} (token "
                        f"{row.get('token')!r}) lacks field(s) {missing}."
                    )
                for field in _FIELDS[name]:
                    problem = _field_error(path, i, row, field)
                    if problem is not None:
                        raise DatasetImportError(problem)
            tables[name] = rows
        return cls(tables, str(folder))

    def records(self, table: str) -> list[dict[str, Any]]:
        """All records of ``table`` (an empty list for an absent optional table)."""
        return self.tables.get(table, [])

    def get(self, table: str, token: str, *, referrer: str = "") -> dict[str, Any]:
        """The record of ``table`` with ``token``; raises naming the record that points to it."""
        try:
            return self._by_token[table][token]
        except KeyError:
            by = f" (referenced by {referrer})" if referrer else ""
            raise DatasetImportError(
                f"nuScenes table {table}.json in {self.where!r} has no record with token "
                f"{token!r}{by}; the tables are incomplete or from different versions."
            ) from None

    def has(self, table: str, token: str) -> bool:
        return token in self._by_token.get(table, {})

    @functools.cached_property
    def camera_channels(self) -> dict[str, str]:
        """calibrated_sensor token -> channel, for camera sensors."""
        out = {}
        for cs in self.records("calibrated_sensor"):
            sensor = self.get("sensor", cs["sensor_token"], referrer=f"calibrated_sensor {cs['token']!r}")
            if sensor["modality"] == "camera":
                out[cs["token"]] = sensor["channel"]
        return out

    @functools.cached_property
    def samples_by_scene(self) -> dict[str, list[dict[str, Any]]]:
        """scene token -> its samples in time order (grouped once: the big tables are read in one pass)."""
        out: dict[str, list[dict[str, Any]]] = {}
        for sample in self.records("sample"):
            out.setdefault(sample["scene_token"], []).append(sample)
        for rows in out.values():
            rows.sort(key=lambda s: s["timestamp"])
        return out

    @functools.cached_property
    def camera_data_by_scene(self) -> dict[str, dict[str, list[dict[str, Any]]]]:
        """scene token -> camera channel -> its sample_data records (key frames and sweeps) in time order."""
        scene_of = {s["token"]: s["scene_token"] for s in self.records("sample")}
        out: dict[str, dict[str, list[dict[str, Any]]]] = {}
        for record in self.records("sample_data"):
            channel = self.camera_channels.get(record["calibrated_sensor_token"])
            scene = scene_of.get(record["sample_token"])
            if channel is not None and scene is not None:
                out.setdefault(scene, {}).setdefault(channel, []).append(record)
        for channels in out.values():
            for rows in channels.values():
                rows.sort(key=lambda r: r["timestamp"])
        return out


def box_velocity(tables: NuScenesTables, annotation: dict[str, Any], *, max_time_diff: float = 1.5) -> np.ndarray:
    """Global velocity ``[vx, vy, vz]`` (m/s) of an annotated box from its neighbours in time.

    The centred difference of the previous and next annotation of the same instance, or the
    one-sided difference where only one exists (the nuScenes devkit's rule, including its time
    limit: ``max_time_diff`` seconds, doubled for a centred difference). NaN when it cannot be
    estimated.
    """
    has_prev, has_next = bool(annotation["prev"]), bool(annotation["next"])
    if not has_prev and not has_next:
        return np.full(3, np.nan)
    where = f"sample_annotation {annotation['token']!r}"
    first = tables.get("sample_annotation", annotation["prev"], referrer=where) if has_prev else annotation
    last = tables.get("sample_annotation", annotation["next"], referrer=where) if has_next else annotation
    t_first = tables.get("sample", first["sample_token"], referrer=where)["timestamp"] * 1e-6
    t_last = tables.get("sample", last["sample_token"], referrer=where)["timestamp"] * 1e-6
    span = t_last - t_first
    limit = max_time_diff * 2 if has_prev and has_next else max_time_diff
    if not 0 < span <= limit:
        return np.full(3, np.nan)
    return (np.asarray(last["translation"], np.float64) - np.asarray(first["translation"], np.float64)) / span

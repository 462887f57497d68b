"""The annotation file format: one ``<clip_id>.npz`` per clip, in a folder (numpy only).

Layout of ``<folder>/<clip_id>.npz`` (``numpy.savez``; loaded with ``allow_pickle=False``, so
strings are numpy unicode arrays, never objects):

=============================  ==========================  ==================================================
key                            shape                       meaning
=============================  ==========================  ==================================================
``format``                     ``[]`` str                  ``"lightning_vstream.annotations"``
``version``                    ``[]`` int                  ``1``
``camera_names``               ``[C]`` str                 camera order of ``camera.*`` / ``frame_camera.*``
``frame_index``                ``[F]`` int64               the video frame each row belongs to (increasing)
``timestamp``                  ``[F]`` float64             or/and its presentation time in seconds (increasing)
``clip.<name>``                any                         one value per clip (``clip.scene_token``)
``camera.<name>``              ``[C, ...]``                one value per camera (``camera.intrinsics``)
``frame.<name>``               ``[F, ...]``                one value per row (``frame.ego_pose``)
``frame.<name>`` (ragged)      ``[sum(lengths), ...]``     rows of every frame, concatenated (``frame.boxes``)
``frame.<name>.lengths``       ``[F]`` int64               rows each frame holds in the ragged field
``frame_camera.<name>``        ``[F, C, ...]``             one value per row and camera
=============================  ==========================  ==================================================

Names are Python identifiers and unique across the namespaces; the batch delivers each field
under its bare name (``batch["annotations"]["intrinsics"]``). Per-camera fields are reordered
to the cameras the loader reads. See ``docs/training_data.md`` for the recommended field names
(``intrinsics``, ``extrinsics``, ``ego_pose``, ``boxes``, ``labels``, ``token``, ``is_key_frame``).
"""

from __future__ import annotations

import math
import threading
import zipfile
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from lightning_vstream.errors import AnnotationError
from lightning_vstream.storage.atomic import open_atomic

__all__ = ["FORMAT", "VERSION", "AnnotationFiles", "ClipAnnotations", "MatchMode", "write_clip_annotations"]

FORMAT = "lightning_vstream.annotations"
VERSION = 1
NAMESPACES = ("clip", "camera", "frame", "frame_camera")
MatchMode = Literal["auto", "index", "timestamp"]
_OPEN_CLIPS = 16


def _check_name(name: str, where: str) -> None:
    if not isinstance(name, str) or not name.isidentifier():
        raise AnnotationError(f"{where}: field name {name!r} is not a Python identifier; use letters, digits and _.")


def _array(value: Any, where: str) -> np.ndarray:
    array = np.asarray(value.cpu().numpy() if hasattr(value, "cpu") else value)
    if array.dtype.kind in "OSV":
        if array.dtype.kind == "O" and all(isinstance(v, str) for v in array.reshape(-1)):
            return array.astype(str)
        raise AnnotationError(
            f"{where} holds {array.dtype} values; store numbers, booleans or str (numpy unicode), not objects or bytes."
        )
    return array


def write_clip_annotations(
    folder: Path | str,
    clip_id: str,
    *,
    frames: Sequence[Mapping[str, Any]],
    clip: Mapping[str, Any] | None = None,
    camera_names: Sequence[str] | None = None,
    camera: Mapping[str, Any] | None = None,
    ragged: Sequence[str] = (),
) -> Path:
    """Write one clip's annotations to ``folder/<clip_id>.npz`` (atomically).

    Args:
        folder: The annotation folder (created if missing).
        clip_id: The clip id, as the index names it.
        frames: One mapping per annotated frame, in frame order. Each holds ``frame_index``
            and/or ``timestamp`` (seconds, the video's presentation time), the per-frame fields,
            and optionally ``cameras``: a mapping of per-camera fields ``[C, ...]`` (stored as
            ``frame_camera.<name>``). Every frame must hold the same fields.
        clip: Per-clip fields (``{"scene_token": "..."}``).
        camera_names: Order of the camera axis of ``camera`` and ``frames[i]["cameras"]``.
        camera: Per-camera fields, ``[C, ...]`` each (``{"intrinsics": K, "extrinsics": E}``).
        ragged: Per-frame fields whose first dimension varies between frames (``("boxes", "labels")``).

    Returns:
        The written file.

    Raises:
        AnnotationError: A field is missing in some frames, shapes disagree, a name is invalid
            or repeated, or frames are not in increasing order.

    Example::

        >>> import numpy as np
        >>> path = write_clip_annotations(
        ...     "/tmp/ann", "scene-0000", camera_names=["CAM_FRONT"], clip={"scene_token": "s0"},
        ...     camera={"intrinsics": np.eye(3, dtype=np.float32)[None]},
        ...     frames=[{"frame_index": 0, "ego_pose": np.eye(4, dtype=np.float32),
        ...              "boxes": np.zeros((2, 9), np.float32), "labels": np.zeros(2, np.int64)}],
        ...     ragged=("boxes", "labels"))
        >>> path.name
        'scene-0000.npz'
    """
    where = f"annotations of clip {clip_id!r}"
    if not frames:
        raise AnnotationError(f"{where}: frames is empty; write at least one annotated frame.")
    out: dict[str, np.ndarray] = {"format": np.array(FORMAT), "version": np.array(VERSION)}
    names = _FieldNames(where)
    for name, value in (clip or {}).items():
        out[names.claim("clip", name)] = _array(value, f"{where}, clip field {name!r}")
    cams = None if camera_names is None else [str(c) for c in camera_names]
    if cams is not None:
        out["camera_names"] = np.array(cams, dtype=str)
    for name, value in (camera or {}).items():
        array = _array(value, f"{where}, camera field {name!r}")
        if cams is None or array.ndim == 0 or array.shape[0] != len(cams):
            raise AnnotationError(
                f"{where}: camera field {name!r} has shape {array.shape}; it needs camera_names and "
                f"a first dimension of {len(cams) if cams else 'len(camera_names)'}."
            )
        out[names.claim("camera", name)] = array
    out.update(_frame_axes(frames, where))
    keys = [k for k in frames[0] if k not in ("frame_index", "timestamp", "cameras")]
    unknown = [r for r in ragged if r not in keys]
    if unknown:
        raise AnnotationError(f"{where}: ragged={list(ragged)!r} names {unknown}, which are not per-frame fields.")
    for name in keys:
        out.update(_frame_field(names, name, frames, name in ragged, where))
    for name in frames[0].get("cameras", {}) or {}:
        values = [_array(f["cameras"][name], f"{where}, frame {i} camera field {name!r}") for i, f in enumerate(frames)]
        if cams is None or any(v.ndim == 0 or v.shape[0] != len(cams) for v in values):
            raise AnnotationError(f"{where}: frame camera field {name!r} needs camera_names and [C, ...] values.")
        out[names.claim("frame_camera", name)] = np.stack(values)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{clip_id}.npz"
    with open_atomic(path) as f:
        np.savez(f, **out)  # type: ignore[arg-type]
    return path


@dataclass(frozen=True)
class ClipAnnotations:
    """One clip's annotation file, parsed: per-clip, per-camera and per-frame fields."""

    clip_id: str
    path: Path
    camera_names: tuple[str, ...] | None
    frame_index: np.ndarray | None
    timestamp: np.ndarray | None
    clip: dict[str, np.ndarray]
    camera: dict[str, np.ndarray]
    frame: dict[str, np.ndarray]
    offsets: dict[str, np.ndarray]  # ragged field -> [F + 1] row offsets
    frame_camera: dict[str, np.ndarray]

    @property
    def rows(self) -> int:
        axis = self.frame_index if self.frame_index is not None else self.timestamp
        return 0 if axis is None else len(axis)

    @classmethod
    def load(cls, path: Path, clip_id: str) -> ClipAnnotations:
        """Parse and validate ``path``; every problem raises :class:`AnnotationError` naming it."""
        where = f"annotation file {str(path)!r} (clip {clip_id!r})"
        arrays = _read_npz(path, clip_id, where)
        spaces, lengths = _split_keys(arrays, where)
        cams = tuple(str(c) for c in arrays["camera_names"]) if "camera_names" in arrays else None
        index, times = arrays.get("frame_index"), arrays.get("timestamp")
        rows = _frame_rows(index, times, where)
        _check_camera_fields(spaces, cams, rows, where)
        offsets = _ragged_offsets(spaces["frame"], lengths, rows, where)
        _check_unique_names(spaces, where)
        return cls(
            clip_id,
            path,
            cams,
            index,
            times,
            spaces["clip"],
            spaces["camera"],
            spaces["frame"],
            offsets,
            spaces["frame_camera"],
        )

    def camera_order(self, cameras: Sequence[str]) -> list[int] | None:
        """Positions in ``camera_names`` of the loaded ``cameras`` (None when no field is per camera)."""
        if not self.camera and not self.frame_camera:
            return None
        assert self.camera_names is not None
        missing = [c for c in cameras if c not in self.camera_names]
        if missing:
            raise AnnotationError(
                f"annotation file {str(self.path)!r} (clip {self.clip_id!r}) has no calibration for camera(s) "
                f"{missing}; it lists {list(self.camera_names)}. Load only those cameras or rewrite the file."
            )
        return [self.camera_names.index(c) for c in cameras]

    def row(self, frame_index: int, timestamp: float, *, match: MatchMode, tolerance: float) -> int | None:
        """The row annotating a frame, or None when no row matches."""
        use_index = self.frame_index is not None and match in ("auto", "index")
        if match == "index" and self.frame_index is None:
            raise AnnotationError(f"annotation file {str(self.path)!r} has no 'frame_index'; use match='timestamp'.")
        if match == "timestamp" and self.timestamp is None:
            raise AnnotationError(f"annotation file {str(self.path)!r} has no 'timestamp'; use match='index'.")
        if use_index:
            assert self.frame_index is not None
            pos = int(np.searchsorted(self.frame_index, frame_index))
            return pos if pos < len(self.frame_index) and int(self.frame_index[pos]) == frame_index else None
        assert self.timestamp is not None
        if math.isnan(timestamp):
            return None
        times = self.timestamp
        pos = int(np.searchsorted(times, timestamp))
        best = min((p for p in (pos - 1, pos) if 0 <= p < len(times)), key=lambda p: abs(times[p] - timestamp))
        return best if abs(float(times[best]) - timestamp) <= tolerance else None

    def nearest(self, frame_index: int, timestamp: float, *, match: MatchMode = "auto") -> str:
        """Describes the rows nearest to a frame (for error messages)."""
        if self.frame_index is not None and match != "timestamp":
            pos = int(np.searchsorted(self.frame_index, frame_index))
            near = sorted({int(self.frame_index[p]) for p in (pos - 1, pos) if 0 <= p < len(self.frame_index)})
            return f"nearest annotated frame indices: {near}"
        assert self.timestamp is not None
        pos = int(np.searchsorted(self.timestamp, timestamp))
        times = sorted({round(float(self.timestamp[p]), 6) for p in (pos - 1, pos) if 0 <= p < len(self.timestamp)})
        return f"nearest annotated timestamps: {times} s"


class AnnotationFiles:
    """An :class:`~lightning_vstream.annotations.AnnotationSource` reading ``<folder>/<clip_id>.npz`` files.

    Files are opened lazily where frames are decoded (each worker parses the clips it reads and
    keeps the last 16 in memory); the object pickles without them.

    Args:
        folder: The folder of per-clip files (see :mod:`lightning_vstream.annotations.files`).
        match: ``"index"``: a frame takes the row with its ``frame_index``; ``"timestamp"``: the
            row whose ``timestamp`` is nearest to the frame's presentation time (first loaded
            camera), within ``tolerance``; ``"auto"``: by index when the file has ``frame_index``.
        tolerance: Largest distance in seconds between a frame and the row it is matched to.

    Raises:
        AnnotationError: ``folder`` is not a folder (at construction) or a file is malformed (when read).

    Example::

        >>> source = AnnotationFiles("data/annotations", match="timestamp", tolerance=0.01)  # doctest: +SKIP
    """

    def __init__(self, folder: Path | str, *, match: MatchMode = "auto", tolerance: float = 1e-3) -> None:
        if match not in ("auto", "index", "timestamp"):
            raise AnnotationError(f"match={match!r} is not supported; use 'auto', 'index' or 'timestamp'.")
        if not tolerance >= 0:
            raise AnnotationError(f"tolerance={tolerance!r} must be a number of seconds >= 0.")
        self.folder = Path(folder)
        if not self.folder.is_dir():
            raise AnnotationError(
                f"annotation folder {str(self.folder)!r} does not exist; pass the folder that holds "
                "the <clip_id>.npz files (write them with write_clip_annotations())."
            )
        self.match: MatchMode = match
        self.tolerance = float(tolerance)
        self._open: OrderedDict[str, ClipAnnotations] = OrderedDict()
        self._declared: frozenset[str] | None = None
        self._clip_fields: dict[tuple[str, tuple[str, ...]], tuple[ClipAnnotations, dict[str, Any]]] = {}

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_open"] = OrderedDict()
        state["_clip_fields"] = {}
        return state

    def __repr__(self) -> str:
        return f"AnnotationFiles({str(self.folder)!r}, match={self.match!r}, tolerance={self.tolerance})"

    def load(self, clip_id: str) -> ClipAnnotations:
        """The parsed file of ``clip_id`` (cached)."""
        found = self._open.get(clip_id)
        if found is None:
            found = ClipAnnotations.load(self.folder / f"{clip_id}.npz", clip_id)
            if set(found.offsets) != self.ragged:
                raise AnnotationError(
                    f"annotation file {str(found.path)!r} stores {sorted(found.offsets)} as ragged fields but the "
                    f"folder's other files store {sorted(self.ragged)}; write every clip with the same ragged=[...]."
                )
            self._open[clip_id] = found
            while len(self._open) > _OPEN_CLIPS:
                self._open.popitem(last=False)
        else:
            self._open.move_to_end(clip_id)
        return found

    @property
    def ragged(self) -> frozenset[str]:
        """Per-frame fields stored ragged (with ``.lengths``), read from the key list of one file.

        Every file of a folder must declare the same ragged fields; a file that differs raises
        when it is read, so a field is never stacked in one batch and listed in the next.
        """
        if self._declared is None:
            found: set[str] = set()
            for path in sorted(self.folder.glob("*.npz"))[:1]:
                try:
                    with zipfile.ZipFile(path) as archive:
                        keys = [n.removesuffix(".npy") for n in archive.namelist()]
                except (OSError, zipfile.BadZipFile) as err:
                    raise AnnotationError(f"annotation file {str(path)!r} cannot be read ({err}).") from err
                found = {k.split(".")[1] for k in keys if k.startswith("frame.") and k.endswith(".lengths")}
            self._declared = frozenset(found)
        return self._declared

    def clip_annotations(self, clip_id: str, cameras: Sequence[str]) -> dict[str, Any]:
        ann = self.load(clip_id)
        key = (clip_id, tuple(cameras))
        cached = self._clip_fields.get(key)
        if cached is not None and cached[0] is ann:
            return dict(cached[1])  # batches stack (copy) these values, so sharing them is safe
        out: dict[str, Any] = {name: _value(v) for name, v in ann.clip.items()}
        order = ann.camera_order(cameras)
        for name, value in ann.camera.items():
            out[name] = _value(value[order])
        if len(self._clip_fields) >= _OPEN_CLIPS:
            self._clip_fields.clear()
        self._clip_fields[key] = (ann, out)
        return dict(out)

    def frame_annotations(
        self, clip_id: str, frame_index: int, timestamp: float, cameras: Sequence[str]
    ) -> dict[str, Any]:
        ann = self.load(clip_id)
        row = ann.row(frame_index, timestamp, match=self.match, tolerance=self.tolerance)
        if row is None:
            when = f" (t={timestamp:.6f} s)" if not math.isnan(timestamp) else ""
            raise AnnotationError(
                f"clip {clip_id!r} frame {frame_index}{when} has no annotation in {str(ann.path)!r} "
                f"(match={self.match!r}, tolerance={self.tolerance} s; {ann.nearest(frame_index, timestamp, match=self.match)}). "
                "Annotate every frame the loader reads, widen the tolerance, or pass on_error='skip' to deliver "
                "such frames with has_annotations=False."
            )
        out: dict[str, Any] = {}
        for name, value in ann.frame.items():
            if name in ann.offsets:
                start, stop = ann.offsets[name][row], ann.offsets[name][row + 1]
                out[name] = _value(value[start:stop])
            else:
                out[name] = _value(value[row])
        order = ann.camera_order(cameras)
        for name, value in ann.frame_camera.items():
            out[name] = _value(value[row][order])
        return out


def _value(value: Any) -> Any:
    """numpy -> what the batch holds: str for unicode scalars, list of str for unicode arrays, else a tensor."""
    import torch

    array = np.array(value)  # a copy: batches never alias the cached file
    if array.dtype.kind == "U":
        return str(array) if array.ndim == 0 else [str(v) for v in array.reshape(-1)]
    return torch.from_numpy(array)


# numpy parses each array's header with ``ast.literal_eval``; CPython 3.11 before 3.11.8 keeps the AST
# validator's recursion depth in one global, so two threads parsing at once raise
# ``SystemError: AST constructor recursion depth mismatch`` (CPython gh-106905). Decode threads load
# annotations concurrently, so the reads take turns; a file is a few kilobytes.
_NPZ_LOCK = threading.Lock()


def _read_npz(path: Path, clip_id: str, where: str) -> dict[str, np.ndarray]:
    """Every array of an annotation file, after checking its format and version."""
    try:
        with _NPZ_LOCK, np.load(path, allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
    except FileNotFoundError:
        raise AnnotationError(
            f"clip {clip_id!r} has no annotation file {str(path)!r}; write one with write_clip_annotations(), "
            "or drop the clip from the index."
        ) from None
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as err:
        raise AnnotationError(f"{where} cannot be read ({err}); rewrite it with write_clip_annotations().") from err
    if str(arrays.get("format", "")) != FORMAT or int(arrays.get("version", -1)) != VERSION:
        raise AnnotationError(
            f"{where} is not a version-{VERSION} {FORMAT} file (format={arrays.get('format')!r}, "
            f"version={arrays.get('version')!r}); rewrite it with write_clip_annotations()."
        )
    return arrays


def _split_keys(
    arrays: Mapping[str, np.ndarray], where: str
) -> tuple[dict[str, dict[str, np.ndarray]], dict[str, np.ndarray]]:
    """The fields of each namespace (``clip.<name>``...), and the ``frame.<name>.lengths`` of ragged frame fields."""
    spaces: dict[str, dict[str, np.ndarray]] = {s: {} for s in NAMESPACES}
    lengths: dict[str, np.ndarray] = {}
    for key, value in arrays.items():
        if key in ("format", "version", "camera_names", "frame_index", "timestamp"):
            continue
        parts = key.split(".")
        if len(parts) == 3 and parts[0] == "frame" and parts[2] == "lengths":
            lengths[parts[1]] = value
        elif len(parts) == 2 and parts[0] in spaces and parts[1].isidentifier():
            spaces[parts[0]][parts[1]] = value
        else:
            raise AnnotationError(
                f"{where} has an unknown key {key!r}; keys are clip.<name>, camera.<name>, "
                "frame.<name>[.lengths] or frame_camera.<name>."
            )
    return spaces, lengths


def _frame_rows(index: np.ndarray | None, times: np.ndarray | None, where: str) -> int:
    """The file's frame count: its ``frame_index`` and ``timestamp`` axes (one at least), strictly increasing."""
    if index is None and times is None:
        raise AnnotationError(f"{where} has neither 'frame_index' nor 'timestamp'; frames cannot be matched.")
    rows = len(index) if index is not None else len(times)  # type: ignore[arg-type]
    for name, axis in (("frame_index", index), ("timestamp", times)):
        if axis is not None and (axis.ndim != 1 or len(axis) != rows or (rows > 1 and not np.all(np.diff(axis) > 0))):
            raise AnnotationError(f"{where}: {name!r} must be one strictly increasing value per row ({rows} rows).")
    return rows


def _check_camera_fields(
    spaces: Mapping[str, Mapping[str, np.ndarray]], cams: tuple[str, ...] | None, rows: int, where: str
) -> None:
    """Camera fields hold a row per camera of ``camera_names``; frame-camera fields ``[rows, cameras, ...]``."""
    for name, value in spaces["camera"].items():
        if cams is None or value.ndim == 0 or value.shape[0] != len(cams):
            raise AnnotationError(
                f"{where}: camera.{name} has shape {value.shape} but camera_names lists "
                f"{len(cams) if cams else 0} cameras."
            )
    for name, value in spaces["frame_camera"].items():
        if cams is None or value.ndim < 2 or value.shape[:2] != (rows, len(cams)):
            raise AnnotationError(
                f"{where}: frame_camera.{name} has shape {value.shape}; expected [{rows}, "
                f"{len(cams) if cams else 'C'}, ...]."
            )


def _ragged_offsets(
    frame: Mapping[str, np.ndarray], lengths: dict[str, np.ndarray], rows: int, where: str
) -> dict[str, np.ndarray]:
    """Where each frame's rows of every ragged frame field start (from its ``.lengths``); other frame fields hold
    one row per frame."""
    offsets = {}
    for name, value in frame.items():
        if name in lengths:
            counts = lengths.pop(name)
            if counts.shape != (rows,) or counts.min(initial=0) < 0 or value.ndim == 0 or counts.sum() != len(value):
                raise AnnotationError(
                    f"{where}: frame.{name}.lengths must hold {rows} counts summing to the "
                    f"{value.shape[0] if value.ndim else 0} rows of frame.{name}."
                )
            offsets[name] = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        elif value.ndim == 0 or value.shape[0] != rows:
            raise AnnotationError(
                f"{where}: frame.{name} has shape {value.shape}; expected [{rows}, ...] "
                "(or add frame.{name}.lengths for a ragged field)."
            )
    if lengths:
        raise AnnotationError(f"{where}: {sorted(lengths)} have .lengths but no frame.<name> data.")
    return offsets


def _check_unique_names(spaces: Mapping[str, Mapping[str, np.ndarray]], where: str) -> None:
    """A field name belongs to one namespace (a batch holds fields by name)."""
    seen: dict[str, str] = {}
    for space, fields in spaces.items():
        for name in fields:
            if name in seen:
                raise AnnotationError(f"{where}: field {name!r} appears as {seen[name]}.{name} and {space}.{name}.")
            seen[name] = space


class _FieldNames:
    """The field names of one annotation file being written: each unique across clip, camera and frame fields."""

    def __init__(self, where: str) -> None:
        self.where = where
        self.names: dict[str, str] = {}

    def claim(self, space: str, name: str) -> str:
        """The file's key of field ``name`` of ``space`` (``"frame.boxes"``), once the name is known to be free."""
        _check_name(name, self.where)
        if name in self.names:
            raise AnnotationError(
                f"{self.where}: field {name!r} appears as {self.names[name]}.{name} and {space}.{name}; "
                "names must be unique across clip, camera and frame fields."
            )
        self.names[name] = space
        return f"{space}.{name}"


def _frame_axes(frames: Sequence[Mapping[str, Any]], where: str) -> dict[str, np.ndarray]:
    """The ``frame_index`` and ``timestamp`` axes of the frames (one at least, each strictly increasing)."""
    out = {}
    for axis in ("frame_index", "timestamp"):
        present = [axis in f for f in frames]
        if any(present) and not all(present):
            raise AnnotationError(f"{where}: some frames have {axis!r} and some do not; give it to every frame.")
        if all(present):
            values = np.array([f[axis] for f in frames], dtype=np.int64 if axis == "frame_index" else np.float64)
            if len(values) > 1 and not np.all(np.diff(values) > 0):
                raise AnnotationError(f"{where}: {axis} must be strictly increasing, got {values[:8].tolist()}...")
            out[axis] = values
    if not out:
        raise AnnotationError(f"{where}: every frame needs 'frame_index' or 'timestamp' to be matched to video frames.")
    return out


def _frame_field(
    names: _FieldNames, name: str, frames: Sequence[Mapping[str, Any]], ragged: bool, where: str
) -> dict[str, np.ndarray]:
    """The arrays of one per-frame field: stacked, or (``ragged``) concatenated with the frames' ``.lengths``."""
    try:
        values = [_array(f[name], f"{where}, frame {i} field {name!r}") for i, f in enumerate(frames)]
    except KeyError:
        raise AnnotationError(
            f"{where}: field {name!r} is missing in some frames; every frame needs "
            "the same fields (use empty arrays for frames without objects)."
        ) from None
    key = names.claim("frame", name)
    if ragged:
        if any(v.ndim == 0 for v in values) or len({v.shape[1:] for v in values}) > 1:
            raise AnnotationError(
                f"{where}: ragged field {name!r} needs shapes [N, ...] with the same trailing "
                f"dimensions; got {sorted({v.shape for v in values})[:4]}."
            )
        return {
            key: np.concatenate(values, axis=0),
            key + ".lengths": np.array([len(v) for v in values], dtype=np.int64),
        }
    if len({v.shape for v in values}) > 1:
        raise AnnotationError(
            f"{where}: field {name!r} changes shape between frames "
            f"({sorted({v.shape for v in values})[:4]}); pass ragged=[{name!r}, ...]."
        )
    return {key: np.stack(values)}

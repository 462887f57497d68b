"""Frozen, validated records of an index: clips, their cameras and frame counts."""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from lightning_vstream.index.tables import VideoInfo
from lightning_vstream.storage.urls import child, is_url

if TYPE_CHECKING:
    from lightning_vstream.index.table_file import FrameTables
    from lightning_vstream.storage.config import StorageConfig

__all__ = ["CameraStream", "Clip", "ClipSequence", "VideoIndex"]


class CameraStream:
    """One camera of one clip: a video file or a folder of images.

    Its frame table (:attr:`info`) is either given, or read on demand from the index's
    memory-mapped :class:`~lightning_vstream.index.table_file.FrameTables` (``tables`` and
    ``row``), so an index of a million files holds no per-file tables in memory, and pickling a
    camera into a worker sends only its name, path and row.

    Args:
        name: Camera name (the file stem).
        path: Video file or image folder (a string is turned into a ``Path`` on first use: an
            index of a million files makes a million of these).
        info: Frame table, if known.
        tables: Frame tables to read ``info`` from on demand (when ``info`` is None).
        row: Row of this file in ``tables``.

    Example::

        >>> cam = CameraStream("CAM_FRONT", Path("videos/scene-0000/CAM_FRONT.mp4"))
        >>> cam.name, cam.info is None
        ('CAM_FRONT', True)
    """

    __slots__ = ("_info", "_path", "name", "row", "tables")
    name: str
    _path: Path | str
    row: int
    tables: FrameTables | None
    _info: VideoInfo | None

    def __init__(
        self,
        name: str,
        path: Path | str,
        info: VideoInfo | None = None,
        *,
        tables: FrameTables | None = None,
        row: int = -1,
    ) -> None:
        # Slot descriptors set directly: an index of a million files makes a million of these.
        _set_name(self, name)
        _set_path(self, path)
        _set_info(self, info)
        has_row = tables is not None and row >= 0
        _set_tables(self, tables if has_row else None)
        _set_row(self, row if has_row else -1)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"CameraStream is immutable; cannot set {name!r}.")

    @property
    def path(self) -> Path | str:
        """The video file or image folder: a ``Path``, or a URL, which stays a string."""
        path = self._path
        if isinstance(path, str):
            if is_url(path):
                return path
            path = Path(path)
            _set_path(self, path)
        return path

    @property
    def path_str(self) -> str:
        """:attr:`path` as a string, without making a ``Path``."""
        return str(self._path)

    @property
    def info(self) -> VideoInfo | None:
        """The frame table, or None when the index has none for this file (it is probed on open)."""
        if self._info is not None:
            return self._info
        if self.tables is not None:
            return self.tables.info(self.row)
        return None

    def with_info(self, info: VideoInfo | None) -> CameraStream:
        """A copy holding ``info`` as its frame table."""
        return CameraStream(self.name, self.path, info)

    def __reduce__(self) -> tuple[object, ...]:
        return (_camera, (self.name, self._path, self._info, self.tables, self.row))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, CameraStream):
            return NotImplemented
        return (self.name, self.path, self.info) == (other.name, other.path, other.info)

    def __hash__(self) -> int:
        return hash((self.name, self.path))

    def __repr__(self) -> str:
        return f"CameraStream(name={self.name!r}, path={self.path!r})"

    @property
    def is_image_folder(self) -> bool:
        """True when the camera is a folder of image files rather than a video (never for a URL)."""
        path = self.path
        return not isinstance(path, str) and path.is_dir()


_SLOTS = CameraStream.__dict__
_set_name = _SLOTS["name"].__set__
_set_path = _SLOTS["_path"].__set__
_set_info = _SLOTS["_info"].__set__
_set_tables = _SLOTS["tables"].__set__
_set_row = _SLOTS["row"].__set__


def _camera(name: str, path: Path | str, info: VideoInfo | None, tables: FrameTables | None, row: int) -> CameraStream:
    return CameraStream(name, path, info, tables=tables, row=row)


@dataclass(frozen=True)
class Clip:
    """A clip: several cameras recorded together, ``frame_count`` frames each."""

    clip_id: str
    video_dir: Path | str  # a URL stays a string
    frame_count: int
    cameras: tuple[CameraStream, ...]

    @property
    def folder(self) -> Path | str:
        """Folder holding the clip's camera files (a URL for a remote index)."""
        if isinstance(self.video_dir, str):
            return child(self.video_dir, self.clip_id)
        return self.video_dir / self.clip_id

    @property
    def camera_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.cameras)


class ClipSequence(Sequence[Clip]):
    """The clips of an index held as arrays: a :class:`Clip` is built only when one is used.

    :func:`~lightning_vstream.index.load_index` returns its clips in this form (see
    :class:`~lightning_vstream.index.arrays.ClipArrays`), so an index of 100,000 clips holds a few
    arrays rather than 700,000 Python objects, and pickles into a worker as a reference to its
    files. It behaves as a read-only sequence of :class:`Clip` (indexing, slicing, ``len``,
    iteration, equality with a tuple of the same clips); every clip has the cameras
    :attr:`camera_names` in that order.
    """

    @property
    @abstractmethod
    def frame_counts(self) -> np.ndarray:
        """Frame count of every clip, in order (read-only ``int64``)."""

    @property
    @abstractmethod
    def camera_names(self) -> tuple[str, ...]:
        """The cameras of every clip, in order."""

    @abstractmethod
    def clip_id(self, position: int) -> str:
        """The id of the clip at ``position``, without building the clip."""

    @abstractmethod
    def position(self, clip_id: str) -> int:
        """Where the clip ``clip_id`` is, or -1 (a binary search, not a scan)."""

    def __eq__(self, other: object) -> bool:
        if other is self:
            return True
        if not isinstance(other, Sequence) or isinstance(other, (str, bytes)):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other))

    def __hash__(self) -> int:
        return hash((len(self), self.camera_names))


@dataclass(frozen=True, eq=False)
class VideoIndex:
    """Validated contents of an index file.

    ``clips`` is a tuple of :class:`Clip`, or (as :func:`~lightning_vstream.index.load_index`
    returns it) a :class:`ClipSequence` that builds each clip when it is used. Either way,
    ``index[i]``, ``index["clip_id"]`` (a lookup, not a scan), iteration and ``len`` work alike,
    and :attr:`frame_counts` gives every clip's frame count without building any clip.
    :attr:`excluded` names the clips of the index file left out when it was loaded (``exclude_clips``).

    Example::

        >>> index = load_index("data/index.json")  # doctest: +SKIP
        >>> len(index), index.camera_names[:2], index["scene-0000"].frame_count  # doctest: +SKIP
        (10, ('CAM_BACK', 'CAM_BACK_LEFT'), 40)
        >>> index.frame_counts[:3]  # doctest: +SKIP
        array([40, 40, 38])
    """

    source: Path | str  # the index file; a URL stays a string
    clips: Sequence[Clip]
    camera_names: tuple[str, ...]
    #: How to reach a remote index's files (options, node cache); None for local indexes.
    storage: StorageConfig | None = field(default=None, compare=False, repr=False)
    #: Clip ids the index file lists that were left out when it was loaded (``exclude_clips``), sorted.
    excluded: tuple[str, ...] = field(default=(), compare=False, repr=False)
    _positions: dict[str, int] | None = field(default=None, init=False, repr=False, compare=False)
    _counts: np.ndarray | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.clips, (tuple, ClipSequence)):
            object.__setattr__(self, "clips", tuple(self.clips))
        object.__setattr__(self, "camera_names", tuple(self.camera_names))

    def __reduce__(self) -> tuple[object, ...]:
        # The fields only (a lazy ``clips`` pickles as a reference to its files), no lookup cache.
        return (VideoIndex, (self.source, self.clips, self.camera_names, self.storage, self.excluded))

    def __len__(self) -> int:
        return len(self.clips)

    def __iter__(self) -> Iterator[Clip]:
        return iter(self.clips)

    def __getitem__(self, key: int | str) -> Clip:
        if isinstance(key, str):
            position = self._position(key)
            if position < 0:
                raise KeyError(f"clip {key!r} is not in {str(self.source)!r}.")
            return self.clips[position]
        return self.clips[key]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, VideoIndex):
            return NotImplemented
        return (self.source, self.camera_names) == (other.source, other.camera_names) and (
            self.clips is other.clips or self.clips == other.clips
        )

    def __hash__(self) -> int:
        return hash((self.source, self.camera_names, len(self.clips)))

    def _position(self, clip_id: str) -> int:
        clips = self.clips
        if isinstance(clips, ClipSequence):
            return clips.position(clip_id)
        positions = self._positions
        if positions is None:
            positions = {}
            for i, clip in enumerate(clips):
                positions.setdefault(clip.clip_id, i)  # the first of repeated ids, as a scan finds it
            object.__setattr__(self, "_positions", positions)
        return positions.get(clip_id, -1)

    def position(self, clip_id: str) -> int:
        """Where clip ``clip_id`` is in :attr:`clips`.

        Raises:
            KeyError: No clip has that id.
        """
        position = self._position(clip_id)
        if position < 0:
            raise KeyError(f"clip {clip_id!r} is not in {str(self.source)!r}.")
        return position

    def clip_id(self, position: int) -> str:
        """The id of the clip at ``position``, without building the clip."""
        clips = self.clips
        if isinstance(clips, ClipSequence):
            return clips.clip_id(position)
        return clips[position].clip_id

    @property
    def frame_counts(self) -> np.ndarray:
        """Frame count of every clip, in index order (read-only ``int64``; no clip is built)."""
        clips = self.clips
        if isinstance(clips, ClipSequence):
            return clips.frame_counts
        counts = self._counts
        if counts is None:
            counts = np.fromiter((c.frame_count for c in clips), dtype=np.int64, count=len(clips))
            counts.flags.writeable = False
            object.__setattr__(self, "_counts", counts)
        return counts

    @property
    def total_frames(self) -> int:
        """Frames per camera summed over all clips."""
        return int(self.frame_counts.sum())

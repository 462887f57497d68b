"""The clips of an index as arrays: a :class:`Clip` is built only when one is used.

An index of 100,000 clips of 6 cameras, held as records, is 700,000 Python objects: seconds to
build, hundreds of MB in every spawn worker, tens of MB to pickle into each. :class:`ClipArrays`
holds what those records say as a few arrays instead (clip ids, frame counts, which video folder
and which camera file names each clip has) and builds a clip's :class:`Clip` and
:class:`CameraStream` records when the clip is used, each camera pointing at its row of the
memory-mapped :class:`~lightning_vstream.index.table_file.FrameTables`.

Pickled (into a spawn or forkserver worker), it sends a reference to the files every process
already reads: the index file's path with its size and CRC-32, the frame tables' path, the video
folders and the camera file names. The worker re-reads the index file (a few MB for 100,000 clips,
no folder is listed) and refuses it, naming the file, if it changed since it was loaded. An index
at a URL is re-read through remote storage (one request per worker, with the options it was
loaded with); its video folders and files stay URLs (strings joined with ``/``), never ``Path``.

The camera file names of most clips are the same (``CAM_FRONT.mp4`` ...): each distinct list is
stored once (a *layout*) and every clip points at one.
"""

from __future__ import annotations

import json
import os
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, overload

import numpy as np

from lightning_vstream.errors import IndexValidationError
from lightning_vstream.index.checksum import crc32
from lightning_vstream.index.records import CameraStream, Clip, ClipSequence
from lightning_vstream.storage.urls import child, is_url

if TYPE_CHECKING:
    from lightning_vstream.index.table_file import FrameTables
    from lightning_vstream.storage.config import StorageConfig

__all__ = ["CACHED_CLIPS", "ClipArrays", "fingerprint", "tables_list_files"]

#: Clips a :class:`ClipArrays` keeps built (per process), the most recently used ones.
CACHED_CLIPS = 512


def fingerprint(raw: bytes) -> tuple[int, int]:
    """``(size, CRC-32)`` of an index file's bytes: how a worker knows it reads the file its parent loaded."""
    return len(raw), crc32(raw)


def _smallest_uint(limit: int) -> type[np.unsignedinteger[Any]]:
    for dtype in (np.uint8, np.uint16, np.uint32):
        if limit <= np.iinfo(dtype).max:
            return dtype
    return np.uint64


def _encoded(strings: Sequence[str]) -> np.ndarray:
    """UTF-8 bytes of ``strings`` as one ``S`` array (width of the longest)."""
    if not strings:
        return np.zeros(0, dtype="S1")
    return np.array([s.encode("utf-8") for s in strings])


class ClipArrays(ClipSequence):
    """The clips of one loaded index, held as arrays (see the module docs).

    Built by :func:`~lightning_vstream.index.load_index`; a :class:`VideoIndex` holds it as its
    ``clips``. Every clip has the cameras :attr:`camera_names`, in that order.

    Args:
        source: The index file (a URL stays a string).
        fingerprint: ``(size, CRC-32)`` of the index file's bytes (see :func:`fingerprint`).
        clip_ids: Clip ids in index order.
        frame_counts: Frame count of each clip.
        dir_of_clip: Position in ``video_dirs`` of each clip's video folder.
        video_dirs: Every video folder of the index file, in its order (absolute, normalised; URLs
            for an index at a URL).
        dir_keys: Frame-table key prefix of each video folder (``"videos/"``; ``""`` for the
            index's own folder).
        camera_names: The cameras of every clip.
        layouts: Distinct lists of camera file (or image folder) names, one per camera.
        layout_of_clip: Position in ``layouts`` of each clip's list; None when all use the first.
        tables: The frame tables the cameras read their :class:`VideoInfo` from, if any.
        overrides: Clips held as records instead (a thorough check re-verified or probed them).
        storage: How to reach an index at a URL (a worker re-reads it through remote storage).
        excluded: Clip ids of the index file left out (``exclude_clips``): a process rebuilding the
            arrays from the file leaves them out too.

    Example::

        >>> clips = load_index("data/index.json").clips  # doctest: +SKIP
        >>> clips.frame_counts[:2], clips.clip_id(0), clips.position("scene-0001")  # doctest: +SKIP
        (array([40, 40]), 'scene-0000', 1)
    """

    def __init__(
        self,
        *,
        source: str,
        fingerprint: tuple[int, int],
        clip_ids: Sequence[str] | np.ndarray,
        frame_counts: Sequence[int] | np.ndarray,
        dir_of_clip: Sequence[int] | np.ndarray,
        video_dirs: Sequence[str],
        dir_keys: Sequence[str],
        camera_names: Sequence[str],
        layouts: Sequence[Sequence[str]],
        layout_of_clip: Sequence[int] | np.ndarray | None,
        tables: FrameTables | None,
        overrides: Mapping[int, Clip] | None = None,
        storage: StorageConfig | None = None,
        excluded: frozenset[str] = frozenset(),
    ) -> None:
        ids = clip_ids if isinstance(clip_ids, np.ndarray) else _encoded(clip_ids)
        n = len(ids)
        self._ids = ids
        self._order = np.argsort(ids, kind="stable").astype(np.int64 if n >= 2**31 else np.int32)
        counts = np.asarray(frame_counts, dtype=np.int64).reshape(n)
        counts.flags.writeable = False
        self._counts = counts
        self._dir_of = np.asarray(dir_of_clip).astype(_smallest_uint(max(len(video_dirs) - 1, 0))).reshape(n)
        self._video_dirs = tuple(video_dirs)
        self._dir_keys = tuple(dir_keys)
        self._is_url = is_url(source)
        # A URL stays a string: Path("s3://b/ds") would become "s3:/b/ds".
        self._dir_paths: tuple[Path | str, ...] = tuple(d if self._is_url else Path(d) for d in video_dirs)
        self._names = tuple(camera_names)
        self._layouts = tuple(tuple(files) for files in layouts)
        layout = None if layout_of_clip is None else np.asarray(layout_of_clip).reshape(n)
        if layout is not None and not layout.any():
            layout = None
        self._layout_of = None if layout is None else layout.astype(_smallest_uint(max(len(self._layouts) - 1, 0)))
        self._tables = tables
        self._overrides = dict(overrides or {})
        self._source = source
        self._fingerprint = fingerprint
        self._storage = storage
        self._excluded = excluded
        self._built: OrderedDict[int, Clip] = OrderedDict()
        if len(self._dir_keys) != len(self._video_dirs) or any(len(files) != len(self._names) for files in layouts):
            raise IndexValidationError(repr(source), [f"index {source!r}: inconsistent clip arrays."])

    @classmethod
    def from_entries(
        cls,
        entries: Mapping[str, Mapping[str, int]],
        *,
        source: str,
        fingerprint: tuple[int, int],
        video_dirs: Sequence[str],
        dir_keys: Sequence[str],
        camera_names: Sequence[str],
        layouts: Sequence[Sequence[str]],
        layout_of_clip: np.ndarray | None,
        tables: FrameTables | None,
        overrides: Mapping[int, Clip] | None = None,
        storage: StorageConfig | None = None,
        excluded: frozenset[str] = frozenset(),
    ) -> ClipArrays:
        """The arrays of a validated index file's contents ``{video_dir: {clip_id: frame_count}}``, without the
        clips ``excluded`` names."""
        if excluded:
            entries = {
                video_dir: {clip_id: count for clip_id, count in clips.items() if clip_id not in excluded}
                for video_dir, clips in entries.items()
            }
        sizes = [len(clips) for clips in entries.values()]
        ids: list[str] = [clip_id for clips in entries.values() for clip_id in clips]
        counts = np.fromiter(
            (count for clips in entries.values() for count in clips.values()), dtype=np.int64, count=len(ids)
        )
        return cls(
            source=source,
            fingerprint=fingerprint,
            clip_ids=ids,
            frame_counts=counts,
            dir_of_clip=np.repeat(np.arange(len(sizes)), sizes),
            video_dirs=video_dirs,
            dir_keys=dir_keys,
            camera_names=camera_names,
            layouts=layouts,
            layout_of_clip=layout_of_clip,
            tables=tables,
            overrides=overrides,
            storage=storage,
            excluded=excluded,
        )

    def with_overrides(self, overrides: Mapping[int, Clip]) -> ClipArrays:
        """A copy in which the clips at the given positions are the given records."""
        copy = ClipArrays.__new__(ClipArrays)
        copy.__dict__.update(self.__dict__)
        copy._overrides = {**self._overrides, **overrides}
        copy._built = OrderedDict()
        return copy

    # -- the sequence -----------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._ids)

    @overload
    def __getitem__(self, position: int) -> Clip: ...

    @overload
    def __getitem__(self, position: slice) -> tuple[Clip, ...]: ...

    def __getitem__(self, position: int | slice) -> Clip | tuple[Clip, ...]:
        if isinstance(position, slice):
            return tuple(self[i] for i in range(*position.indices(len(self))))
        i = position.__index__()
        n = len(self._ids)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"clip position {position} is out of range: the index holds {n} clips.")
        # No lock (a forked worker must never inherit one held): each OrderedDict call is atomic
        # under the GIL, and a key another thread evicted meanwhile is simply built again.
        built = self._built
        clip = built.get(i)
        if clip is not None:
            try:
                built.move_to_end(i)
            except KeyError:
                pass
            return clip
        clip = built.setdefault(i, self._build(i))  # the first of two threads building it wins
        while len(built) > CACHED_CLIPS:
            try:
                built.popitem(last=False)
            except KeyError:
                break
        return clip

    def __iter__(self) -> Iterator[Clip]:
        for i in range(len(self._ids)):
            clip = self._built.get(i)
            yield clip if clip is not None else self._build(i)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, ClipArrays) and self._same_arrays(other):
            return True
        return super().__eq__(other)

    __hash__ = ClipSequence.__hash__

    def __repr__(self) -> str:
        return f"ClipArrays({self._source!r}, clips={len(self)}, cameras={list(self._names)})"

    def _same_arrays(self, other: ClipArrays) -> bool:
        return (
            self._source == other._source
            and self._fingerprint == other._fingerprint
            and self._names == other._names
            and self._video_dirs == other._video_dirs
            and self._layouts == other._layouts
            and np.array_equal(self._layout_codes(), other._layout_codes())
            and getattr(self._tables, "path", None) == getattr(other._tables, "path", None)
            and self._overrides == other._overrides
        )

    def _layout_codes(self) -> np.ndarray:
        return np.zeros(len(self), np.uint8) if self._layout_of is None else self._layout_of

    def _build(self, i: int) -> Clip:
        override = self._overrides.get(i)
        if override is not None:
            return override
        clip_id = self.clip_id(i)
        d = int(self._dir_of[i])
        files = self._layouts[0 if self._layout_of is None else int(self._layout_of[i])]
        if self._is_url:
            folder = child(self._video_dirs[d], clip_id)
            paths = [child(folder, file) for file in files]
        else:
            folder = f"{self._video_dirs[d]}{os.sep}{clip_id}"
            paths = [f"{folder}{os.sep}{file}" for file in files]
        tables = self._tables
        if tables is not None:
            prefix = f"{self._dir_keys[d]}{clip_id}/"
            rows = tables.rows([prefix + f for f in files]).tolist()
        else:
            rows = [-1] * len(files)
        cameras = tuple(
            CameraStream(name, path, tables=tables, row=row) for name, path, row in zip(self._names, paths, rows)
        )
        return Clip(clip_id, self._dir_paths[d], int(self._counts[i]), cameras)

    # -- array accessors --------------------------------------------------------------------
    @property
    def frame_counts(self) -> np.ndarray:
        return self._counts

    @property
    def camera_names(self) -> tuple[str, ...]:
        return self._names

    @property
    def tables(self) -> FrameTables | None:
        """The frame tables the cameras read their frame tables from, if any."""
        return self._tables

    def clip_id(self, position: int) -> str:
        return bytes(self._ids[position]).decode("utf-8")

    def position(self, clip_id: str) -> int:
        key = clip_id.encode("utf-8")
        ids = self._ids
        if not len(ids) or len(key) > ids.dtype.itemsize or not key or key.endswith(b"\0"):
            return -1
        at = int(np.searchsorted(ids, np.array(key, dtype=ids.dtype), sorter=self._order))
        if at < len(ids) and ids[self._order[at]] == key:
            return int(self._order[at])
        return -1

    def layout_counts(self) -> list[tuple[tuple[str, ...], int]]:
        """Each distinct list of camera file names and how many clips use it."""
        used = np.bincount(self._layout_codes(), minlength=len(self._layouts))
        return [(files, int(n)) for files, n in zip(self._layouts, used.tolist())]

    # -- pickling ---------------------------------------------------------------------------
    def __reduce__(self) -> tuple[Any, ...]:
        return (
            _restore,
            (
                self._source,
                self._fingerprint,
                self._video_dirs,
                self._dir_keys,
                self._names,
                self._layouts,
                self._layout_of,
                self._tables,
                self._overrides,
                self._storage,
                self._excluded,
            ),
        )


def _restore(
    source: str,
    recorded: tuple[int, int],
    video_dirs: tuple[str, ...],
    dir_keys: tuple[str, ...],
    camera_names: tuple[str, ...],
    layouts: tuple[tuple[str, ...], ...],
    layout_of_clip: np.ndarray | None,
    tables: FrameTables | None,
    overrides: dict[int, Clip],
    storage: StorageConfig | None = None,
    excluded: frozenset[str] = frozenset(),
) -> ClipArrays:
    """Rebuild the arrays in another process from the index file they were loaded from."""
    from lightning_vstream.index.files import read_index_bytes

    raw = read_index_bytes(source, storage=storage)
    if fingerprint(raw) != tuple(recorded):
        raise IndexValidationError(
            repr(source),
            [
                (
                    f"index file {source!r} changed after it was loaded (it held {recorded[0]} bytes with CRC-32 "
                    f"{recorded[1]:08x}, now {len(raw)} bytes with CRC-32 {crc32(raw):08x}); every worker "
                    "re-reads it, so keep it unchanged while training, or load it again."
                )
            ],
        )
    entries = json.loads(raw.decode("utf-8"))
    if len(entries) != len(video_dirs):
        raise IndexValidationError(
            repr(source), [f"index file {source!r} lists {len(entries)} video folders, not {len(video_dirs)}."]
        )
    return ClipArrays.from_entries(
        entries,
        source=source,
        fingerprint=recorded,
        video_dirs=video_dirs,
        dir_keys=dir_keys,
        camera_names=camera_names,
        layouts=layouts,
        layout_of_clip=layout_of_clip,
        tables=tables,
        overrides=overrides,
        storage=storage,
        excluded=excluded,
    )


def tables_list_files(tables: FrameTables, prefixes: Sequence[str], files: Sequence[str], *, only: bool) -> np.ndarray:
    """For each clip folder, whether the frame tables hold a table for each of ``files`` in it.

    One vectorised search per camera over the sorted, memory-mapped keys: no folder is listed
    and no Python string is made per file.

    Args:
        tables: The frame tables.
        prefixes: Each clip folder's key prefix (``"videos/scene-0001/"``, ending in ``/``).
        files: The camera file (or image folder) names every clip should have.
        only: Also require that the tables hold no other key under the prefix.

    Returns:
        A boolean array, one entry per prefix.

    Example::

        >>> tables_list_files(tables, ["videos/scene-0000/"], ["CAM_FRONT.mp4"], only=True)  # doctest: +SKIP
        array([ True])
    """
    keys = tables.key_array
    if not len(keys):
        return np.zeros(len(prefixes), dtype=bool)
    ok = np.ones(len(prefixes), dtype=bool)
    if not len(prefixes):
        return ok
    width = keys.dtype.itemsize
    last = len(keys) - 1
    heads = _encoded(prefixes)

    def search(wanted: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Where each of ``wanted`` would sort among the keys, and whether it fits the keys' width."""
        cut = wanted.astype(keys.dtype)  # never wider than the keys: no copy of the keys array
        return np.searchsorted(keys, cut), np.char.str_len(wanted) <= width

    for file in files:
        wanted = np.char.add(heads, file.encode("utf-8"))
        at, fits = search(wanted)
        ok &= fits & (at <= last) & (keys[np.minimum(at, last)] == wanted)
    if only:
        # Every key under "a/b/" sorts in ["a/b/", "a/b0"): "0" follows "/".
        lo, fits = search(heads)
        hi, _ = search(_encoded([p[:-1] + "0" for p in prefixes]))
        ok &= fits & (hi - lo == len(files))
    return ok

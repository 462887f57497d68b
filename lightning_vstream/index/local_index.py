"""Index files -> frozen, validated records of clips, cameras and frame counts.

The index format is accvlab's, unchanged: a JSON object ``{"<video_dir>": {"<clip_id>":
<frame_count>, ...}, ...}`` where each ``<video_dir>/<clip_id>/`` folder holds one video file
per camera (or one folder of images per camera). Relative ``video_dir`` paths resolve against
the index file's folder.

Frame tables come from the sidecar next to the index when it is there (see
:mod:`lightning_vstream.index.tables`).
"""

from __future__ import annotations

import errno
import itertools
import json
import os
import sys
import warnings
from collections.abc import Callable, Collection, Iterable, Sequence
from pathlib import Path
from typing import Any

from lightning_vstream.errors import (
    ConfigurationError,
    DataFormatError,
    FileChangedError,
    IndexValidationError,
    VStreamWarning,
)
from lightning_vstream.index.arrays import ClipArrays
from lightning_vstream.index.files import VIDEO_EXTENSIONS, irregular_cameras, is_dir, read_index_bytes, scan_cameras
from lightning_vstream.index.listing import (
    ClipLists,
    camera_reference,
    check_exclude_clips,
    entry_problem,
    folder_entries_problem,
    index_object,
    leave_out_hint,
    match_cameras,
    table_cameras,
)
from lightning_vstream.index.records import CameraStream, Clip, VideoIndex
from lightning_vstream.index.table_file import FrameTables, tables_path
from lightning_vstream.index.tables import (
    cached_info,
    load_metadata,
    metadata_path,
    table_key,
)

__all__ = ["FileCheck", "load_local_index", "read_index_bytes", "read_index_layout"]

#: The thorough check of an index's files (see :func:`lightning_vstream.indexing.load_index`):
#: ``check(clips, where, problems, changed)`` returns the clips, each with what it found (frame tables
#: probed, identities re-verified); it adds files that changed since the index was built to ``changed``
#: and every other problem to ``problems``.
FileCheck = Callable[[list[Clip], str, list[str], list[str]], list[Clip]]

_WARNED_NO_TABLES: set[str] = set()


class CameraChoiceError(IndexValidationError, ConfigurationError):
    """``cameras=`` names a camera no clip of the index has: an argument is wrong, not the data (a typo,
    another dataset's names), so ``vstream`` commands exit with status 2 for it."""


def _pairs_without_duplicates(where: str) -> Any:
    def hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        result: dict[str, Any] = {}
        for key, value in pairs:
            if any("\ud800" <= ch <= "\udfff" for ch in key):
                # JSON's \ud800 escapes can spell half a character, which no file name can hold.
                raise IndexValidationError(
                    where,
                    [
                        f"{where} lists the name {key!r}, which is not valid Unicode (a lone surrogate escape); "
                        "write names as UTF-8 text, or re-run `vstream index` to rebuild the index."
                    ],
                )
            if key in result:
                raise IndexValidationError(
                    where, [f"{where} lists clip or folder {key!r} twice; each clip id must appear once."]
                )
            result[key] = value
        return result

    return hook


def _parse_json(raw: bytes, where: str) -> Any:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise IndexValidationError(
            where,
            [
                (
                    f"index file {where} is not valid UTF-8 (byte {err.start}: {raw[err.start : err.start + 1]!r}); "
                    "save it as UTF-8 JSON, or re-run `vstream index` to rebuild it."
                )
            ],
        ) from None
    try:
        return json.loads(text, object_pairs_hook=_pairs_without_duplicates(where))
    except json.JSONDecodeError as err:
        raise DataFormatError(
            f"index file {where} is not valid JSON: {err.msg} at line {err.lineno}, column {err.colno}."
        ) from None
    except RecursionError:
        raise DataFormatError(f"index file {where} nests JSON too deeply to be an index.") from None
    except IndexValidationError:
        raise
    except ValueError as err:  # a number of thousands of digits (Python's int conversion limit)
        raise DataFormatError(
            f"index file {where} holds a number of more than {sys.get_int_max_str_digits()} digits, which no "
            f"frame count is ({err}); re-run `vstream index` to rebuild the index."
        ) from None


def _read_json(path: Path) -> Any:
    return _parse_json(read_index_bytes(path), repr(str(path)))


def reindex_command(index: Path) -> str:
    """The ``vstream index`` command that rebuilds ``index`` from the folder it lies in (quoted for a message)."""
    base = index.parent
    output = "" if index.name == "index.json" else f" -o {str(index)!r}"
    return f"`vstream index {str(base)!r}{output}`"


def _missing_folder_fix(base: Path, video_dir_key: str, entries: dict[str, Any]) -> str:
    """How to mend an index whose video folder is gone: the folder its clips moved to, or re-indexing."""
    clip_ids = list(entries)[:3]
    moved = []
    try:
        with os.scandir(base) as listing:
            for entry in itertools.islice(listing, 200):  # a dataset root, not a whole disk
                if entry.is_dir() and clip_ids and all(os.path.isdir(os.path.join(entry.path, c)) for c in clip_ids):
                    moved.append(entry.name)
    except OSError:
        pass
    reindex = f"`vstream index {str(base)!r}` writes an index of the folders that are there now"
    if moved:
        return (
            f" Its clips ({', '.join(clip_ids)}) are in {moved[0]!r}: rename that folder back to "
            f"{video_dir_key!r}, or re-index: {reindex}."
        )
    return (
        f" The index lists its video folders relative to its own folder ({str(base)!r}): restore {video_dir_key!r} "
        f"there, keep the index in the dataset's root when moving a dataset, or re-index: {reindex}."
    )


def _folder_problem(folder: Path) -> str:
    """Why ``folder`` is not a usable folder, in words."""
    try:
        os.stat(folder)
    except OSError as err:
        if err.errno == errno.ELOOP:
            return "is a symbolic link loop"
        if err.errno == errno.EACCES:
            return "cannot be read (permission denied)"
        if err.errno in (errno.ENOENT, errno.ENOTDIR):
            return "does not exist"
        if err.errno == errno.ENAMETOOLONG:
            return "does not exist (its name is too long for the file system)"
        return f"cannot be read ({err.strerror or err})"
    return "is not a folder"


def load_local_index(
    path: Path | str,
    *,
    cameras: Sequence[str] | None = None,
    check_files: FileCheck | None = None,
    exclude_clips: Collection[str] | None = None,
) -> VideoIndex:
    """Parse and validate a local index file (:func:`~lightning_vstream.indexing.load_index` without a URL).

    Args:
        path: The index JSON file.
        cameras: Cameras to load, in this order; all cameras when None.
        check_files: The thorough check of the files themselves (see :data:`FileCheck`); None: the
            fast check, which opens no file (with frame tables, not even a clip folder listing).
        exclude_clips: Clip ids to leave out, unchecked (ids the index does not list are ignored).

    Raises:
        See :func:`~lightning_vstream.indexing.load_index`.
    """
    return _load(path, cameras, check_files, with_tables=True, exclude=check_exclude_clips(exclude_clips))


def read_index_layout(path: Path | str) -> list[tuple[str, str, str, Path]]:
    """``(table key, clip id, camera, file)`` of every camera file an index lists; frame tables are ignored.

    Raises:
        IndexValidationError: The index does not describe the files on disk (every problem listed).
    """
    index = _load(path, None, None, with_tables=False)
    base = Path(index.source).parent
    return [
        (table_key(base, Path(cam.path)), clip.clip_id, cam.name, Path(cam.path))
        for clip in index
        for cam in clip.cameras
    ]


def _load(
    path: Path | str,
    cameras: Sequence[str] | None,
    check_files: FileCheck | None,
    *,
    with_tables: bool,
    exclude: frozenset[str] = frozenset(),
) -> VideoIndex:
    try:
        path = Path(path).resolve()
    except (OSError, RuntimeError):  # a symbolic link loop
        raise IndexValidationError(repr(str(path)), [f"index file {str(path)!r} is a symbolic link loop."]) from None
    raw = read_index_bytes(path)
    reading = _IndexReading(path, cameras, with_tables=with_tables)
    data = index_object(_parse_json(raw, reading.where), reading.where)
    # The quick check with binary frame tables lists each video folder once and takes a clip's
    # camera files from the tables, which record every file: listing 100,000 clip folders would
    # take longer than training waits. The files themselves are checked when a decoder opens
    # them (identity, then every packet's checksum); check="thorough" lists every clip folder.
    quick = reading.tables is not None and check_files is None
    reading.collect(reading.lists.leave_out(data, exclude), quick=quick)
    # Clips whose every camera file the tables describe; the others are listed on disk after all.
    described = reading.lists.resolve_deferred(reading.tables, reading.cameras, reading.scan, reading.problems)
    reading.check_cameras_asked_for()
    clips = reading.clips(raw, check_files)
    if with_tables:
        # Only clips listed on disk can lack a frame table: the tables described every deferred one.
        maybe_bare = (clips[i] for i in range(len(clips)) if i not in described)
        _warn_if_unchecked(path, clips, maybe_bare, reading.tables is not None or bool(reading.meta))
    assert reading.reference is not None
    return VideoIndex(path, clips, reading.reference[1], excluded=tuple(sorted(reading.lists.excluded)))


class _IndexReading:
    """One reading of a local index file: its clips checked against their folders, or the frame tables.

    It collects problems (every one is reported together) and, per clip, what
    :class:`~lightning_vstream.index.listing.ClipLists` turns into arrays. The first clip sets the
    cameras (their order and file names) every other clip must have, unless ``cameras`` asks for some.
    """

    def __init__(self, path: Path, cameras: Sequence[str] | None, *, with_tables: bool) -> None:
        self.path = path
        self.where = repr(str(path))
        self.base = path.parent
        self.tables, self.meta = _load_tables(path) if with_tables else (None, {})
        self.not_indexed = self.tables.not_indexed if self.tables is not None else _not_indexed(path)
        self.cameras, self.reference = camera_reference(cameras)
        self.problems: list[str] = []
        self.lists = ClipLists()
        self.scanned: list[set[str]] = []  # the camera files of every clip folder read
        self._seen: dict[str, str] = {}  # clip id -> its video folder
        self._folders: dict[str, str] = {}  # real path -> the video folder key naming it

    def collect(self, data: dict[str, Any], *, quick: bool) -> None:
        """Check every video folder and clip entry of the index, noting each good clip."""
        for video_dir_key, entries in data.items():
            problem = folder_entries_problem(self.where, video_dir_key, entries)
            if problem is not None:
                self.problems.append(problem)
                continue
            self._video_folder(video_dir_key, entries, quick=quick)

    def _video_folder(self, video_dir_key: str, entries: dict[str, Any], *, quick: bool) -> None:
        # Sidecar keys and folders follow the index's own strings, never a resolved path, so a
        # video folder reached through a symbolic link still finds its frame tables.
        video_dir = Path(os.path.normpath(self.base / video_dir_key))
        if not is_dir(video_dir):
            why = _folder_problem(video_dir)
            fix = _missing_folder_fix(self.base, video_dir_key, entries) if why == "does not exist" else ""
            self.problems.append(f"{self.where}: video folder {video_dir_key!r} ({str(video_dir)!r}) {why}.{fix}")
            return
        real = os.path.realpath(video_dir)
        if real in self._folders:
            self.problems.append(
                f"{self.where}: video folders {self._folders[real]!r} and {video_dir_key!r} are the same folder "
                f"({real!r}); list it once, or its clips are read twice under two names."
            )
            return
        self._folders[real] = video_dir_key
        video_dir_str = str(video_dir)
        vd_key = table_key(self.base, video_dir)
        key_prefix = "" if vd_key == "." else vd_key + "/"
        dir_index = self.lists.add_folder(video_dir_str, key_prefix)
        listed = _clip_folders(video_dir_str) if quick else None
        for clip_id, count in entries.items():
            problem = entry_problem(self.where, video_dir_key, clip_id, count, self._seen)
            if problem is not None:
                self.problems.append(problem)
                continue
            folder = f"{video_dir_str}{os.sep}{clip_id}"
            if self.lists.layouts and listed is not None and clip_id in listed:
                self.lists.defer(len(self.problems), clip_id, folder, f"{key_prefix}{clip_id}/")
                files: tuple[str, ...] | None = None
            else:
                files = self.scan(clip_id, folder, f"{key_prefix}{clip_id}/", self.problems)
                if files is None:
                    continue
            self.lists.add(clip_id, count, dir_index, files)

    def scan(self, clip_id: str, folder: str, prefix: str, out: list[str]) -> tuple[str, ...] | None:
        """The clip's camera file names (in camera order) found on disk, or None with the problems in ``out``."""
        where = self.where
        if not os.path.isdir(folder):
            out.append(f"{where}: clip {clip_id!r}: folder {folder!r} {_folder_problem(Path(folder))}.")
            return None
        try:
            found = scan_cameras(folder)
        except IndexValidationError as err:
            out.extend(err.problems)
            return None
        except OSError as err:
            out.append(
                f"{where}: clip {clip_id!r}: folder {folder!r} cannot be read ({err.strerror or err}); "
                "check its permissions."
            )
            return None
        if self.not_indexed:
            # Files the build named and left out (a camera the other clips lack); a file added since is still found.
            found = {name: file for name, file in found.items() if f"{prefix}{file}" not in self.not_indexed}
        if self.reference is None:
            if not found:
                out.append(f"{where}: clip {clip_id!r}: folder {folder!r} holds no camera files.")
                return None
            # The first clip sets the cameras, unless a file of it is gone since the tables were written:
            # then its own problem is that file, not every other clip's "extra" camera.
            recorded = (
                table_cameras(self.tables, prefix.rstrip("/"), image_folders=True) if self.tables is not None else {}
            )
            if recorded and set(recorded) != set(found) and (set(recorded) > set(found) or set(recorded) < set(found)):
                # A file gone, or one added since: the tables' cameras are the reference, the clip's own problem
                # is that file, not every other clip's camera.
                self.reference = (f"clip {clip_id!r} when it was indexed", tuple(recorded))
            else:
                self.reference = (f"clip {clip_id!r}", tuple(found))
        self.scanned.append(set(found))
        wanted = self.cameras if self.cameras is not None else self.reference[1]
        # Only a clip that lacks a camera is listed again, to tell a FIFO or a device from a missing file.
        irregular = irregular_cameras(folder) if any(name not in found for name in wanted) else {}
        refused = [irregular[name] for name in wanted if name in irregular and name not in found]
        if refused:
            out.append(
                f"{where}: clip {clip_id!r}: camera file(s) in {folder!r} are not regular files: "
                f"{'; '.join(refused)}; expected a regular video file. {leave_out_hint(clip_id)}"
            )
            return None
        return match_cameras(
            found,
            self.reference,
            self.cameras,
            clip_id=clip_id,
            where=where,
            folder=folder,
            listed="",
            out=out,
            reindex=reindex_command(self.path),
        )

    def check_cameras_asked_for(self) -> None:
        """A camera asked for that no clip has is one mistake (a typo, another dataset's names), not one per clip."""
        if self.cameras is None or not self.scanned:
            return
        nowhere = [n for n in self.cameras if not any(n in found for found in self.scanned)]
        if nowhere:
            existing = sorted(set().union(*self.scanned))
            raise CameraChoiceError(
                self.where,
                [
                    f"{self.where}: cameras={self.cameras!r}: no clip has camera(s) {nowhere}; the index's clips "
                    f"have cameras {existing}. Pass names from that list, or cameras=None for all of them."
                ],
            )

    def clips(self, raw: bytes, check_files: FileCheck | None) -> Sequence[Clip]:
        """The clips collected, their files checked with ``check_files`` (when given).

        Raises:
            FileChangedError: A file changed since its frame table was written.
            IndexValidationError: Any problem found, all of them listed; or no clip at all.
        """
        where, lists, reference = self.where, self.lists, self.reference
        records = lists.arrays(str(self.path), raw, reference[1], self.tables) if lists.ids and reference else None
        # The older JSON sidecar gives every file its frame table as an object: those clips are records.
        clips: Sequence[Clip] = () if records is None else records
        if self.meta and records is not None:
            clips = tuple(_with_sidecar_tables(clip, self.meta, self.base) for clip in records)
        changed: list[str] = []
        if check_files is not None:
            originals = list(clips)
            checked = check_files(originals, where, self.problems, changed)
            if isinstance(clips, ClipArrays):
                clips = clips.with_overrides({i: c for i, (c, o) in enumerate(zip(checked, originals)) if c is not o})
            else:
                clips = tuple(checked)
        if changed:
            raise FileChangedError(where, self.problems + changed)
        if self.problems:
            raise IndexValidationError(where, self.problems)
        if not clips:
            raise IndexValidationError(where, [f"index file {where} lists no clips."])
        return clips


def _clip_folders(video_dir: str) -> set[str] | None:
    """Names of the folders in ``video_dir`` (one listing), or None when it cannot be listed."""
    try:
        with os.scandir(video_dir) as entries:
            return {entry.name for entry in entries if entry.is_dir()}
    except OSError:
        return None


def _with_sidecar_tables(clip: Clip, meta: dict[str, Any], base: Path) -> Clip:
    """``clip`` with each camera's frame table from the JSON sidecar (``meta``, keyed relative to ``base``)."""
    streams = tuple(
        CameraStream(cam.name, cam.path_str, cached_info(meta, table_key(base, Path(cam.path_str))))
        for cam in clip.cameras
    )
    return Clip(clip.clip_id, clip.video_dir, clip.frame_count, streams)


def _not_indexed(path: Path) -> frozenset[str]:
    """The camera files the build of ``path`` left out on purpose, from its frame tables' header (none without)."""
    try:
        return FrameTables(tables_path(path)).not_indexed if tables_path(path).is_file() else frozenset()
    except (OSError, IndexValidationError):
        return frozenset()  # the reading that uses the tables names their problem


def _load_tables(path: Path) -> tuple[FrameTables | None, dict[str, Any]]:
    """The binary frame tables next to ``path`` if there are any, else the JSON sidecar's entries."""
    binary = tables_path(path)
    try:
        has_binary = binary.is_file()
    except OSError:
        has_binary = True  # let FrameTables name the problem
    if has_binary:
        return FrameTables(binary), {}
    return None, load_metadata(path)


def _warn_if_unchecked(path: Path | str, clips: Sequence[Clip], candidates: Iterable[Clip], has_tables: bool) -> None:
    """Warn once per index when video files have no frame tables (so no checksums are checked).

    ``candidates`` are the clips that may lack tables (the others are known to have them).
    """
    if str(path) in _WARNED_NO_TABLES:
        return
    bare: list[CameraStream] = []
    for clip in candidates:
        for cam in clip.cameras:
            # A stat each, only for files without tables; without any tables the first one tells.
            if cam.tables is None and cam._info is None and not cam.is_image_folder:
                bare.append(cam)
                if not has_tables:
                    break
        if bare and not has_tables:
            break
    if not bare:
        return
    _WARNED_NO_TABLES.add(str(path))
    if not has_tables:
        what = f"has no frame tables ({tables_path(path).name} or {metadata_path(path).name})"
    else:
        what = (
            f"has no frame table for {len(bare)} of its {_video_files(clips)} video files (first: "
            f"{str(bare[0].path)!r})"
        )
    warnings.warn(
        f"index {str(path)!r} {what}, so integrity checks are off for those files: their packet checksums and "
        "file fingerprints are not checked, and a replaced or corrupted file can deliver wrong frames without an "
        f"error. Turn the checks on with `vstream index --tables {path}` (writes the frame tables of the files "
        "this index lists).",
        VStreamWarning,
        stacklevel=4,
    )


def _video_files(clips: Sequence[Clip]) -> int:
    """Camera files with a video extension, counted per distinct layout where the clips are arrays."""

    def videos(names: Iterable[str]) -> int:
        return sum(os.path.splitext(n)[1].lower() in VIDEO_EXTENSIONS for n in names)

    if isinstance(clips, ClipArrays):
        return sum(videos(files) * n for files, n in clips.layout_counts())
    return sum(videos(cam.path_str for cam in clip.cameras) for clip in clips)

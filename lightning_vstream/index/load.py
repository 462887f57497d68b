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
import json
import os
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from lightning_vstream.errors import (
    ConfigurationTypeError,
    DataFormatError,
    FileChangedError,
    IndexValidationError,
    MissingFileError,
)
from lightning_vstream.index.files import VIDEO_EXTENSIONS, is_dir, scan_cameras
from lightning_vstream.index.records import CameraStream, Clip, VideoIndex
from lightning_vstream.index.table_file import FrameTables, tables_path
from lightning_vstream.index.tables import (
    cached_info,
    load_metadata,
    metadata_path,
    table_key,
)
from lightning_vstream.storage.urls import is_url

__all__ = ["MAX_FRAMES", "Check", "load_index"]

Check = Literal["fast", "thorough"]

#: Largest frame count an index may list for one clip (2**31 - 1: years of video at 30 fps).
MAX_FRAMES = 2**31 - 1

_WARNED_NO_TABLES: set[str] = set()


def _pairs_without_duplicates(where: str) -> Any:
    def hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        result: dict[str, Any] = {}
        for key, value in pairs:
            if key in result:
                raise IndexValidationError(
                    where, [f"{where} lists clip or folder {key!r} twice; each clip id must appear once."]
                )
            result[key] = value
        return result

    return hook


def _read_json(path: Path) -> Any:
    where = repr(str(path))
    if not path.is_file():
        raise MissingFileError(f"index file {where} does not exist.")
    try:
        raw = path.read_bytes()
    except OSError as err:
        raise IndexValidationError(
            where, [f"index file {where} cannot be read ({err.strerror or err}); check its permissions."]
        ) from None
    return parse_index_json(raw, where)


def parse_index_json(raw: bytes, where: str) -> Any:
    """The JSON value of an index file's bytes (read from disk or from remote storage); ``where`` names it."""
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


def _bad_clip_id(clip_id: str) -> bool:
    """True unless ``clip_id`` names exactly one folder inside its video folder."""
    return (
        not clip_id
        or clip_id in (".", "..")
        or "/" in clip_id
        or "\\" in clip_id
        or "\0" in clip_id
        or clip_id != clip_id.strip("\n\r")
    )


def load_index(
    path: Path | str,
    *,
    cameras: Sequence[str] | None = None,
    check: Check = "fast",
    storage_options: dict[str, Any] | None = None,
    cache_dir: str | None = None,
    cache_limit: int | str | None = None,
) -> VideoIndex:
    """Parse and validate an index file, on a local disk or at a URL.

    Camera order is the sorted file stems found in the first clip, or ``cameras`` (which may
    also select a subset). Every problem found is reported in one error.

    A URL (``s3://bucket/ds/index.json``, ``gs://``, ``az://``, ``http(s)://``, ``file://``...) is read
    through remote storage: video paths resolve relative to the index's URL and stay URLs; the frame
    tables are fetched once per machine into ``cache_dir`` (else the system's temporary folder) and
    memory-mapped; decoders then read each file GOP by GOP (see ``docs/remote.md``).

    Args:
        path: The index JSON file, or its URL.
        cameras: Cameras to load, in this order; all cameras when None.
        check: ``"fast"`` checks that folders and camera files exist and that every clip has
            the same cameras (no file is opened: each decoder checks its file's identity when it
            opens it); ``"thorough"`` also compares every file's size and modification time with
            the index, re-verifies changed files in full, probes files without frame tables, and
            checks frame counts, frame sizes and codecs. For a URL, ``"thorough"`` compares every
            file's size and ETag with the frame tables (one HEAD each).
        storage_options: How to reach a URL (endpoint, credentials, retries...; see
            :class:`~lightning_vstream.storage.options.StorageConfig`); the provider's standard
            environment otherwise.
        cache_dir: Node-local folder caching the frame tables and every GOP read (shared by the
            ranks and workers of a machine); None: GOPs are only held in memory while needed.
        cache_limit: Bytes the GOP cache may hold (``"20GB"`` or an int); None: no limit.

    Returns:
        The validated :class:`VideoIndex`.

    Raises:
        FileNotFoundError: The index file does not exist.
        ValueError: The JSON is malformed (message gives line and column), or ``cameras`` is empty
            or repeats a name.
        TypeError: ``cameras`` is a single string instead of a list.
        IndexValidationError: The index disagrees with the files (every problem listed).
        FileChangedError: With ``check="thorough"``, a file changed since the index was built and
            its packets no longer match the frame tables.

    Example::

        >>> index = load_index("data/index.json", cameras=["CAM_FRONT", "CAM_BACK"])  # doctest: +SKIP
    """
    if check not in ("fast", "thorough"):
        raise DataFormatError(f"check={check!r} is not supported; use 'fast' or 'thorough'.")
    if is_url(path):
        from lightning_vstream.index.remote import load_remote_index
        from lightning_vstream.storage.options import StorageConfig

        config = StorageConfig.make(storage_options, cache_dir=cache_dir, cache_limit=cache_limit)
        return load_remote_index(str(path), cameras=cameras, check=check, storage=config)
    return _load(path, cameras, check, with_tables=True)


def read_index_layout(path: Path | str) -> list[tuple[str, str, str, Path]]:
    """``(table key, clip id, camera, file)`` of every camera file an index lists; frame tables are ignored.

    Raises:
        IndexValidationError: The index does not describe the files on disk (every problem listed).
    """
    index = _load(path, None, "fast", with_tables=False)
    base = Path(index.source).parent
    return [
        (table_key(base, Path(cam.path)), clip.clip_id, cam.name, Path(cam.path))
        for clip in index
        for cam in clip.cameras
    ]


def _load(path: Path | str, cameras: Sequence[str] | None, check: Check, *, with_tables: bool) -> VideoIndex:
    try:
        path = Path(path).resolve()
    except (OSError, RuntimeError):  # a symbolic link loop
        raise IndexValidationError(repr(str(path)), [f"index file {str(path)!r} is a symbolic link loop."]) from None
    where = repr(str(path))
    data = _read_json(path)
    if not isinstance(data, dict):
        raise IndexValidationError(
            where,
            [
                (
                    f"index file {where} must hold a JSON object {{video_dir: {{clip_id: frame_count}}}}, "
                    f"not a {type(data).__name__}."
                )
            ],
        )
    tables, meta = _load_tables(path) if with_tables else (None, {})
    base = path.parent
    problems: list[str] = []
    seen: dict[str, str] = {}
    folders_seen: dict[str, str] = {}
    reference: tuple[str, tuple[str, ...]] | None = None
    if cameras is not None:
        if isinstance(cameras, str):
            raise ConfigurationTypeError(
                f"cameras={cameras!r} must be a list of camera names, not a string; pass [{cameras!r}]."
            )
        cameras = list(cameras)
        if not cameras or len(set(cameras)) != len(cameras):
            raise DataFormatError(f"cameras={cameras!r} must be a non-empty list of distinct camera names.")
        reference = ("the cameras argument", tuple(cameras))
    # Clips whose frame tables come from the binary tables: (clip id, folder, count, cameras, files, keys).
    pending: list[tuple[str, Path, int, tuple[str, ...], list[str], list[str]]] = []
    clips: list[Clip] = []
    for video_dir_key, entries in data.items():
        # Sidecar keys and folders follow the index's own strings, never a resolved path, so a
        # video folder reached through a symbolic link still finds its frame tables.
        video_dir = Path(os.path.normpath(base / video_dir_key))
        if not isinstance(entries, dict):
            problems.append(
                f"{where}: video folder {video_dir_key!r} must map clip ids to frame counts, "
                f"got a {type(entries).__name__}."
            )
            continue
        if not is_dir(video_dir):
            problems.append(
                f"{where}: video folder {video_dir_key!r} ({str(video_dir)!r}) {_folder_problem(video_dir)}."
            )
            continue
        real = os.path.realpath(video_dir)
        video_dir_str = str(video_dir)
        vd_key = table_key(base, video_dir)
        key_prefix = "" if vd_key == "." else vd_key + "/"
        if real in folders_seen:
            problems.append(
                f"{where}: video folders {folders_seen[real]!r} and {video_dir_key!r} are the same folder "
                f"({real!r}); list it once, or its clips are read twice under two names."
            )
            continue
        folders_seen[real] = video_dir_key
        for clip_id, count in entries.items():
            if isinstance(count, bool) or not isinstance(count, int) or count <= 0:
                problems.append(f"{where}: clip {clip_id!r} has frame count {count!r}; expected a positive integer.")
                continue
            if count > MAX_FRAMES:
                problems.append(
                    f"{where}: clip {clip_id!r} has frame count {count}, more than any video holds (at most "
                    f"{MAX_FRAMES}); re-run `vstream index` to rebuild the index."
                )
                continue
            if _bad_clip_id(clip_id):
                problems.append(
                    f"{where}: clip id {clip_id!r} in video folder {video_dir_key!r} is not a plain folder name; "
                    "a clip id names one folder inside its video folder (no '/', '\\', '.' or '..'), so that "
                    "no clip is read under two ids. Move the clip into a video folder and list it there."
                )
                continue
            if clip_id in seen:
                problems.append(
                    f"{where}: clip id {clip_id!r} appears in both {seen[clip_id]!r} and {video_dir_key!r}; "
                    "clip ids must be unique across the index (rename one, or use separate index files)."
                )
                continue
            seen[clip_id] = video_dir_key
            folder = f"{video_dir_str}{os.sep}{clip_id}"
            if not os.path.isdir(folder):
                problems.append(f"{where}: clip {clip_id!r}: folder {folder!r} {_folder_problem(Path(folder))}.")
                continue
            try:
                found = scan_cameras(folder)
            except IndexValidationError as err:
                problems.extend(err.problems)
                continue
            except OSError as err:
                problems.append(
                    f"{where}: clip {clip_id!r}: folder {folder!r} cannot be read ({err.strerror or err}); "
                    "check its permissions."
                )
                continue
            if reference is None:
                if not found:
                    problems.append(f"{where}: clip {clip_id!r}: folder {folder!r} holds no camera files.")
                    continue
                reference = (f"clip {clip_id!r}", tuple(found))
            names = reference[1]
            missing = [n for n in names if n not in found]
            if missing:
                problems.append(
                    f"{where}: clip {clip_id!r} is missing camera file(s) {missing} in {folder!r} "
                    f"(expected the cameras of {reference[0]}: {list(names)})."
                )
                continue
            if cameras is None and set(found) != set(names):
                problems.append(
                    f"{where}: clip {clip_id!r} has cameras {sorted(found)} but {reference[0]} has "
                    f"{list(names)}; pass cameras=[...] to load a common subset."
                )
                continue
            files = [found[n] for n in names]
            paths = [f"{folder}{os.sep}{f}" for f in files]
            keys = [f"{key_prefix}{clip_id}/{f}" for f in files]
            if tables is not None:
                # Cameras are made once every key's row is known (one vectorised search below).
                pending.append((clip_id, video_dir, count, names, paths, keys))
                continue
            streams = tuple(CameraStream(n, p, cached_info(meta, k)) for n, p, k in zip(names, paths, keys))
            clips.append(Clip(clip_id, video_dir, count, streams))
    if tables is not None and pending:
        rows = tables.rows([k for *_, keys in pending for k in keys]).tolist()
        at = 0
        for clip_id, video_dir, count, names, paths, _ in pending:
            mine = rows[at : at + len(names)]
            streams = tuple(CameraStream(n, p, tables=tables, row=r) for n, p, r in zip(names, paths, mine))
            at += len(names)
            clips.append(Clip(clip_id, video_dir, count, streams))
    changed: list[str] = []
    if check == "thorough" and not problems:
        # The fast check opens no file: a decoder compares each file's identity when it opens it.
        clips = [_check_identities(clip, where, changed) for clip in clips]
    if check == "thorough" and not changed:
        from lightning_vstream.index.build import probe_clip

        clips = [probe_clip(clip, where, problems) for clip in clips]
    if changed:
        raise FileChangedError(where, problems + changed)
    if problems:
        raise IndexValidationError(where, problems)
    if not clips:
        raise IndexValidationError(where, [f"index file {where} lists no clips."])
    assert reference is not None
    if with_tables:
        _warn_if_unchecked(path, clips, tables is not None or bool(meta))
    return VideoIndex(path, tuple(clips), reference[1])


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


def _check_identities(clip: Clip, where: str, changed: list[str]) -> Clip:
    """Compare each video file's size and mtime with the index; re-verify in full any file that differs."""
    from lightning_vstream.index.identity import reverify

    streams = []
    for cam in clip.cameras:
        if cam.tables is not None:
            recorded = cam.tables.identity(cam.row)
        else:
            recorded = cam.info.identity if cam.info is not None else None
        if recorded is None:
            streams.append(cam)
            continue
        try:
            st = os.stat(cam.path)
            same = st.st_size == recorded.size and (recorded.size_only or st.st_mtime_ns == recorded.mtime_ns)
        except OSError:
            same = False
        if same:
            streams.append(cam)
            continue
        label = f"clip {clip.clip_id!r}, camera {cam.name!r} ({str(cam.path)!r})"
        info = cam.info
        assert info is not None
        try:
            streams.append(cam.with_info(reverify(Path(cam.path), info, label)))
        except FileChangedError as err:
            changed.extend(f"{where}: {p}" for p in err.problems)
            streams.append(cam)
    return Clip(clip.clip_id, clip.video_dir, clip.frame_count, tuple(streams))


def _warn_if_unchecked(path: Path | str, clips: list[Clip], has_tables: bool) -> None:
    """Warn once per index when video files have no frame tables (so no checksums are checked)."""
    if str(path) in _WARNED_NO_TABLES:
        return
    bare = [cam for clip in clips for cam in clip.cameras if cam.tables is None and cam._info is None]
    bare = [cam for cam in bare if not cam.is_image_folder]  # a stat each, only for files without tables
    if not bare:
        return
    videos = [
        cam
        for clip in clips
        for cam in clip.cameras
        if os.path.splitext(str(cam.path_str))[1].lower() in VIDEO_EXTENSIONS
    ]
    _WARNED_NO_TABLES.add(str(path))
    what = (
        f"has no frame tables ({tables_path(path).name} or {metadata_path(path).name})"
        if not has_tables
        else f"has no frame table for {len(bare)} of its {len(videos)} video files (first: {str(bare[0].path)!r})"
    )
    warnings.warn(
        f"index {str(path)!r} {what}, so integrity checks are off for those files: their packet checksums and "
        "file fingerprints are not checked, and a replaced or corrupted file can deliver wrong frames without an "
        f"error. Turn the checks on with `vstream index --tables {path}` (writes the frame tables of the files "
        "this index lists).",
        UserWarning,
        stacklevel=4,
    )

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
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from lightning_vstream.errors import (
    ConfigurationError,
    ConfigurationTypeError,
    DataFormatError,
    FileChangedError,
    IndexValidationError,
    MissingFileError,
    VStreamWarning,
)
from lightning_vstream.index.arrays import ClipArrays, fingerprint, tables_list_files
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

if TYPE_CHECKING:
    from lightning_vstream.storage.options import StorageConfig

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


def read_index_bytes(path: Path | str, *, storage: StorageConfig | None = None) -> bytes:
    """The bytes of an index file (also what a worker re-reads to rebuild the clip arrays).

    An index at a URL is read through remote storage (one request, retried like every other),
    with ``storage``'s options.

    Raises:
        FileNotFoundError: The file does not exist.
        IndexValidationError: It cannot be read.
        RemoteStorageError: Remote storage failed for good (retries spent).
    """
    where = repr(str(path))
    if is_url(path):
        from lightning_vstream.storage.client import storage_for
        from lightning_vstream.storage.options import StorageConfig

        try:
            raw, _ = storage_for(storage or StorageConfig()).read(str(path), label="index")
        except MissingFileError:
            raise MissingFileError(f"index file {where} does not exist.") from None
        return bytes(raw)
    path = Path(path)
    if path.is_dir():
        inside = path / "index.json"
        fix = f"pass {str(inside)!r}" if inside.is_file() else f"run `vstream index {path}` to write {str(inside)!r}"
        raise ConfigurationError(f"index file {where} is a folder; {fix}.")
    if not path.is_file():
        raise MissingFileError(
            f"index file {where} does not exist. Run `vstream index DATASET_FOLDER` to index your videos, "
            "or `vstream synth FOLDER` to write a stamped synthetic dataset."
        )
    try:
        return path.read_bytes()
    except OSError as err:
        raise IndexValidationError(
            where, [f"index file {where} cannot be read ({err.strerror or err}); check its permissions."]
        ) from None


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


def _read_json(path: Path) -> Any:
    return _parse_json(read_index_bytes(path), repr(str(path)))


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
    raw = read_index_bytes(path)
    data = _parse_json(raw, where)
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
    scanned: list[set[str]] = []  # the camera files of every clip folder read

    def scan(clip_id: str, folder: str, out: list[str]) -> tuple[str, ...] | None:
        """The clip's camera file names (in camera order) found on disk, or None with the problems in ``out``."""
        nonlocal reference
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
        if reference is None:
            if not found:
                out.append(f"{where}: clip {clip_id!r}: folder {folder!r} holds no camera files.")
                return None
            reference = (f"clip {clip_id!r}", tuple(found))
        names = reference[1]
        missing = [n for n in names if n not in found]
        scanned.append(set(found))
        if missing:
            out.append(
                f"{where}: clip {clip_id!r} is missing camera file(s) {missing} in {folder!r} "
                f"(expected the cameras of {reference[0]}: {list(names)})."
            )
            return None
        if cameras is None and set(found) != set(names):
            out.append(
                f"{where}: clip {clip_id!r} has cameras {sorted(found)} but {reference[0]} has "
                f"{list(names)}; pass cameras=[...] to load a common subset."
            )
            return None
        return tuple(found[n] for n in names)

    # The quick check with binary frame tables lists each video folder once and takes a clip's
    # camera files from the tables, which record every file: listing 100,000 clip folders would
    # take longer than training waits. The files themselves are checked when a decoder opens
    # them (identity, then every packet's checksum); check="thorough" lists every clip folder.
    quick = tables is not None and check == "fast"
    # Per clip, in order: id, frame count, video folder, layout (its camera file names).
    ids: list[str] = []
    counts: list[int] = []
    dir_of: list[int] = []
    layout_of: list[int] = []
    layouts: dict[tuple[str, ...], int] = {}
    video_dirs: list[str] = []
    dir_keys: list[str] = []
    # Clips whose camera files come from the tables: (position, where their problems go, id, folder, key prefix).
    deferred: list[tuple[int, int, str, str, str]] = []
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
        dir_index = len(video_dirs)
        video_dirs.append(video_dir_str)
        dir_keys.append(key_prefix)
        listed = _clip_folders(video_dir_str) if quick else None
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
            if layouts and listed is not None and clip_id in listed:
                deferred.append((len(ids), len(problems), clip_id, folder, f"{key_prefix}{clip_id}/"))
                files: tuple[str, ...] | None = None
            else:
                files = scan(clip_id, folder, problems)
                if files is None:
                    continue
            ids.append(clip_id)
            counts.append(count)
            dir_of.append(dir_index)
            layout_of.append(0 if files is None else layouts.setdefault(files, len(layouts)))
    described: set[int] = set()  # clips whose every camera file the tables describe
    if deferred:
        # One vectorised search of the tables for every deferred clip; a clip they do not describe
        # exactly (another camera file name, a file missing) is listed on disk after all, and its
        # problems take the place in the report they would have had.
        assert tables is not None
        template = next(iter(layouts))
        ok = tables_list_files(tables, [d[4] for d in deferred], template, only=cameras is None).tolist()
        for (at, place, clip_id, folder, _), good in reversed(list(zip(deferred, ok))):
            if good:
                described.add(at)
                continue
            found: list[str] = []
            files = scan(clip_id, folder, found)
            problems[place:place] = found
            if files is not None:
                layout_of[at] = layouts.setdefault(files, len(layouts))
    if cameras is not None and scanned:
        # A camera no clip has is one mistake (a typo, another dataset's names), not one per clip.
        nowhere = [n for n in cameras if not any(n in found for found in scanned)]
        if nowhere:
            existing = sorted(set().union(*scanned))
            raise IndexValidationError(
                where,
                [
                    f"{where}: cameras={cameras!r}: no clip has camera(s) {nowhere}; the index's clips have "
                    f"cameras {existing}. Pass names from that list, or cameras=None for all of them."
                ],
            )
    records = (
        ClipArrays(
            source=str(path),
            fingerprint=fingerprint(raw),
            clip_ids=ids,
            frame_counts=counts,
            dir_of_clip=dir_of,
            video_dirs=video_dirs,
            dir_keys=dir_keys,
            camera_names=reference[1],
            layouts=list(layouts),
            layout_of_clip=layout_of,
            tables=tables,
        )
        if ids and reference is not None
        else None
    )
    # The older JSON sidecar gives every file its frame table as an object: those clips are records.
    clips: Sequence[Clip] = () if records is None else records
    if meta and records is not None:
        clips = tuple(_with_sidecar_tables(clip, meta, base) for clip in records)
    changed: list[str] = []
    if check == "thorough":
        originals = list(clips)
        checked = originals
        if not problems:
            # The fast check opens no file: a decoder compares each file's identity when it opens it.
            checked = [_check_identities(clip, where, changed) for clip in checked]
        if not changed:
            from lightning_vstream.index.build import probe_clip

            checked = [probe_clip(clip, where, problems) for clip in checked]
        if isinstance(clips, ClipArrays):
            clips = clips.with_overrides({i: c for i, (c, o) in enumerate(zip(checked, originals)) if c is not o})
        else:
            clips = tuple(checked)
    if changed:
        raise FileChangedError(where, problems + changed)
    if problems:
        raise IndexValidationError(where, problems)
    if not clips:
        raise IndexValidationError(where, [f"index file {where} lists no clips."])
    assert reference is not None
    if with_tables:
        # Only clips listed on disk can lack a frame table: the tables described every deferred one.
        maybe_bare = (clips[i] for i in range(len(clips)) if i not in described)
        _warn_if_unchecked(path, clips, maybe_bare, tables is not None or bool(meta))
    return VideoIndex(path, clips, reference[1])


def _clip_folders(video_dir: str) -> set[str] | None:
    """Names of the folders in ``video_dir`` (one listing), or None when it cannot be listed."""
    try:
        with os.scandir(video_dir) as entries:
            return {entry.name for entry in entries if entry.is_dir()}
    except OSError:
        return None


def _with_sidecar_tables(clip: Clip, meta: dict[str, Any], base: Path) -> Clip:
    streams = tuple(
        CameraStream(cam.name, cam.path_str, cached_info(meta, table_key(base, Path(cam.path_str))))
        for cam in clip.cameras
    )
    return Clip(clip.clip_id, clip.video_dir, clip.frame_count, streams)


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
    if all(new is old for new, old in zip(streams, clip.cameras)):
        return clip
    return Clip(clip.clip_id, clip.video_dir, clip.frame_count, tuple(streams))


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

"""Index files -> frozen, validated records of clips, cameras and frame counts.

The index format is accvlab's, unchanged: a JSON object ``{"<video_dir>": {"<clip_id>":
<frame_count>, ...}, ...}`` where each ``<video_dir>/<clip_id>/`` folder holds one video file
per camera (or one folder of images per camera). Relative ``video_dir`` paths resolve against
the index file's folder.

Richer per-file metadata (codec, size, frame timestamps, keyframe positions) lives in a
sidecar file next to the index, ``<index stem>.meta.json``, so plain accvlab readers keep
working on our index files and our loader seeks without rescanning files. The sidecar is
versioned and keyed by file path relative to the index; an entry whose file size changed
is ignored.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from lightning_vstream.decode.base import VideoInfo

__all__ = [
    "IMAGE_EXTENSIONS",
    "VIDEO_EXTENSIONS",
    "CameraStream",
    "Clip",
    "IndexValidationError",
    "VideoIndex",
    "build_index",
    "load_index",
    "metadata_path",
]

VIDEO_EXTENSIONS = frozenset({".mp4", ".mov", ".mkv", ".avi", ".webm", ".m4v", ".ts", ".h264", ".h265", ".hevc"})
IMAGE_EXTENSIONS = frozenset({".jpg", ".jpeg", ".png"})
META_FORMAT = "lightning_vstream.meta"
META_VERSION = 1
Check = Literal["fast", "thorough"]


class IndexValidationError(ValueError):
    """An index file does not describe the files on disk; ``problems`` lists every finding."""

    def __init__(self, source: str, problems: Sequence[str]) -> None:
        self.source = source
        self.problems = list(problems)
        if len(self.problems) == 1:
            message = self.problems[0]
        else:
            listed = "\n".join(f"  {i + 1}. {p}" for i, p in enumerate(self.problems))
            message = f"{source} has {len(self.problems)} problems:\n{listed}"
        super().__init__(message)


@dataclass(frozen=True)
class CameraStream:
    """One camera of one clip: a video file or a folder of images."""

    name: str
    path: Path
    info: VideoInfo | None = None

    @property
    def is_image_folder(self) -> bool:
        """True when the camera is a folder of image files rather than a video."""
        return self.path.is_dir()


@dataclass(frozen=True)
class Clip:
    """A clip: several cameras recorded together, ``frame_count`` frames each."""

    clip_id: str
    video_dir: Path
    frame_count: int
    cameras: tuple[CameraStream, ...]

    @property
    def folder(self) -> Path:
        """Folder holding the clip's camera files."""
        return self.video_dir / self.clip_id

    @property
    def camera_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.cameras)


@dataclass(frozen=True)
class VideoIndex:
    """Validated contents of an index file.

    Example::

        >>> index = load_index("data/index.json")  # doctest: +SKIP
        >>> len(index), index.camera_names[:2], index["scene-0000"].frame_count  # doctest: +SKIP
        (10, ('CAM_BACK', 'CAM_BACK_LEFT'), 40)
    """

    source: Path
    clips: tuple[Clip, ...]
    camera_names: tuple[str, ...]

    def __len__(self) -> int:
        return len(self.clips)

    def __iter__(self) -> Iterator[Clip]:
        return iter(self.clips)

    def __getitem__(self, key: int | str) -> Clip:
        if isinstance(key, int):
            return self.clips[key]
        for clip in self.clips:
            if clip.clip_id == key:
                return clip
        raise KeyError(f"clip {key!r} is not in {str(self.source)!r}.")

    @property
    def total_frames(self) -> int:
        """Frames per camera summed over all clips."""
        return sum(c.frame_count for c in self.clips)


def metadata_path(index_path: Path | str) -> Path:
    """Where the metadata sidecar of ``index_path`` lives (``index.json`` -> ``index.meta.json``)."""
    index_path = Path(index_path)
    return index_path.with_name(index_path.stem + ".meta.json")


def _is_dir(path: Path) -> bool:
    """``path.is_dir()`` that answers False for paths the OS rejects (names over 255 bytes...)."""
    try:
        return path.is_dir()
    except OSError:
        return False


def _natural_key(text: str) -> list[Any]:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", text)]


def _image_files(folder: Path) -> list[Path]:
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return []
    files = [Path(e.path) for e in entries if e.is_file() and Path(e.name).suffix.lower() in IMAGE_EXTENSIONS]
    return sorted(files, key=lambda p: _natural_key(p.name))


def _discover_cameras(folder: Path) -> dict[str, Path]:
    """Camera name -> file (or image folder) found in a clip folder."""
    found: dict[str, Path] = {}
    for entry in sorted(os.scandir(folder), key=lambda e: e.name):
        path = Path(entry.path)
        if entry.is_file() and path.suffix.lower() in VIDEO_EXTENSIONS:
            if path.stem in found:
                raise IndexValidationError(
                    str(folder), [f"{str(folder)!r} holds two files for camera {path.stem!r}: "
                                  f"{found[path.stem].name!r} and {path.name!r}; keep one."]
                )
            found[path.stem] = path
        elif entry.is_dir() and _image_files(path):
            found.setdefault(entry.name, path)
    # Order by camera name (the stem), not by file name: "CAM-2.mp4" sorts before "CAM.mp4".
    return dict(sorted(found.items()))


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
    if not path.is_file():
        raise FileNotFoundError(f"index file {str(path)!r} does not exist.")
    text = path.read_text(encoding="utf-8")
    try:
        return json.loads(text, object_pairs_hook=_pairs_without_duplicates(repr(str(path))))
    except json.JSONDecodeError as err:
        raise ValueError(
            f"index file {str(path)!r} is not valid JSON: {err.msg} at line {err.lineno}, column {err.colno}."
        ) from None
    except RecursionError:
        raise ValueError(f"index file {str(path)!r} nests JSON too deeply to be an index.") from None


def _load_metadata(index_path: Path) -> dict[str, dict[str, Any]]:
    meta_file = metadata_path(index_path)
    if not meta_file.is_file():
        return {}
    try:
        data = json.loads(meta_file.read_text(encoding="utf-8"))
    except RecursionError:
        raise ValueError(f"metadata file {str(meta_file)!r} nests JSON too deeply; delete it or rebuild it "
                         "with `vstream index`.") from None
    except json.JSONDecodeError as err:
        raise ValueError(
            f"metadata file {str(meta_file)!r} is not valid JSON ({err.msg} at line {err.lineno}, column "
            f"{err.colno}); delete it or rebuild it with `vstream index`."
        ) from None
    if not isinstance(data, dict) or data.get("format") != META_FORMAT or data.get("version") != META_VERSION:
        raise ValueError(
            f"metadata file {str(meta_file)!r} is not a version-{META_VERSION} lightning_vstream metadata file; "
            "delete it or rebuild it with `vstream index`."
        )
    files = data.get("files", {})
    return files if isinstance(files, dict) else {}


def _cached_info(meta: Mapping[str, dict[str, Any]], base: Path, path: Path) -> VideoInfo | None:
    key = os.path.relpath(path, base).replace(os.sep, "/")
    entry = meta.get(key)
    if entry is None:
        return None
    try:
        if path.is_file() and entry.get("size") != path.stat().st_size:
            return None
        return VideoInfo.from_dict(entry["info"])
    except (KeyError, TypeError, ValueError, AttributeError, OverflowError, OSError):
        return None  # a damaged entry is ignored: the file is probed instead


def probe(path: Path) -> VideoInfo:
    """Probe a camera stream (video file or image folder) for its frame table."""
    if path.is_dir():
        from lightning_vstream.decode.images import probe_image_folder

        return probe_image_folder(path)
    from lightning_vstream.decode.cpu import probe_video

    return probe_video(path)


def load_index(
    path: Path | str,
    *,
    cameras: Sequence[str] | None = None,
    check: Check = "fast",
) -> VideoIndex:
    """Parse and validate an index file.

    Camera order is the sorted file stems found in the first clip, or ``cameras`` (which may
    also select a subset). Every problem found is reported in one error.

    Args:
        path: The index JSON file.
        cameras: Cameras to load, in this order; all cameras when None.
        check: ``"fast"`` checks that folders and camera files exist and that every clip has
            the same cameras; ``"thorough"`` also probes every file (or uses fresh metadata)
            and checks frame counts, frame sizes and codecs.

    Returns:
        The validated :class:`VideoIndex`.

    Raises:
        FileNotFoundError: The index file does not exist.
        ValueError: The JSON is malformed (message gives line and column), or ``cameras`` is empty
            or repeats a name.
        TypeError: ``cameras`` is a single string instead of a list.
        IndexValidationError: The index disagrees with the files (every problem listed).

    Example::

        >>> index = load_index("data/index.json", cameras=["CAM_FRONT", "CAM_BACK"])  # doctest: +SKIP
    """
    if check not in ("fast", "thorough"):
        raise ValueError(f"check={check!r} is not supported; use 'fast' or 'thorough'.")
    path = Path(path).resolve()
    where = repr(str(path))
    data = _read_json(path)
    if not isinstance(data, dict):
        raise IndexValidationError(
            where, [f"index file {where} must hold a JSON object {{video_dir: {{clip_id: frame_count}}}}, "
                    f"not a {type(data).__name__}."]
        )
    meta = _load_metadata(path)
    base = path.parent
    problems: list[str] = []
    seen: dict[str, str] = {}
    reference: tuple[str, tuple[str, ...]] | None = None
    if cameras is not None:
        if isinstance(cameras, str):
            raise TypeError(f"cameras={cameras!r} must be a list of camera names, not a string; pass [{cameras!r}].")
        cameras = list(cameras)
        if not cameras or len(set(cameras)) != len(cameras):
            raise ValueError(f"cameras={cameras!r} must be a non-empty list of distinct camera names.")
        reference = ("the cameras argument", tuple(cameras))
    clips: list[Clip] = []
    for video_dir_key, entries in data.items():
        video_dir = (base / video_dir_key).resolve()
        if not isinstance(entries, dict):
            problems.append(
                f"{where}: video folder {video_dir_key!r} must map clip ids to frame counts, "
                f"got a {type(entries).__name__}."
            )
            continue
        if not _is_dir(video_dir):
            problems.append(f"{where}: video folder {video_dir_key!r} ({str(video_dir)!r}) does not exist.")
            continue
        for clip_id, count in entries.items():
            if isinstance(count, bool) or not isinstance(count, int) or count <= 0:
                problems.append(
                    f"{where}: clip {clip_id!r} has frame count {count!r}; expected a positive integer."
                )
                continue
            if clip_id in seen:
                problems.append(
                    f"{where}: clip id {clip_id!r} appears in both {seen[clip_id]!r} and {video_dir_key!r}; "
                    "clip ids must be unique across the index (rename one, or use separate index files)."
                )
                continue
            seen[clip_id] = video_dir_key
            folder = video_dir / clip_id
            if not _is_dir(folder):
                problems.append(f"{where}: clip {clip_id!r}: folder {str(folder)!r} does not exist.")
                continue
            try:
                found = _discover_cameras(folder)
            except IndexValidationError as err:
                problems.extend(err.problems)
                continue
            if reference is None:
                if not found:
                    problems.append(f"{where}: clip {clip_id!r}: folder {str(folder)!r} holds no camera files.")
                    continue
                reference = (f"clip {clip_id!r}", tuple(found))
            names = reference[1]
            missing = [n for n in names if n not in found]
            if missing:
                problems.append(
                    f"{where}: clip {clip_id!r} is missing camera file(s) {missing} in {str(folder)!r} "
                    f"(expected the cameras of {reference[0]}: {list(names)})."
                )
                continue
            if cameras is None and set(found) != set(names):
                problems.append(
                    f"{where}: clip {clip_id!r} has cameras {sorted(found)} but {reference[0]} has "
                    f"{list(names)}; pass cameras=[...] to load a common subset."
                )
                continue
            streams = tuple(
                CameraStream(n, found[n], _cached_info(meta, base, found[n])) for n in names
            )
            clips.append(Clip(clip_id, video_dir, count, streams))
    if check == "thorough":
        clips = [_probe_clip(clip, where, problems) for clip in clips]
    if problems:
        raise IndexValidationError(where, problems)
    if not clips:
        raise IndexValidationError(where, [f"index file {where} lists no clips."])
    assert reference is not None
    return VideoIndex(path, tuple(clips), reference[1])


def _probe_clip(clip: Clip, where: str, problems: list[str]) -> Clip:
    from lightning_vstream.decode.base import VideoDecodeError

    streams = []
    sizes: dict[str, tuple[int, int]] = {}
    for cam in clip.cameras:
        info = cam.info
        if info is None:
            try:
                info = probe(cam.path)
            except (VideoDecodeError, OSError, ValueError) as err:
                problems.append(f"{where}: clip {clip.clip_id!r}, camera {cam.name!r}: {err}")
                streams.append(cam)
                continue
        if info.frame_count < clip.frame_count:
            problems.append(
                f"{where}: clip {clip.clip_id!r} lists {clip.frame_count} frames, but camera {cam.name!r} "
                f"({cam.path.name}) holds {info.frame_count}. Re-run `vstream index` to rebuild the index."
            )
        if not cam.path.is_dir() and not _decodable(info.codec):
            problems.append(
                f"{where}: clip {clip.clip_id!r}, camera {cam.name!r} ({cam.path.name}) uses codec "
                f"{info.codec!r}, which this FFmpeg build cannot decode; re-encode it to H.264 or H.265."
            )
        sizes[cam.name] = (info.width, info.height)
        streams.append(CameraStream(cam.name, cam.path, info))
    if len(set(sizes.values())) > 1:
        listed = ", ".join(f"{n}={w}x{h}" for n, (w, h) in sizes.items())
        problems.append(
            f"{where}: clip {clip.clip_id!r} has cameras of different frame sizes ({listed}); "
            "batches stack cameras, so resize them to one size or load the cameras separately."
        )
    return Clip(clip.clip_id, clip.video_dir, clip.frame_count, tuple(streams))


def _decodable(codec: str) -> bool:
    import av

    try:
        av.codec.Codec(codec, "r")
    except Exception:  # noqa: BLE001 - PyAV raises several types for unknown codecs
        return False
    return True


def _find_clip_folders(root: Path) -> dict[Path, list[Path]]:
    """video_dir -> clip folders under ``root`` (a clip folder holds camera files)."""
    result: dict[Path, list[Path]] = {}
    for dirpath, dirnames, _ in os.walk(root):
        folder = Path(dirpath)
        dirnames.sort()
        try:
            cams = _discover_cameras(folder)
        except IndexValidationError:
            cams = {"": folder}
        if cams and not _image_files(folder):
            result.setdefault(folder.parent, []).append(folder)
            dirnames[:] = [d for d in dirnames if not (folder / d) in cams.values()]
    return result


def build_index(
    root: Path | str,
    *,
    output: Path | str,
    video_dirs: Sequence[str] | None = None,
    progress: bool = True,
    metadata: bool = True,
) -> Path:
    """Scan a dataset tree and write an accvlab index (plus the metadata sidecar).

    Every camera file is probed, so frame counts come from the streams themselves. A clip's
    frame count is the smallest over its cameras; clips whose cameras disagree are reported
    on stderr.

    Args:
        root: Dataset folder; clip folders are found anywhere below it.
        output: Index file to write; ``video_dir`` keys are relative to its folder.
        video_dirs: Only these folders (relative to ``root``) instead of scanning.
        progress: Show a progress bar while probing.
        metadata: Also write frame tables to the sidecar (see :func:`metadata_path`).

    Returns:
        The index path.

    Raises:
        FileNotFoundError: ``root`` does not exist.
        IndexValidationError: No clip folder was found, or files could not be probed.

    Example::

        >>> build_index("data", output="data/index.json")  # doctest: +SKIP
    """
    from tqdm import tqdm

    root = Path(root).resolve()
    output = Path(output).resolve()
    if not root.is_dir():
        raise FileNotFoundError(f"dataset folder {str(root)!r} does not exist.")
    if video_dirs is not None:
        missing = [d for d in video_dirs if not (root / d).is_dir()]
        if missing:
            raise FileNotFoundError(f"video folder(s) {missing} do not exist under {str(root)!r}.")
        groups = {
            (root / d).resolve(): sorted((p for p in (root / d).iterdir() if p.is_dir()), key=lambda p: _natural_key(p.name))
            for d in video_dirs
        }
    else:
        groups = _find_clip_folders(root)
    jobs = [(vd, folder, name, path) for vd, folders in groups.items() for folder in folders
            for name, path in _discover_cameras(folder).items()]
    if not jobs:
        raise IndexValidationError(str(root), [f"no clip folders with video files or image folders found under {str(root)!r}."])
    infos: dict[Path, VideoInfo] = {}
    problems: list[str] = []
    from lightning_vstream.decode.base import VideoDecodeError

    for _, folder, name, path in tqdm(jobs, desc="probing", unit="file", disable=not progress or len(jobs) < 20):
        try:
            infos[path] = probe(path)
        except (VideoDecodeError, OSError, ValueError) as err:
            problems.append(f"clip {folder.name!r}, camera {name!r}: {err}")
    if problems:
        raise IndexValidationError(str(root), problems)
    index: dict[str, dict[str, int]] = {}
    files: dict[str, Any] = {}
    for vd, folder, name, path in jobs:
        key = os.path.relpath(vd, output.parent).replace(os.sep, "/")
        counts = index.setdefault(key, {})
        n = infos[path].frame_count
        if folder.name in counts and counts[folder.name] != n:
            print(
                f"vstream index: clip {folder.name!r}: cameras hold different frame counts; "
                f"using the smallest ({min(n, counts[folder.name])}).",
                file=sys.stderr,
            )
        counts[folder.name] = min(n, counts.get(folder.name, n))
        rel = os.path.relpath(path, output.parent).replace(os.sep, "/")
        size = path.stat().st_size if path.is_file() else None
        files[rel] = {"size": size, "info": infos[path].to_dict()}
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")
    if metadata:
        meta = {"format": META_FORMAT, "version": META_VERSION, "files": files}
        metadata_path(output).write_text(json.dumps(meta, separators=(",", ":")) + "\n", encoding="utf-8")
    return output

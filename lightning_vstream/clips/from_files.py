"""An in-memory index of single-camera clips made from a list of files: :func:`index_from_files`."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from lightning_vstream.decode.base import VideoInfo
from lightning_vstream.errors import ConfigurationError, MissingFileError
from lightning_vstream.index import CameraStream, Clip, VideoIndex
from lightning_vstream.storage.atomic import write_atomic

__all__ = ["index_from_files"]


def _load_table_cache(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise ConfigurationError(
            f"frame-table cache {str(path)!r} is not valid JSON ({err.msg} at line {err.lineno}); delete it."
        ) from None
    return data if isinstance(data, dict) else {}


def index_from_files(
    paths: Iterable[Path | str],
    *,
    ids: Sequence[str] | None = None,
    camera: str = "video",
    cache_file: Path | str | None = None,
) -> VideoIndex:
    """An in-memory index of single-camera clips, one per video file or image folder.

    Every file is probed here (its packets demuxed once, no frame decoded). With
    ``cache_file`` the frame tables are stored there (keyed by absolute path, size and
    modification time) and reused by later calls, so a long video is scanned once.

    Args:
        paths: Video files or image folders.
        ids: Clip ids, one per path; the file names without extension when None.
        camera: Camera name of every clip.
        cache_file: JSON file caching the frame tables across runs.

    Returns:
        A :class:`~lightning_vstream.VideoIndex` (its ``source`` is ``cache_file`` or the
        current folder).

    Raises:
        FileNotFoundError: A path does not exist.
        ValueError: Ids repeat (pass ``ids=``), or ``ids`` has the wrong length.

    Example::

        >>> index = index_from_files(sorted(Path("videos").glob("*.mp4")), cache_file="tables.json")  # doctest: +SKIP
    """
    from lightning_vstream.indexing import probe

    files = [Path(p).resolve() for p in paths]
    if not files:
        raise ConfigurationError("index_from_files needs at least one path.")
    names = [p.stem if p.is_file() else p.name for p in files] if ids is None else list(ids)
    if len(names) != len(files):
        raise ConfigurationError(
            f"ids has {len(names)} entries but {len(files)} paths were given; pass one id per path."
        )
    seen: dict[str, Path] = {}
    for name, path in zip(names, files):
        if name in seen:
            raise ConfigurationError(
                f"clip id {name!r} is used by both {str(seen[name])!r} and {str(path)!r}; pass ids=[...] "
                "with one distinct id per path."
            )
        seen[name] = path
    cache_path = None if cache_file is None else Path(cache_file)
    cache = {} if cache_path is None else _load_table_cache(cache_path)
    changed = False
    clips = []
    for name, path in zip(names, files):
        if not path.exists():
            raise MissingFileError(f"{str(path)!r} (clip {name!r}) does not exist.")
        stat = path.stat()
        key = [stat.st_size if path.is_file() else None, stat.st_mtime_ns]
        entry = cache.get(str(path))
        info = None
        if isinstance(entry, dict) and entry.get("key") == key:
            try:
                info = VideoInfo.from_dict(entry["info"])
            except (KeyError, TypeError, ValueError):
                info = None
        if info is None:
            info = probe(path)
            cache[str(path)] = {"key": key, "info": info.to_dict()}
            changed = True
        clips.append(Clip(name, path.parent, info.frame_count, (CameraStream(camera, path, info),)))
    if cache_path is not None and changed:
        cache_path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(cache_path, json.dumps(cache, separators=(",", ":")))
    source = cache_path.resolve() if cache_path is not None else Path.cwd()
    return VideoIndex(source, tuple(clips), (camera,))

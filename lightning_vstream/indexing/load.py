"""Loading an index, with the thorough check of its files that probes them (``check="thorough"``).

Parsing and validating the index itself is :mod:`lightning_vstream.index`'s (it opens no file in the
fast check); the thorough check re-verifies changed files and probes files without frame tables,
so it lives here, above the decoders, and is handed to the index loaders.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal

from lightning_vstream.errors import ConfigurationError, FileChangedError, IndexValidationError, MissingFileError
from lightning_vstream.index.identity import reverify
from lightning_vstream.index.listing import leave_out_hint
from lightning_vstream.index.local_index import load_local_index
from lightning_vstream.index.records import CameraStream, Clip, VideoIndex
from lightning_vstream.index.remote_index import load_remote_index
from lightning_vstream.indexing.camera_tables import probe, probe_clip
from lightning_vstream.storage.client import storage_for
from lightning_vstream.storage.config import StorageConfig
from lightning_vstream.storage.urls import is_url

__all__ = ["Check", "check_files", "check_remote_files", "load_index"]

Check = Literal["fast", "thorough"]


def load_index(
    path: Path | str,
    *,
    cameras: Sequence[str] | None = None,
    check: Check = "fast",
    storage_options: dict[str, Any] | None = None,
    cache_dir: str | None = None,
    cache_limit: int | str | None = None,
    exclude_clips: Collection[str] | None = None,
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
            :class:`~lightning_vstream.storage.config.StorageConfig`); the provider's standard
            environment otherwise.
        cache_dir: Node-local folder caching the frame tables and every GOP read (shared by the
            ranks and workers of a machine); None: GOPs are only held in memory while needed.
        cache_limit: Bytes the GOP cache may hold (``"20GB"`` or an int); None: no limit.
        exclude_clips: Clip ids to leave out: a clip whose camera file is gone, or one you do not want
            to train on. They are not checked (their files may be missing) and never read; ids the
            index does not list are ignored, and :attr:`VideoIndex.excluded` names those left out.

    Returns:
        The validated :class:`VideoIndex`.

    Raises:
        FileNotFoundError: The index file does not exist.
        ValueError: The JSON is malformed (message gives line and column), or ``cameras`` is empty
            or repeats a name.
        TypeError: ``cameras`` or ``exclude_clips`` is a single string instead of a list.
        ConfigurationError: ``check`` is neither ``"fast"`` nor ``"thorough"`` (the class the DataModules
            raise for ``index_check``).
        IndexValidationError: The index disagrees with the files (every problem listed).
        FileChangedError: With ``check="thorough"``, a file changed since the index was built and
            its packets no longer match the frame tables.

    Example::

        >>> index = load_index("data/index.json", cameras=["CAM_FRONT", "CAM_BACK"])  # doctest: +SKIP
        >>> load_index("data/index.json", exclude_clips=["scene-0003"]).excluded  # doctest: +SKIP
        ('scene-0003',)
    """
    if check not in ("fast", "thorough"):
        raise ConfigurationError(f"check={check!r} is not supported; use 'fast' or 'thorough'.")
    thorough = check == "thorough"
    if is_url(path):
        config = StorageConfig(dict(storage_options or {}), cache_dir=cache_dir, cache_limit=cache_limit)
        return load_remote_index(
            str(path),
            cameras=cameras,
            check_files=check_remote_files if thorough else None,
            storage=config,
            exclude_clips=exclude_clips,
        )
    return load_local_index(
        path, cameras=cameras, check_files=check_files if thorough else None, exclude_clips=exclude_clips
    )


def check_files(clips: list[Clip], where: str, problems: list[str], changed: list[str]) -> list[Clip]:
    """The thorough check of a local index (see :data:`~lightning_vstream.index.local_index.FileCheck`).

    Unless the index already has problems, every video file's size and modification time is compared
    with the index and a file that differs is re-verified in full; unless a file changed, files without
    frame tables are probed and every clip's frame counts, frame sizes and codecs checked.
    """
    checked = clips
    if not problems:
        # The fast check opens no file: a decoder compares each file's identity when it opens it.
        checked = [_check_identities(clip, where, changed) for clip in checked]
    if not changed:
        checked = [probe_clip(clip, where, problems) for clip in checked]
    return checked


def _check_identities(clip: Clip, where: str, changed: list[str]) -> Clip:
    """Compare each video file's size and mtime with the index; re-verify in full any file that differs."""
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
        except FileNotFoundError:
            changed.append(
                f"{where}: clip {clip.clip_id!r}, camera {cam.name!r}: {str(cam.path)!r} no longer exists. "
                f"{leave_out_hint(clip.clip_id)}"
            )
            streams.append(cam)
            continue
        except OSError:
            same = False
        if same:
            streams.append(cam)
            continue
        label = f"clip {clip.clip_id!r}, camera {cam.name!r} ({str(cam.path)!r})"
        info = cam.info
        assert info is not None
        try:
            streams.append(cam.with_info(reverify(Path(cam.path), info, label, probe=probe)))
        except FileChangedError as err:
            changed.extend(f"{where}: {p}" for p in err.problems)
            streams.append(cam)
    if all(new is old for new, old in zip(streams, clip.cameras)):
        return clip
    return Clip(clip.clip_id, clip.video_dir, clip.frame_count, tuple(streams))


def check_remote_files(clips: list[Clip], where: str, config: StorageConfig) -> list[Clip]:
    """The thorough check of a remote index: every file's size and ETag compared with its frame table (one
    HEAD each), files without one probed (see :data:`~lightning_vstream.index.remote_index.RemoteFileCheck`)."""
    client = storage_for(config)
    cams = [cam for clip in clips for cam in clip.cameras if cam.info is not None]

    def head(cam: CameraStream) -> str | None:
        info = cam.info
        assert info is not None
        recorded = info.identity
        try:
            current = client.head(str(cam.path))
        except MissingFileError:
            return f"{where}: {cam.path!r} (camera {cam.name!r}) does not exist."
        if recorded is None:
            return None
        if current.size != recorded.size or (recorded.etag and current.etag and current.etag != recorded.etag):
            what = (
                f"size {recorded.size} -> {current.size} bytes" if current.size != recorded.size else "its ETag differs"
            )
            return (
                f"{where}: {cam.path!r} (camera {cam.name!r}) changed since the index was built ({what}). Re-run "
                "`vstream index` to rebuild the index if it was replaced on purpose, or restore it."
            )
        return None

    with ThreadPoolExecutor(max_workers=8) as pool:
        changed = [p for p in pool.map(head, cams) if p is not None]
    if changed:
        raise FileChangedError(where, changed)
    problems: list[str] = []
    probed = [probe_clip(clip, where, problems, storage=config) for clip in clips]
    if problems:
        raise IndexValidationError(where, problems)
    return probed

"""Building an index on remote storage in place, and writing the frame tables of one there.

Building an index on a bucket (``vstream index s3://bucket/ds``) lists the dataset, reads every camera
file once (one GET each), probes it from memory and records its size and ETag, then writes the index
and its tables next to it. An index built locally and uploaded with its files stays valid: its files
are identified by size and packet CRC-32s.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from lightning_vstream.errors import ConfigurationError, IndexValidationError, MissingFileError
from lightning_vstream.index.files import VIDEO_EXTENSIONS, natural_key
from lightning_vstream.index.remote_index import load_remote_index, remote_key, tables_url
from lightning_vstream.index.table_write import write_tables
from lightning_vstream.index.tables import VideoInfo
from lightning_vstream.indexing.build import (
    Incomplete,
    incomplete_path,
    refuse_incomplete,
    warn_incomplete,
    whole_clips,
)
from lightning_vstream.indexing.camera_tables import probe_objects
from lightning_vstream.storage.client import Storage, storage_for
from lightning_vstream.storage.config import StorageConfig
from lightning_vstream.storage.urls import basename, dirname, is_url

__all__ = ["build_remote_index", "write_remote_index_tables"]


def _upload_tables(client: Storage, index_url: str, files: dict[str, VideoInfo]) -> str:
    url = tables_url(index_url)
    with tempfile.TemporaryDirectory(prefix="vstream-tables-") as tmp:
        path = write_tables(Path(tmp) / "index.tables.bin", files)
        client.write(url, path.read_bytes())
    return url


def build_remote_index(
    root: str,
    *,
    output: str | None = None,
    storage: StorageConfig | None = None,
    progress: Callable[[Iterable[Any]], Iterable[Any]] | None = None,
    incomplete: Incomplete = "skip",
) -> str:
    """Build an index of the dataset under the URL ``root``, in place: the index and its tables are written next to it.

    Every camera file is read once (one GET) and probed from memory; its frame table records its
    size and ETag, so readers check both with every request. A clip missing a camera file the
    other clips have is left out and listed in ``index.incomplete.json`` next to the index (as
    :func:`~lightning_vstream.indexing.build_index` does; ``incomplete="raise"`` refuses it); a file
    that cannot be read fails the build, every one listed.

    Args:
        root: Folder URL of the dataset (clip folders of camera files anywhere below it).
        output: URL of the index to write; ``root/index.json`` when None.
        storage: Options of the store.
        progress: Optional wrapper for the probe loop (a ``tqdm``).
        incomplete: ``"skip"`` leaves incomplete clips out and lists them; ``"raise"`` refuses them.

    Returns:
        The index URL.

    Raises:
        IndexValidationError: No clip folder found, files could not be probed (every problem listed), no clip
            is whole, or (``incomplete="raise"``) a clip is not whole.

    Example::

        >>> build_remote_index("s3://bucket/ds")  # doctest: +SKIP
        's3://bucket/ds/index.json'
    """
    config = storage or StorageConfig()
    client = storage_for(config)
    root = root.rstrip("/")
    output = output or f"{root}/index.json"
    if not is_url(output):
        raise ConfigurationError(f"output={output!r}: an index of {root!r} is written to a URL next to the data.")
    base = dirname(output)
    folders: dict[str, dict[str, str]] = {}
    for url, _ in client.list(root):
        stem, ext = os.path.splitext(basename(url))
        if ext.lower() not in VIDEO_EXTENSIONS:
            continue
        cams = folders.setdefault(dirname(url), {})
        if stem in cams:
            raise IndexValidationError(
                repr(root),
                [
                    f"{dirname(url)!r} holds two files for camera {stem!r}: {basename(cams[stem])!r} and {basename(url)!r}; keep one."
                ],
            )
        cams[stem] = url
    if not folders:
        raise IndexValidationError(repr(root), [f"no clip folders with video files found under {root!r}."])
    ordered = sorted(folders, key=natural_key)
    whole, left_out = whole_clips({folder: dict.fromkeys(folders[folder]) for folder in ordered})
    if left_out and (incomplete == "raise" or not whole):
        raise refuse_incomplete(root, {basename(f): reasons for f, reasons in left_out.items()}, whole=len(whole))
    folders = {folder: folders[folder] for folder in whole}
    jobs = [
        (url, f"clip {basename(folder)!r}, camera {name!r}")
        for folder, cams in sorted(folders.items(), key=lambda item: natural_key(item[0]))
        for name, url in sorted(cams.items())
    ]
    infos, problems = probe_objects(client, jobs, progress)
    if problems:
        raise IndexValidationError(repr(root), problems)
    index: dict[str, dict[str, int]] = {}
    files: dict[str, VideoInfo] = {}
    for folder, cams in sorted(folders.items(), key=lambda item: natural_key(item[0])):
        video_dir = dirname(folder)
        vd_key = "." if video_dir.rstrip("/") == base.rstrip("/") else remote_key(base, video_dir)
        counts = [infos[url].frame_count for url in cams.values()]
        index.setdefault(vd_key, {})[basename(folder)] = min(counts)
        for url in cams.values():
            files[remote_key(base, url)] = infos[url]
    _upload_tables(client, output, files)
    client.write(output, (json.dumps(index, indent=2) + "\n").encode())
    listing = incomplete_path(output)
    listed: dict[str, dict[str, list[str]]] = {}
    for folder, reasons in left_out.items():
        video_dir = dirname(folder)
        vd_key = "." if video_dir.rstrip("/") == base.rstrip("/") else remote_key(base, video_dir)
        listed.setdefault(vd_key, {})[basename(folder)] = reasons
    if listed or _exists(client, listing):  # {} replaces a list from an earlier build
        client.write(listing, (json.dumps(listed, indent=2) + "\n").encode())
    if left_out:
        warn_incomplete(root, listing, {basename(f): r for f, r in left_out.items()}, len(ordered))
    return output


def _exists(client: Storage, url: str) -> bool:
    try:
        client.head(url)
    except MissingFileError:
        return False
    return True


def write_remote_index_tables(
    url: str, *, storage: StorageConfig | None = None, progress: Callable[[Iterable[Any]], Iterable[Any]] | None = None
) -> str:
    """Probe every file the index at ``url`` lists (one GET each) and write its frame tables next to it.

    Returns:
        The URL of the tables written.
    """
    config = storage or StorageConfig()
    client = storage_for(config)
    index = load_remote_index(url, storage=config, use_tables=False)
    jobs = [(str(cam.path), f"clip {clip.clip_id!r}, camera {cam.name!r}") for clip in index for cam in clip.cameras]
    infos, problems = probe_objects(client, jobs, progress)
    if problems:
        raise IndexValidationError(repr(url), problems)
    base = dirname(url)
    return _upload_tables(client, url, {remote_key(base, u): info for u, info in infos.items()})

"""Indexes on remote storage: loading them and their frame tables.

Loading an index from a URL reads the index JSON (one GET), and its frame tables once per machine:
they are copied into ``cache_dir/tables`` (or a private folder in the system's temporary folder) under
a name that holds their ETag and the SHA-256 of their bytes, checked before each use, and
memory-mapped from there, so every rank and worker on the machine shares one copy and a rebuilt or
replaced copy is never used (see :func:`fetch_tables`). Camera files are found in the frame tables
(no listing); an index without tables is listed once per video folder. Video paths resolve relative
to the index's URL and must stay below its folder (:func:`remote_key`).
Building and checking an index there probes files: see :mod:`lightning_vstream.indexing.remote_build`.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import tempfile
from collections.abc import Callable, Collection, Sequence
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import unquote

from lightning_vstream.errors import (
    ConfigurationError,
    IndexValidationError,
    MissingFileError,
)
from lightning_vstream.index.arrays import ClipArrays
from lightning_vstream.index.files import IMAGE_EXTENSIONS, VIDEO_EXTENSIONS, read_index_bytes
from lightning_vstream.index.listing import (
    ClipLists,
    camera_reference,
    check_exclude_clips,
    entry_problem,
    folder_entries_problem,
    index_object,
    match_cameras,
    table_cameras,
)
from lightning_vstream.index.local_index import _parse_json, _warn_if_unchecked
from lightning_vstream.index.records import CameraStream, Clip, VideoIndex
from lightning_vstream.index.table_file import DigestMismatchError, FrameTables
from lightning_vstream.index.tables import cached_info
from lightning_vstream.storage.cache import warn_unwritable
from lightning_vstream.storage.client import Expect, Storage, storage_for
from lightning_vstream.storage.config import StorageConfig
from lightning_vstream.storage.private import (
    CacheWriteError,
    inner_folder,
    open_regular,
    private_folder,
    remove_entry,
    write_file,
)
from lightning_vstream.storage.urls import basename, child, dirname, join, normalise, scheme_of, with_name

__all__ = ["RemoteFileCheck", "fetch_tables", "load_remote_index", "remote_key", "tables_url"]

#: The thorough check of a remote index's files: ``check(clips, where, storage)`` returns the clips
#: with what it found, or raises (see :func:`lightning_vstream.indexing.load_index`).
RemoteFileCheck = Callable[[list[Clip], str, StorageConfig], list[Clip]]


def _stem(url: str) -> str:
    return PurePosixPath(basename(url)).stem


def tables_url(index_url: str) -> str:
    """The URL of the binary frame tables next to the index at ``index_url``."""
    return with_name(index_url, _stem(index_url) + ".tables.bin")


def remote_key(base: str, url: str) -> str:
    """The frame-table key of ``url``: its path relative to the index's folder URL ``base``.

    Both are normalised first (``.`` and ``..`` resolved, percent-escapes of ``file://`` URLs read), so
    a URL that climbs out of the folder is refused whatever its spelling.

    Raises:
        ConfigurationError: ``url`` does not lie under ``base``.
    """
    prefix = normalise(base).rstrip("/") + "/"
    full = normalise(url)
    if not full.startswith(prefix):
        raise ConfigurationError(
            f"{url!r} does not lie under the index's folder {base!r}; keep videos below the index."
        )
    key = full[len(prefix) :]
    return unquote(key) if scheme_of(base) == "file" else key


def _node_folder(config: StorageConfig) -> Path | None:
    """The private folder where this machine keeps copies of remote frame tables; None if it cannot be written.

    ``cache_dir/tables``, or ``lightning_vstream-<uid>/tables`` in the system's temporary folder (created
    private; another user's folder of that name, or a symbolic link there, is refused).

    Raises:
        ConfigurationError: The folder (or ``cache_dir``) is not private to this user.
    """
    if config.cache_dir is not None:
        root, what, follow = Path(config.cache_dir), "cache_dir", True
    else:
        uid = os.geteuid() if hasattr(os, "geteuid") else 0
        root = Path(tempfile.gettempdir()) / f"lightning_vstream-{uid}"
        what, follow = "the temporary folder for frame tables", False
    try:
        private_folder(root, what=what, follow=follow)
        return inner_folder(root / "tables", what=f"{what} {str(root)!r}")
    except CacheWriteError as err:
        warn_unwritable(root, err.strerror or str(err))
        return None


def _copy_prefix(source: str, etag: str | None) -> str:
    """How the names of this machine's copies of the tables at ``source`` (of one ETag) start."""
    head = hashlib.sha256(source.encode()).hexdigest()[:20]
    version = hashlib.sha256(etag.encode()).hexdigest()[:12] if etag else "noetag"
    return f"{head}-{version}-"


def _use_copy(local: Path, source: str, digest: str) -> FrameTables | None:
    """The copy at ``local`` if it holds exactly the bytes whose SHA-256 is ``digest``; else None (and it is removed)."""
    fd = open_regular(local)
    if fd is None:
        return None
    os.close(fd)
    try:
        return FrameTables(local, source=source, sha256=digest)
    except DigestMismatchError:
        remove_entry(local)
        return None


def fetch_tables(url: str, config: StorageConfig) -> FrameTables | None:
    """The frame tables of the index at ``url``, copied once per machine and memory-mapped; None without tables.

    A copy is identified by its content. Where the store gives an ETag, one HEAD tells it and a copy
    of that version is used after its bytes are checked against the SHA-256 its name records. Where
    it gives none (``file://``, most fsspec file systems), the tables are read (they are small) and
    a copy is used only if it holds the very same bytes. Anything else in the folder (another
    version, a damaged or planted file, a link) is replaced. Without a writable folder the tables
    are held in memory.
    """
    storage = storage_for(config)
    source = tables_url(url)
    try:
        info = storage.head(source)
    except MissingFileError:
        return None
    folder = _node_folder(config)
    prefix = _copy_prefix(source, info.etag)
    if info.etag and folder is not None:
        for candidate in sorted(folder.glob(glob.escape(prefix) + "*.tables.bin")):
            tables = _use_copy(candidate, source, candidate.name[len(prefix) : -len(".tables.bin")])
            if tables is not None:
                tables.require_byte_ranges()
                return tables
    data, _ = storage.read(source, expect=Expect(info.size, info.etag), label="frame tables")
    data = bytes(data)
    digest = hashlib.sha256(data).hexdigest()
    tables = None
    if folder is not None:
        local = folder / f"{prefix}{digest}.tables.bin"
        tables = _use_copy(local, source, digest)  # the same bytes already here: no write, pages shared
        if tables is None:
            try:
                write_file(local, data, tmp=folder)
                tables = FrameTables(local, source=source, sha256=digest)
            except CacheWriteError as err:
                warn_unwritable(folder.parent, err.strerror or str(err))
    if tables is None:
        tables = FrameTables.from_bytes(data, source=source)
    tables.require_byte_ranges()
    return tables


def _sidecar(url: str, storage: Storage) -> dict[str, Any]:
    """Entries of the JSON sidecar (``index.meta.json``) next to the index at ``url``; empty without one."""
    meta_url = with_name(url, _stem(url) + ".meta.json")
    try:
        raw, _ = storage.read(meta_url, label="frame tables")
    except MissingFileError:
        return {}
    try:
        data = json.loads(bytes(raw).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise IndexValidationError(
            repr(meta_url), [f"metadata file {meta_url!r} is not valid JSON; rebuild it with `vstream index`."]
        ) from None
    files = data.get("files", {}) if isinstance(data, dict) else {}
    return files if isinstance(files, dict) else {}


def _listed_cameras(storage: Storage, folder_url: str, cache: dict[str, dict[str, dict[str, str]]]) -> dict[str, str]:
    """Camera name -> file name in a clip folder, from one listing of its video folder (cached)."""
    video_dir = dirname(folder_url)
    listing = cache.get(video_dir)
    if listing is None:
        listing = {}
        for url, _ in storage.list(video_dir):
            folder, name = dirname(url), basename(url)
            stem, ext = os.path.splitext(name)
            if ext.lower() in VIDEO_EXTENSIONS:
                listing.setdefault(folder, {}).setdefault(stem, name)
        cache[video_dir] = listing
    return dict(sorted(listing.get(folder_url.rstrip("/"), {}).items()))


def _image_folders(storage: Storage, folder_url: str) -> list[str]:
    """The cameras of a clip folder that are folders of images (``CAM/0.jpg``), from one listing of it."""
    folder = folder_url.rstrip("/")
    cameras = set()
    for url, _ in storage.list(folder):
        parent = dirname(url)
        if dirname(parent) == folder and os.path.splitext(basename(url))[1].lower() in IMAGE_EXTENSIONS:
            cameras.add(basename(parent))
    return sorted(cameras)


def load_remote_index(
    url: str,
    *,
    cameras: Sequence[str] | None = None,
    check_files: RemoteFileCheck | None = None,
    storage: StorageConfig | None = None,
    use_tables: bool = True,
    exclude_clips: Collection[str] | None = None,
) -> VideoIndex:
    """:func:`~lightning_vstream.indexing.load_index` for an index at a URL (see the module docs).

    The clips are held as arrays (:class:`~lightning_vstream.index.arrays.ClipArrays`) like a local
    index's, with URLs for folders and files; a spawn worker re-reads the index JSON through remote
    storage (one request) and checks its size and CRC-32.

    Raises:
        MissingFileError: The index does not exist.
        IndexValidationError: The index does not describe the files its tables (or listings) hold,
            or its tables do not record packet byte ranges (written before they were).
        FileChangedError: With ``check_files``, a file's size or ETag differs from the tables.
    """
    config = storage or StorageConfig()
    raw = read_index_bytes(url, storage=config)
    data = index_object(_parse_json(raw, repr(url)), repr(url))
    reading = _RemoteIndexReading(url, cameras, config, use_tables=use_tables)
    reading.collect(reading.lists.leave_out(data, check_exclude_clips(exclude_clips)))
    clips = reading.clips(raw, check_files)
    if use_tables:
        # Only a remote index without tables (or with the JSON sidecar) can hold files without one.
        candidates = clips if reading.tables is None else ()
        _warn_if_unchecked(url, clips, candidates, reading.tables is not None or bool(reading.meta))
    assert reading.reference is not None
    return VideoIndex(url, clips, reading.reference[1], storage=config, excluded=tuple(sorted(reading.lists.excluded)))


class _RemoteIndexReading:
    """One reading of an index at a URL: its clips checked against the frame tables (or folder listings).

    With tables, clips after the first are checked in one vectorised search of the tables. Problems
    are collected and reported together; the first clip sets the cameras every other clip must have,
    unless ``cameras`` asks for some.
    """

    def __init__(self, url: str, cameras: Sequence[str] | None, config: StorageConfig, *, use_tables: bool) -> None:
        self.url = url
        self.where = repr(url)
        self.config = config
        self.client = storage_for(config)
        self.base = dirname(url)
        self.tables = fetch_tables(url, config) if use_tables else None
        self.meta = _sidecar(url, self.client) if use_tables and self.tables is None else {}
        self.cameras, self.reference = camera_reference(cameras)
        self.problems: list[str] = []
        self.lists = ClipLists()
        self._seen: dict[str, str] = {}  # clip id -> its video folder
        self._listings: dict[str, dict[str, dict[str, str]]] = {}

    def collect(self, data: dict[str, Any]) -> None:
        """Check every video folder and clip entry of the index, noting each good clip."""
        for video_dir_key, entries in data.items():
            problem = folder_entries_problem(self.where, video_dir_key, entries)
            if problem is not None:
                self.problems.append(problem)
                continue
            self._video_folder(video_dir_key, entries)
        self.lists.resolve_deferred(
            self.tables,
            self.cameras,
            lambda i, folder, prefix, out: self.found_in(i, folder, prefix[:-1], out),
            self.problems,
        )

    def _video_folder(self, video_dir_key: str, entries: dict[str, Any]) -> None:
        try:
            video_dir = join(self.base, video_dir_key)
            vd_key = "" if video_dir.rstrip("/") == self.base.rstrip("/") else remote_key(self.base, video_dir)
        except ConfigurationError as err:
            self.problems.append(f"{self.where}: video folder {video_dir_key!r}: {err}")
            return
        dir_index = self.lists.add_folder(video_dir, f"{vd_key}/" if vd_key else "")
        for clip_id, count in entries.items():
            problem = entry_problem(self.where, video_dir_key, clip_id, count, self._seen)
            if problem is not None:
                self.problems.append(problem)
                continue
            folder_key = f"{vd_key}/{clip_id}" if vd_key else clip_id
            folder_url = child(video_dir, clip_id)
            if self.lists.layouts and self.tables is not None:
                self.lists.defer(len(self.problems), clip_id, folder_url, folder_key + "/")
                files: tuple[str, ...] | None = None
            else:
                files = self.found_in(clip_id, folder_url, folder_key, self.problems)
                if files is None:
                    continue
            self.lists.add(clip_id, count, dir_index, files)

    def found_in(self, clip_id: str, folder_url: str, folder_key: str, out: list[str]) -> tuple[str, ...] | None:
        """The clip's camera file names in camera order (from the tables, else a listing), or None with problems."""
        if self.tables is not None:
            found = table_cameras(self.tables, folder_key)
            how = "its frame tables list"
        else:
            found = _listed_cameras(self.client, folder_url, self._listings)
            how = "the folder holds"
        if self.reference is None:
            if not found:
                images = _image_folders(self.client, folder_url)
                if images:
                    out.append(
                        f"{self.where}: clip {clip_id!r}: camera(s) {images} in {folder_url!r} are image folders, "
                        "which are read from local paths only: an index at a URL (s3://, gs://, az://, https://, "
                        "file://) reads video files. Encode the images to one video per camera first "
                        "(`vstream encode INDEX OUT_DIR` on the local copy) and upload those, or give the index as a "
                        "local path."
                    )
                    return None
                out.append(f"{self.where}: clip {clip_id!r}: {how} no camera files in {folder_url!r}.")
                return None
            self.reference = (f"clip {clip_id!r}", tuple(found))
        listed = f"{how} {sorted(found)}; "
        return match_cameras(
            found,
            self.reference,
            self.cameras,
            clip_id=clip_id,
            where=self.where,
            folder=folder_url,
            listed=listed,
            out=out,
        )

    def clips(self, raw: bytes, check_files: RemoteFileCheck | None) -> Sequence[Clip]:
        """The clips collected, their files checked with ``check_files`` (when given).

        Raises:
            IndexValidationError: Any problem found, all of them listed; or no clip at all.
            FileChangedError: With ``check_files``, a file's size or ETag differs from the tables.
        """
        where, lists = self.where, self.lists
        if self.problems:
            raise IndexValidationError(where, self.problems)
        if not lists.ids or self.reference is None:
            raise IndexValidationError(where, [f"index file {where} lists no clips."])
        records = lists.arrays(self.url, raw, self.reference[1], self.tables, self.config)
        clips: Sequence[Clip] = records
        if self.meta:
            # The older JSON sidecar gives every file its frame table as an object: those clips are records.
            clips = tuple(self._with_sidecar_tables(clip) for clip in records)
        if check_files is not None:
            checked = check_files(list(clips), where, self.config)
            if isinstance(clips, ClipArrays):
                clips = clips.with_overrides({i: c for i, c in enumerate(checked)})
            else:
                clips = tuple(checked)
        return clips

    def _with_sidecar_tables(self, clip: Clip) -> Clip:
        """``clip`` with each camera's frame table from the JSON sidecar."""
        streams = tuple(
            CameraStream(cam.name, cam.path_str, cached_info(self.meta, remote_key(self.base, cam.path_str)))
            for cam in clip.cameras
        )
        return Clip(clip.clip_id, clip.video_dir, clip.frame_count, streams)

"""Indexes on remote storage: loading them, building them in place on a bucket, writing and checking their tables.

Loading an index from a URL reads the index JSON (one GET), and its frame tables once per machine:
they are copied into ``cache_dir/tables`` (or the system's temporary folder) under a name that holds
their ETag, and memory-mapped from there, so every rank and worker on the machine shares one copy and
a rebuilt index is fetched again. Camera files are found in the frame tables (no listing); an index
without tables is listed once per video folder. Video paths resolve relative to the index's URL.

Building an index on a bucket (``vstream index s3://bucket/ds``) lists the dataset, reads every camera
file once (one GET each), probes it from memory and records its size and ETag, then writes the index
and its tables next to it. An index built locally and uploaded with its files stays valid: its files
are identified by size and packet CRC-32s.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import zlib
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path, PurePosixPath
from typing import Any

from lightning_vstream.errors import (
    ConfigurationError,
    ConfigurationTypeError,
    DataFormatError,
    FileChangedError,
    IndexValidationError,
    MissingFileError,
    VideoDecodeError,
    VStreamError,
)
from lightning_vstream.index.arrays import ClipArrays, fingerprint, tables_list_files
from lightning_vstream.index.files import VIDEO_EXTENSIONS, natural_key
from lightning_vstream.index.identity import BLOCK, FileIdentity
from lightning_vstream.index.records import CameraStream, Clip, VideoIndex
from lightning_vstream.index.table_file import FrameTables, write_tables
from lightning_vstream.index.tables import VideoInfo, cached_info
from lightning_vstream.storage.client import Expect, Storage, storage_for
from lightning_vstream.storage.options import StorageConfig
from lightning_vstream.storage.urls import basename, child, dirname, is_url, join, with_name

__all__ = [
    "build_remote_index",
    "fetch_tables",
    "load_remote_index",
    "remote_key",
    "verify_remote_index",
    "write_remote_index_tables",
]

#: Files probed at once when building or checking an index on remote storage.
PROBE_THREADS = 4


def _stem(url: str) -> str:
    return PurePosixPath(basename(url)).stem


def remote_key(base: str, url: str) -> str:
    """The frame-table key of ``url``: its path relative to the index's folder URL ``base``.

    Raises:
        ConfigurationError: ``url`` does not lie under ``base``.
    """
    prefix = base.rstrip("/") + "/"
    if not url.startswith(prefix):
        raise ConfigurationError(
            f"{url!r} does not lie under the index's folder {base!r}; keep videos below the index."
        )
    return url[len(prefix) :]


def _node_folder(config: StorageConfig) -> Path:
    """Where this machine keeps copies of remote frame tables."""
    if config.cache_dir is not None:
        return Path(config.cache_dir) / "tables"
    uid = os.getuid() if hasattr(os, "getuid") else 0
    return Path(tempfile.gettempdir()) / f"lightning_vstream-{uid}" / "tables"


def fetch_tables(url: str, config: StorageConfig) -> FrameTables | None:
    """The frame tables of the index at ``url``, copied once per machine and memory-mapped; None without tables.

    One HEAD tells the tables' ETag; a copy of that version already on this machine is used as it is.
    """
    storage = storage_for(config)
    tables_url = with_name(url, _stem(url) + ".tables.bin")
    try:
        info = storage.head(tables_url)
    except MissingFileError:
        return None
    version = info.etag or f"size:{info.size}"
    digest = hashlib.sha256(tables_url.encode()).hexdigest()[:20]
    local = _node_folder(config) / f"{digest}-{hashlib.sha256(version.encode()).hexdigest()[:12]}.tables.bin"
    try:
        current = local.stat().st_size == info.size
    except OSError:
        current = False
    if not current:
        data, _ = storage.read(tables_url, expect=Expect(info.size, info.etag), label="frame tables")
        local.parent.mkdir(parents=True, exist_ok=True)
        tmp = local.with_name(f".{local.name}.{os.getpid()}.tmp")
        with open(tmp, "wb") as f:
            f.write(memoryview(data))
        os.replace(tmp, local)
    tables = FrameTables(local, source=tables_url)
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


def _cameras_from_tables(tables: FrameTables, folder_key: str) -> dict[str, str]:
    """Camera name -> file name of the video files directly in ``folder_key``, as the tables list them."""
    found: dict[str, str] = {}
    prefix = folder_key + "/" if folder_key else ""
    for key, _ in tables.under(prefix):
        name = key[len(prefix) :]
        if "/" in name:
            continue
        stem, ext = os.path.splitext(name)
        if ext.lower() in VIDEO_EXTENSIONS:
            found.setdefault(stem, name)
    return dict(sorted(found.items()))


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


def load_remote_index(
    url: str,
    *,
    cameras: Sequence[str] | None = None,
    check: str = "fast",
    storage: StorageConfig | None = None,
    use_tables: bool = True,
) -> VideoIndex:
    """:func:`~lightning_vstream.index.load_index` for an index at a URL (see the module docs).

    The clips are held as arrays (:class:`~lightning_vstream.index.arrays.ClipArrays`) like a local
    index's, with URLs for folders and files; a spawn worker re-reads the index JSON through remote
    storage (one request) and checks its size and CRC-32.

    Raises:
        MissingFileError: The index does not exist.
        IndexValidationError: The index does not describe the files its tables (or listings) hold,
            or its tables do not record packet byte ranges (written before they were).
        FileChangedError: With ``check="thorough"``, a file's size or ETag differs from the tables.
    """
    from lightning_vstream.index.load import (
        MAX_FRAMES,
        _bad_clip_id,
        _parse_json,
        _warn_if_unchecked,
        read_index_bytes,
    )

    config = storage or StorageConfig()
    client = storage_for(config)
    where = repr(url)
    raw = read_index_bytes(url, storage=config)
    data = _parse_json(raw, where)
    if not isinstance(data, dict):
        raise IndexValidationError(
            where, [f"index file {where} must hold a JSON object {{video_dir: {{clip_id: frame_count}}}}."]
        )
    tables = fetch_tables(url, config) if use_tables else None
    meta = _sidecar(url, client) if use_tables and tables is None else {}
    base = dirname(url)
    problems: list[str] = []
    seen: dict[str, str] = {}
    listings: dict[str, dict[str, dict[str, str]]] = {}
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

    def found_in(clip_id: str, folder_url: str, folder_key: str, out: list[str]) -> tuple[str, ...] | None:
        """The clip's camera file names in camera order (from the tables, else a listing), or None with problems."""
        nonlocal reference
        if tables is not None:
            found = _cameras_from_tables(tables, folder_key)
            how = "its frame tables list"
        else:
            found = _listed_cameras(client, folder_url, listings)
            how = "the folder holds"
        if reference is None:
            if not found:
                out.append(f"{where}: clip {clip_id!r}: {how} no camera files in {folder_url!r}.")
                return None
            reference = (f"clip {clip_id!r}", tuple(found))
        names = reference[1]
        missing = [n for n in names if n not in found]
        if missing:
            out.append(
                f"{where}: clip {clip_id!r} is missing camera file(s) {missing} in {folder_url!r} ({how} "
                f"{sorted(found)}; expected the cameras of {reference[0]}: {list(names)})."
            )
            return None
        if cameras is None and set(found) != set(names):
            out.append(
                f"{where}: clip {clip_id!r} has cameras {sorted(found)} but {reference[0]} has {list(names)}; "
                "pass cameras=[...] to load a common subset."
            )
            return None
        return tuple(found[n] for n in names)

    # Per clip, in order: id, frame count, video folder, layout (its camera file names).
    ids: list[str] = []
    counts: list[int] = []
    dir_of: list[int] = []
    layout_of: list[int] = []
    layouts: dict[tuple[str, ...], int] = {}
    video_dirs: list[str] = []
    dir_keys: list[str] = []
    # With tables, clips after the first are checked in one vectorised search of the tables:
    # (position, where their problems go, id, folder URL, key prefix).
    deferred: list[tuple[int, int, str, str, str]] = []
    for video_dir_key, entries in data.items():
        if not isinstance(entries, dict):
            problems.append(f"{where}: video folder {video_dir_key!r} must map clip ids to frame counts.")
            continue
        try:
            video_dir = join(base, video_dir_key)
            vd_key = "" if video_dir.rstrip("/") == base.rstrip("/") else remote_key(base, video_dir)
        except ConfigurationError as err:
            problems.append(f"{where}: video folder {video_dir_key!r}: {err}")
            continue
        dir_index = len(video_dirs)
        video_dirs.append(video_dir)
        dir_keys.append(f"{vd_key}/" if vd_key else "")
        for clip_id, count in entries.items():
            if isinstance(count, bool) or not isinstance(count, int) or count <= 0 or count > MAX_FRAMES:
                problems.append(f"{where}: clip {clip_id!r} has frame count {count!r}; expected a positive integer.")
                continue
            if _bad_clip_id(clip_id):
                problems.append(
                    f"{where}: clip id {clip_id!r} in video folder {video_dir_key!r} is not a plain folder name."
                )
                continue
            if clip_id in seen:
                problems.append(
                    f"{where}: clip id {clip_id!r} appears in both {seen[clip_id]!r} and {video_dir_key!r}; clip ids "
                    "must be unique across the index."
                )
                continue
            seen[clip_id] = video_dir_key
            folder_key = f"{vd_key}/{clip_id}" if vd_key else clip_id
            folder_url = child(video_dir, clip_id)
            if layouts and tables is not None:
                deferred.append((len(ids), len(problems), clip_id, folder_url, folder_key + "/"))
                files: tuple[str, ...] | None = None
            else:
                files = found_in(clip_id, folder_url, folder_key, problems)
                if files is None:
                    continue
            ids.append(clip_id)
            counts.append(count)
            dir_of.append(dir_index)
            layout_of.append(0 if files is None else layouts.setdefault(files, len(layouts)))
    if deferred:
        # A clip the tables do not describe exactly like the first (another camera file name, a
        # file missing) is looked at alone, and its problems take the place they would have had.
        assert tables is not None
        template = next(iter(layouts))
        ok = tables_list_files(tables, [d[4] for d in deferred], template, only=cameras is None).tolist()
        for (at, place, clip_id, folder_url, prefix), good in reversed(list(zip(deferred, ok))):
            if good:
                continue
            found: list[str] = []
            files = found_in(clip_id, folder_url, prefix[:-1], found)
            problems[place:place] = found
            if files is not None:
                layout_of[at] = layouts.setdefault(files, len(layouts))
    if problems:
        raise IndexValidationError(where, problems)
    if not ids or reference is None:
        raise IndexValidationError(where, [f"index file {where} lists no clips."])
    records = ClipArrays(
        source=url,
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
        storage=config,
    )
    clips: Sequence[Clip] = records
    if meta:
        # The older JSON sidecar gives every file its frame table as an object: those clips are records.
        clips = tuple(
            Clip(
                clip.clip_id,
                clip.video_dir,
                clip.frame_count,
                tuple(
                    CameraStream(cam.name, cam.path_str, cached_info(meta, remote_key(base, cam.path_str)))
                    for cam in clip.cameras
                ),
            )
            for clip in records
        )
    if check == "thorough":
        checked = _thorough(list(clips), where, config)
        if isinstance(clips, ClipArrays):
            clips = clips.with_overrides({i: c for i, c in enumerate(checked)})
        else:
            clips = tuple(checked)
    if use_tables:
        # Only a remote index without tables (or with the JSON sidecar) can hold files without one.
        candidates = clips if tables is None else ()
        _warn_if_unchecked(url, clips, candidates, tables is not None or bool(meta))
    return VideoIndex(url, clips, reference[1], storage=config)


def _thorough(clips: list[Clip], where: str, config: StorageConfig) -> list[Clip]:
    """Compare every file's size and ETag with its frame table (one HEAD each); probe files without tables."""
    from lightning_vstream.index.build import probe_clip

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


# -- building on remote storage ---------------------------------------------------------------------
def _probe_object(client: Storage, url: str, expect: Expect | None = None) -> VideoInfo:
    """Read ``url`` whole (one GET) and probe it from memory; its identity holds the response's size and ETag."""
    import dataclasses

    from lightning_vstream.decode.probe import probe_video_bytes

    data, info = client.read(url, expect=expect)
    view = memoryview(data)
    probed = probe_video_bytes(view, name=url)
    head = zlib.crc32(view[:BLOCK])
    tail = zlib.crc32(view[max(len(view) - BLOCK, 0) :])
    identity = FileIdentity(len(view), max(info.mtime_ns or 0, 0), head, tail, etag=info.etag)
    return dataclasses.replace(probed, identity=identity)


def _probe_all(
    client: Storage, jobs: Sequence[tuple[str, str]], progress: Callable[[Iterable[Any]], Iterable[Any]] | None
) -> tuple[dict[str, VideoInfo], list[str]]:
    """Probe every ``(url, label)``: frame tables by URL, and the problems (every failure listed)."""
    infos: dict[str, VideoInfo] = {}
    problems: list[str] = []

    def one(job: tuple[str, str]) -> tuple[str, VideoInfo | None, str | None]:
        url, label = job
        try:
            return url, _probe_object(client, url), None
        except (VStreamError, OSError, ValueError) as err:
            return url, None, f"{label} ({url!r}): {err}"

    with ThreadPoolExecutor(max_workers=PROBE_THREADS) as pool:
        results: Iterable[Any] = pool.map(one, jobs)
        for url, info, problem in progress(results) if progress else results:
            if info is not None:
                infos[url] = info
            if problem is not None:
                problems.append(problem)
    return infos, problems


def _upload_tables(client: Storage, index_url: str, files: dict[str, VideoInfo]) -> str:
    tables_url = with_name(index_url, _stem(index_url) + ".tables.bin")
    with tempfile.TemporaryDirectory(prefix="vstream-tables-") as tmp:
        path = write_tables(Path(tmp) / "index.tables.bin", files)
        client.write(tables_url, path.read_bytes())
    return tables_url


def build_remote_index(
    root: str,
    *,
    output: str | None = None,
    storage: StorageConfig | None = None,
    progress: Callable[[Iterable[Any]], Iterable[Any]] | None = None,
) -> str:
    """Build an index of the dataset under the URL ``root``, in place: the index and its tables are written next to it.

    Every camera file is read once (one GET) and probed from memory; its frame table records its
    size and ETag, so readers check both with every request.

    Args:
        root: Folder URL of the dataset (clip folders of camera files anywhere below it).
        output: URL of the index to write; ``root/index.json`` when None.
        storage: Options of the store.
        progress: Optional wrapper for the probe loop (a ``tqdm``).

    Returns:
        The index URL.

    Raises:
        IndexValidationError: No clip folder found, or files could not be probed (every problem listed).

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
    jobs = [
        (url, f"clip {basename(folder)!r}, camera {name!r}")
        for folder, cams in sorted(folders.items(), key=lambda item: natural_key(item[0]))
        for name, url in sorted(cams.items())
    ]
    infos, problems = _probe_all(client, jobs, progress)
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
    return output


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
    infos, problems = _probe_all(client, jobs, progress)
    if problems:
        raise IndexValidationError(repr(url), problems)
    base = dirname(url)
    return _upload_tables(client, url, {remote_key(base, u): info for u, info in infos.items()})


def verify_remote_index(
    url: str, *, storage: StorageConfig | None = None, progress: Callable[[Iterable[Any]], Iterable[Any]] | None = None
) -> Any:
    """``vstream index --check`` for an index at a URL: every file read (one GET each, ``If-Match`` on its
    recorded ETag) and compared packet by packet with the frame tables.

    Returns:
        A :class:`~lightning_vstream.index.verify.VerifyReport`.
    """
    from lightning_vstream.index.verify import VerifyReport, _compare

    config = storage or StorageConfig()
    client = storage_for(config)
    index = load_remote_index(url, storage=config)
    report = VerifyReport(url)
    items = [(clip, cam) for clip in index for cam in clip.cameras]

    def one(item: tuple[Clip, CameraStream]) -> tuple[int, list[str]]:
        clip, cam = item
        label = f"{str(cam.path)!r} (clip {clip.clip_id!r}, camera {cam.name!r})"
        stored = cam.info
        if stored is None:
            return 0, [
                f"{label}: the index holds no frame table for this file, so its checksums cannot be verified; run "
                f"`vstream index --tables {url}` to record them."
            ]
        recorded = stored.identity
        expect = Expect(recorded.size, recorded.etag) if recorded is not None else None
        try:
            probed = _probe_object(client, str(cam.path), expect)
        except (FileChangedError, MissingFileError) as err:
            return 0, [f"{label}: {err}"]
        except (VideoDecodeError, OSError, ValueError) as err:
            return 0, [f"{label}: cannot be read as a video: {err}"]
        return probed.frame_count, _compare(stored, probed, clip.frame_count, label)

    with ThreadPoolExecutor(max_workers=PROBE_THREADS) as pool:
        results: Iterable[Any] = pool.map(one, items)
        for frames, problems in progress(results) if progress else results:
            report.files += 1
            report.frames += frames
            report.problems.extend(problems)
    return report

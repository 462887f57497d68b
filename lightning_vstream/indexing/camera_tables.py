"""Probing camera streams for their frame tables: a local file or image folder, or an object read whole.

Probing demuxes every packet of a file (no frame is decoded) and records its timestamps, keyframes
and CRC-32s. The decoders' probes are imported when a file is probed, so importing this module
loads no decoder library.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from lightning_vstream.errors import VideoDecodeError, VStreamError
from lightning_vstream.index.checksum import crc32
from lightning_vstream.index.identity import BLOCK, FileIdentity, file_identity
from lightning_vstream.index.records import CameraStream, Clip
from lightning_vstream.index.tables import VideoInfo
from lightning_vstream.storage.client import Expect, Storage
from lightning_vstream.storage.config import StorageConfig
from lightning_vstream.storage.urls import basename, is_url

__all__ = [
    "PROBE_THREADS",
    "probe",
    "probe_clip",
    "probe_for_index",
    "probe_object",
    "probe_objects",
    "probe_with_identity",
]

#: Files probed at once when building or checking an index on remote storage.
PROBE_THREADS = 4


def probe(path: Path | str, storage: StorageConfig | None = None) -> VideoInfo:
    """Probe a camera stream (video file, image folder, or a URL read through its container) for its frame table.

    Example::

        >>> probe("data/videos/scene-0000/CAM_FRONT.mp4").frame_count  # doctest: +SKIP
        240
    """
    if isinstance(path, str) and is_url(path):
        from lightning_vstream.decode.cpu.probe import probe_url

        return probe_url(path, storage)
    path = Path(path)
    if path.is_dir():
        from lightning_vstream.decode.images import probe_image_folder

        return probe_image_folder(path)
    from lightning_vstream.decode.cpu.probe import probe_video

    return probe_video(path)


def probe_with_identity(path: Path) -> VideoInfo:
    """:func:`probe` plus the file's identity (size, mtime, fingerprint) for video files.

    The identity is read before the probe, so a file written meanwhile shows as changed later.
    """
    identity = None if path.is_dir() else file_identity(path)
    info = probe(path)
    return dataclasses.replace(info, identity=identity) if identity is not None else info


def probe_for_index(path: Path) -> tuple[VideoInfo, str | None]:
    """:func:`probe_with_identity` for building an index: only the frames a file holds whole, and how it is cut.

    A video file cut short keeps the frames whose packets lie whole in it and decode
    (:func:`~lightning_vstream.decode.cpu.probe.probe_whole_frames`); the second value then says how it
    is truncated (``"truncated: 14 whole frames of the 36 its container lists ..."``), else None.
    """
    if path.is_dir():
        return probe_with_identity(path), None
    from lightning_vstream.decode.cpu.probe import check_upright, frame_rotation, probe_whole_frames

    identity = file_identity(path)
    info, truncation = probe_whole_frames(path)
    check_upright(frame_rotation(path), repr(str(path)))  # refused here, not met on its side in training
    return dataclasses.replace(info, identity=identity), truncation.describe() if truncation is not None else None


def probe_clip(clip: Clip, where: str, problems: list[str], *, storage: StorageConfig | None = None) -> Clip:
    """``clip`` with a frame table for every camera (probing those without), its problems added to ``problems``.

    A camera must hold the clip's frames in a codec this FFmpeg build decodes, and every camera of a
    clip must have one frame size.
    """
    streams = []
    sizes: dict[str, tuple[int, int]] = {}
    for cam in clip.cameras:
        info = cam.info
        if info is None:
            try:
                info = probe(cam.path, storage)
            except (VideoDecodeError, OSError, ValueError) as err:
                problems.append(f"{where}: clip {clip.clip_id!r}, camera {cam.name!r}: {err}")
                streams.append(cam)
                continue
        name = basename(cam.path) if isinstance(cam.path, str) else cam.path.name
        if info.frame_count < clip.frame_count:
            problems.append(
                f"{where}: clip {clip.clip_id!r} lists {clip.frame_count} frames, but camera {cam.name!r} "
                f"({name}) holds {info.frame_count}. Re-run `vstream index` to rebuild the index."
            )
        if not cam.is_image_folder and not _decodable(info.codec):
            problems.append(
                f"{where}: clip {clip.clip_id!r}, camera {cam.name!r} ({name}) uses codec "
                f"{info.codec!r}, which this FFmpeg build cannot decode; re-encode it to H.264 or H.265."
            )
        sizes[cam.name] = (info.width, info.height)
        # A camera that already had its frame table stays as it is (one read from the tables on demand).
        streams.append(cam if cam.info is not None else CameraStream(cam.name, cam.path, info))
    if len(set(sizes.values())) > 1:
        listed = ", ".join(f"{n}={w}x{h}" for n, (w, h) in sizes.items())
        problems.append(
            f"{where}: clip {clip.clip_id!r} has cameras of different frame sizes ({listed}); "
            "batches stack cameras, so resize them to one size or load the cameras separately."
        )
    if all(new is old for new, old in zip(streams, clip.cameras)):
        return clip
    return Clip(clip.clip_id, clip.video_dir, clip.frame_count, tuple(streams))


def _decodable(codec: str) -> bool:
    import av

    try:
        av.codec.Codec(codec, "r")
    except Exception:
        return False
    return True


def probe_object(client: Storage, url: str, expect: Expect | None = None) -> VideoInfo:
    """Read ``url`` whole (one GET) and probe it from memory; its identity holds the response's size and ETag."""
    from lightning_vstream.decode.cpu.probe import probe_video_bytes

    data, info = client.read(url, expect=expect)
    view = memoryview(data)
    probed = probe_video_bytes(view, name=url)
    head = crc32(view[:BLOCK])
    tail = crc32(view[max(len(view) - BLOCK, 0) :])
    identity = FileIdentity(len(view), max(info.mtime_ns or 0, 0), head, tail, etag=info.etag)
    return dataclasses.replace(probed, identity=identity)


def probe_objects(
    client: Storage, jobs: Sequence[tuple[str, str]], progress: Callable[[Iterable[Any]], Iterable[Any]] | None
) -> tuple[dict[str, VideoInfo], list[str]]:
    """Probe every ``(url, label)`` on :data:`PROBE_THREADS` threads: frame tables by URL, and the problems
    (every failure listed)."""
    infos: dict[str, VideoInfo] = {}
    problems: list[str] = []

    def one(job: tuple[str, str]) -> tuple[str, VideoInfo | None, str | None]:
        url, label = job
        try:
            return url, probe_object(client, url), None
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

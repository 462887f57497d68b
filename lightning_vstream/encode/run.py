"""Encoding a dataset: camera streams in, accvlab layout (one video per camera and clip) plus its index out.

``OUT_DIR/videos/<clip_id>/<camera>.mp4`` holds every frame of each source camera stream at its
source presentation time (see :mod:`lightning_vstream.encode.writer`); ``OUT_DIR/index.json``
and its frame-table sidecar are written by :func:`~lightning_vstream.build_index`. A run finds
the files that are already done (they probe with the expected codec, frame count and times) and
encodes only the rest, in parallel processes.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

from lightning_vstream.encode.settings import CameraSource, Codec, EncodeSettings, EncodeSummary
from lightning_vstream.encode.writer import FileTask, encode_file, mismatch, plan_file
from lightning_vstream.errors import ConfigurationError, EncodeError

__all__ = ["encode_index", "encode_sources"]


def encode_sources(
    sources: Sequence[CameraSource],
    out_dir: Path | str,
    *,
    settings: EncodeSettings | None = None,
    jobs: int = 1,
    progress: bool = True,
    video_dir: str = "videos",
    index_name: str = "index.json",
) -> EncodeSummary:
    """Encode camera streams to ``out_dir/<video_dir>/<clip_id>/<camera>.mp4`` and index them.

    Files are written under a temporary name, probed (frame count, codec and every frame time must
    match the source, and with a keyframe stride exactly the frames on the stride must be
    references) and then renamed into place, so an interrupted run leaves no half-written file
    under a camera's name, and a file already there that probes right is skipped.

    Args:
        sources: The camera streams; ``(clip_id, camera)`` pairs must be unique.
        out_dir: Output folder (created).
        settings: Codec and rate control (defaults: :class:`EncodeSettings`).
        jobs: Files encoded in parallel, each in its own process.
        progress: Show a progress bar over files.
        video_dir: Folder under ``out_dir`` that holds the clip folders.
        index_name: Index file written under ``out_dir`` (with its frame-table sidecar).

    Returns:
        An :class:`EncodeSummary`.

    Raises:
        ConfigurationError: ``jobs`` < 1, duplicate streams, or ``out_dir`` is a file.
        VideoDecodeError: A source frame could not be read (names clip, camera and frame).
        EncodeError: The encoder failed or its output does not keep the source frames and times.

    Example::

        >>> src = CameraSource("scene-0000", "CAM_FRONT", Path("images/scene-0000/CAM_FRONT"))
        >>> encode_sources([src], "out", settings=EncodeSettings(codec="h264"))  # doctest: +SKIP
    """
    from tqdm import tqdm

    from lightning_vstream.indexing.build import build_index

    settings = settings if settings is not None else EncodeSettings()
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ConfigurationError(f"jobs={jobs!r} must be a positive number of processes.")
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise ConfigurationError(f"output folder {str(out_dir)!r} is a file; give a folder to write videos into.")
    if not sources:
        raise ConfigurationError("there are no camera streams to encode.")
    seen: set[tuple[str, str]] = set()
    for src in sources:
        key = (src.clip_id, src.camera)
        if key in seen:
            raise ConfigurationError(f"clip {src.clip_id!r}, camera {src.camera!r} is listed twice; give each once.")
        seen.add(key)
    start = time.perf_counter()
    skipped = frames = in_bytes = out_bytes = 0
    todo: list[FileTask] = []
    with tqdm(total=len(sources), desc="encoding", unit="file", disable=not progress) as bar:
        # Done files are found here, so a finished dataset is checked without starting any process.
        for src in sources:
            task = plan_file(src, out_dir / video_dir / src.clip_id / f"{src.camera}.mp4")
            if task.path.is_file() and mismatch(task, task.path, settings.codec, settings.stride) is None:
                skipped += 1
                bar.update(1)
            else:
                todo.append(task)
        workers = min(jobs, len(todo))
        if workers > 1:
            threads = max(1, (os.cpu_count() or 1) // workers)
            # forkserver: encoders start clean, without the caller's threads or open decoders.
            context = multiprocessing.get_context("forkserver")
            with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
                futures = [pool.submit(encode_file, task, settings, threads) for task in todo]
                try:
                    for future in as_completed(futures):
                        n, sb, ob = future.result()
                        frames, in_bytes, out_bytes = frames + n, in_bytes + sb, out_bytes + ob
                        bar.update(1)
                except BrokenProcessPool as err:
                    raise EncodeError(
                        f"an encoding process ended abruptly (out of memory?) while writing to {str(out_dir)!r}; "
                        "run again with fewer --jobs: finished files are kept and skipped."
                    ) from err
                finally:
                    for future in futures:
                        future.cancel()
        else:
            for task in todo:
                n, sb, ob = encode_file(task, settings)
                frames, in_bytes, out_bytes = frames + n, in_bytes + sb, out_bytes + ob
                bar.update(1)
    seconds = time.perf_counter() - start
    index = build_index(out_dir, output=out_dir / index_name, video_dirs=[video_dir], progress=False)
    return EncodeSummary(index, len(todo), skipped, frames, seconds, in_bytes, out_bytes)


def encode_index(
    src_index: Path | str,
    out_dir: Path | str,
    *,
    codec: Codec = "hevc",
    gop: int = 12,
    bframes: int = 0,
    crf: int | None = None,
    bitrate: int | str | None = None,
    preset: str = "fast",
    keyframe_stride: int | None = None,
    cameras: Sequence[str] | None = None,
    jobs: int = 1,
    progress: bool = True,
) -> EncodeSummary:
    """Transcode every camera of every clip of an index into ``out_dir`` (accvlab layout) and index it.

    Each camera stream is encoded whole (all the frames it holds, at their source times) to
    ``out_dir/videos/<clip_id>/<camera>.mp4``; ``out_dir/index.json`` and its frame-table sidecar
    are written with :func:`~lightning_vstream.build_index`. Running it again skips the files
    that are already done (see :func:`encode_sources`).

    Args:
        src_index: Index of the source dataset (image folders, videos, or both).
        out_dir: Output folder; must not be a folder the source's clips live in.
        codec: ``"hevc"`` or ``"h264"``.
        gop: Keyframe interval in frames.
        bframes: Maximum consecutive B-frames.
        crf: Constant quality (0..51); the codec's default when neither this nor ``bitrate`` is given.
        bitrate: Target bit rate (bits per second, or ``"4M"`` / ``"800k"``) instead of ``crf``.
        preset: Encoder speed preset.
        keyframe_stride: ``N`` > 1 writes the stride layout (every ``N``-th frame a reference, the
            frames between non-reference B-frames: see :class:`EncodeSettings`); None or 1: the
            usual layout (an index does not say which of its frames are key frames).
        cameras: Cameras to encode (all when None).
        jobs: Files encoded in parallel (processes).
        progress: Show a progress bar.

    Returns:
        An :class:`EncodeSummary` (speed, sizes, files encoded and skipped).

    Raises:
        FileNotFoundError: ``src_index`` does not exist.
        IndexValidationError: The source index does not match its files.
        ConfigurationError: An argument is out of range, or ``out_dir`` would overwrite the source.
        VideoDecodeError: A source frame could not be read.
        EncodeError: The encoder failed or its output does not keep the source frames and times.

    Example::

        >>> encode_index("images/index.json", "encoded", codec="h264", crf=18, jobs=2)  # doctest: +SKIP
    """
    from lightning_vstream.indexing import load_index

    settings = EncodeSettings(
        codec=codec, gop=gop, bframes=bframes, crf=crf, bitrate=bitrate, preset=preset, keyframe_stride=keyframe_stride
    )
    index = load_index(src_index, cameras=cameras)
    if isinstance(index.source, str):
        raise ConfigurationError(
            f"vstream encode reads local files; {index.source!r} is remote. Download the dataset first, or encode "
            "where the images are."
        )
    if (Path(out_dir) / "index.json").resolve() == index.source.resolve():
        raise ConfigurationError(
            f"output folder {str(out_dir)!r} holds the source index {str(index.source)!r}, which encoding would "
            "overwrite; choose another output folder."
        )
    video_root = (Path(out_dir) / "videos").resolve()
    sources: list[CameraSource] = []
    for clip in index:
        if (video_root / clip.clip_id).resolve() == Path(clip.folder).resolve():
            raise ConfigurationError(
                f"output folder {str(out_dir)!r} would write clip {clip.clip_id!r} into its own source folder "
                f"{str(clip.folder)!r}; choose another output folder."
            )
        # No pts: each source is probed once, and decoded with that frame table.
        sources.extend(CameraSource(clip.clip_id, cam.name, Path(cam.path)) for cam in clip.cameras)
    return encode_sources(sources, out_dir, settings=settings, jobs=jobs, progress=progress)

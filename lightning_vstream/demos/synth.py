"""Stamped synthetic datasets: every frame carries its (clip, camera, frame) as large blocks.

The stamp is a grid of 8 x 6 cells in the frame's top-left corner, each cell pure black or
pure white, holding 48 bits: clip number (16), camera number (8), frame index (20) and a 4-bit
check. The cells survive lossy compression; :func:`read_stamp` recovers the numbers from a
decoded frame. The rest of the frame is a coloured texture that moves every frame, so encoders
produce realistic P/B-frames.
"""

from __future__ import annotations

import itertools
import json
import math
import multiprocessing
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any, Literal

import numpy as np

from lightning_vstream.encode.settings import check_preset
from lightning_vstream.errors import ConfigurationError
from lightning_vstream.storage.atomic import atomic_path, write_atomic

__all__ = [
    "NUSCENES_CAMERAS",
    "Stamp",
    "clip_name",
    "clip_number",
    "draw_stamp",
    "frame_image",
    "read_stamp",
    "write_dataset",
    "write_stamped_video",
]

#: Camera names used by :func:`write_dataset` for up to six cameras (sorted, as the index orders them).
NUSCENES_CAMERAS = (
    "CAM_BACK",
    "CAM_BACK_LEFT",
    "CAM_BACK_RIGHT",
    "CAM_FRONT",
    "CAM_FRONT_LEFT",
    "CAM_FRONT_RIGHT",
)

_COLS, _ROWS = 8, 6
_CLIP_BITS, _CAMERA_BITS, _FRAME_BITS, _CHECK_BITS = 16, 8, 20, 4
_MAX_CELL = 32
Codec = Literal["h264", "hevc"]


@dataclass(frozen=True)
class Stamp:
    """The numbers a stamped frame carries."""

    clip: int
    camera: int
    frame: int


def clip_name(number: int) -> str:
    """Clip id used by :func:`write_dataset` for clip ``number`` (``scene-0007``)."""
    return f"scene-{number:04d}"


def clip_number(clip_id: str) -> int:
    """Inverse of :func:`clip_name`: the number a synthetic clip's frames are stamped with."""
    try:
        return int(clip_id.rsplit("-", 1)[1])
    except (IndexError, ValueError):
        raise ConfigurationError(f"clip id {clip_id!r} is not a synthetic clip id like 'scene-0007'.") from None


def _cell(width: int, height: int) -> int:
    cell = min(width // _COLS, height // _COLS, _MAX_CELL)
    if cell < 4:
        raise ConfigurationError(f"frames of {width}x{height} are too small for a stamp; use at least 32x32.")
    return cell


def _check(clip: int, camera: int, frame: int) -> int:
    value = clip ^ (camera << 3) ^ (frame * 7) ^ (frame >> 9)
    nibbles = 0
    while value:
        nibbles ^= value & 0xF
        value >>= 4
    # The constant keeps all-black and all-white frames (a decoder's blank or failed output) from
    # reading as valid stamps: without it an all-black frame reads as clip 0, camera 0, frame 0.
    return nibbles ^ 0b1010


def _bits(stamp: Stamp) -> list[int]:
    for value, width in ((stamp.clip, _CLIP_BITS), (stamp.camera, _CAMERA_BITS), (stamp.frame, _FRAME_BITS)):
        if not 0 <= value < (1 << width):
            raise ConfigurationError(f"stamp value {value} does not fit in {width} bits.")
    fields = (
        (stamp.clip, _CLIP_BITS),
        (stamp.camera, _CAMERA_BITS),
        (stamp.frame, _FRAME_BITS),
        (_check(stamp.clip, stamp.camera, stamp.frame), _CHECK_BITS),
    )
    bits: list[int] = []
    for value, width in fields:
        if not 0 <= value < (1 << width):
            raise ConfigurationError(f"stamp value {value} does not fit in {width} bits.")
        bits.extend((value >> (width - 1 - b)) & 1 for b in range(width))
    return bits


def draw_stamp(image: np.ndarray, stamp: Stamp) -> None:
    """Draw ``stamp`` in place into an HWC uint8 RGB image."""
    height, width = image.shape[:2]
    cell = _cell(width, height)
    for i, bit in enumerate(_bits(stamp)):
        row, col = divmod(i, _COLS)
        image[row * cell : (row + 1) * cell, col * cell : (col + 1) * cell] = 255 if bit else 0


def read_stamp(
    image: Any, *, layout: Literal["chw", "hwc"] = "chw", source_size: tuple[int, int] | None = None
) -> Stamp:
    """Recover the stamp from a decoded RGB frame (uint8 tensor or array, CHW or HWC).

    Args:
        image: The frame.
        layout: ``"chw"`` or ``"hwc"``.
        source_size: ``(width, height)`` the video was written at, for frames resized since; the
            stamp's cells are scaled with the frame. None when the frame has its written size.

    Raises:
        ValueError: The frame carries no valid stamp (check bits disagree).

    Example::

        >>> img = np.zeros((48, 64, 3), np.uint8); draw_stamp(img, Stamp(3, 1, 17))
        >>> read_stamp(img, layout="hwc")
        Stamp(clip=3, camera=1, frame=17)
    """
    array = image.cpu().numpy() if hasattr(image, "cpu") else np.asarray(image)
    if layout == "chw":
        array = array.transpose(1, 2, 0)
    array = array.astype(np.float32)
    height, width = array.shape[:2]
    scale_x = scale_y = 1.0
    if source_size is None:
        cell = _cell(width, height)
    else:
        cell = _cell(*source_size)
        scale_x, scale_y = width / source_size[0], height / source_size[1]
    bits = []
    for i in range(_COLS * _ROWS):
        row, col = divmod(i, _COLS)
        if source_size is None:
            margin = cell // 4
            patch = array[
                row * cell + margin : (row + 1) * cell - margin, col * cell + margin : (col + 1) * cell - margin
            ]
        else:  # the middle half of each scaled cell, away from edges that compression and resizing blur
            top, bottom = int((row + 0.25) * cell * scale_y), int((row + 0.75) * cell * scale_y)
            left, right = int((col + 0.25) * cell * scale_x), int((col + 0.75) * cell * scale_x)
            patch = array[top : max(bottom, top + 1), left : max(right, left + 1)]
        bits.append(1 if patch.mean() >= 128 else 0)
    values = []
    pos = 0
    for width_bits in (_CLIP_BITS, _CAMERA_BITS, _FRAME_BITS, _CHECK_BITS):
        value = 0
        for b in bits[pos : pos + width_bits]:
            value = (value << 1) | b
        values.append(value)
        pos += width_bits
    clip, camera, frame, check = values
    if _check(clip, camera, frame) != check:
        raise ConfigurationError(f"frame carries no valid stamp (read clip={clip}, camera={camera}, frame={frame}).")
    return Stamp(clip, camera, frame)


def _texture(width: int, height: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    coarse = rng.integers(0, 256, size=(height // 8 + 2, width // 8 + 2, 3), dtype=np.uint8)
    fine = np.kron(coarse, np.ones((8, 8, 1), dtype=np.uint8))[:height, :]
    # Extra width so the content can scroll without a visible seam at the edge.
    return np.concatenate([fine, fine], axis=1)[:, : 2 * width]


def _frame(texture: np.ndarray, width: int, height: int, index: int, stamp: Stamp) -> np.ndarray:
    shift = (index * 3) % width
    image = np.ascontiguousarray(texture[:height, shift : shift + width])
    draw_stamp(image, stamp)
    return image


def frame_image(width: int, height: int, stamp: Stamp) -> np.ndarray:
    """The RGB image ``[height, width, 3]`` (uint8) of a stamped frame, as :func:`write_stamped_video` encodes it."""
    _cell(width, height)
    texture = _texture(width, height, seed=stamp.clip * 1000 + stamp.camera)
    return _frame(texture, width, height, stamp.frame, stamp)


def write_stamped_video(
    path: Path | str,
    *,
    clip: int,
    camera: int,
    frames: int,
    size: tuple[int, int] = (64, 48),
    codec: Codec = "h264",
    gop: int = 10,
    bframes: int = 0,
    fps: float = 12.0,
    timestamps: Sequence[float] | None = None,
    audio_first: bool = False,
    faststart: bool = False,
    preset: str = "veryfast",
    crf: int = 23,
) -> Path:
    """Encode one stamped video file.

    Args:
        path: Output ``.mp4`` path (folders are created).
        clip: Clip number stamped into every frame.
        camera: Camera number stamped into every frame.
        frames: Number of frames.
        size: ``(width, height)``; odd sizes are encoded as 4:4:4.
        codec: ``"h264"`` (libx264) or ``"hevc"`` (libx265, open GOP as x265 defaults).
        gop: Keyframe interval in frames.
        bframes: Maximum consecutive B-frames.
        fps: Frame rate, for constant-rate files.
        timestamps: Presentation times in seconds, strictly increasing, for variable-rate files.
        audio_first: Add an audio stream placed before the video stream.
        faststart: Put the MP4 index before the frames (so a truncated file still opens).
        preset: Encoder speed preset.
        crf: Encoder quality (lower is better).

    Returns:
        The written path.
    """
    import av

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    width, height = size
    _cell(width, height)
    if timestamps is not None and (len(timestamps) != frames or any(b <= a for a, b in itertools.pairwise(timestamps))):
        raise ConfigurationError("timestamps must hold one strictly increasing time per frame.")
    odd = width % 2 or height % 2
    params = f"keyint={gop}:min-keyint={gop}:scenecut=0:bframes={bframes}"
    encoder = {"h264": "libx264", "hevc": "libx265"}[codec]
    options = {"preset": preset, "crf": str(crf)}
    if codec == "h264":
        options["x264-params"] = params
    else:
        options["x265-params"] = params + ":log-level=error"
    rate = Fraction(fps).limit_denominator(1001)
    time_base = Fraction(1, 90000) if timestamps is not None else 1 / rate
    container_options = {"movflags": "faststart"} if faststart else {}
    muxer = _muxer(path)
    with (
        atomic_path(path) as partial,
        av.open(str(partial), mode="w", format=muxer, options=container_options) as container,
    ):
        audio = container.add_stream("aac", rate=16000) if audio_first else None
        stream = container.add_stream(encoder, rate=rate, options=options)
        stream.width, stream.height = width, height
        stream.pix_fmt = "yuv444p" if odd else "yuv420p"
        stream.codec_context.time_base = time_base
        texture = _texture(width, height, seed=clip * 1000 + camera)
        audio_pts = 0
        for i in range(frames):
            image = _frame(texture, width, height, i, Stamp(clip, camera, i))
            frame = av.VideoFrame.from_ndarray(image, format="rgb24")
            frame.pts = round(timestamps[i] * 90000) if timestamps is not None else i
            frame.time_base = time_base
            for packet in stream.encode(frame):
                container.mux(packet)
            if audio is not None:
                audio_pts = _mux_audio(container, audio, audio_pts, until=float(frame.pts * time_base))
        for packet in stream.encode():
            container.mux(packet)
        if audio is not None:
            for packet in audio.encode():
                container.mux(packet)
    from lightning_vstream.decode.cpu.probe import probe_video

    written = probe_video(path).frame_count
    if written != frames:
        raise ConfigurationError(
            f"{str(path)!r} holds {written} frames instead of {frames}: the encoder or muxer dropped frames "
            "(extreme timestamp gaps with B-frames do this); use fewer B-frames or smoother timestamps."
        )
    return path


#: FFmpeg's muxer for each video file extension (the file is written under a temporary name first).
_MUXERS = {
    ".mp4": "mp4",
    ".m4v": "mp4",
    ".mov": "mov",
    ".mkv": "matroska",
    ".webm": "webm",
    ".avi": "avi",
    ".ts": "mpegts",
    ".h264": "h264",
    ".h265": "hevc",
    ".hevc": "hevc",
}


def _muxer(path: Path) -> str:
    """The muxer for ``path``'s extension.

    Raises:
        ConfigurationError: The extension is not a video file's.
    """
    muxer = _MUXERS.get(path.suffix.lower())
    if muxer is None:
        raise ConfigurationError(
            f"{str(path)!r}: {path.suffix or 'no extension'!r} is not a video file extension; use one of "
            f"{sorted(_MUXERS)}."
        )
    return muxer


def _mux_audio(container: Any, audio: Any, pts: int, *, until: float) -> int:
    import av

    while pts / audio.rate <= until:
        samples = np.zeros((1, 1024), dtype=np.float32)
        frame = av.AudioFrame.from_ndarray(samples, format="fltp", layout="mono")
        frame.sample_rate = audio.rate
        frame.pts = pts
        for packet in audio.encode(frame):
            container.mux(packet)
        pts += 1024
    return pts


def _write_job(job: dict[str, Any]) -> str:
    if job.pop("images"):
        for key in ("codec", "gop", "bframes", "preset"):
            job.pop(key)
        from lightning_vstream.demos.synth_images import write_stamped_images

        return str(write_stamped_images(job.pop("path").with_suffix(""), **job))
    return str(write_stamped_video(**job))


#: What a dataset written by :func:`write_dataset` may leave in its root, besides its index and video folder.
_DATASET_FILES = ("annotations", "index.tables.bin", "index.meta.json")


def _stale(root: Path, video_dir: str, clip_ids: Sequence[str], cameras: Sequence[str], images: bool) -> list[str]:
    """Files of an earlier dataset in ``root`` that writing this one would not overwrite, relative to ``root``.

    Such files would end up in the new index (a clip or camera too many) or beside it (annotations of
    other clips, tables in the other format); writing the same dataset again leaves none.
    """
    stale: list[str] = []
    videos = root / video_dir
    expected = {f"{name}{'' if images else '.mp4'}" for name in cameras}
    if videos.is_dir():
        for clip in sorted(videos.iterdir()):
            if clip.name not in clip_ids:
                stale.append(f"{video_dir}/{clip.name}" + ("/" if clip.is_dir() else ""))
            elif clip.is_dir():
                stale += [f"{video_dir}/{clip.name}/{e.name}" for e in sorted(clip.iterdir()) if e.name not in expected]
    annotations = root / "annotations"
    if annotations.is_dir():
        wanted = {f"{clip}.npz" for clip in clip_ids}
        stale += [f"annotations/{e.name}" for e in sorted(annotations.iterdir()) if e.name not in wanted]
    if (root / "index.meta.json").exists():  # tables are written as index.tables.bin
        stale.append("index.meta.json")
    return stale


def _clear_dataset(root: Path, video_dir: str, index_name: str) -> None:
    """Delete the index, tables, video folder and annotations of a dataset in ``root``; nothing else."""
    import shutil

    for name in (index_name, video_dir, *_DATASET_FILES):
        path = root / name
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()


def write_dataset(
    root: Path | str,
    *,
    clips: int = 2,
    cameras: int | Sequence[str] = 2,
    frames: int | Sequence[int] = 20,
    size: tuple[int, int] = (64, 48),
    codec: Codec = "h264",
    gop: int = 10,
    bframes: int = 0,
    fps: float = 12.0,
    preset: str = "veryfast",
    video_dir: str = "videos",
    jobs: int = 1,
    index_name: str = "index.json",
    with_metadata: bool = True,
    annotations: bool = False,
    images: bool = False,
    replace: bool = False,
    progress: Callable[[str, int, int], None] | None = None,
) -> Path:
    """Write a stamped multi-camera dataset in accvlab's layout plus its index.

    Files go to ``root/<video_dir>/<clip_id>/<camera>.mp4`` (with ``images``: a folder
    ``<camera>/`` of JPEG files and ``timestamps.txt``); the index is written to
    ``root/<index_name>`` with ``video_dir`` relative to it. Clip ``i`` is named
    :func:`clip_name` ``(i)`` and its frames are stamped with ``clip=i``; camera numbers are
    positions in the sorted camera list, as the index orders cameras.

    Args:
        root: Output folder.
        clips: Number of clips.
        cameras: Number of cameras (nuScenes names for up to six) or explicit names.
        frames: Frames per clip, or one count per clip (cycled).
        size: ``(width, height)`` of every frame.
        codec: ``"h264"`` or ``"hevc"``.
        gop: Keyframe interval.
        bframes: Maximum consecutive B-frames.
        fps: Frame rate.
        preset: Encoder preset.
        video_dir: Folder name under ``root`` that holds the clip folders.
        jobs: Parallel encoding processes.
        index_name: File name of the index written under ``root``.
        with_metadata: Also write the frame-table metadata file next to the index.
        annotations: Also write synthetic annotations to ``root/annotations`` (values encode
            clip and frame; see :mod:`lightning_vstream.demos.synth_annotations`).
        images: Write each camera as a folder of stamped JPEG images with ``timestamps.txt``
            instead of a video file (an image dataset, as ``vstream encode`` takes; needs Pillow).
        replace: Delete a dataset already in ``root`` (its index, frame tables, video folder and
            annotations; nothing else) before writing. Without it, a folder holding files of another
            dataset that this one would not overwrite (clips or cameras too many, annotations of other
            clips) is refused, since they would end up in the new index; writing the same dataset again
            is fine.
        progress: Called as ``progress(path, done, total)`` after each camera file is written.

    Returns:
        Path of the written index file.

    Raises:
        ConfigurationError: ``root`` holds another dataset's files and ``replace`` is False, or an
            argument is invalid (the message names it).

    Example::

        >>> index = write_dataset("/tmp/demo", clips=2, cameras=2, frames=8)  # doctest: +SKIP
    """
    from lightning_vstream.indexing import build_index

    root = Path(root)
    if root.exists() and not root.is_dir():
        raise ConfigurationError(f"{str(root)!r} is a file; give a folder to write the dataset into.")
    _cell(*size)  # a frame size too small for a stamp is refused before anything is created
    check_preset(preset)
    if not (isinstance(fps, (int, float)) and not isinstance(fps, bool) and math.isfinite(fps) and fps > 0):
        raise ConfigurationError(f"fps={fps!r} must be a positive frame rate, e.g. 12 or 29.97.")
    if isinstance(cameras, int):
        if cameras < 1:
            raise ConfigurationError(f"cameras={cameras!r} must be >= 1.")
        names = list(NUSCENES_CAMERAS[:cameras]) if cameras <= 6 else [f"CAM_{i:02d}" for i in range(cameras)]
    else:
        names = list(cameras)
    names = sorted(names)
    if replace:
        _clear_dataset(root, video_dir, index_name)
    elif root.is_dir():
        stale = _stale(root, video_dir, [clip_name(c) for c in range(clips)], names, images)
        if stale:
            listed = ", ".join(stale[:4]) + (f" and {len(stale) - 4} more" if len(stale) > 4 else "")
            raise ConfigurationError(
                f"{str(root)!r} holds another dataset: {listed} would not be overwritten and would end up in the "
                "new index. Choose an empty folder, or pass --replace (replace=True) to delete the dataset there "
                "(its index, frame tables, videos and annotations; nothing else) first."
            )
    counts = [frames] * clips if isinstance(frames, int) else [frames[i % len(frames)] for i in range(clips)]
    job_list = []
    for c in range(clips):
        for k, name in enumerate(names):
            job_list.append(
                dict(
                    path=root / video_dir / clip_name(c) / f"{name}.mp4",
                    clip=c,
                    camera=k,
                    frames=counts[c],
                    size=size,
                    codec=codec,
                    gop=gop,
                    bframes=bframes,
                    fps=fps,
                    preset=preset,
                    images=images,
                )
            )
    total = len(job_list)
    if jobs > 1:
        # forkserver: encoding processes inherit no state (open decoders, threads) from the caller.
        context = multiprocessing.get_context("forkserver")
        with ProcessPoolExecutor(max_workers=min(jobs, os.cpu_count() or 1), mp_context=context) as pool:
            futures = [pool.submit(_write_job, job) for job in job_list]
            for done, future in enumerate(as_completed(futures), 1):
                written = future.result()
                if progress is not None:
                    progress(written, done, total)
    else:
        for done, job in enumerate(job_list, 1):
            written = _write_job(job)
            if progress is not None:
                progress(written, done, total)
    index_path = root / index_name
    entries = {video_dir: {clip_name(c): counts[c] for c in range(clips)}}
    if with_metadata:
        build_index(root, output=index_path, video_dirs=[video_dir], progress=False)
    else:
        write_atomic(index_path, json.dumps(entries, indent=2) + "\n")
    if annotations:
        from lightning_vstream.demos.synth_annotations import write_synthetic_annotations

        write_synthetic_annotations(
            root / "annotations",
            clip_ids=[clip_name(c) for c in range(clips)],
            clip_numbers=list(range(clips)),
            camera_names=names,
            frame_counts=counts,
            size=size,
            fps=fps,
        )
    return index_path

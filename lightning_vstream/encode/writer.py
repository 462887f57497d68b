"""Encoding one camera stream into one MP4 file that keeps every source frame time exactly.

The output's time base is ``1/den`` of the source's ``num/den``, so each frame's time is an
integer number of ticks with no rounding. MP4 keeps variable-rate timestamps; its movie
timescale is set to the track's so an edit list holding a large start time (UNIX microseconds)
stays exact too. A file is written under a temporary name, probed, compared frame by frame with
the source times, and only then renamed into place.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from fractions import Fraction
from math import gcd
from pathlib import Path
from typing import Any

from lightning_vstream.encode.settings import DEFAULT_CRF, ENCODERS, CameraSource, EncodeSettings
from lightning_vstream.errors import EncodeError, VideoDecodeError
from lightning_vstream.index.tables import VideoInfo
from lightning_vstream.storage.atomic import atomic_path

__all__ = ["FileTask", "encode_file", "mismatch", "plan_file", "source_bytes", "stride_mismatch"]


@dataclass(frozen=True)
class FileTask:
    """One output file to write: its source, the source's frame table when probed, and the target times."""

    source: CameraSource
    path: Path
    info: VideoInfo | None
    ticks: tuple[int, ...]
    time_base: Fraction

    @property
    def where(self) -> str:
        return f"clip {self.source.clip_id!r}, camera {self.source.camera!r}"


def _out_time_base(pts: Sequence[int], time_base: tuple[int, int]) -> tuple[tuple[int, ...], Fraction]:
    num, den = time_base
    common = gcd(num, den)
    num, den = num // common, den // common
    return tuple(p * num for p in pts), Fraction(1, den)


def plan_file(source: CameraSource, path: Path) -> FileTask:
    """The task for ``source``: its frame times (probing a file or folder that has no ``pts`` given)."""
    info = None
    if source.pts is not None:
        pts, time_base = source.pts, source.time_base
    else:
        from lightning_vstream.indexing.camera_tables import probe

        assert isinstance(source.frames, Path)  # CameraSource requires pts for explicit image lists
        info = probe(source.frames)
        pts, time_base = info.pts, info.time_base
    ticks, base = _out_time_base(pts, time_base)
    return FileTask(source, path, info, ticks, base)


def mismatch(task: FileTask, path: Path, codec: str, keyframe_stride: int = 1) -> str | None:
    """None when ``path`` holds exactly the task's frame times in ``codec`` (in the stride layout of
    ``keyframe_stride`` when it is over 1); otherwise what differs."""
    from lightning_vstream.decode.cpu.probe import probe_video

    try:
        info = probe_video(path)
    except (VideoDecodeError, OSError) as err:
        return f"it cannot be read ({err})"
    if info.codec != codec:
        return f"it is {info.codec}, not {codec}"
    if info.frame_count != len(task.ticks):
        return f"it holds {info.frame_count} frames instead of {len(task.ticks)}"
    unit = Fraction(*info.time_base)
    for i, (got, want) in enumerate(zip(info.pts, task.ticks)):
        if got * unit != want * task.time_base:
            return f"frame {i} is at {float(got * unit)!r} s instead of {float(want * task.time_base)!r} s"
    return stride_mismatch(info, keyframe_stride) if keyframe_stride > 1 else None


def stride_mismatch(info: VideoInfo, keyframe_stride: int) -> str | None:
    """None when ``info`` is in the stride layout of ``keyframe_stride``; otherwise the first frame that is not.

    In the stride layout every frame on the stride (``i % keyframe_stride == 0``) is a reference and
    every other frame up to the last one on the stride is not; the frames after it end the stream,
    which the encoder closes with a reference picture.
    """
    from lightning_vstream.index.tables import is_reference

    if info.references is None:
        return "it does not say which of its pictures are references"
    last = (info.frame_count - 1) // keyframe_stride * keyframe_stride
    for i in range(last + 1):
        if is_reference(info.references[i]) != (i % keyframe_stride == 0):
            kind = "a reference picture" if i % keyframe_stride else "not a reference picture"
            return f"frame {i} is {kind} (keyframe stride {keyframe_stride})"
    return None


def _read_images(files: Sequence[Path], where: str) -> Iterator[Any]:
    import numpy as np

    from lightning_vstream.decode.images import _pil

    image_mod = _pil()
    size = None
    for i, file in enumerate(files):
        try:
            with image_mod.open(file) as image:
                array = np.asarray(image.convert("RGB"))
        except (OSError, ValueError) as err:
            raise VideoDecodeError(f"{where} frame {i} ({str(file)!r}): unreadable image: {err}") from err
        if size is None:
            size = array.shape[:2]
        elif array.shape[:2] != size:
            raise VideoDecodeError(
                f"{where} frame {i} ({str(file)!r}) is {array.shape[1]}x{array.shape[0]}, but frame 0 is "
                f"{size[1]}x{size[0]}; every frame of a camera must have one size."
            )
        yield array


def _read_source(task: FileTask) -> Iterator[Any]:
    frames = task.source.frames
    if isinstance(frames, tuple):
        yield from _read_images(frames, task.where)
        return
    from lightning_vstream.decode.factory import make_decoder

    decoder = make_decoder(frames, info=task.info, layout="hwc", label=task.where)
    try:
        for _ in range(decoder.info.frame_count):
            yield decoder.read().numpy()
    finally:
        decoder.close()


def source_bytes(source: CameraSource) -> int:
    """Bytes the source of a camera stream takes on disk."""
    if isinstance(source.frames, tuple):
        return sum(p.stat().st_size for p in source.frames)
    if source.frames.is_dir():
        from lightning_vstream.index.files import image_files

        return sum(p.stat().st_size for p in image_files(source.frames))
    return source.frames.stat().st_size


#: x265's lookahead depth per preset: it must exceed the B-frames in a row, or x265 refuses to open.
_X265_LOOKAHEAD = {
    "ultrafast": 5,
    "superfast": 10,
    "veryfast": 15,
    "faster": 15,
    "fast": 15,
    "medium": 20,
    "slow": 25,
    "slower": 40,
    "veryslow": 40,
    "placebo": 60,
}


def _encoder_options(settings: EncodeSettings, threads: int) -> dict[str, str]:
    stride = settings.stride
    bframes = stride - 1 if stride > 1 else settings.bframes
    gop = settings.keyframe_interval
    params = f"keyint={gop}:min-keyint={gop}:scenecut=0:bframes={bframes}"
    if stride > 1:
        # The stride layout: a fixed pattern (no adaptive B-frame placement) of N - 1 B-frames that are
        # not references (no pyramid) between references on the stride. Open GOPs let the B-frames
        # before a keyframe be predicted from it; a closed GOP would make the last of them a P-frame.
        params += f":b-adapt=0:open-gop=1:b-pyramid={'none' if settings.codec == 'h264' else '0'}"
        if settings.codec == "hevc" and _X265_LOOKAHEAD.get(settings.preset, 20) <= bframes:
            params += f":rc-lookahead={bframes + 1}"  # the preset's own is too short for the stride's B-frames
    options = {"preset": settings.preset}
    if settings.bitrate is None:
        options["crf"] = str(settings.crf if settings.crf is not None else DEFAULT_CRF[settings.codec])
    if settings.codec == "h264":
        options["x264-params"] = params
        if threads:
            options["threads"] = str(threads)
    else:
        options["x265-params"] = params + ":log-level=error" + (f":pools={threads}" if threads else "")
    return options


def encode_file(
    task: FileTask, settings: EncodeSettings, threads: int = 0, on_frame: Callable[[int], None] | None = None
) -> tuple[int, int, int]:
    """Encode one camera stream to ``task.path``; returns (frames, source bytes, output bytes).

    ``threads`` is the encoder's thread count (0: its own choice from the machine's cores; the
    bytes it writes can depend on it). ``on_frame`` is called with the count of frames written so
    far after each frame, while the temporary file is open.

    The file is written under a temporary name next to ``task.path`` (never a video extension, so
    an index scan meanwhile skips it), checked, and renamed into place only when it keeps every
    source frame; on any failure the temporary file is removed and an earlier file is kept.

    Raises:
        VideoDecodeError: A source frame could not be read.
        EncodeError: The encoder failed, or the written file does not keep the source frames and times.
        FileWriteError: The file could not be written (a full disk).
    """
    import av

    ticks, base = task.ticks, task.time_base
    task.path.parent.mkdir(parents=True, exist_ok=True)
    span = (ticks[-1] - ticks[0]) * base
    rate = Fraction((len(ticks) - 1) / span).limit_denominator(1001) if len(ticks) > 1 and span > 0 else Fraction(10)
    try:
        with atomic_path(task.path) as partial:
            count = _encode_into(partial, task, settings, threads, rate, on_frame)
    except av.FFmpegError as err:
        raise EncodeError(f"{task.where}: encoding {str(task.path)!r} failed: {err}") from err
    return count, source_bytes(task.source), task.path.stat().st_size


def _encode_into(
    partial: Path,
    task: FileTask,
    settings: EncodeSettings,
    threads: int,
    rate: Fraction,
    on_frame: Callable[[int], None] | None = None,
) -> int:
    """Encode ``task``'s frames into the file ``partial`` and check it keeps them; returns the frame count.

    Raises:
        EncodeError: The source holds no frames, or more than its timestamps, or the encoded file
            does not keep them.
    """
    import av
    from av.video.frame import PictureType

    ticks, base = task.ticks, task.time_base
    stride, gop = settings.stride, settings.keyframe_interval
    count = 0
    # movie_timescale = the track's: an edit list holding a large start time stays exact.
    with av.open(str(partial), mode="w", format="mp4", options={"movie_timescale": str(base.denominator)}) as out:
        stream: Any = None
        for count, image in enumerate(_read_source(task), start=1):
            if count > len(ticks):
                raise EncodeError(f"{task.where}: the source holds more frames than its {len(ticks)} timestamps.")
            if stream is None:
                height, width = image.shape[:2]
                stream = out.add_stream(
                    ENCODERS[settings.codec], rate=rate, options=_encoder_options(settings, threads)
                )
                stream.width, stream.height = width, height
                # x264/x265 need even sizes for 4:2:0; odd sizes keep full chroma instead.
                stream.pix_fmt = "yuv444p" if width % 2 or height % 2 else "yuv420p"
                stream.codec_context.time_base = base
                stream.time_base = base
                if settings.bitrate is not None:
                    stream.codec_context.bit_rate = int(settings.bitrate)
            frame = av.VideoFrame.from_ndarray(image, format="rgb24")
            frame.pts = ticks[count - 1]
            frame.time_base = base
            if stride > 1 and (count - 1) % gop:
                # The stride layout, frame by frame: the encoders' fixed B-frame pattern alone moves a
                # P-frame before a keyframe on some content. Keyframes are left to keyint (a forced
                # I-frame would not be a random-access point).
                frame.pict_type = PictureType.P if (count - 1) % stride == 0 else PictureType.B
            for packet in stream.encode(frame):
                out.mux(packet)
            if on_frame is not None:
                on_frame(count)
        if stream is None:
            raise EncodeError(f"{task.where}: the source holds no frames.")
        for packet in stream.encode():
            out.mux(packet)
    problem = mismatch(task, partial, settings.codec, settings.stride)
    if problem is not None:
        hint = (
            (" Use bframes=0 (--bframes 0): B-frames over large time gaps can make encoders drop or retime frames.")
            if settings.bframes and settings.stride == 1
            else ""
        )
        raise EncodeError(f"{task.where}: the encoded file does not keep the source frames: {problem}.{hint}")
    return count

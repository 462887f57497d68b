"""What to encode and how: codec settings, camera sources, and the summary of a run."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from lightning_vstream.errors import ConfigurationError

__all__ = ["DEFAULT_CRF", "PRESETS", "CameraSource", "Codec", "EncodeSettings", "EncodeSummary", "check_preset"]

Codec = Literal["hevc", "h264"]

#: The encoders' own default quality per codec (about the same visual quality).
DEFAULT_CRF = {"h264": 23, "hevc": 28}
ENCODERS = {"h264": "libx264", "hevc": "libx265"}
#: The longest stride a stride layout takes: x264 and x265 code at most 16 B-frames in a row.
MAX_KEYFRAME_STRIDE = 17
#: The keyframe interval of the usual layout when none is given.
DEFAULT_GOP = 12
#: Reference pictures per GOP in the stride layout when no interval is given: ``gop`` = this x the stride
#: (36 at stride 6), so a random access decodes as many pictures as in the usual layout's GOP 12.
REFERENCES_PER_GOP = 6


def _parse_bitrate(value: int | str) -> int:
    if isinstance(value, bool):
        raise ConfigurationError(f"bitrate={value!r} must be bits per second, e.g. 4000000 or '4M'.")
    if isinstance(value, int):
        rate = value
    else:
        match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kKmM]?)\s*", str(value))
        if match is None:
            raise ConfigurationError(
                f"bitrate={value!r} is not a bit rate; write bits per second with an optional k or M suffix, "
                "e.g. 800k or 4M."
            )
        rate = int(float(match.group(1)) * {"": 1, "k": 1_000, "m": 1_000_000}[match.group(2).lower()])
    if rate <= 0:
        raise ConfigurationError(f"bitrate={value!r} must be positive.")
    return rate


#: The speed presets x264 and x265 share, fastest first.
PRESETS = ("ultrafast", "superfast", "veryfast", "faster", "fast", "medium", "slow", "slower", "veryslow", "placebo")


def check_preset(preset: object) -> None:
    """Refuse a name that is not an x264/x265 preset, before any file is written (the encoder would fail on open).

    Raises:
        ConfigurationError: ``preset`` is not one of :data:`PRESETS`.

    Example::

        >>> check_preset("fast")
    """
    if preset not in PRESETS:
        raise ConfigurationError(f"preset={preset!r} is not an encoder speed preset; use one of {', '.join(PRESETS)}.")


@dataclass(frozen=True)
class EncodeSettings:
    """How camera streams are encoded.

    Args:
        codec: ``"hevc"`` (libx265; accvlab's format) or ``"h264"`` (libx264).
        gop: Keyframe interval in frames: a random access decodes at most this many frames. None (the
            default): 12 in the usual layout; in the stride layout six references per GOP, ``6 x
            keyframe_stride`` (36 at stride 6; at least 12), which halves the size and the stride reads'
            decoding of GOP 12 there while a random access decodes what it does in the usual GOP 12
            (``docs/encode.md``). :attr:`keyframe_interval` is the interval written.
        bframes: Maximum consecutive B-frames (0 keeps decode order equal to presentation order).
        crf: Constant quality, 0 (lossless) .. 51 (worst); the codec's default (23 for H.264, 28 for
            H.265) when neither ``crf`` nor ``bitrate`` is given.
        bitrate: Target bit rate in bits per second (``4000000``, ``"4M"``, ``"800k"``) instead of ``crf``.
        preset: Encoder speed preset (``"ultrafast"`` .. ``"veryslow"``).
        keyframe_stride: ``N`` > 1 writes the *stride layout*: every ``N``-th frame (0, N, 2N, ...) is
            a reference picture (I or P) and every frame between two of them a B-frame that no
            picture is predicted from, so a reader at ``frame_stride=N`` decodes only the frames it
            reads, while every frame stays in the file. Sets ``bframes`` to ``N - 1`` (x264/x265
            ``b-adapt=0``, no B-pyramid, open GOPs); ``gop`` must be a multiple of ``N``. 1: the
            usual layout. None: from the data where an importer knows it (nuScenes: the spacing of
            its annotated key frames, every 6th camera frame), otherwise 1.

    Raises:
        ConfigurationError: A value is out of range, both ``crf`` and ``bitrate`` are given, or
            ``keyframe_stride`` does not fit ``gop`` or ``bframes``.

    Example::

        >>> EncodeSettings(codec="h264", gop=12, crf=18).quality
        'crf 18'
        >>> EncodeSettings(gop=12, keyframe_stride=6).stride
        6
        >>> EncodeSettings(keyframe_stride=6).keyframe_interval, EncodeSettings().keyframe_interval
        (36, 12)
    """

    codec: Codec = "hevc"
    gop: int | None = None
    bframes: int = 0
    crf: int | None = None
    bitrate: int | str | None = None
    preset: str = "fast"
    keyframe_stride: int | None = None

    def __post_init__(self) -> None:
        if self.codec not in ENCODERS:
            raise ConfigurationError(f"codec={self.codec!r} is not supported; use 'hevc' or 'h264'.")
        if self.gop is not None and (isinstance(self.gop, bool) or not isinstance(self.gop, int) or self.gop < 1):
            raise ConfigurationError(f"gop={self.gop!r} must be a keyframe interval of at least 1 frame.")
        if isinstance(self.bframes, bool) or not isinstance(self.bframes, int) or not 0 <= self.bframes <= 16:
            raise ConfigurationError(f"bframes={self.bframes!r} must be an integer from 0 to 16.")
        if self.crf is not None and self.bitrate is not None:
            raise ConfigurationError(
                f"crf={self.crf!r} and bitrate={self.bitrate!r} were both given; pick one: crf for constant quality, "
                "bitrate for a target size."
            )
        if self.crf is not None and (
            isinstance(self.crf, bool) or not isinstance(self.crf, int) or not 0 <= self.crf <= 51
        ):
            raise ConfigurationError(f"crf={self.crf!r} must be an integer from 0 (lossless) to 51.")
        if self.bitrate is not None:
            object.__setattr__(self, "bitrate", _parse_bitrate(self.bitrate))
        check_preset(self.preset)
        stride = self.keyframe_stride
        if stride is not None and (
            isinstance(stride, bool) or not isinstance(stride, int) or not 1 <= stride <= MAX_KEYFRAME_STRIDE
        ):
            raise ConfigurationError(
                f"keyframe_stride={stride!r} must be an integer from 1 (the usual layout) to {MAX_KEYFRAME_STRIDE} "
                "(x264 and x265 code at most 16 B-frames in a row), or None (from the data)."
            )
        if stride is not None and stride > 1:
            if self.gop is not None and self.gop % stride:
                multiple = -(-self.gop // stride) * stride
                raise ConfigurationError(
                    f"gop={self.gop} is not a multiple of keyframe_stride={stride}: keyframes must be on the stride. "
                    f"Use gop={multiple} (--gop {multiple}) or another multiple of {stride}."
                )
            if self.bframes not in (0, stride - 1):
                raise ConfigurationError(
                    f"bframes={self.bframes} does not fit keyframe_stride={stride}, which codes the {stride - 1} "
                    f"frames between two references as B-frames; leave bframes at 0 (or set it to {stride - 1})."
                )

    @property
    def stride(self) -> int:
        """The keyframe stride the encoder writes: ``keyframe_stride``, 1 when None (no importer chose one)."""
        return self.keyframe_stride or 1

    @property
    def keyframe_interval(self) -> int:
        """The keyframe interval the encoder writes: ``gop``, or when None 12 in the usual layout and
        ``6 x stride`` (at least 12) in the stride layout."""
        if self.gop is not None:
            return self.gop
        return max(DEFAULT_GOP, REFERENCES_PER_GOP * self.stride)

    @property
    def quality(self) -> str:
        """The rate control in words: ``"crf 28"`` or ``"4000000 bit/s"``."""
        if self.bitrate is not None:
            return f"{self.bitrate} bit/s"
        return f"crf {self.crf if self.crf is not None else DEFAULT_CRF[self.codec]}"


@dataclass(frozen=True)
class CameraSource:
    """One camera stream of one clip to encode.

    Args:
        clip_id: Clip the stream belongs to (its output folder).
        camera: Camera name (the output file's stem).
        frames: A video file, an image folder, or an explicit sequence of image files in frame order.
        pts: Presentation time of every frame in ``time_base`` units (strictly increasing); for a
            video file or image folder, None reads them from the source (``timestamps.txt`` or the
            file's own timestamps). Required for a sequence of image files.
        time_base: ``(numerator, denominator)`` of the ``pts`` unit in seconds.

    Example::

        >>> src = CameraSource("scene-0001", "CAM_FRONT", (Path("a.jpg"), Path("b.jpg")), (0, 83_333), (1, 1_000_000))
        >>> src.camera, len(src.frames)
        ('CAM_FRONT', 2)
    """

    clip_id: str
    camera: str
    frames: Path | tuple[Path, ...]
    pts: tuple[int, ...] | None = None
    time_base: tuple[int, int] = (1, 1_000_000)

    def __post_init__(self) -> None:
        where = f"clip {self.clip_id!r}, camera {self.camera!r}"
        if isinstance(self.frames, (str, Path)):
            object.__setattr__(self, "frames", Path(self.frames))
        else:
            object.__setattr__(self, "frames", tuple(Path(p) for p in self.frames))
            if not self.frames:
                raise ConfigurationError(f"{where}: the list of image files is empty.")
            if self.pts is None:
                raise ConfigurationError(f"{where}: a list of image files needs pts (one time per image).")
        if self.pts is not None:
            object.__setattr__(self, "pts", tuple(int(p) for p in self.pts))
            if isinstance(self.frames, tuple) and len(self.pts) != len(self.frames):
                raise ConfigurationError(
                    f"{where}: {len(self.frames)} image files but {len(self.pts)} timestamps; give one per image."
                )
            bad = next((i for i in range(1, len(self.pts)) if self.pts[i] <= self.pts[i - 1]), None)
            if bad is not None:
                raise ConfigurationError(
                    f"{where}: the times of frames {bad - 1} and {bad} ({self.pts[bad - 1]}, {self.pts[bad]}) are not "
                    "strictly increasing; every frame needs its own, later time."
                )
        num, den = self.time_base
        if num <= 0 or den <= 0:
            raise ConfigurationError(f"{where}: time_base={self.time_base!r} must be two positive integers.")


@dataclass(frozen=True)
class EncodeSummary:
    """What an encoding run did.

    Attributes:
        index: The written index file.
        files_encoded: Camera files written by this run.
        files_skipped: Camera files already done by an earlier run (probed and left alone).
        frames_encoded: Frames encoded by this run.
        seconds: Wall time of the run.
        source_bytes: Size of the sources of the encoded files.
        output_bytes: Size of the encoded files.
        retries: Tasks tried again after a failure (a crashed process, an I/O error).

    Example::

        >>> s = EncodeSummary(Path("out/index.json"), 2, 0, 80, 2.0, 1_000_000, 50_000)
        >>> s.frames_per_second, s.size_ratio
        (40.0, 0.05)
    """

    index: Path
    files_encoded: int
    files_skipped: int
    frames_encoded: int
    seconds: float
    source_bytes: int
    output_bytes: int
    retries: int = 0

    @property
    def frames_per_second(self) -> float:
        """Frames encoded per second of wall time (0 when nothing was encoded)."""
        return self.frames_encoded / self.seconds if self.seconds > 0 and self.frames_encoded else 0.0

    @property
    def size_ratio(self) -> float:
        """Encoded size over source size, for the files this run encoded."""
        return self.output_bytes / self.source_bytes if self.source_bytes else 0.0

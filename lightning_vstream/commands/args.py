"""Argument types shared by the ``vstream`` commands (argparse only: no heavy imports here)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from lightning_vstream.errors import ConfigurationError

if TYPE_CHECKING:
    from lightning_vstream.encode.settings import EncodeSummary

__all__ = [
    "counts",
    "crf",
    "encode_options",
    "encode_summary",
    "existing",
    "non_negative",
    "positive",
    "rate",
    "size",
]


def size(text: str) -> tuple[int, int]:
    """``WIDTHxHEIGHT`` -> ``(width, height)``."""
    try:
        width, height = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"size {text!r} must look like WIDTHxHEIGHT, for example 1600x900.") from None
    return width, height


def counts(text: str) -> int | list[int]:
    """A positive count, or a comma-separated list of them."""
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"frames {text!r} must be a count or a comma-separated list of counts."
        ) from None
    if any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"frames {text!r} must be positive.")
    return values[0] if len(values) == 1 else values


def positive(text: str) -> int:
    """An integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer.") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be at least 1.")
    return value


def rate(text: str) -> float:
    """A frame rate > 0 (``12``, ``29.97``)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number.") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} must be a positive frame rate, e.g. 12 or 29.97.")
    return value


def non_negative(text: str) -> int:
    """An integer >= 0."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer.") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be 0 or more.")
    return value


def crf(text: str) -> int:
    """A constant-rate-factor quality, 0..51."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer.") from None
    if not 0 <= value <= 51:
        raise argparse.ArgumentTypeError(f"{text!r} must be from 0 (lossless) to 51.")
    return value


def existing(path: Path, what: str, *, hint: str = "") -> Path:
    """``path`` when it exists, else a :class:`ConfigurationError` naming ``what`` it should be (exit status 2)."""
    if not path.exists():
        raise ConfigurationError(f"{what} {str(path)!r} does not exist.{' ' + hint if hint else ''}")
    return path


def encode_options(parser: argparse.ArgumentParser) -> None:
    """The encoder options ``vstream encode`` and ``vstream import-nuscenes`` share."""
    parser.add_argument("--codec", choices=["hevc", "h264"], default="hevc", help="video codec")
    parser.add_argument(
        "--gop",
        type=positive,
        default=None,
        help="frames between keyframes (default: 12; with --keyframe-stride N > 1, 6 x N, at least 12)",
    )
    parser.add_argument("--bframes", type=non_negative, default=0, help="consecutive B-frames (0 for none)")
    rate = parser.add_mutually_exclusive_group()
    rate.add_argument(
        "--crf",
        type=crf,
        default=None,
        help="constant quality 0..51 (default: the codec's own, 28 for hevc, 23 for h264)",
    )
    rate.add_argument("--bitrate", default=None, help="target bit rate instead of --crf, e.g. 4M or 800k")
    parser.add_argument("--preset", default="fast", help="x264/x265 speed preset (ultrafast .. veryslow)")
    parser.add_argument(
        "--keyframe-stride",
        type=positive,
        default=None,
        metavar="N",
        help=(
            "stride layout: every N-th frame a reference, the frames between non-reference B-frames (readers at "
            "frame_stride=N decode only the frames they read); 1: the usual layout; None: from the data where known "
            "(import-nuscenes: the key-frame spacing, 6), else 1"
        ),
    )
    parser.add_argument(
        "--executor",
        choices=("local", "ray"),
        default="local",
        help="where files are encoded: local processes (--jobs) or Ray tasks (the cluster at RAY_ADDRESS, or a "
        "local one); the frames, their times and the index are the same",
    )
    parser.add_argument(
        "-j", "--jobs", type=positive, default=1, help="files encoded at once by local processes (default: 1)"
    )
    parser.add_argument(
        "--threads",
        type=non_negative,
        default=None,
        help="encoder threads per file (default: the cores over --jobs, 1 per Ray task; 0: the encoder's choice); "
        "x264/x265 write other bytes with other counts",
    )


def encode_summary(summary: EncodeSummary) -> str:
    """The closing line of an encoding run: files, frames, bytes, seconds and retries."""
    return (
        f"{summary.files_encoded + summary.files_skipped} files ({summary.files_encoded} encoded, "
        f"{summary.files_skipped} already done), {summary.frames_encoded} frames, {summary.output_bytes} bytes "
        f"({summary.size_ratio:.3f} x source size), {summary.seconds:.1f} s "
        f"({summary.frames_per_second:.1f} frames/s), {summary.retries} retries"
    )

"""What a failed camera read becomes, the same in both stream loaders.

The worker loader (:mod:`lightning_vstream.stream.worker_loader`, reads in DataLoader workers) and the
thread engine (:mod:`lightning_vstream.stream.engine`) share what a failed read becomes
(:func:`failed_read`), the error for a frame of the wrong size (:func:`frame_size_error`), and how
reads are named in messages (:func:`place`, :func:`describe_streams`), so a damaged file raises the
same error whichever loader reads it. What ``on_error="skip"`` then does with the slot, and how it is
counted, is the ledger's (:mod:`lightning_vstream.stream.ledger`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from lightning_vstream.decode.device import gpu_failure
from lightning_vstream.errors import (
    DataFormatError,
    DecoderCapabilityError,
    FrameSizeError,
    MissingFileError,
    VideoDecodeError,
    VStreamError,
)
from lightning_vstream.index import VideoIndex
from lightning_vstream.index.listing import leave_out_hint

__all__ = ["FILE_ERRORS", "describe_streams", "failed_read", "frame_size_error", "place"]

log = logging.getLogger("lightning_vstream")

#: Errors of ours that say a file cannot be read as the index describes it: kept as they are, and
#: skipped under ``on_error="skip"``.
FILE_ERRORS = (VideoDecodeError, MissingFileError, DecoderCapabilityError, DataFormatError)
#: Errors of other libraries (and of the file system) that mean the same: wrapped in a VideoDecodeError.
_FOREIGN_READ_ERRORS = (OSError, IndexError, ValueError, RuntimeError)


def place(index: VideoIndex, clip: int, camera: int, frame: int) -> str:
    """Where a read happens, for messages: ``clip 'scene-0001', camera 'CAM_FRONT', frame 12 ('/data/...mp4')``."""
    record = index.clips[clip]
    stream = record.cameras[camera]
    return f"clip {record.clip_id!r}, camera {stream.name!r}, frame {frame} ({str(stream.path)!r})"


def describe_streams(index: VideoIndex, streams: Iterable[tuple[int, int, Any]], limit: int = 8) -> str:
    """``the camera streams slot 0 CAM_FRONT (clip 'scene-0001', frame 12, '/data/...mp4'), ...`` for errors.

    ``streams`` holds ``(slot, camera, read)`` with the read's ``clip`` and ``frame``; at most ``limit``
    are named. Returns ``""`` when there is none.
    """
    named = []
    for slot, camera, read in streams:
        clip = index.clips[read.clip]
        stream = clip.cameras[camera]
        named.append(f"slot {slot} {stream.name} (clip {clip.clip_id!r}, frame {read.frame}, {str(stream.path)!r})")
    if not named:
        return ""
    more = f" and {len(named) - limit} more" if len(named) > limit else ""
    return "the camera streams " + ", ".join(named[:limit]) + more


def _is_ffmpeg_error(err: BaseException) -> bool:
    try:
        import av
    except ImportError:  # pragma: no cover - av is a dependency
        return False
    return isinstance(err, av.FFmpegError)


def failed_read(err: BaseException, index: VideoIndex, clip: int, camera: int, frame: int) -> VStreamError | None:
    """The error a failed read of one camera frame stands for; None when ``err`` is not a read failure.

    Both loaders call this for whatever opening a decoder, decoding, or checking the frame's size
    raised, and raise the result (``on_error="raise"``) or count it and skip the clip (``"skip"``).

    - A file that does not exist (one gone since indexing) is a :class:`MissingFileError` that says how to
      leave its clip out (``exclude_clips``).
    - Our errors about a file (:class:`VideoDecodeError` and its subclasses :class:`FileChangedError`
      and :class:`FrameSizeError`, :class:`MissingFileError`, :class:`DecoderCapabilityError`,
      :class:`DataFormatError`) keep their class, so ``except FileChangedError`` works. Their
      messages name the frame that failed (which can differ from the one requested: a packet read
      ahead, a keyframe decoded to reach it); one whose first line does not name the clip and the
      file gets the place of the read in front.
    - ``OSError``, ``IndexError``, ``ValueError``, ``RuntimeError`` and FFmpeg's errors become a
      :class:`VideoDecodeError` that names the place and the original error.
    - Anything else (a configuration error, a bug, ``KeyboardInterrupt``) is not a read failure:
      None, and the caller re-raises it as it is.
    - The GPU's own errors (a CUDA error, GPU memory exhausted, a Triton failure; see
      :func:`~lightning_vstream.decode.device.gpu_failure`) are no read failure either: they become
      a :class:`~lightning_vstream.errors.GpuError`, which no loader skips.

    Example::

        >>> failed_read(OSError("I/O error"), index, clip=0, camera=1, frame=7)  # doctest: +SKIP
        VideoDecodeError("clip 'scene-0000', camera 'CAM_BACK', frame 7 ('/data/.../CAM_BACK.mp4'): OSError: I/O error")
    """
    fatal = gpu_failure(err, place(index, clip, camera, frame))
    if fatal is not None:
        return fatal
    if isinstance(err, VStreamError) and not isinstance(err, FILE_ERRORS):
        return None
    if isinstance(err, FileNotFoundError):
        return _missing_file(err, index, clip, camera, frame)
    if isinstance(err, FILE_ERRORS):
        record = index.clips[clip]
        first = str(err).split("\n", 1)[0]
        if repr(record.clip_id) in first and str(record.cameras[camera].path) in first:
            return err
        try:
            return type(err)(f"{place(index, clip, camera, frame)}: {err}")  # every class of ours takes a message
        except Exception:  # pragma: no cover - a subclass defined elsewhere with another signature
            return VideoDecodeError(f"{place(index, clip, camera, frame)}: {type(err).__name__}: {err}")
    if isinstance(err, _FOREIGN_READ_ERRORS) or _is_ffmpeg_error(err):
        return VideoDecodeError(f"{place(index, clip, camera, frame)}: {type(err).__name__}: {err}")
    return None


def _missing_file(err: FileNotFoundError, index: VideoIndex, clip: int, camera: int, frame: int) -> MissingFileError:
    """A camera file gone since the index was built, with the way to go on without its clip."""
    clip_id = index.clips[clip].clip_id
    first = str(err).split("\n", 1)[0]
    where = "" if repr(clip_id) in first else f"{place(index, clip, camera, frame)}: "
    return MissingFileError(f"{where}{first} {leave_out_hint(clip_id)}")


def frame_size_error(
    index: VideoIndex,
    clip: int,
    camera: int,
    frame: int,
    got: tuple[int, ...],
    expected: tuple[int, ...],
    *,
    got_dtype: Any = None,
    expected_dtype: Any = None,
) -> FrameSizeError:
    """The error for a frame whose shape (or dtype) differs from the batch's, naming file, clip, camera and frame.

    The dtypes are named only where they differ.
    """
    if got_dtype == expected_dtype:
        got_dtype = expected_dtype = None
    what = f"{got} {got_dtype}" if got_dtype is not None else f"{got}"
    batch = f"{expected} {expected_dtype}" if expected_dtype is not None else f"{expected}"
    return FrameSizeError(
        f"{place(index, clip, camera, frame)} is {what} but the batch's frames are {batch}; batches stack frames "
        "of one size, so pass a resize transform (transform=FrameTransform(resize=(H, W))) or re-encode the file "
        "to the size of the others. With on_error='skip' such clips are skipped."
    )

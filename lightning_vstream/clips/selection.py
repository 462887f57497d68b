"""Frame selection: which frames of which clip one sample holds.

A :class:`ClipRequest` names a clip and its frames, either as frame indices or as times in
seconds. Times are resolved against the clip's frame table (real presentation timestamps,
so variable-frame-rate files are handled exactly) with a documented policy:

``"nearest"``
    The frame whose timestamp is closest to the time; a tie goes to the earlier frame.
``"at_or_before"``
    The last frame whose timestamp is at or before the time (the frame on screen then).

A time within :data:`TIME_TOLERANCE` (one microsecond) of a frame's timestamp counts as that
frame's time, so computed times such as ``0.1 + 0.2`` hit the intended frame. Times are
presentation timestamps, the same values as a sample's ``timestamp`` field, so a returned
timestamp can be requested again. A time more than one average frame interval after the last
frame is out of range (``IndexError``), and so is a time before the first frame by more than
that interval (``"nearest"``) or at all (``"at_or_before"``, which has no frame to show then).

The frame policy (:data:`FramePolicy`) says whether a sample holds exactly the frames it asks
for or, approximately, the keyframes nearest them (:func:`snap_to_keyframes`).

A *segment* is ``(rate in frames per second, number of frames)``. Windows over many clips
(:func:`~lightning_vstream.clips.windows.random_clips`, ...) are :mod:`lightning_vstream.clips.windows`'.

This module imports neither torch nor a decoder library.
"""

from __future__ import annotations

import bisect
import math
import numbers
import operator
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, get_args

from lightning_vstream.decode.base import VideoInfo
from lightning_vstream.errors import ConfigurationError, ConfigurationTypeError
from lightning_vstream.index import CameraStream
from lightning_vstream.options import FramePolicy, TimePolicy

if TYPE_CHECKING:
    from lightning_vstream.storage.config import StorageConfig

__all__ = [
    "FRAME_POLICIES",
    "TIME_POLICIES",
    "TIME_TOLERANCE",
    "ClipRequest",
    "FramePolicy",
    "TimePolicy",
    "at_indices",
    "at_times",
    "camera_names",
    "check_segments",
    "frame_table",
    "multi_rate",
    "resolve_times",
    "segment_times",
    "snap_to_keyframes",
]

#: Seconds within which a requested time counts as equal to a frame's timestamp.
TIME_TOLERANCE = 1e-6
#: The accepted :data:`TimePolicy` values.
TIME_POLICIES = ("nearest", "at_or_before")


def camera_names(value: Sequence[str] | None, argument: str = "cameras") -> tuple[str, ...] | None:
    """Check a camera list argument: None, or a sequence of camera-name strings.

    A single string is refused rather than read as a sequence of one-letter camera names.

    Raises:
        ConfigurationTypeError: ``value`` is a string, not iterable, or holds a non-string.
    """
    if value is None:
        return None
    if isinstance(value, (str, bytes)):
        raise ConfigurationTypeError(
            f"{argument}={value!r} must be a list of camera names, not a single string; pass [{value!r}]."
        )
    try:
        names = tuple(value)
    except TypeError:
        raise ConfigurationTypeError(
            f"{argument}={value!r} must be a list of camera names such as ['CAM_FRONT'], not a {type(value).__name__}."
        ) from None
    bad = [n for n in names if not isinstance(n, str)]
    if bad:
        raise ConfigurationTypeError(
            f"{argument}={value!r} must hold camera-name strings; {bad[0]!r} is a {type(bad[0]).__name__}."
        )
    return names


def _time(clip_id: str, value: object) -> float:
    t: float | None = None
    if not isinstance(value, (bool, str, bytes)):
        try:
            t = float(value)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            t = None
    if t is None:
        raise ConfigurationTypeError(
            f"request for clip {clip_id!r}: time {value!r} is a {type(value).__name__}; times must be "
            "numbers of seconds (use frames=... for frame indices)."
        )
    if not math.isfinite(t):
        raise ConfigurationError(f"request for clip {clip_id!r}: time {value!r} must be a finite number of seconds.")
    return t


@dataclass(frozen=True)
class ClipRequest:
    """The frames one sample holds: frame indices or times of one clip.

    Exactly one of ``frames`` and ``times`` is non-empty. Frames come back in the order given;
    repeats are allowed (the frame is decoded once).

    Args:
        clip_id: Clip id as listed in the index.
        frames: Frame indices (presentation order, 0-based).
        times: Times in seconds, resolved with ``policy`` against the frame table of the first
            requested camera (cameras of a clip are frame-aligned, as the index assumes).
        policy: ``"nearest"`` or ``"at_or_before"`` (see the module docs).
        cameras: Cameras to return, in this order; all of the dataset's cameras when None.

    Example::

        >>> ClipRequest("scene-0001", frames=(0, 5, 10)).num_frames
        3
        >>> ClipRequest("scene-0001", times=(0.5, 1.0), policy="at_or_before").times
        (0.5, 1.0)
    """

    clip_id: str
    frames: tuple[int, ...] = ()
    times: tuple[float, ...] = ()
    policy: TimePolicy = "nearest"
    cameras: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.clip_id, str) or not self.clip_id:
            raise ConfigurationTypeError(
                f"clip_id={self.clip_id!r} must be a non-empty string (a clip id from the index)."
            )
        frames = tuple(self.frames)
        times = tuple(self.times)
        if bool(frames) == bool(times):
            raise ConfigurationError(
                f"request for clip {self.clip_id!r} must give either frames or times (exactly one, non-empty); "
                f"got frames={frames!r}, times={times!r}."
            )
        for f in frames:
            try:
                if isinstance(f, bool):
                    raise TypeError
                operator.index(f)
            except TypeError:
                raise ConfigurationTypeError(
                    f"request for clip {self.clip_id!r}: frame {f!r} is a {type(f).__name__}; "
                    "frame indices must be integers (use times=... for seconds)."
                ) from None
        if self.policy not in TIME_POLICIES:
            raise ConfigurationError(
                f"request for clip {self.clip_id!r}: policy={self.policy!r} is not supported; "
                f"use 'nearest' or 'at_or_before'."
            )
        cameras = camera_names(self.cameras)
        if cameras is not None and (not cameras or len(set(cameras)) != len(cameras)):
            raise ConfigurationError(
                f"request for clip {self.clip_id!r}: cameras={cameras!r} must be None (all cameras) or a "
                "non-empty list of distinct camera names."
            )
        object.__setattr__(self, "frames", tuple(operator.index(f) for f in frames))
        object.__setattr__(self, "times", tuple(_time(self.clip_id, t) for t in times))
        object.__setattr__(self, "cameras", cameras)

    @property
    def num_frames(self) -> int:
        """Frames the sample holds per camera (``T`` in the batch layout)."""
        return len(self.frames) or len(self.times)


def at_indices(clip_id: str, indices: Iterable[int], *, cameras: Sequence[str] | None = None) -> ClipRequest:
    """Request explicit frame indices of a clip.

    Example::

        >>> at_indices("scene-0003", [0, 4, 8]).frames
        (0, 4, 8)
    """
    return ClipRequest(clip_id, frames=tuple(indices), cameras=camera_names(cameras))


def at_times(
    clip_id: str,
    times: Iterable[float],
    *,
    policy: TimePolicy = "nearest",
    cameras: Sequence[str] | None = None,
) -> ClipRequest:
    """Request the frames shown at the given times (seconds), resolved with ``policy``.

    Example::

        >>> at_times("scene-0003", [0.0, 0.5], policy="at_or_before").policy
        'at_or_before'
    """
    return ClipRequest(clip_id, times=tuple(times), policy=policy, cameras=camera_names(cameras))


def check_segments(segments: Sequence[tuple[float, int]]) -> list[tuple[float, int]]:
    """``segments`` as ``(rate, count)`` pairs, each rate a positive finite number and each count a positive int.

    Raises:
        ValueError: A segment is malformed (which one, and why).
    """
    checked: list[tuple[float, int]] = []
    if not segments:
        raise ConfigurationError(
            "segments must hold at least one (rate, count) pair, for example [(1.0, 8), (2.0, 8)]."
        )
    for k, segment in enumerate(segments):
        try:
            rate, count = segment
        except (TypeError, ValueError):
            raise ConfigurationError(
                f"segments[{k}]={segment!r} must be a (rate in fps, number of frames) pair."
            ) from None
        if isinstance(rate, bool) or not (isinstance(rate, numbers.Real) and 0 < rate < math.inf):
            raise ConfigurationError(
                f"segments[{k}]: rate {rate!r} must be a positive, finite number of frames per second."
            )
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ConfigurationError(f"segments[{k}]: count {count!r} must be a positive integer number of frames.")
        checked.append((float(rate), count))
    return checked


def segment_times(start: float, segments: Sequence[tuple[float, int]]) -> list[float]:
    """Times of multi-rate segments laid end to end from ``start``.

    Segment ``(rate, count)`` contributes ``count`` times ``1 / rate`` seconds apart and lasts
    ``count / rate`` seconds; the next segment starts where it ends.

    Args:
        start: Time of the first frame, in seconds.
        segments: ``(rate in fps, number of frames)`` pairs.

    Returns:
        ``sum(count)`` increasing times in seconds.

    Raises:
        ValueError: A segment has a non-positive rate or count.

    Example::

        >>> segment_times(10.0, [(1.0, 3), (2.0, 2)])
        [10.0, 11.0, 12.0, 13.0, 13.5]
    """
    times: list[float] = []
    if isinstance(start, bool) or not isinstance(start, numbers.Real) or not math.isfinite(start):
        raise ConfigurationError(f"start={start!r} must be a finite number of seconds.")
    origin = float(start)
    for rate, count in check_segments(segments):
        # Multiply rather than accumulate, so long segments do not drift.
        times.extend(origin + k / rate for k in range(count))
        origin += count / rate
    return times


def multi_rate(
    clip_id: str,
    *,
    start: float,
    segments: Sequence[tuple[float, int]],
    policy: TimePolicy = "nearest",
    cameras: Sequence[str] | None = None,
) -> ClipRequest:
    """Request multi-rate segments (see :func:`segment_times`) of a clip.

    Example::

        >>> req = multi_rate("scene-0001", start=2.0, segments=[(1.0, 8), (2.0, 8)])
        >>> req.num_frames, req.times[7:9]
        (16, (9.0, 10.0))
    """
    return at_times(clip_id, segment_times(start, segments), policy=policy, cameras=cameras)


def resolve_times(
    info: VideoInfo,
    times: Sequence[float],
    *,
    policy: TimePolicy = "nearest",
    frame_count: int | None = None,
    where: str = "",
) -> list[int]:
    """Frame indices for times in seconds, by ``policy`` (see the module docs).

    Args:
        info: The camera's frame table.
        times: Times in seconds (presentation timestamps).
        policy: ``"nearest"`` or ``"at_or_before"``.
        frame_count: Only the first ``frame_count`` frames are eligible (the clip's length in
            the index); all frames when None.
        where: Clip and camera, for error messages.

    Returns:
        One frame index per time.

    Raises:
        ValueError: ``policy`` is unknown.
        IndexError: A time lies outside the frames (message gives the valid range).

    Example::

        >>> info = VideoInfo("h264", 64, 48, (1, 10), (0, 1, 3, 4), (0,), (0,), 10.0)
        >>> resolve_times(info, [0.2, 0.25, 0.29], policy="nearest")  # 0.2 is a tie: earlier frame
        [1, 2, 2]
        >>> resolve_times(info, [0.2, 0.29], policy="at_or_before")
        [1, 1]
    """
    if policy not in TIME_POLICIES:
        raise ConfigurationError(f"policy={policy!r} is not supported; use 'nearest' or 'at_or_before'.")
    # Search the integer pts directly: building every frame's time in seconds would make each
    # request cost time proportional to the video's length.
    num, den = info.time_base
    count = info.frame_count if frame_count is None else min(frame_count, info.frame_count)
    pts = info.pts
    first, last = info.timestamp(0), info.timestamp(count - 1)
    tail = 1.0 / info.average_fps if info.average_fps > 0 else 0.0
    lowest = first - TIME_TOLERANCE if policy == "at_or_before" else first - tail
    result = []
    for t in times:
        if not lowest <= t <= last + tail:
            at = f" in {where}" if where else ""
            raise IndexError(
                f"time {t!r} s is outside the frames{at}: frames span {first!r}..{last!r} s "
                f"({count} frames; policy {policy!r} accepts {lowest!r}..{last + tail!r} s). "
                "Request times within the video (timestamps are presentation times, as in a sample's "
                "'timestamp' field)."
            )
        after = bisect.bisect_right(pts, (t + TIME_TOLERANCE) * den / num, 0, count)  # frames at or before t
        if policy == "at_or_before":
            result.append(max(after - 1, 0))
            continue
        if after == 0:
            result.append(0)
        elif after == count or t - info.timestamp(after - 1) <= info.timestamp(after) - t + TIME_TOLERANCE:
            result.append(after - 1)
        else:
            result.append(after)
    return result


def frame_table(camera: CameraStream, storage: StorageConfig | None = None) -> VideoInfo:
    """A camera's frame table: from the index metadata when present, else by probing the file.

    ``storage`` reaches a remote file without frame tables (read through its container).
    """
    if camera.info is not None:
        return camera.info
    from lightning_vstream.indexing import probe

    return probe(camera.path, storage)


# -- the frame policy ----------------------------------------------------------------------------
#: ``"exact"``: the requested frames. ``"nearest_keyframe"``: APPROXIMATE, each requested frame
#: replaced by the keyframe nearest to it (labelled with that keyframe's real index and time).
FRAME_POLICIES: tuple[str, ...] = get_args(FramePolicy)


def snap_to_keyframes(indices: Sequence[int], info: VideoInfo) -> list[int]:
    """Replace each frame index by the index of the keyframe nearest to it (ties: the earlier one).

    This is the ``"nearest_keyframe"`` policy: approximate by design (a returned frame can be up to
    half a GOP away from the requested one), but never mislabelled, since the returned indices are
    the keyframes' own. Decoding a keyframe needs no other frame, so each costs one frame decode.

    Example::

        >>> info = VideoInfo("hevc", 256, 256, (1, 30), tuple(range(40)), (0, 30), (0, 30), 30.0)
        >>> snap_to_keyframes([3, 14, 15, 16, 29, 39], info)
        [0, 0, 0, 30, 30, 30]
    """
    keys = info.key_indices
    out = []
    for index in indices:
        pos = bisect.bisect_right(keys, index) - 1
        before = keys[max(pos, 0)]
        after = keys[pos + 1] if pos + 1 < len(keys) else None
        out.append(after if after is not None and after - index < index - before else before)
    return out

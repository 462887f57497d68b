"""Windows over clips: which samples a dataset holds.

Glossary: a *window* is the shape of a sample in time (:class:`FrameWindow`: ``count`` frames
``stride`` frames apart; :class:`TimeWindow`: rate segments laid end to end, see
:func:`~lightning_vstream.clips.selection.segment_times`). The helpers :func:`random_clips` and
:func:`regular_clips` place windows over a set of clips and return
:class:`~lightning_vstream.clips.selection.ClipRequest` s.

This module imports neither torch nor a decoder library.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from lightning_vstream.clips.selection import (
    TIME_POLICIES,
    TIME_TOLERANCE,
    ClipRequest,
    TimePolicy,
    camera_names,
    check_segments,
    frame_table,
    segment_times,
)
from lightning_vstream.errors import ConfigurationError
from lightning_vstream.index import CameraStream, Clip, VideoIndex
from lightning_vstream.options import Weighting

__all__ = ["FrameWindow", "TimeWindow", "Weighting", "random_clips", "regular_clips"]


@dataclass(frozen=True)
class FrameWindow:
    """A sample shape in frame units: ``count`` frames, ``stride`` frames apart.

    Example::

        >>> FrameWindow(4, stride=3).offsets
        (0, 3, 6, 9)
    """

    count: int
    stride: int = 1

    def __post_init__(self) -> None:
        for name in ("count", "stride"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigurationError(f"FrameWindow {name}={value!r} must be a positive integer.")

    @property
    def offsets(self) -> tuple[int, ...]:
        """Frame offsets from the window's first frame."""
        return tuple(k * self.stride for k in range(self.count))

    @property
    def span(self) -> int:
        """Frames from the first to the last frame of the window, inclusive."""
        return (self.count - 1) * self.stride + 1


@dataclass(frozen=True)
class TimeWindow:
    """A sample shape in time: multi-rate segments laid end to end (see :func:`segment_times`).

    Args:
        segments: ``(rate in fps, number of frames)`` pairs.
        policy: How times map to frames (see the module docs).

    Example::

        >>> TimeWindow([(1.0, 2), (4.0, 2)]).offsets
        (0.0, 1.0, 2.0, 2.25)
        >>> TimeWindow.at_rate(2.0, 3).duration
        1.5
    """

    segments: tuple[tuple[float, int], ...]
    policy: TimePolicy = "nearest"

    def __post_init__(self) -> None:
        object.__setattr__(self, "segments", tuple(check_segments(self.segments)))
        if self.policy not in TIME_POLICIES:
            raise ConfigurationError(
                f"TimeWindow policy={self.policy!r} is not supported; use 'nearest' or 'at_or_before'."
            )

    @classmethod
    def at_rate(cls, rate: float, count: int, *, policy: TimePolicy = "nearest") -> TimeWindow:
        """``count`` frames at ``rate`` frames per second."""
        return cls(((rate, count),), policy)

    @property
    def offsets(self) -> tuple[float, ...]:
        """Times of the window's frames relative to its first frame, in seconds."""
        return tuple(segment_times(0.0, self.segments))

    @property
    def duration(self) -> float:
        """Seconds the segments last end to end (``sum(count / rate)``)."""
        return sum(count / rate for rate, count in self.segments)

    @property
    def count(self) -> int:
        """Frames per sample."""
        return sum(count for _, count in self.segments)


Window = FrameWindow | TimeWindow


def _reference(clip: Clip, cameras: Sequence[str] | None) -> CameraStream:
    if cameras is None:
        return clip.cameras[0]
    for cam in clip.cameras:
        if cam.name == cameras[0]:
            return cam
    raise ConfigurationError(
        f"clip {clip.clip_id!r} has no camera {cameras[0]!r} (cameras: {list(clip.camera_names)})."
    )


def _starts(clips: Sequence[Clip], window: Window, cameras: Sequence[str] | None) -> list[list[float]]:
    """For each clip, the valid start positions (frame indices, or times in seconds)."""
    result: list[list[float]] = []
    for clip in clips:
        if isinstance(window, FrameWindow):
            result.append(list(range(max(clip.frame_count - window.span + 1, 0))))
            continue
        stamps = frame_table(_reference(clip, cameras)).timestamps[: clip.frame_count]
        span = window.offsets[-1]
        valid = bisect.bisect_right(stamps, stamps[-1] - span + TIME_TOLERANCE)
        result.append(stamps[:valid])
    return result


def _too_short(clips: Sequence[Clip], window: Window, cameras: Sequence[str] | None) -> ValueError:
    longest = max(clips, key=lambda c: c.frame_count)
    has = f"{longest.frame_count} frames"
    if isinstance(window, FrameWindow):
        need = f"{window.span} frames (count {window.count}, stride {window.stride})"
    else:
        need = f"{window.offsets[-1]:.6g} s from first to last frame (segments {list(window.segments)})"
        stamps = frame_table(_reference(longest, cameras)).timestamps[: longest.frame_count]
        has += f" spanning {stamps[-1] - stamps[0]:.6g} s"
    return ValueError(
        f"no clip is long enough for the window: it needs {need}, and the longest clip, "
        f"{longest.clip_id!r}, has {has}. Use fewer frames or a shorter spacing."
    )


def _request(clip: Clip | str, window: Window, start: float, cameras: Sequence[str] | None) -> ClipRequest:
    clip_id = clip if isinstance(clip, str) else clip.clip_id
    cams = None if cameras is None else tuple(cameras)
    if isinstance(window, FrameWindow):
        return ClipRequest(clip_id, frames=tuple(int(start) + o for o in window.offsets), cameras=cams)
    return ClipRequest(clip_id, times=tuple(start + o for o in window.offsets), policy=window.policy, cameras=cams)


def _start_counts(index: VideoIndex, window: FrameWindow) -> Any:
    """Valid start frames per clip of an index (from its frame counts: no clip is built)."""
    import numpy as np

    counts = np.maximum(index.frame_counts - (window.span - 1), 0)
    if not counts.any():
        raise _too_short([index.clips[int(np.argmax(index.frame_counts))]], window, None)
    return counts


def _random_frame_windows(
    index: VideoIndex, window: FrameWindow, count: int, seed: int, weighting: Weighting, cameras: Sequence[str] | None
) -> list[ClipRequest]:
    """:func:`random_clips` over an index with a frame window: the same draws, from the frame counts alone."""
    import numpy as np

    starts = _start_counts(index, window)
    usable = np.flatnonzero(starts)
    rng = np.random.default_rng(seed)
    requests: list[ClipRequest] = []
    if weighting == "frames":
        cumulative = np.cumsum(starts[usable])
        draws = rng.integers(0, int(cumulative[-1]), size=count)
        picked = np.searchsorted(cumulative, draws, side="right")
        offsets = draws - np.where(picked > 0, cumulative[picked - 1], 0)
        for k, offset in zip(usable[picked].tolist(), offsets.tolist()):
            requests.append(_request(index.clip_id(k), window, offset, cameras))
    else:
        for pick in rng.integers(0, len(usable), size=count):
            k = int(usable[int(pick)])
            requests.append(_request(index.clip_id(k), window, int(rng.integers(0, int(starts[k]))), cameras))
    return requests


def random_clips(
    index: Iterable[Clip],
    window: Window,
    *,
    count: int,
    seed: int = 0,
    weighting: Weighting = "frames",
    cameras: Sequence[str] | None = None,
) -> list[ClipRequest]:
    """Draw ``count`` windows at random places in a set of clips.

    Every window lies wholly inside its clip; clips shorter than the window are never drawn.
    A window starts on a frame (for a :class:`TimeWindow`, at that frame's timestamp).

    Args:
        index: A :class:`~lightning_vstream.VideoIndex` or any sequence of its clips.
        window: :class:`FrameWindow` or :class:`TimeWindow`.
        count: Number of requests.
        seed: Seed of the random generator; the same seed gives the same requests.
        weighting: ``"frames"`` draws uniformly over all valid start frames of all clips (long
            clips are drawn more often); ``"videos"`` first draws a clip uniformly, then a start
            uniformly within it.
        cameras: Cameras each request returns; all when None.

    Returns:
        ``count`` requests.

    Raises:
        ValueError: ``count`` or ``weighting`` is invalid, or no clip is long enough.

    Example::

        >>> reqs = random_clips(load_index("index.json"), TimeWindow.at_rate(1.0, 16), count=100)  # doctest: +SKIP
    """
    import numpy as np

    cameras = camera_names(cameras)
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise ConfigurationError(f"count={count!r} must be a non-negative integer number of requests.")
    if weighting not in ("frames", "videos"):
        raise ConfigurationError(f"weighting={weighting!r} is not supported; use 'frames' or 'videos'.")
    if isinstance(index, VideoIndex) and isinstance(window, FrameWindow) and len(index):
        return _random_frame_windows(index, window, count, seed, weighting, cameras)
    clips = list(index)
    if not clips:
        raise ConfigurationError("random_clips needs at least one clip.")
    starts = _starts(clips, window, cameras)
    usable = [k for k, s in enumerate(starts) if s]
    if not usable:
        raise _too_short(clips, window, cameras)
    rng = np.random.default_rng(seed)
    requests: list[ClipRequest] = []
    if weighting == "frames":
        cumulative = np.cumsum([len(starts[k]) for k in usable])
        for draw in rng.integers(0, int(cumulative[-1]), size=count):
            pos = int(np.searchsorted(cumulative, draw, side="right"))
            k = usable[pos]
            offset = int(draw) - (int(cumulative[pos - 1]) if pos else 0)
            requests.append(_request(clips[k], window, starts[k][offset], cameras))
    else:
        for pick in rng.integers(0, len(usable), size=count):
            k = usable[int(pick)]
            requests.append(_request(clips[k], window, starts[k][int(rng.integers(0, len(starts[k])))], cameras))
    return requests


def regular_clips(
    index: Iterable[Clip],
    window: Window,
    *,
    hop: float | None = None,
    cameras: Sequence[str] | None = None,
) -> list[ClipRequest]:
    """Lay windows at regular steps over every clip, in index order.

    Args:
        index: A :class:`~lightning_vstream.VideoIndex` or any sequence of its clips.
        window: :class:`FrameWindow` or :class:`TimeWindow`.
        hop: Step between window starts, in the window's unit: frames for a
            :class:`FrameWindow`, seconds for a :class:`TimeWindow`. Defaults to the window's
            length (``span`` frames, or ``duration`` seconds), so windows do not overlap.
        cameras: Cameras each request returns; all when None.

    Returns:
        Every window that fits wholly inside its clip (clips shorter than the window add none).

    Raises:
        ValueError: ``hop`` is not positive (or not an integer for a frame window), or no
            clip is long enough.

    Example::

        >>> reqs = regular_clips(load_index("index.json"), FrameWindow(8, stride=2))  # doctest: +SKIP
    """
    listed = None if isinstance(index, VideoIndex) else list(index)
    cameras = camera_names(cameras)
    if not (listed if listed is not None else index):
        raise ConfigurationError("regular_clips needs at least one clip.")
    if isinstance(window, FrameWindow):
        step: float = window.span if hop is None else hop
        if isinstance(step, float) and step.is_integer():  # configs may spell 4 as 4.0
            step = int(step)
        if isinstance(step, bool) or not isinstance(step, int) or step < 1:
            raise ConfigurationError(f"hop={hop!r} must be a positive integer number of frames for a FrameWindow.")
        if isinstance(index, VideoIndex):  # from the frame counts alone: no clip is built
            starts = _start_counts(index, window).tolist()
            return [
                _request(index.clip_id(k), window, p, cameras)
                for k, n in enumerate(starts)
                for p in range(0, n, int(step))
            ]
    else:
        step = window.duration if hop is None else hop
        if isinstance(step, bool) or not (isinstance(step, (int, float)) and 0 < step < math.inf):
            raise ConfigurationError(f"hop={hop!r} must be a positive number of seconds for a TimeWindow.")
    clips = listed if listed is not None else list(index)
    requests: list[ClipRequest] = []
    for clip, starts in zip(clips, _starts(clips, window, cameras)):
        if not starts:
            continue
        if isinstance(window, FrameWindow):
            positions: list[float] = list(range(0, len(starts), int(step)))
        else:
            positions = []
            k = 0
            while (t := starts[0] + k * step) <= starts[-1] + TIME_TOLERANCE:
                positions.append(t)
                k += 1
        requests.extend(_request(clip, window, p, cameras) for p in positions)
    if not requests:
        raise _too_short(clips, window, cameras)
    return requests

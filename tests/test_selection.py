"""Frame selection helpers: requests, time resolution, multi-rate segments, clip sampling.

These tests build frame tables in memory (no file is opened); decoding is covered in test_clips.py.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from lightning_vstream.clips.selection import (
    ClipRequest,
    at_indices,
    at_times,
    multi_rate,
    resolve_times,
    segment_times,
)
from lightning_vstream.clips.windows import FrameWindow, TimeWindow, random_clips, regular_clips
from lightning_vstream.decode.base import VideoInfo
from lightning_vstream.index import CameraStream, Clip


def _info(seconds: list[float], *, fps: float | None = None) -> VideoInfo:
    pts = tuple(round(t * 90000) for t in seconds)
    average = fps if fps is not None else (len(seconds) - 1) / (seconds[-1] - seconds[0])
    return VideoInfo("h264", 64, 48, (1, 90000), pts, (0,), (pts[0],), average)


def _clip(clip_id: str, seconds: list[float], *, cameras: tuple[str, ...] = ("CAM_A",)) -> Clip:
    info = _info(seconds)
    streams = tuple(CameraStream(name, Path(f"/nonexistent/{clip_id}/{name}.mp4"), info) for name in cameras)
    return Clip(clip_id, Path("/nonexistent"), len(seconds), streams)


def _cfr(clip_id: str, frames: int, fps: float = 10.0) -> Clip:
    return _clip(clip_id, [i / fps for i in range(frames)])


# -- requests -----------------------------------------------------------------------------------
def test_request_normalises_sequences_and_numpy_ints() -> None:
    req = ClipRequest("c", frames=[np.int64(3), 1], cameras=["B", "A"])  # type: ignore[arg-type]
    assert req.frames == (3, 1) and type(req.frames[0]) is int
    assert req.cameras == ("B", "A")
    assert req.num_frames == 2
    assert at_indices("c", range(3)).frames == (0, 1, 2)
    assert at_times("c", [0.5], policy="at_or_before").times == (0.5,)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({}, ValueError, "either frames or times"),
        ({"frames": (1,), "times": (0.1,)}, ValueError, "either frames or times"),
        ({"frames": (1.5,)}, TypeError, "frame 1.5 is a float; frame indices must be integers"),
        ({"frames": (True,)}, TypeError, "frame True is a bool"),
        ({"times": (0.1,), "policy": "closest"}, ValueError, "policy='closest' is not supported"),
        ({"frames": (1,), "cameras": ("A", "A")}, ValueError, "distinct camera names"),
        ({"frames": (1,), "cameras": ()}, ValueError, "distinct camera names"),
    ],
)
def test_request_errors(kwargs: dict, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        ClipRequest("scene-0001", **kwargs)


def test_request_needs_clip_id() -> None:
    with pytest.raises(TypeError, match="clip_id=''"):
        ClipRequest("", frames=(1,))


# -- segments -----------------------------------------------------------------------------------
def test_segment_times_lay_segments_end_to_end() -> None:
    assert segment_times(10.0, [(1.0, 3), (2.0, 2)]) == [10.0, 11.0, 12.0, 13.0, 13.5]
    # 8 frames at 1 fps then 8 at 2 fps: the second segment starts 8 s after the first.
    times = segment_times(0.0, [(1.0, 8), (2.0, 8)])
    assert times[:8] == [float(k) for k in range(8)]
    assert times[8:] == [8.0 + k / 2 for k in range(8)]
    req = multi_rate("c", start=2.0, segments=[(1.0, 8), (2.0, 8)], policy="at_or_before")
    assert req.times == tuple(t + 2.0 for t in times) and req.policy == "at_or_before"


def test_segment_times_do_not_drift_over_long_segments() -> None:
    times = segment_times(0.0, [(30.0, 3001)])
    assert times[-1] == 100.0


@pytest.mark.parametrize(
    ("segments", "match"),
    [
        ([], "at least one"),
        ([(0.0, 4)], "rate 0.0 must be a positive"),
        ([(2.0, 0)], "count 0 must be a positive integer"),
        ([(2.0, 1.5)], "count 1.5"),
        ([(2.0,)], r"segments\[0\]=\(2.0,\) must be a \(rate in fps, number of frames\) pair"),
    ],
)
def test_segment_errors(segments: list, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        segment_times(0.0, segments)


# -- time resolution ----------------------------------------------------------------------------
def test_nearest_and_at_or_before_on_constant_rate() -> None:
    info = _info([i / 10 for i in range(10)])
    assert resolve_times(info, [0.0, 0.1, 0.14, 0.16, 0.9], policy="nearest") == [0, 1, 1, 2, 9]
    assert resolve_times(info, [0.0, 0.1, 0.14, 0.19, 0.9], policy="at_or_before") == [0, 1, 1, 1, 9]
    # A tie goes to the earlier frame; computed times within a microsecond hit the frame.
    assert resolve_times(info, [0.15, 0.1 + 0.2], policy="nearest") == [1, 3]
    assert resolve_times(info, [0.1 + 0.2], policy="at_or_before") == [3]


def test_resolution_on_variable_frame_rate() -> None:
    seconds = [0.0, 0.05, 0.30, 0.32, 1.00, 1.01]
    info = _info(seconds)
    assert resolve_times(info, [0.17, 0.18, 0.6, 0.7], policy="nearest") == [1, 2, 3, 4]
    assert resolve_times(info, [0.17, 0.18, 0.6, 0.99], policy="at_or_before") == [1, 1, 3, 3]
    assert resolve_times(info, seconds, policy="nearest") == list(range(6))
    assert resolve_times(info, seconds, policy="at_or_before") == list(range(6))


def test_resolution_honours_the_clip_frame_count() -> None:
    info = _info([i / 10 for i in range(10)])
    assert resolve_times(info, [0.5], frame_count=6) == [5]
    with pytest.raises(IndexError, match=r"frames span 0.0..0.5 s \(6 frames"):
        resolve_times(info, [0.8], frame_count=6)


def test_resolution_range_errors() -> None:
    info = _info([i / 10 for i in range(10)])
    # Nearest accepts up to one frame interval outside; at_or_before nothing before the first frame.
    assert resolve_times(info, [-0.05, 0.95], policy="nearest") == [0, 9]
    assert resolve_times(info, [0.95], policy="at_or_before") == [9]
    with pytest.raises(IndexError, match=r"time -0.05 s is outside the frames in clip 'x'"):
        resolve_times(info, [-0.05], policy="at_or_before", where="clip 'x'")
    with pytest.raises(IndexError, match="time 1.5 s is outside the frames"):
        resolve_times(info, [1.5])
    with pytest.raises(ValueError, match="policy='first'"):
        resolve_times(info, [0.0], policy="first")  # type: ignore[arg-type]


# -- windows ------------------------------------------------------------------------------------
def test_windows() -> None:
    assert FrameWindow(4, stride=3).offsets == (0, 3, 6, 9)
    assert FrameWindow(4, stride=3).span == 10
    window = TimeWindow([(1.0, 2), (4.0, 2)])
    assert window.offsets == (0.0, 1.0, 2.0, 2.25) and window.duration == 2.5 and window.count == 4
    assert TimeWindow.at_rate(2.0, 3, policy="at_or_before").policy == "at_or_before"
    with pytest.raises(ValueError, match="FrameWindow stride=0 must be a positive integer"):
        FrameWindow(3, stride=0)
    with pytest.raises(ValueError, match="TimeWindow policy='x'"):
        TimeWindow([(1.0, 2)], policy="x")  # type: ignore[arg-type]


# -- random clips -------------------------------------------------------------------------------
CLIPS = [_cfr("short", 5), _cfr("a", 20), _cfr("b", 60)]


def test_random_frame_windows_lie_inside_their_clips_and_repeat_with_the_seed() -> None:
    window = FrameWindow(4, stride=2)
    reqs = random_clips(CLIPS, window, count=200, seed=3)
    assert reqs == random_clips(CLIPS, window, count=200, seed=3)
    assert reqs != random_clips(CLIPS, window, count=200, seed=4)
    lengths = {c.clip_id: c.frame_count for c in CLIPS}
    for req in reqs:
        assert req.clip_id != "short"  # 5 frames cannot hold a 7-frame window
        assert list(req.frames) == [req.frames[0] + o for o in window.offsets]
        assert req.frames[0] >= 0 and req.frames[-1] < lengths[req.clip_id]


def test_random_weighting_by_frames_and_by_videos() -> None:
    window = FrameWindow(1)
    by_frames = Counter(r.clip_id for r in random_clips(CLIPS, window, count=4000, seed=0))
    # 5 + 20 + 60 valid starts: uniform over all frames of all videos.
    assert abs(by_frames["b"] / 4000 - 60 / 85) < 0.03
    assert abs(by_frames["short"] / 4000 - 5 / 85) < 0.02
    by_video = Counter(r.clip_id for r in random_clips(CLIPS, window, count=3000, seed=0, weighting="videos"))
    assert all(abs(n / 3000 - 1 / 3) < 0.03 for n in by_video.values())
    starts = Counter(r.frames[0] for r in random_clips([CLIPS[1]], window, count=4000, seed=1))
    assert set(starts) == set(range(20))  # every frame reachable


def test_random_time_windows_start_on_frames_of_variable_rate_clips() -> None:
    seconds = [0.0, 0.1, 0.15, 0.5, 0.6, 1.2, 1.3, 2.0, 2.1, 2.2]
    clip = _clip("vfr", seconds, cameras=("CAM_A", "CAM_B"))
    window = TimeWindow([(2.0, 2), (10.0, 2)], policy="at_or_before")  # offsets 0, 0.5, 1.0, 1.1
    reqs = random_clips([clip], window, count=100, seed=0, cameras=["CAM_B"])
    starts = {r.times[0] for r in reqs}
    assert starts <= set(seconds) and max(starts) <= 2.2 - 1.1 + 1e-9
    assert starts == {0.0, 0.1, 0.15, 0.5, 0.6}  # all valid starts drawn
    for r in reqs:
        assert r.policy == "at_or_before" and r.cameras == ("CAM_B",)
        assert r.times == pytest.approx(tuple(r.times[0] + o for o in window.offsets))


def test_random_clip_errors() -> None:
    with pytest.raises(
        ValueError, match=r"it needs 61 frames \(count 4, stride 20\), and the longest clip, 'b', has 60"
    ):
        random_clips(CLIPS, FrameWindow(4, stride=20), count=1)
    with pytest.raises(ValueError, match=r"needs 10 s from first to last frame .* 'b', has 60 frames spanning 5.9 s"):
        random_clips(CLIPS, TimeWindow.at_rate(1.0, 11), count=1)
    with pytest.raises(ValueError, match="weighting='clips'"):
        random_clips(CLIPS, FrameWindow(1), count=1, weighting="clips")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="count=-1"):
        random_clips(CLIPS, FrameWindow(1), count=-1)
    with pytest.raises(ValueError, match="no camera 'CAM_Z'"):
        random_clips(CLIPS, TimeWindow.at_rate(1.0, 2), count=1, cameras=["CAM_Z"])


# -- regular clips ------------------------------------------------------------------------------
def test_regular_frame_windows() -> None:
    reqs = regular_clips(CLIPS, FrameWindow(4, stride=2))  # span 7, hop 7
    assert [r.frames[0] for r in reqs if r.clip_id == "a"] == [0, 7]
    assert [r.frames[0] for r in reqs if r.clip_id == "b"] == list(range(0, 54, 7))
    assert not [r for r in reqs if r.clip_id == "short"]
    overlapping = regular_clips([CLIPS[1]], FrameWindow(4), hop=4)
    assert [r.frames for r in overlapping] == [tuple(range(s, s + 4)) for s in range(0, 17, 4)]


def test_regular_time_windows() -> None:
    reqs = regular_clips([_cfr("a", 20)], TimeWindow.at_rate(5.0, 3))  # 0..1.9 s, span 0.4 s, hop 0.6 s
    assert [round(r.times[0], 6) for r in reqs] == [0.0, 0.6, 1.2]
    assert reqs[1].times == pytest.approx((0.6, 0.8, 1.0))
    reqs = regular_clips([_cfr("a", 20)], TimeWindow.at_rate(5.0, 3), hop=0.5)
    assert [round(r.times[0], 6) for r in reqs] == [0.0, 0.5, 1.0, 1.5]


def test_regular_clip_errors() -> None:
    with pytest.raises(ValueError, match="hop=2.5 must be a positive integer number of frames"):
        regular_clips(CLIPS, FrameWindow(2), hop=2.5)
    with pytest.raises(ValueError, match="hop=0 must be a positive number of seconds"):
        regular_clips(CLIPS, TimeWindow.at_rate(1.0, 2), hop=0)
    with pytest.raises(ValueError, match="no clip is long enough"):
        regular_clips(CLIPS, FrameWindow(61))
    with pytest.raises(ValueError, match="needs at least one clip"):
        regular_clips([], FrameWindow(1))


# -- argument errors a user can hit --------------------------------------------------------------
def test_a_single_camera_string_is_refused_not_split_into_letters() -> None:
    from lightning_vstream.errors import ConfigurationTypeError

    for make in (
        lambda: at_indices("a", [0], cameras="CAM_BACK"),  # type: ignore[arg-type]
        lambda: at_times("a", [0.0], cameras="CAM_BACK"),  # type: ignore[arg-type]
        lambda: random_clips(CLIPS, FrameWindow(2), count=1, cameras="CAM_BACK"),  # type: ignore[arg-type]
        lambda: regular_clips(CLIPS, FrameWindow(2), cameras="CAM_BACK"),  # type: ignore[arg-type]
    ):
        with pytest.raises(
            ConfigurationTypeError,
            match=r"cameras='CAM_BACK' must be a list of camera names, not a "
            r"single string; pass \['CAM_BACK'\]",
        ):
            make()
    with pytest.raises(TypeError, match=r"must hold camera-name strings; 3 is a int"):
        at_indices("a", [0], cameras=["CAM_A", 3])  # type: ignore[list-item]


@pytest.mark.parametrize("bad", ["abc", None, b"1", True])
def test_non_numeric_times_raise_a_named_error(bad: object) -> None:
    from lightning_vstream.errors import ConfigurationTypeError

    with pytest.raises(
        ConfigurationTypeError,
        match=rf"request for clip 'a': time {re.escape(repr(bad))} is a "
        rf"{type(bad).__name__}; times must be numbers of seconds",
    ):
        at_times("a", [0.5, bad])  # type: ignore[list-item]


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_times_are_refused(bad: float) -> None:
    from lightning_vstream.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="must be a finite number of seconds"):
        at_times("a", [bad])
    assert at_times("a", [np.float64(0.5), np.int64(1)]).times == (0.5, 1.0)


@pytest.mark.parametrize("rate", [float("inf"), float("nan"), 0, -1.0, True])
def test_multi_rate_refuses_infinite_or_non_positive_rates(rate: float) -> None:
    from lightning_vstream.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match=r"segments\[1\]: rate .* must be a positive, finite number"):
        multi_rate("a", start=0.0, segments=[(1.0, 2), (rate, 2)])
    with pytest.raises(ConfigurationError, match=r"segments\[0\]: rate .* must be a positive, finite number"):
        TimeWindow(((rate, 2),))


def test_multi_rate_refuses_a_non_finite_or_textual_start() -> None:
    from lightning_vstream.errors import ConfigurationError

    for start in (float("inf"), float("nan"), "1.0"):
        with pytest.raises(ConfigurationError, match=r"start=.* must be a finite number of seconds"):
            multi_rate("a", start=start, segments=[(1.0, 2)])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="hop=inf must be a positive number of seconds"):
        regular_clips(CLIPS, TimeWindow.at_rate(1.0, 2), hop=float("inf"))

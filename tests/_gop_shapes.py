"""Stamped videos of every GOP shape the reference-flag and feed-plan tests cover, and their ground truth.

Each shape is one encoder configuration: x264 and x265 without B-frames, with B-frame pyramids and
without, with open GOPs (x265's default, x264's ``open-gop``) and closed ones, x265 with temporal
sub-layers, the stride layout of ``vstream encode --keyframe-stride``, Annex-B in MPEG-TS, and
AV1 (SVT-AV1, hierarchical, with hidden frames shown later). Frames are stamped
(:func:`~lightning_vstream.demos.synth.frame_image`), 64x48, 12 per second.

:func:`traced_references` reads what FFmpeg's own bitstream parser (the ``trace_headers`` filter)
says about every packet: an independent reading to hold :class:`ReferenceReader` against.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest

from lightning_vstream.demos.synth import Stamp, frame_image

SIZE = (64, 48)
FRAMES = 48

#: name -> (encoder, its private options, container format, file suffix)
SHAPES: dict[str, tuple[str, dict[str, str], str, str]] = {
    "h264-ippp": ("libx264", {"x264-params": "keyint=12:min-keyint=12:scenecut=0:bframes=0"}, "mp4", "mp4"),
    "h264-b3-pyramid": ("libx264", {"x264-params": "keyint=12:min-keyint=12:scenecut=0:bframes=3"}, "mp4", "mp4"),
    "h264-b3-flat": (
        "libx264",
        {"x264-params": "keyint=12:min-keyint=12:scenecut=0:bframes=3:b-pyramid=none"},
        "mp4",
        "mp4",
    ),
    "h264-stride6-open-gop": (
        "libx264",
        {"x264-params": "keyint=12:min-keyint=12:scenecut=0:bframes=5:b-adapt=0:b-pyramid=none:open-gop=1"},
        "mp4",
        "mp4",
    ),
    "h264-b3-annexb-ts": ("libx264", {"x264-params": "keyint=12:min-keyint=12:scenecut=0:bframes=3"}, "mpegts", "ts"),
    "hevc-ippp": ("libx265", {"x265-params": "keyint=12:min-keyint=12:scenecut=0:bframes=0"}, "mp4", "mp4"),
    "hevc-b3-pyramid-open-gop": (
        "libx265",
        {"x265-params": "keyint=12:min-keyint=12:scenecut=0:bframes=3"},
        "mp4",
        "mp4",
    ),
    "hevc-b3-closed-gop": (
        "libx265",
        {"x265-params": "keyint=12:min-keyint=12:scenecut=0:bframes=3:open-gop=0"},
        "mp4",
        "mp4",
    ),
    "hevc-stride6": (
        "libx265",
        {"x265-params": "keyint=12:min-keyint=12:scenecut=0:bframes=5:b-pyramid=0:b-adapt=0"},
        "mp4",
        "mp4",
    ),
    "hevc-temporal-layers": (
        "libx265",
        {"x265-params": "keyint=16:min-keyint=16:scenecut=0:bframes=3:temporal-layers=3"},
        "mp4",
        "mp4",
    ),
    "hevc-b3-annexb-ts": ("libx265", {"x265-params": "keyint=12:min-keyint=12:scenecut=0:bframes=3"}, "mpegts", "ts"),
    "av1-svt": ("libsvtav1", {"g": "24", "preset": "12"}, "matroska", "mkv"),
}


def encode(path: Path, shape: str, *, frames: int = FRAMES) -> Path:
    """Write ``frames`` stamped frames (clip 5, camera 0) with the encoder configuration ``shape``."""
    import av

    encoder, options, fmt, _ = SHAPES[shape]
    private = dict(options)
    if "x265-params" in private:
        private["x265-params"] += ":log-level=error"
    private.setdefault("crf", "23")
    if encoder != "libsvtav1":
        private["preset"] = "veryfast"
    width, height = SIZE
    rate = Fraction(12)
    with av.open(str(path), mode="w", format=fmt) as out:
        stream = out.add_stream(encoder, rate=rate, options=private)
        stream.width, stream.height = width, height
        stream.pix_fmt = "yuv420p"
        stream.codec_context.time_base = 1 / rate
        for i in range(frames):
            frame = av.VideoFrame.from_ndarray(frame_image(width, height, Stamp(5, 0, i)), format="rgb24")
            frame.pts = i
            frame.time_base = 1 / rate
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return path


@pytest.fixture(scope="session")
def gop_shapes(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """``shape -> path`` of its video, each encoded once per session when first asked for."""
    root = tmp_path_factory.mktemp("gop-shapes")
    made: dict[str, Path] = {}

    def get(shape: str) -> Path:
        require_encoder(SHAPES[shape][0])
        if shape not in made:
            made[shape] = encode(root / f"{shape}.{SHAPES[shape][3]}", shape)
        return made[shape]

    return get


def require_encoder(name: str) -> None:
    """Skip the test, saying why, where this FFmpeg build lacks the encoder ``name`` (PyAV's wheels have them all)."""
    import av

    try:
        av.codec.Codec(name, "w")
    except Exception:
        pytest.skip(f"this FFmpeg build has no {name} encoder")


def demuxed(path: Path) -> Iterator[Any]:
    """The video packets of ``path`` in decode order (the flush packet left out)."""
    import av

    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        for packet in container.demux(stream):
            if packet.size:
                yield packet


_FIELD = re.compile(r"^\d+\s+(\w+)\s+[01]+ = (\d+)$")


def traced_references(path: Path) -> list[tuple[int, bool | None, int]]:
    """``(pts, is reference, temporal id)`` of every packet in decode order, as FFmpeg's ``trace_headers`` reads it.

    H.264: any slice with ``nal_ref_idc`` > 0. H.265: any slice of a type other than the ``_N`` ones,
    its ``nuh_temporal_id_plus1 - 1``. AV1: a frame header with ``refresh_frame_flags`` other than
    0, or a shown key frame; the OBU extension's ``temporal_id``. None: no picture header found.
    """
    import av
    import av.logging
    from av.bitstream import BitStreamFilterContext

    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        codec = stream.codec_context.codec.canonical_name
        bsf = BitStreamFilterContext("trace_headers", stream)
        level = av.logging.get_level()
        av.logging.set_level(av.logging.INFO)
        packets: list[tuple[int, list[tuple[str, int]]]] = []
        try:
            with av.logging.Capture(True) as logs:
                for packet in container.demux(stream):
                    if not packet.size:
                        continue
                    start = len(logs)
                    pts = packet.pts
                    for _ in bsf.filter(packet):
                        pass
                    fields = []
                    for _, name, message in logs[start:]:
                        match = _FIELD.match(message.strip()) if name == "trace_headers" else None
                        if match:
                            fields.append((match.group(1), int(match.group(2))))
                    packets.append((pts, fields))
        finally:
            av.logging.set_level(level)
    return [(pts, *_judge(codec, fields)) for pts, fields in packets]


def _judge(codec: str, fields: list[tuple[str, int]]) -> tuple[bool | None, int]:
    reference: bool | None = None
    temporal_id = 0
    if codec == "h264":
        ref_idc = 0
        for name, value in fields:
            if name == "nal_ref_idc":
                ref_idc = value
            elif name == "nal_unit_type" and value in (1, 5):
                reference = bool(reference) or ref_idc > 0
    elif codec == "hevc":
        kind = None
        for name, value in fields:
            if name == "nal_unit_type":
                kind = value
            elif name == "nuh_temporal_id_plus1" and kind is not None and kind < 32:
                reference = bool(reference) or not (kind <= 14 and kind % 2 == 0)
                temporal_id = value - 1
    elif codec == "av1":
        state: dict[str, int] = {}
        for name, value in fields:
            state[name] = value
            if name == "temporal_id":
                temporal_id = max(temporal_id, value)
            elif name == "show_existing_frame" and value:
                reference = bool(reference)
            elif name == "show_frame" and value and state.get("frame_type") == 0:
                reference = True  # a shown key frame refreshes every slot (not coded)
            elif name == "refresh_frame_flags":
                reference = bool(reference) or value != 0
    return reference, temporal_id

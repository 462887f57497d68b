"""Helpers for the `nvdriver` tests: the real PyNvVideoCodec over the fake NVIDIA driver.

The fake driver decodes no pixels: every surface holds a row pattern (luma row ``y`` is ``y % 251``,
chroma row ``y`` is ``200 + y % 50``; 16-bit: ``(y % 1000) << 6`` and ``(500 + y) << 6``). To prove
which frame reached which batch row, :class:`Marker` wraps each real decoder the project creates and,
right after every ``Decode``, writes a stamp (three numbers: clip, camera, frame) into the output
buffer of each frame it returned, found by the frame's timestamp. The library reuses that buffer at
the next ``Decode``, so a frame converted too late carries another frame's stamp.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

import av
import numpy as np
import pytest
import torch

from lightning_vstream.decode.nvdec.nv12 import ColorSpec, Nv12Converter
from lightning_vstream.index.tables import VideoInfo

Stamp = tuple[int, int, int]

_ENCODERS = {"h264": "libx264", "hevc": "libx265", "av1": "libsvtav1", "vp9": "libvpx-vp9", "mpeg2": "mpeg2video"}


def encode(
    path: Path,
    codec: str,
    *,
    frames: int = 20,
    size: tuple[int, int] = (256, 256),
    gop: int = 10,
    bframes: int = 0,
    pix_fmt: str = "yuv420p",
    start: float = 0.0,
    fps: int = 12,
) -> Path:
    """A small file of ``codec`` with moving content; timestamps start at ``start`` seconds."""
    width, height = size
    options: dict[str, str] = {}
    if codec == "h264":
        options = {"preset": "veryfast", "x264-params": f"keyint={gop}:min-keyint={gop}:scenecut=0:bframes={bframes}"}
    elif codec == "hevc":
        params = f"keyint={gop}:min-keyint={gop}:scenecut=0:bframes={bframes}:log-level=error"
        options = {"preset": "ultrafast", "x265-params": params}
    elif codec == "av1":
        options = {"preset": "12", "svtav1-params": f"keyint={gop}"}
    elif codec == "vp9":
        options = {"deadline": "realtime", "cpu-used": "8", "g": str(gop)}
    elif codec == "mpeg2":
        fps = 25  # MPEG-2 knows only the broadcast frame rates
    time_base = Fraction(1, 90000)
    rng = np.random.default_rng(len(str(path)))
    texture = rng.integers(0, 256, (height // 8 + 1, width // 8 + 1, 3), dtype=np.uint8)
    with av.open(str(path), "w") as container:
        stream = container.add_stream(_ENCODERS[codec], rate=fps, options=options)
        stream.width, stream.height, stream.pix_fmt = width, height, pix_fmt
        stream.codec_context.time_base = time_base
        if codec == "mpeg2":
            stream.codec_context.gop_size = gop
            stream.codec_context.max_b_frames = bframes
            stream.codec_context.time_base = time_base = Fraction(1, fps)
        for i in range(frames):
            image = np.repeat(np.repeat(np.roll(texture, i, axis=1), 8, 0), 8, 1)[:height, :width]
            frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(image), format="rgb24").reformat(format=pix_fmt)
            frame.pts = round((start + i / fps) / time_base)
            frame.time_base = time_base
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


@functools.cache
def probed(path: Path) -> tuple[VideoInfo, ColorSpec]:
    """A file's frame table and colour spec, as PyAV's demuxer reads them (probed once per path)."""
    from lightning_vstream.decode.cpu.probe import probe_video
    from lightning_vstream.decode.nvdec.sources import PacketSource

    info = probe_video(path)
    source = PacketSource(path, info)
    try:
        return info, source.format.color
    finally:
        source.close()


def fake_format(
    monkeypatch: pytest.MonkeyPatch, info: VideoInfo, *, depth: int = 8, coded_height: int | None = None
) -> None:
    """Make the fake driver announce ``info``'s size (and ``depth``) and reorder as the file does."""
    monkeypatch.setenv("FAKE_W", str(info.width))
    monkeypatch.setenv("FAKE_H", str(info.height))
    monkeypatch.setenv("FAKE_CODED_W", str(-(-info.width // 16) * 16))
    monkeypatch.setenv("FAKE_CODED_H", str(coded_height or -(-info.height // 16) * 16))
    monkeypatch.setenv("FAKE_DEPTH", str(depth))
    # The fake shows pictures in timestamp order only after this many more; a real parser knows it.
    monkeypatch.setenv("FAKE_REORDER", str(info.reorder_depth or 0))


def stamp_surface(view: torch.Tensor, stamp: Stamp) -> None:
    """Write ``stamp`` into an NV12 / P016 surface: luma thirds hold 16 + each number, chroma is neutral."""
    height = view.shape[0] * 2 // 3
    sixteen = view.element_size() == 2
    thirds = (0, height // 3, 2 * height // 3, height)
    values = view.view(torch.int16) if sixteen else view

    def sample(code: int) -> int:  # an 8-bit code as the sample type stores it (P016: high bits, as int16)
        return code if not sixteen else (code << 8) - (65536 if code >= 128 else 0)

    for part, number in enumerate(stamp):
        values[thirds[part] : thirds[part + 1]] = sample(16 + number)
    values[height:] = sample(128)


def stamped_rgb(stamp: Stamp, height: int, width: int, spec: ColorSpec, *, sixteen: bool = False) -> torch.Tensor:
    """The RGB frame a stamped surface converts to (the torch reference conversion)."""
    nv12 = torch.zeros((height * 3 // 2, width), dtype=torch.int16 if sixteen else torch.uint8)
    stamp_surface(nv12, stamp)
    return Nv12Converter(spec, height, width, backend="torch")(nv12)


def pattern_nv12(height: int, width: int, *, sixteen: bool = False) -> torch.Tensor:
    """The surface the fake driver exports for a ``height x width`` display area (cropped, no padding)."""
    rows = torch.arange(height, dtype=torch.int64)[:, None].expand(height, width)
    chroma = torch.arange(height // 2, dtype=torch.int64)[:, None].expand(height // 2, width)
    if sixteen:
        luma, uv = (rows % 1000) << 6, (500 + chroma) << 6
        words = torch.cat([luma, uv])
        return torch.where(words >= 32768, words - 65536, words).to(torch.int16)  # 16-bit words as int16
    return torch.cat([rows % 251, 200 + chroma % 50]).to(torch.uint8)


@dataclass
class Marker:
    """Wraps the decoders the project creates; stamps each decoded frame's buffer by its timestamp.

    ``devices`` holds, per ``Decode`` call, the device the calling thread had set
    (:meth:`HostMemory.thread_device <lightning_vstream.decode.device.HostMemory.thread_device>`).
    """

    stamps: dict[int, Stamp] = field(default_factory=dict)  # pts -> stamp
    decoders: list[Any] = field(default_factory=list)
    decode_calls: int = 0
    devices: list[tuple[str, int | None]] = field(default_factory=list)  # (thread name, its device) per Decode

    def add(self, info: VideoInfo, clip: int, camera: int) -> None:
        for index, pts in enumerate(info.pts):
            self.stamps[pts] = (clip, camera, index)

    def wrap(self, session: Any) -> Any:
        session.decoder = _MarkingDecoder(session.decoder, session.stream, self)
        self.decoders.append(session.decoder)
        return session


class _MarkingDecoder:
    def __init__(self, real: Any, stream: Any, marker: Marker) -> None:
        self.real = real
        self.stream = stream
        self.marker = marker
        self.pointers: set[int] = set()

    def Decode(self, data: Any) -> list[Any]:
        import threading

        from lightning_vstream.decode.device import frame_memory, host_view

        memory = frame_memory()
        device = memory.thread_device() if hasattr(memory, "thread_device") else None
        self.marker.devices.append((threading.current_thread().name, device))
        frames = self.real.Decode(data)
        self.marker.decode_calls += 1
        for frame in frames:
            view = host_view(frame.__dlpack__(stream=self.stream.cuda_stream))
            self.pointers.add(view.data_ptr())
            stamp = self.marker.stamps.get(frame.getPTS())
            if stamp is not None:
                stamp_surface(view, stamp)
        return frames


def install_marker(monkeypatch: pytest.MonkeyPatch) -> Marker:
    """Wrap every decoder the GPU readers create with a new :class:`Marker`."""
    from lightning_vstream.decode.nvdec import decoder as decode_gpu
    from lightning_vstream.decode.nvdec import session as nvdec

    mark = Marker()
    real = nvdec.create_session

    def create(*args: Any, **kwargs: Any) -> Any:
        return mark.wrap(real(*args, **kwargs))

    monkeypatch.setattr(decode_gpu, "create_session", create)
    return mark


class FakeLog:
    """The fake driver's call log (one file per process, ``FAKE_LOG``), read from where this was made."""

    def __init__(self) -> None:
        self.path = Path(os.environ["FAKE_LOG"])
        self.start = self.path.stat().st_size if self.path.exists() else 0

    def lines(self) -> list[str]:
        if not self.path.exists():
            return []
        with open(self.path, "rb") as f:
            f.seek(self.start)
            return f.read().decode("utf-8", "replace").splitlines()

    def calls(self, name: str) -> Iterator[str]:
        return (line for line in self.lines() if line.startswith(name))


def decode_stream_waits(lines: list[str]) -> tuple[list[str], dict[str, int]]:
    """The ``cuStreamWaitEvent`` calls of a fake-driver log that make a decode stream wait for another stream's event.

    Decode streams are those NVDEC copies frames out on (``cuvidMapVideoFrame64 ... output_stream=``). An
    event counts as the stream it was last recorded on before the wait. Returns the offending lines and
    counts of what the log holds (decode streams, waits, host waits), so a caller can check that the log
    is not empty of what it looks for.
    """
    decode = {
        m.group(1) for m in (re.search(r"cuvidMapVideoFrame64 .*output_stream=(\S+)", line) for line in lines) if m
    }
    last_record: dict[str, str] = {}
    bad: list[str] = []
    counts = {"decode_streams": len(decode), "records": 0, "waits": 0, "waits_on_decode_events": 0, "host_waits": 0}
    for line in lines:
        if line.startswith("cuEventRecord "):
            found = re.match(r"cuEventRecord ev=(\S+) stream=(\S+)", line)
            if found:
                last_record[found.group(1)] = found.group(2)
                counts["records"] += 1
        elif line.startswith("cuStreamWaitEvent "):
            found = re.match(r"cuStreamWaitEvent stream=(\S+) ev=(\S+)", line)
            if found:
                counts["waits"] += 1
                stream, source = found.group(1), last_record.get(found.group(2))
                counts["waits_on_decode_events"] += source in decode
                if stream in decode and source != stream:
                    bad.append(line)
        elif line.startswith("cuEventSynchronize"):
            counts["host_waits"] += 1
    return bad, counts

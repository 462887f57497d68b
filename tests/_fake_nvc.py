"""The one stand-in for PyNvVideoCodec, for what the fake NVIDIA driver cannot show: real pixels and CUDA errors.

Everything else about the library (call names and arguments, latency modes, buffer reuse, crop,
P016 strides, capabilities, flushing, reuse) is tested against the real wheel over the fake driver
(``tests/test_gpu_nvdriver.py``). This stand-in decodes the Annex-B packets with FFmpeg so frames
hold real pictures, and is no kinder than the library where the code relies on it:

- one output buffer per position in the list ``Decode`` returns, overwritten by the next ``Decode``
  (the library reuses its buffer the same way);
- ``__dlpack__(stream=0)`` is refused, as the library refuses it;
- ``fail_decode`` (a message) makes ``Decode`` of a packet raise as the library does when a CUDA or NVDEC
  call fails;
- capabilities come from a probe child's report (:func:`caps_runner`), as on a GPU.
"""

from __future__ import annotations

import ctypes
import json
import subprocess
import types
from typing import Any

import av
import torch

from lightning_vstream.decode.device import host_view


class FakeFrame:
    def __init__(self, surface: torch.Tensor, pts: int) -> None:
        self._surface = surface
        self._pts = pts

    def getPTS(self) -> int:
        return self._pts

    def GetPtrToPlane(self, plane: int) -> int:
        return int(self._surface.data_ptr())  # the buffer reused at this list position, as the library's

    def __dlpack__(self, stream: Any = None) -> Any:
        if stream == 0:
            raise BufferError("stream 0 is not a valid CUDA stream")
        return self._surface.__dlpack__()


class FakeDecoder:
    def __init__(self, module: types.ModuleType, **kwargs: Any) -> None:
        self.module = module
        self.kwargs = kwargs
        self.codec = {"H264": "h264", "HEVC": "hevc"}[kwargs["codec"]]
        self.context: Any = None
        self.buffers: list[torch.Tensor] = []  # reused by every Decode call, as the library's are
        self.packets = 0
        self.flushes = 0
        self.flags: list[Any] = []

    def Decode(self, packet: Any) -> list[FakeFrame]:
        if self.module.fail_decode and packet.bsl:  # a failed CUDA call decoding a picture (pybind11: RuntimeError)
            raise RuntimeError(self.module.fail_decode)
        if self.context is None:
            self.context = av.CodecContext.create(self.codec, "r")
        if packet.bsl == 0:
            frames = self.context.decode(None)
            self.context = None  # the parser starts over after the end of a stream
            self.flushes += 1
        else:
            data = av.Packet(ctypes.string_at(packet.bsl_data, packet.bsl))
            data.pts = packet.pts
            self.flags.append(packet.decode_flag)
            frames = self.context.decode(data)
            self.packets += 1
        return [self._frame(k, f) for k, f in enumerate(frames)]

    def _frame(self, position: int, frame: Any) -> FakeFrame:
        nv12 = torch.from_numpy(frame.to_ndarray(format="nv12").copy())
        while len(self.buffers) <= position:
            self.buffers.append(torch.empty_like(nv12))
        buffer = self.buffers[position]
        buffer.copy_(nv12)
        return FakeFrame(buffer, frame.pts)


def fake_module(*, version: str = "2.2.4") -> types.ModuleType:
    """A ``PyNvVideoCodec`` module decoding H.264 and HEVC with FFmpeg (see the module docs)."""
    module = types.ModuleType("PyNvVideoCodec")
    module.__version__ = version
    module.created = []  # type: ignore[attr-defined]
    module.fail_decode = ""  # type: ignore[attr-defined]
    module.cudaVideoCodec = types.SimpleNamespace(H264="H264", HEVC="HEVC")  # type: ignore[attr-defined]
    module.OutputColorType = types.SimpleNamespace(NATIVE="NATIVE", RGB="RGB", RGBP="RGBP")  # type: ignore[attr-defined]
    module.DisplayDecodeLatencyType = types.SimpleNamespace(NATIVE="NATIVE", LOW="LOW", ZERO="ZERO")  # type: ignore[attr-defined]
    module.VideoPacketFlag = types.SimpleNamespace(ENDOFPICTURE=8)  # type: ignore[attr-defined]

    class PacketData:
        def __init__(self) -> None:
            self.bsl_data = 0
            self.bsl = 0
            self.pts = 0
            self.decode_flag = 0

    def create_decoder(**kwargs: Any) -> FakeDecoder:
        decoder = FakeDecoder(module, **kwargs)
        module.created.append(decoder)  # type: ignore[attr-defined]
        return decoder

    module.PacketData = PacketData  # type: ignore[attr-defined]
    module.CreateDecoder = create_decoder  # type: ignore[attr-defined]
    return module


class StandInStream:
    """A stream handle: never 0, like a real CUDA stream."""

    def __init__(self, handle: int = 1) -> None:
        self.cuda_stream = handle


class StandInMemory:
    """Frames in host memory (the stand-in's tensors), as :class:`~lightning_vstream.decode.device.HostMemory` sees them."""

    host = True

    def device(self, gpu: int) -> torch.device:
        return torch.device("cpu")

    def new_stream(self, gpu: int) -> StandInStream:
        return StandInStream()

    def current_stream(self, gpu: int) -> StandInStream:
        return StandInStream()

    def import_surface(self, frame: Any, stream: Any) -> torch.Tensor:
        return host_view(frame.__dlpack__(stream=stream.cuda_stream))

    def set_device(self, gpu: int) -> None:
        pass

    def mem_get_info(self, gpu: int) -> tuple[int, int]:
        return 64 << 30, 80 << 30

    def new_event(self) -> None:
        return None

    def record(self, event: Any, stream: Any) -> None:
        pass

    def wait(self, stream: Any, event: Any) -> None:
        pass

    def synchronize(self, event: Any) -> None:
        pass


CAPS = {
    "supported": 1,
    "num_decoder_engines": 7,
    "width_min": 144,
    "height_min": 144,
    "width_max": 8192,
    "height_max": 8192,
    "mb_num_max": 262144,
}


def caps_runner(calls: list[list[str]] | None = None, **overrides: int) -> Any:
    """A probe-child runner reporting ``CAPS`` (with ``overrides``) for every codec and bit depth."""
    from lightning_vstream.decode.nvdec.session import CAPS_BIT_DEPTHS, NVDEC_CODECS, PROBE_REPORT, caps_key

    def run(cmd: list[str], timeout: float, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
        if calls is not None:
            calls.append(cmd)
        table = {caps_key(c, d): {**CAPS, **overrides} for c in NVDEC_CODECS for d in CAPS_BIT_DEPTHS}
        report = {"status": "ok", "visible_devices": env.get("CUDA_VISIBLE_DEVICES"), "caps": table, "decode": "ok"}
        return subprocess.CompletedProcess(cmd, 0, PROBE_REPORT + json.dumps(report) + "\n", "")

    return run

"""A CPU stand-in for PyNvVideoCodec's low-level decoder with NATIVE (NV12) output.

``CreateDecoder(...)`` returns a decoder whose ``Decode(PacketData)`` decodes the Annex-B packet
with FFmpeg and returns frames that behave like ``DecodedFrame``: ``getPTS()`` and ``__dlpack__``
exporting an NV12 ``[1.5 H, W]`` uint8 surface from a small ring that later frames overwrite; an
empty packet (``bsl == 0``) flushes. Keyword names and enum members follow PyNvVideoCodec 2.2.4.
"""

from __future__ import annotations

import ctypes
import types
from typing import Any

import av
import torch


class FakeFrame:
    def __init__(self, surface: torch.Tensor, pts: int) -> None:
        self._surface = surface
        self._pts = pts

    def getPTS(self) -> int:
        return self._pts

    def __dlpack__(self, stream: Any = None) -> Any:
        if stream == 0:
            raise BufferError("stream 0 is not a valid CUDA stream")
        return self._surface.__dlpack__()

    def __dlpack_device__(self) -> Any:
        return self._surface.__dlpack_device__()


class FakeDecoder:
    RING = 4

    def __init__(self, module: types.ModuleType, **kwargs: Any) -> None:
        self.module = module
        self.kwargs = kwargs
        self.codec = {"H264": "h264", "HEVC": "hevc"}[kwargs["codec"]]
        self.context: Any = None
        self.surfaces: list[torch.Tensor] = []
        self.turn = 0
        self.packets = 0
        self.flushes = 0
        self.flags: list[Any] = []

    def Decode(self, packet: Any) -> list[FakeFrame]:
        if self.module.fail_decode:
            raise RuntimeError("CUDA_ERROR_LAUNCH_FAILED")
        if self.context is None:
            self.context = av.CodecContext.create(self.codec, "r")
        if packet.bsl == 0:
            frames = self.context.decode(None)
            self.context = None
            self.flushes += 1
        else:
            data = av.Packet(ctypes.string_at(packet.bsl_data, packet.bsl))
            data.pts = packet.pts
            self.flags.append(packet.decode_flag)
            frames = self.context.decode(data)
            self.packets += 1
        return [self._frame(f) for f in frames]

    def _frame(self, frame: Any) -> FakeFrame:
        nv12 = torch.from_numpy(frame.to_ndarray(format="nv12").copy())
        if len(self.surfaces) < self.RING:
            self.surfaces.append(torch.empty_like(nv12))
        surface = self.surfaces[self.turn % self.RING]
        self.turn += 1
        surface.copy_(nv12)
        return FakeFrame(surface, frame.pts)


def fake_module(*, engines: int = 3, caps: dict[str, int] | None = None) -> types.ModuleType:
    module = types.ModuleType("PyNvVideoCodec")
    module.__version__ = "2.2.4-fake"
    module.created = []  # type: ignore[attr-defined]
    module.fail_decode = False  # type: ignore[attr-defined]
    module.cudaVideoCodec = types.SimpleNamespace(H264="H264", HEVC="HEVC", AV1="AV1", VP9="VP9")  # type: ignore[attr-defined]
    module.cudaVideoChromaFormat = types.SimpleNamespace(Monochrome="400")  # type: ignore[attr-defined]
    setattr(module.cudaVideoChromaFormat, "420", "420")
    module.OutputColorType = types.SimpleNamespace(NATIVE="NATIVE", RGB="RGB", RGBP="RGBP")  # type: ignore[attr-defined]
    module.DisplayDecodeLatencyType = types.SimpleNamespace(NATIVE="NATIVE", LOW="LOW", ZERO="ZERO")  # type: ignore[attr-defined]
    module.VideoPacketFlag = types.SimpleNamespace(ENDOFPICTURE="ENDOFPICTURE")  # type: ignore[attr-defined]

    class PacketData:
        def __init__(self) -> None:
            self.bsl_data = 0
            self.bsl = 0
            self.pts = 0
            self.decode_flag = None

    def create_decoder(**kwargs: Any) -> FakeDecoder:
        decoder = FakeDecoder(module, **kwargs)
        module.created.append(decoder)  # type: ignore[attr-defined]
        return decoder

    def get_decoder_caps(**kwargs: Any) -> dict[str, int]:
        base = {
            "supported": 1,
            "num_decoder_engines": engines,
            "mb_num_max": 0,
            "width_max": 8192,
            "height_max": 8192,
            "width_min": 48,
            "height_min": 16,
        }
        return {**base, **(caps or {})}

    module.PacketData = PacketData  # type: ignore[attr-defined]
    module.CreateDecoder = create_decoder  # type: ignore[attr-defined]
    module.GetDecoderCaps = get_decoder_caps  # type: ignore[attr-defined]
    return module

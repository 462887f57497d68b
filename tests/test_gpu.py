"""GPU decoding: device choice, decoder reuse and NvDecoder's frame exactness.

Everything except the ``cuda``-marked tests runs on the CPU: NvDecoder drives a stand-in
``PyNvVideoCodec`` module whose decoder decodes the Annex-B packets with FFmpeg but behaves like
NVDEC where it matters (frames come out as DLPack views of a small ring of reused surfaces, an
empty packet ends the stream). The ``cuda`` tests decode with real NVDEC.
"""

from __future__ import annotations

import ctypes
import importlib.util
import json
import random
import subprocess
import sys
import types
from dataclasses import replace
from pathlib import Path
from typing import Any

import av
import numpy as np
import pytest
import torch

from lightning_vstream import profiling
from lightning_vstream.decode import nvdec
from lightning_vstream.decode.base import FrameDecoder, VideoDecodeError
from lightning_vstream.decode.cpu import PyAVDecoder, probe_video
from lightning_vstream.decode.gpu import (
    DecoderKey,
    DecoderPool,
    NvDecoder,
    import_pynvvideocodec,
    nvdec_available,
    resolve_decode_device,
)
from lightning_vstream.decode.nvdec import PacketSource
from lightning_vstream.demos.synth import read_stamp, write_stamped_video
from lightning_vstream.errors import DecoderCapabilityError, FileChangedError
from lightning_vstream.index.identity import file_identity
from lightning_vstream.transforms import FrameTransform

FRAMES = 25
GOP = 10
SIZE = (256, 256)  # NVDEC's HEVC minimum is 144x144; even sizes encode as 4:2:0
ROOT = Path(__file__).resolve().parents[1]


# -- a stand-in for PyNvVideoCodec ---------------------------------------------------------------
class _FakeFrame:
    def __init__(self, surface: torch.Tensor, pts: int) -> None:
        self._surface = surface
        self.timestamp = pts

    def getPTS(self) -> int:
        return self.timestamp

    def __dlpack__(self, *args: Any, **kwargs: Any) -> Any:
        return self._surface.__dlpack__(*args, **kwargs)

    def __dlpack_device__(self) -> Any:
        return self._surface.__dlpack_device__()


class _FakeDecoder:
    """FFmpeg decoding behind PyNvVideoCodec's decoder interface, with NVDEC's surface reuse."""

    RING = 6

    def __init__(self, module: types.ModuleType, **kwargs: Any) -> None:
        self.module = module
        self.kwargs = kwargs
        self.codec = {"H264": "h264", "HEVC": "hevc"}[kwargs["codec"]]
        self.context: Any = None
        self.surfaces: list[torch.Tensor] = []
        self.turn = 0
        self.flushes = 0
        self.packets = 0
        self.flags: list[int] = []

    def Decode(self, packet: Any) -> list[_FakeFrame]:
        if self.module.fail_decode:
            raise RuntimeError("CUDA_ERROR_LAUNCH_FAILED")
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
        return [self._surface(frame) for frame in frames]

    def _surface(self, frame: Any) -> _FakeFrame:
        assert self.kwargs["outputColorType"] == "NATIVE"  # NV12 out; our kernel converts
        image = torch.from_numpy(frame.to_ndarray(format="nv12"))
        if len(self.surfaces) < self.RING:
            self.surfaces.append(torch.empty_like(image, memory_format=torch.contiguous_format))
        surface = self.surfaces[self.turn % self.RING]
        self.turn += 1
        surface.copy_(image)
        return _FakeFrame(surface, frame.pts)


def _fake_module(*, with_color: bool = True) -> types.ModuleType:
    module = types.ModuleType("PyNvVideoCodec")
    module.__version__ = "0.0-fake"
    module.created = []  # type: ignore[attr-defined]
    module.fail_decode = False  # type: ignore[attr-defined]
    module.cudaVideoCodec = types.SimpleNamespace(H264="H264", HEVC="HEVC", AV1="AV1")  # type: ignore[attr-defined]
    if with_color:
        module.OutputColorType = types.SimpleNamespace(NATIVE="NATIVE", RGB="RGB", RGBP="RGBP")  # type: ignore[attr-defined]
    module.DisplayDecodeLatencyType = types.SimpleNamespace(NATIVE="NATIVE", LOW="LOW", ZERO="ZERO")  # type: ignore[attr-defined]
    module.VideoPacketFlag = types.SimpleNamespace(ENDOFPICTURE=8)  # type: ignore[attr-defined]
    module.cudaVideoChromaFormat = types.SimpleNamespace(Monochrome="400", **{"420": "420", "422": "422", "444": "444"})  # type: ignore[attr-defined]
    module.caps = dict(  # type: ignore[attr-defined]
        supported=1,
        num_decoder_engines=7,
        width_min=144,
        height_min=144,
        width_max=8192,
        height_max=8192,
        mb_num_max=262144,
    )
    module.caps_calls = []  # type: ignore[attr-defined]

    def get_decoder_caps(**kwargs: Any) -> dict[str, int]:
        module.caps_calls.append(kwargs)  # type: ignore[attr-defined]
        return dict(module.caps)  # type: ignore[attr-defined]

    module.GetDecoderCaps = get_decoder_caps  # type: ignore[attr-defined]

    class PacketData:
        def __init__(self) -> None:
            self.bsl_data = 0
            self.bsl = 0
            self.pts = 0
            self.decode_flag = 0

    def create_decoder(**kwargs: Any) -> _FakeDecoder:
        decoder = _FakeDecoder(module, **kwargs)
        module.created.append(decoder)  # type: ignore[attr-defined]
        return decoder

    module.PacketData = PacketData  # type: ignore[attr-defined]
    module.CreateDecoder = create_decoder  # type: ignore[attr-defined]
    return module


@pytest.fixture
def fake_nvc(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    module = _fake_module()
    monkeypatch.setitem(sys.modules, "PyNvVideoCodec", module)
    monkeypatch.setattr(nvdec, "_caps_cache", {})
    return module


@pytest.fixture(scope="module")
def videos(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("gpu_videos")
    specs = {
        "hevc": dict(clip=1, codec="hevc", size=SIZE),
        "hevc_other_clip": dict(clip=2, codec="hevc", size=SIZE),
        "hevc_large": dict(clip=3, codec="hevc", size=(320, 256)),
        "h264_bframes": dict(clip=4, codec="h264", bframes=3, size=SIZE),
        "hevc_bframes": dict(clip=5, codec="hevc", bframes=2, size=SIZE),
        "h264": dict(clip=6, codec="h264", size=SIZE),
    }
    return {
        name: write_stamped_video(root / f"{name}.mp4", camera=0, frames=FRAMES, gop=GOP, **spec)  # type: ignore[arg-type]
        for name, spec in specs.items()
    }


def _stamp(frame: torch.Tensor, layout: str = "chw") -> int:
    return read_stamp(frame, layout=layout).frame  # type: ignore[arg-type]


# -- import and availability ---------------------------------------------------------------------
def test_importing_the_package_loads_no_gpu_library() -> None:
    code = (
        "import sys, lightning_vstream.decode.gpu, lightning_vstream.transforms, lightning_vstream.profiling\n"
        "print(sorted(m for m in ('PyNvVideoCodec', 'nvtx') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_missing_pynvvideocodec_explains_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "PyNvVideoCodec", None)
    with pytest.raises(ImportError, match=r"NVIDIA driver.*pip install lightning_vstream\[gpu\]"):
        import_pynvvideocodec()
    assert nvdec_available() is False


def test_pynvvideocodec_without_rgb_output_asks_for_version_2(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "PyNvVideoCodec", _fake_module(with_color=False))
    with pytest.raises(ImportError, match=r"0\.0-fake has no OutputColorType.*pynvvideocodec>=2\.0"):
        import_pynvvideocodec()


def test_available_with_the_module(fake_nvc: types.ModuleType) -> None:
    assert nvdec_available() is True
    assert import_pynvvideocodec() is fake_nvc


# -- device choice -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("choice", "rank", "probes", "expected"),
    [
        ("cpu", 0, dict(cuda_available=True, device_count=2, nvdec=True), "cpu"),
        ("auto", 0, dict(cuda_available=False), "cpu"),
        ("auto", 1, dict(cuda_available=True, device_count=2, nvdec=True), "cuda:1"),
        ("cuda", 0, dict(cuda_available=True, device_count=1, nvdec=True), "cuda:0"),
        ("cuda", 1, dict(cuda_available=True, device_count=4, nvdec=True, root_device="cuda:3"), "cuda:3"),
        ("cuda", 1, dict(cuda_available=True, device_count=4, nvdec=True, root_device="cpu"), "cuda:1"),
    ],
)
def test_resolve_decode_device(choice: str, rank: int, probes: dict[str, Any], expected: str) -> None:
    assert resolve_decode_device(choice, rank, **probes) == torch.device(expected)  # type: ignore[arg-type]


def test_resolve_cuda_without_cuda_names_the_fix() -> None:
    with pytest.raises(RuntimeError, match=r"torch.cuda.is_available\(\) is False.*decode_device='cpu'"):
        resolve_decode_device("cuda", 0, cuda_available=False)


def test_resolve_cuda_without_pynvvideocodec(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "PyNvVideoCodec", None)
    with pytest.raises(ImportError, match=r"pip install lightning_vstream\[gpu\]"):
        resolve_decode_device("cuda", 0, cuda_available=True, device_count=1)


def test_resolve_auto_without_pynvvideocodec_warns_and_uses_cpu() -> None:
    with pytest.warns(UserWarning, match="PyNvVideoCodec is not"):
        device = resolve_decode_device("auto", 0, cuda_available=True, device_count=1, nvdec=False)
    assert device == torch.device("cpu")


def test_resolve_rank_without_its_own_gpu() -> None:
    with pytest.raises(ValueError, match=r"local_rank=2 has no GPU of its own: this process sees 2"):
        resolve_decode_device("cuda", 2, cuda_available=True, device_count=2, nvdec=True)


@pytest.mark.parametrize(
    ("choice", "rank", "message"), [("gpu", 0, "decode_device='gpu'"), ("cpu", -1, "local_rank=-1")]
)
def test_resolve_rejects_bad_arguments(choice: str, rank: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        resolve_decode_device(choice, rank)  # type: ignore[arg-type]


# -- decoder pool --------------------------------------------------------------------------------
def test_pool_reuses_by_key_only() -> None:
    pool = DecoderPool()
    small = DecoderKey(0, "hevc", 1600, 900, "RGBP")
    other_gpu = replace(small, gpu=1)
    first = pool.acquire(small, object)
    assert pool.release(small, first)
    assert pool.acquire(other_gpu, object) is not first
    assert pool.acquire(small, object) is first
    assert pool.stats == {"created": 2, "reused": 1, "dropped": 0, "idle": 0}


def test_pool_keeps_at_most_max_idle_per_key() -> None:
    pool = DecoderPool(max_idle_per_key=1)
    a, b = pool.acquire("k", object), pool.acquire("k", object)
    assert pool.release("k", a) is True
    assert pool.release("k", b) is False
    assert pool.idle("k") == 1 and pool.idle() == 1
    assert pool.stats["dropped"] == 1
    pool.clear()
    assert pool.idle() == 0


def test_pool_inherited_by_fork_starts_empty() -> None:
    pool = DecoderPool()
    pool.release("k", object())
    pool._pid = -1  # what a forked child sees: another process id
    assert pool.acquire("k", lambda: "new") == "new"
    assert pool.idle() == 0


def test_pool_rejects_negative_capacity() -> None:
    with pytest.raises(ValueError, match="max_idle_per_key=-1"):
        DecoderPool(max_idle_per_key=-1)


# -- packets -------------------------------------------------------------------------------------
def test_packet_source_yields_annexb_with_frame_table_timestamps(videos: dict[str, Path]) -> None:
    info = probe_video(videos["hevc"])
    source = PacketSource(videos["hevc"], info)
    try:
        packets = list(source.packets())
        assert bytes(packets[0])[:4] == b"\x00\x00\x00\x01"
        assert sorted(p.pts for p in packets) == list(info.pts)
        source.seek(info.key_seek[1])
        first = next(iter(source.packets()))
        assert first.pts == info.pts[info.key_indices[1]] and first.is_keyframe
    finally:
        source.close()


def test_packet_source_missing_file(tmp_path: Path, videos: dict[str, Path]) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        PacketSource(tmp_path / "nope.mp4", probe_video(videos["hevc"]))


# -- NvDecoder on the stand-in -------------------------------------------------------------------
@pytest.mark.parametrize("name", ["hevc", "h264_bframes", "hevc_bframes"])
def test_sequential_read_matches_the_cpu_decoder(
    fake_nvc: types.ModuleType, videos: dict[str, Path], name: str
) -> None:
    pool = DecoderPool()
    dec = NvDecoder(videos[name], pool=pool, label="clip 'x', camera 'CAM'")
    cpu = PyAVDecoder(videos[name])
    assert isinstance(dec, FrameDecoder)
    for i in range(FRAMES):
        frame = dec.read()
        assert _stamp(frame) == i
        diff = (frame.int() - cpu.read().int()).abs()
        assert diff.max() <= 4 and diff.float().mean() < 1.0  # our NV12 kernel vs FFmpeg's swscale
    assert dec.frames_decoded == FRAMES and dec.seeks == 0 and dec.position == FRAMES
    (created,) = fake_nvc.created
    assert created.kwargs["gpuid"] == 0 and created.kwargs["usedevicememory"] is True
    assert created.kwargs["outputColorType"] == "NATIVE"
    # LOW latency only where nothing is reordered; NATIVE keeps B-frame streams correct.
    assert created.kwargs["latency"] == ("NATIVE" if "bframes" in name else "LOW")
    assert (created.kwargs["maxwidth"], created.kwargs["maxheight"]) == SIZE
    dec.close()
    cpu.close()


@pytest.mark.parametrize("name", ["hevc", "h264_bframes", "hevc_bframes"])
def test_random_access_returns_the_requested_frame(
    fake_nvc: types.ModuleType, videos: dict[str, Path], name: str
) -> None:
    order = list(range(FRAMES)) * 2
    random.Random(7).shuffle(order)
    with NvDecoder(videos[name], pool=DecoderPool()) as dec:
        for i in order:
            assert _stamp(dec.get(i)) == i


def test_a_file_replaced_after_indexing_is_refused_before_any_frame(
    fake_nvc: types.ModuleType, videos: dict[str, Path], tmp_path: Path
) -> None:
    path = tmp_path / "CAM_FRONT.mp4"
    path.write_bytes(videos["hevc"].read_bytes())
    info = replace(probe_video(path), identity=file_identity(path))
    path.write_bytes(videos["hevc_other_clip"].read_bytes())  # another clip's video under the indexed name
    with NvDecoder(path, info=info, pool=DecoderPool()) as dec, pytest.raises(FileChangedError, match="CAM_FRONT.mp4"):
        dec.get(0)
    assert fake_nvc.created == []  # refused before a decoder was created


def test_forward_get_in_the_gop_decodes_forward_and_backward_seeks(
    fake_nvc: types.ModuleType, videos: dict[str, Path]
) -> None:
    dec = NvDecoder(videos["hevc"], pool=DecoderPool())
    assert _stamp(dec.get(2)) == 2 and dec.seeks == 0  # first GOP: decoded from the start
    assert _stamp(dec.get(7)) == 7 and dec.seeks == 0
    assert _stamp(dec.get(15)) == 15 and dec.seeks == 1  # next GOP: one jump
    assert _stamp(dec.get(11)) == 11 and dec.seeks == 2  # backwards: jump to its keyframe
    assert _stamp(dec.read()) == 12 and dec.seeks == 2
    dec.close()


def test_frames_outlive_the_decoder_surfaces(fake_nvc: types.ModuleType, videos: dict[str, Path]) -> None:
    dec = NvDecoder(videos["hevc"], pool=DecoderPool())
    first = dec.read()
    later = [dec.read() for _ in range(2 * _FakeDecoder.RING)]
    assert _stamp(first) == 0
    assert [_stamp(f) for f in later] == list(range(1, 2 * _FakeDecoder.RING + 1))
    dec.close()


def test_hwc_layout_converts_to_interleaved_rgb(fake_nvc: types.ModuleType, videos: dict[str, Path]) -> None:
    dec = NvDecoder(videos["hevc"], layout="hwc", pool=DecoderPool())
    frame = dec.get(13)
    assert frame.shape == (256, 256, 3) and _stamp(frame, "hwc") == 13
    dec.close()


def test_closed_decoder_is_flushed_and_reused_for_the_same_size(
    fake_nvc: types.ModuleType, videos: dict[str, Path]
) -> None:
    pool = DecoderPool()
    first = NvDecoder(videos["hevc"], pool=pool)
    assert _stamp(first.get(5)) == 5
    first.close()
    assert pool.idle() == 1 and fake_nvc.created[0].flushes == 1
    second = NvDecoder(videos["hevc_other_clip"], pool=pool)
    frames = [second.read() for _ in range(3)]
    assert [read_stamp(f).clip for f in frames] == [2, 2, 2]
    assert [_stamp(f) for f in frames] == [0, 1, 2]
    assert len(fake_nvc.created) == 1 and pool.stats["reused"] == 1
    third = NvDecoder(videos["hevc_large"], pool=pool)
    assert third.get(0).shape == (3, 256, 320)
    assert len(fake_nvc.created) == 2
    key = DecoderKey(0, "hevc", 320, 256, 8, "420", "NATIVE", "LOW")
    third.close()
    assert pool.idle(key) == 1


def test_close_keeps_position_and_reopens(fake_nvc: types.ModuleType, videos: dict[str, Path]) -> None:
    dec = NvDecoder(videos["hevc"], pool=DecoderPool())
    dec.get(13)
    dec.close()
    assert dec.position == 14 and "closed" in repr(dec)
    assert _stamp(dec.read()) == 14


def test_device_selects_the_gpu(fake_nvc: types.ModuleType, videos: dict[str, Path]) -> None:
    dec = NvDecoder(videos["hevc"], device="cuda:1", pool=DecoderPool())
    dec.read()
    assert fake_nvc.created[0].kwargs["gpuid"] == 1 and dec.device == torch.device("cuda", 1)
    dec.close()


def test_demuxer_overshoot_steps_back_one_gop(fake_nvc: types.ModuleType, videos: dict[str, Path]) -> None:
    info = probe_video(videos["hevc"])
    # A seek target past keyframe 1 lands on keyframe 2, as some demuxers do.
    overshooting = replace(info, key_seek=(info.key_seek[0], info.pts[20], info.key_seek[2]))
    dec = NvDecoder(videos["hevc"], info=overshooting, pool=DecoderPool())
    dec.seek(12)
    assert _stamp(dec.read()) == 12
    assert dec.seeks == 2
    dec.close()


def test_wrong_timestamps_fail_and_drop_the_decoder(fake_nvc: types.ModuleType, videos: dict[str, Path]) -> None:
    info = probe_video(videos["hevc"])
    stale = replace(info, pts=tuple(p + 1 for p in info.pts))
    pool = DecoderPool()
    dec = NvDecoder(videos["hevc"], info=stale, pool=pool, label="clip 'x', camera 'CAM'")
    with pytest.raises(VideoDecodeError, match=r"\(clip 'x', camera 'CAM'\) frame 0: .*timestamp 0, which is not in"):
        dec.read()
    assert pool.idle() == 0


def test_frame_table_longer_than_the_file(fake_nvc: types.ModuleType, videos: dict[str, Path]) -> None:
    info = probe_video(videos["hevc"])
    step = info.pts[1] - info.pts[0]
    longer = replace(info, pts=(*info.pts, info.pts[-1] + step))
    dec = NvDecoder(videos["hevc"], info=longer, pool=DecoderPool())
    with pytest.raises(VideoDecodeError, match=rf"frame {FRAMES}: the file ended before this frame"):
        dec.get(FRAMES)


def test_nvdec_failure_is_a_decode_error(fake_nvc: types.ModuleType, videos: dict[str, Path]) -> None:
    fake_nvc.fail_decode = True
    dec = NvDecoder(videos["hevc"], pool=DecoderPool())
    with pytest.raises(VideoDecodeError, match="NVDEC decoding failed: CUDA_ERROR_LAUNCH_FAILED"):
        dec.read()


@pytest.mark.parametrize("index", [-1, FRAMES])
def test_out_of_range_frame(fake_nvc: types.ModuleType, videos: dict[str, Path], index: int) -> None:
    dec = NvDecoder(videos["hevc"], pool=DecoderPool())
    with pytest.raises(IndexError, match=rf"frame {index} is out of range .* holds {FRAMES} frames"):
        dec.seek(index)


def test_codec_nvdec_cannot_take(fake_nvc: types.ModuleType, videos: dict[str, Path]) -> None:
    info = replace(probe_video(videos["hevc"]), codec="png")
    dec = NvDecoder(videos["hevc"], info=info, pool=DecoderPool())
    with pytest.raises(DecoderCapabilityError, match=r"codec 'png'.*decode_device='cpu'"):
        dec.read()


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        (dict(layout="nhwc"), ValueError, "layout='nhwc'"),
        (dict(device="cpu"), ValueError, "device='cpu'.*PyAVDecoder"),
        (dict(device=-1), ValueError, "GPU ordinal must be >= 0"),
        (dict(device=True), TypeError, "device=True"),
    ],
)
def test_constructor_rejects(kwargs: dict[str, Any], error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        NvDecoder("missing.mp4", **kwargs)


def test_constructor_opens_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "PyNvVideoCodec", None)  # importing it would fail
    dec = NvDecoder(tmp_path / "missing.mp4")
    assert dec.position == 0 and "closed" in repr(dec)


def test_decoding_emits_the_pipeline_ranges(
    fake_nvc: types.ModuleType, videos: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    pushed: list[str] = []

    class Domain:
        def get_event_attributes(self, message: str, color: str) -> str:
            return message

        def push_range(self, attributes: str) -> None:
            pushed.append(attributes)

        def pop_range(self) -> None:
            pass

    monkeypatch.setattr(profiling, "_nvtx_domain", lambda: Domain())
    monkeypatch.setattr(profiling, "_attributes", {})
    dec = NvDecoder(videos["hevc"], pool=DecoderPool())
    dec.read()
    dec.close()
    assert {profiling.RANGE_DEMUX, profiling.RANGE_DECODE, profiling.RANGE_HANDOFF} <= set(pushed)


# -- capabilities, fallback, probe ----------------------------------------------------------------
def test_below_nvdec_minimum_size_is_refused_with_the_limits(fake_nvc: types.ModuleType, tmp_path: Path) -> None:
    small = write_stamped_video(tmp_path / "small.mp4", clip=1, camera=0, frames=4, gop=2, codec="hevc", size=(64, 48))
    dec = NvDecoder(small, pool=DecoderPool(), label="clip 'x', camera 'CAM'")
    with pytest.raises(
        DecoderCapabilityError,
        match=r"\(clip 'x', camera 'CAM'\) is hevc 64x48 8-bit 4:2:0, outside "
        r"what NVDEC on GPU 0 decodes .*144x144 to 8192x8192.*gpu_fallback",
    ):
        dec.read()
    assert fake_nvc.caps_calls[0]["chromaformat"] == "420" and fake_nvc.caps_calls[0]["bitdepth"] == 8


def test_four_four_four_is_refused(fake_nvc: types.ModuleType, tmp_path: Path) -> None:
    odd = write_stamped_video(tmp_path / "odd.mp4", clip=1, camera=0, frames=4, gop=2, codec="hevc", size=(257, 255))
    with pytest.raises(DecoderCapabilityError, match=r"4:4:4: the GPU path converts only 4:2:0 frames"):
        NvDecoder(odd, pool=DecoderPool()).read()


def test_unsupported_format_and_caps_are_asked_once(fake_nvc: types.ModuleType, videos: dict[str, Path]) -> None:
    fake_nvc.caps["supported"] = 0
    for _ in range(2):
        with pytest.raises(DecoderCapabilityError, match="NVDEC on GPU 0 cannot decode"):
            NvDecoder(videos["hevc"], pool=DecoderPool()).read()
    assert len(fake_nvc.caps_calls) == 1
    assert nvdec.num_decoder_engines(fake_nvc, 0) == 7


def test_cpu_fallback_decodes_what_nvdec_refuses(fake_nvc: types.ModuleType, tmp_path: Path) -> None:
    from lightning_vstream.stream.engine_loader import _CopyingDecoder, _FallbackDecoder

    small = write_stamped_video(tmp_path / "small.mp4", clip=1, camera=0, frames=4, gop=2, codec="hevc", size=(64, 48))
    dec = _FallbackDecoder(
        NvDecoder(small, pool=DecoderPool()), lambda: _CopyingDecoder(PyAVDecoder(small), torch.device("cpu"))
    )
    assert [_stamp(dec.get(i)) for i in range(4)] == [0, 1, 2, 3]
    assert isinstance(dec.inner, _CopyingDecoder)


def test_pool_keys_separate_bit_depth_chroma_and_latency() -> None:
    base = DecoderKey(0, "hevc", 1600, 900)
    assert len({base, replace(base, bit_depth=10), replace(base, chroma="422"), replace(base, latency="LOW")}) == 4


def test_low_latency_marks_every_packet_as_a_whole_picture(fake_nvc: types.ModuleType, videos: dict[str, Path]) -> None:
    with NvDecoder(videos["hevc"], pool=DecoderPool()) as dec:
        dec.read()
    assert fake_nvc.created[0].kwargs["latency"] == "LOW" and set(fake_nvc.created[0].flags) == {8}
    with NvDecoder(videos["hevc"], pool=DecoderPool(), latency="native") as dec:
        dec.read()
    assert fake_nvc.created[1].kwargs["latency"] == "NATIVE" and set(fake_nvc.created[1].flags) == {0}


def test_low_latency_is_refused_for_reordered_streams(fake_nvc: types.ModuleType, videos: dict[str, Path]) -> None:
    with pytest.raises(ValueError, match=r"reorders frames \(B-frames\), so latency='low'"):
        NvDecoder(videos["hevc_bframes"], pool=DecoderPool(), latency="low").read()


def test_packet_without_timestamps_raises_instead_of_reading_as_frame_zero(fake_nvc: types.ModuleType) -> None:
    packet = av.Packet(b"\x00\x00\x00\x01")
    with pytest.raises(VideoDecodeError, match="neither a presentation nor a decode timestamp"):
        nvdec.packet_data(fake_nvc, packet, "'a.mp4'")


def test_read_writes_into_a_batch_row(fake_nvc: types.ModuleType, videos: dict[str, Path]) -> None:
    batch = torch.zeros(3, 3, 256, 256, dtype=torch.uint8)
    with NvDecoder(videos["hevc"], pool=DecoderPool()) as dec:
        row = batch[1]
        assert dec.get(6, out=row) is row
    assert _stamp(batch[1]) == 6 and batch[0].count_nonzero() == 0 and batch[2].count_nonzero() == 0


def test_packets_are_checked_against_the_frame_table_checksums(
    fake_nvc: types.ModuleType, videos: dict[str, Path]
) -> None:
    info = probe_video(videos["hevc"])
    assert info.crc32 is not None
    wrong = replace(info, crc32=(info.crc32[0], info.crc32[1] ^ 1, *info.crc32[2:]))
    dec = NvDecoder(videos["hevc"], info=wrong, pool=DecoderPool())
    dec.read()
    with pytest.raises(VideoDecodeError, match=r"frame 1: the compressed data differs from the checksum"):
        dec.read()


def test_probe_failure_is_an_error_with_the_child_output() -> None:
    calls: list[list[str]] = []

    def crashed(cmd: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, 1, "", "CUDA_ERROR_ILLEGAL_ADDRESS in cuvidDecodePicture")

    with pytest.raises(
        DecoderCapabilityError,
        match=r"(?s)GPU 5 failed in a child process \(exit code 1\).*"
        r"CUDA_ERROR_ILLEGAL_ADDRESS.*decode_device='cpu'",
    ):
        nvdec.probe_nvdec(5, runner=crashed)
    assert calls[0][-2:] == ["lightning_vstream.decode.nvdec_probe", "5"]


def test_probe_runs_once_per_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nvdec, "_probed", {})
    calls: list[list[str]] = []

    def passed(cmd: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, 0, "NVDEC_PROBE_OK\n", "")

    nvdec.probe_nvdec(0, runner=passed)
    nvdec.probe_nvdec(0, runner=passed)
    assert len(calls) == 1


def test_probe_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nvdec, "_probed", {})

    def hung(cmd: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
        raise subprocess.TimeoutExpired(cmd, timeout)

    with pytest.raises(DecoderCapabilityError, match=r"did not finish within 3 s.*probe=False"):
        nvdec.probe_nvdec(1, runner=hung, timeout=3)


def test_stream_engine_with_nvdecoders_delivers_exact_frames(
    fake_nvc: types.ModuleType, make_dataset: Any, assert_stamps: Any
) -> None:
    from lightning_vstream.index import load_index
    from lightning_vstream.stream.devices import HostDevice
    from lightning_vstream.stream.engine import StreamEngine
    from lightning_vstream.stream.engine_loader import EngineLoader
    from lightning_vstream.stream.loader import StreamSampler

    index = load_index(make_dataset(clips=3, cameras=2, frames=[12, 9, 15], size=(256, 256), codec="hevc", gop=6))
    pool = DecoderPool()
    sampler = StreamSampler([c.frame_count for c in index.clips], num_cameras=2, batch_size=2, shuffle=False)
    engine = StreamEngine(
        index=index,
        sampler=sampler,
        device=HostDevice(),
        num_threads=3,
        decoder_factory=lambda p, i, label: NvDecoder(p, info=i, label=label, pool=pool),
    )
    steps = 0
    for batch in EngineLoader(engine):
        assert_stamps(batch)
        steps += 1
    assert steps == len(sampler.schedule()) and engine.stats.amplification == 1.0
    assert pool.stats["created"] <= 4  # at most one decoder per stream, reused across clips


# -- benchmark without a GPU ---------------------------------------------------------------------
def _load_benchmark() -> types.ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_throughput", ROOT / "benchmarks" / "gpu_throughput.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU path")
def test_benchmark_without_gpu_exits_cleanly(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bench = _load_benchmark()
    out = tmp_path / "result.json"
    data = tmp_path / "data"
    assert bench.main(["--data-dir", str(data), "--output", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["status"] == "skipped" and "CUDA" in result["reason"]
    assert "skipped" in capsys.readouterr().out
    assert not data.exists()  # nothing was generated


def test_benchmark_raw_decoding_counts_every_frame(
    fake_nvc: types.ModuleType, make_dataset: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    bench = _load_benchmark()
    index = make_dataset(clips=1, cameras=2, frames=12, size=(64, 48), codec="hevc", gop=6)
    args = bench.parse_args(["--decoders", "1,2", "--repeats", "2"])
    raw = bench.measure_raw(fake_nvc, index, args, latencies=("NATIVE",))
    assert [row["decoders"] for row in raw["rows"]] == [1, 2]
    assert all(row["frames_per_run"] == 24 and len(row["fps"]["runs"]) == 2 for row in raw["rows"])
    assert raw["best"]["fps"]["median"] > 0
    assert all(d.kwargs["outputColorType"] == "NATIVE" for d in fake_nvc.created)
    bench.print_table({"raw_nvdec": raw})
    assert "raw NVDEC ceiling" in capsys.readouterr().out


def test_benchmark_reports_a_missing_datamodule(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    bench = _load_benchmark()
    monkeypatch.setitem(sys.modules, "lightning_vstream.stream.datamodule", None)
    row = bench.measure_loader(tmp_path / "index.json", {"num_workers": 2}, bench.parse_args([]))
    assert row["status"] == "unavailable" and "StreamVideoDataModule cannot be imported" in row["reason"]


def test_benchmark_reports_a_failing_loader_and_goes_on(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    bench = _load_benchmark()

    class DataModule:
        def __init__(self, **kwargs: Any) -> None:
            if kwargs.get("num_workers") == 99:
                raise ValueError("num_workers=99 is invalid")

    def broken_run(make_dm: Any, args: Any) -> tuple[int, float]:
        make_dm()
        raise RuntimeError("decode_device='cuda' needs the GPU backend")

    monkeypatch.setitem(
        sys.modules, "lightning_vstream.stream.datamodule", types.SimpleNamespace(StreamVideoDataModule=DataModule)
    )
    monkeypatch.setattr(bench, "_loader_run_trainer", broken_run)
    args = bench.parse_args([])
    failed = bench.measure_loader(tmp_path / "index.json", {"num_workers": 0}, args)
    assert failed["status"] == "failed" and "RuntimeError: decode_device='cuda'" in failed["reason"]
    invalid = bench.measure_loader(tmp_path / "index.json", {"num_workers": 99}, args)
    assert invalid["status"] == "invalid" and "num_workers=99" in invalid["reason"]


def test_benchmark_rejects_bad_options() -> None:
    bench = _load_benchmark()
    with pytest.raises(SystemExit):
        bench.parse_args(["--loader-config", "[1, 2]"])
    with pytest.raises(SystemExit):
        bench.parse_args(["--decoders", "0"])


def test_benchmark_summary_statistics() -> None:
    bench = _load_benchmark()
    assert bench.summarize([3.0, 1.0, 2.0]) == {"median": 2.0, "min": 1.0, "max": 3.0, "runs": [3.0, 1.0, 2.0]}


# -- real GPU ------------------------------------------------------------------------------------
@pytest.mark.cuda
@pytest.mark.parametrize("name", ["hevc", "h264", "hevc_bframes", "h264_bframes"])
def test_nvdec_decodes_every_frame_exactly(videos: dict[str, Path], name: str) -> None:
    device = resolve_decode_device("cuda", 0)
    dec = NvDecoder(videos[name], device=device, pool=DecoderPool())
    cpu = PyAVDecoder(videos[name])
    for i in range(FRAMES):
        frame = dec.read()
        assert frame.device == device and frame.dtype == torch.uint8 and frame.shape == (3, *SIZE[::-1])
        assert _stamp(frame) == i
        # Our conversion on the GPU against FFmpeg's on the CPU: same matrix and range, a few levels apart.
        diff = (frame.cpu().int() - cpu.read().int()).abs()
        assert diff.float().mean() < 1.0 and diff.max() <= 4
    assert dec.key is not None and dec.key.latency == ("NATIVE" if "bframes" in name else "LOW")
    dec.close()


@pytest.mark.cuda
def test_nvdec_random_access_and_reuse(videos: dict[str, Path]) -> None:
    pool = DecoderPool()
    order = list(range(FRAMES))
    random.Random(3).shuffle(order)
    dec = NvDecoder(videos["hevc"], device=0, pool=pool)
    assert [_stamp(dec.get(i)) for i in order] == order
    dec.close()
    other = NvDecoder(videos["hevc_other_clip"], device=0, pool=pool)
    assert [(read_stamp(f).clip, read_stamp(f).frame) for f in (other.read(), other.read())] == [(2, 0), (2, 1)]
    assert pool.stats["created"] == 1 and pool.stats["reused"] == 1
    other.close()


@pytest.mark.cuda
def test_nvdec_hwc_layout(videos: dict[str, Path]) -> None:
    dec = NvDecoder(videos["hevc"], device=0, layout="hwc", pool=DecoderPool())
    frame = dec.get(9)
    assert frame.shape == (*SIZE[::-1], 3) and frame.is_cuda and _stamp(frame, "hwc") == 9
    dec.close()


@pytest.mark.cuda
def test_nvdec_writes_into_a_row_of_a_gpu_batch(videos: dict[str, Path]) -> None:
    batch = torch.zeros(2, 3, *SIZE[::-1], dtype=torch.uint8, device="cuda:0")
    row = batch[1]
    with NvDecoder(videos["hevc"], device=0, pool=DecoderPool()) as dec:
        assert dec.get(4, out=row) is row
    assert _stamp(batch[1]) == 4 and int(batch[0].count_nonzero()) == 0


def _tagged_video(path: Path, *, colorspace: int, pix_fmt: str = "yuv420p") -> Path:
    """A 256x256 HEVC clip with colour blocks, tagged with ``colorspace`` (1 = BT.709)."""
    rng = np.random.default_rng(1)
    image = np.repeat(np.repeat(rng.integers(20, 235, (8, 8, 3), dtype=np.uint8), 32, 0), 32, 1)
    with av.open(str(path), "w") as container:
        stream = container.add_stream("libx265", rate=10)
        stream.width, stream.height, stream.pix_fmt = 256, 256, pix_fmt
        stream.codec_context.colorspace = colorspace
        stream.options = {"x265-params": "log-level=none:bframes=0"}
        for _ in range(4):
            frame = av.VideoFrame.from_ndarray(image, format="rgb24").reformat(
                format=pix_fmt, dst_colorspace="ITU709" if colorspace == 1 else "ITU601"
            )
            frame.colorspace = colorspace
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


@pytest.mark.cuda
@pytest.mark.parametrize(("colorspace", "pix_fmt"), [(1, "yuv420p"), (2, "yuv420p"), (1, "yuv420p10le")])
def test_nvdec_colours_match_the_cpu_for_the_stream_matrix(tmp_path: Path, colorspace: int, pix_fmt: str) -> None:
    path = _tagged_video(tmp_path / "tagged.mp4", colorspace=colorspace, pix_fmt=pix_fmt)
    with NvDecoder(path, device=0, pool=DecoderPool()) as dec, PyAVDecoder(path) as cpu:
        for i in range(4):
            diff = (dec.get(i).cpu().int() - cpu.get(i).int()).abs()
            inner = (torch.arange(256) % 32 >= 4) & (torch.arange(256) % 32 < 28)  # away from block edges
            assert diff[:, inner][:, :, inner].max() <= 4 and diff.float().mean() < 2.0


@pytest.mark.cuda
def test_nvdec_capabilities_and_probe_on_this_gpu(tmp_path: Path) -> None:
    nvc = import_pynvvideocodec()
    caps = nvdec.decoder_caps(nvc, 0, "hevc")
    assert caps.supported and caps.engines >= 1 and caps.min_width <= 256 <= caps.max_width
    nvdec.probe_nvdec(0, force=True)
    small = write_stamped_video(tmp_path / "small.mp4", clip=1, camera=0, frames=4, gop=2, codec="hevc", size=(64, 48))
    with pytest.raises(DecoderCapabilityError, match="64x48"):
        NvDecoder(small, device=0, pool=DecoderPool()).read()


@pytest.mark.cuda
def test_stream_engine_trains_on_gpu_batches(make_dataset: Any, tmp_path: Path) -> None:
    import lightning.pytorch as pl
    from _stream_models import RecordingModel

    from lightning_vstream.stream.datamodule import StreamVideoDataModule
    from lightning_vstream.stream.engine_loader import EngineLoader

    index = make_dataset(clips=4, cameras=3, frames=[16, 12, 20, 14], size=(256, 256), codec="hevc", gop=8)
    dm = StreamVideoDataModule(index_file=index, batch_size=2, decode_device="cuda", seed=1)
    model = RecordingModel()
    trainer = pl.Trainer(
        accelerator="gpu",
        devices=1,
        max_epochs=2,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        default_root_dir=tmp_path,
    )
    trainer.fit(model, datamodule=dm)
    assert isinstance(trainer.train_dataloader, EngineLoader)
    assert model.stamp_errors == [] and len(model.seen) == 2 * trainer.num_training_batches
    assert dm.decode_stats().amplification == 1.0


@pytest.mark.cuda
def test_auto_picks_cuda_on_a_gpu_machine() -> None:
    assert resolve_decode_device("auto", 0).type == "cuda"


@pytest.mark.cuda
def test_transform_on_gpu_matches_cpu() -> None:
    frames = torch.from_numpy(np.random.default_rng(0).integers(0, 256, (2, 6, 3, 48, 64), dtype=np.uint8))
    for transform in (
        FrameTransform(crop=(4, 8, 32, 48), resize=(24, 40), dtype="uint8"),
        FrameTransform(resize=(96, 128), mean=(0.5, 0.4, 0.3), std=(0.2, 0.25, 0.3), dtype="float32"),
        FrameTransform(resize=(24, 32), dtype="bfloat16", layout="hwc"),
    ):
        on_gpu = transform(frames.cuda())
        assert on_gpu.is_cuda
        on_cpu = transform(frames)
        if transform.dtype == "uint8":
            assert (on_gpu.cpu().int() - on_cpu.int()).abs().max() <= 1
        else:
            torch.testing.assert_close(on_gpu.cpu().float(), on_cpu.float(), atol=2e-2, rtol=1e-2)


@pytest.mark.cuda
@pytest.mark.slow
def test_benchmark_smoke_on_gpu(tmp_path: Path) -> None:
    bench = _load_benchmark()
    out = tmp_path / "result.json"
    argv = [
        "--data-dir",
        str(tmp_path / "data"),
        "--output",
        str(out),
        "--size",
        "320x192",
        "--clips",
        "4",
        "--cameras",
        "2",
        "--frames",
        "30",
        "--decoders",
        "1,2",
        "--repeats",
        "1",
        "--loader-batches",
        "4",
        "--warmup-batches",
        "2",
        "--loader-config",
        "{}",
    ]
    assert bench.main(argv) == 0
    result = json.loads(out.read_text())
    assert result["status"] == "ok"
    assert result["raw_nvdec"]["best"]["fps"]["median"] > 0
    assert result["summary"]["loader_fps"] > 0 and result["seed_design"]["status"] == "ok"

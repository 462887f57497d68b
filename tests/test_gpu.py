"""GPU decoding on the CPU: device choice, decoder reuse, probes, and NvDecoder's pixels on a stand-in.

The GPU path runs against the real PyNvVideoCodec over the fake NVIDIA driver in
``tests/test_gpu_nvdriver.py`` (the `nvdriver` tests). What the fake driver cannot show (real
pixels, colour against the CPU decoder, CUDA errors inside ``Decode``) is tested here on the one
stand-in, ``tests/_fake_nvc.py``: FFmpeg behind the library's call names, reusing its output
buffers as the library does. The ``cuda`` tests decode with real NVDEC.
"""

from __future__ import annotations

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
from _fake_nvc import StandInMemory, caps_runner, fake_module

from lightning_vstream import DecodeOptions
from lightning_vstream.decode.base import FrameDecoder, VideoDecodeError
from lightning_vstream.decode.cpu.probe import probe_video
from lightning_vstream.decode.cpu.pyav import PyAVDecoder
from lightning_vstream.decode.device import CudaMemory, frame_memory, host_view, pynvvideocodec_version
from lightning_vstream.decode.nvdec import session as nvdec
from lightning_vstream.decode.nvdec import sources as nvdec_sources
from lightning_vstream.decode.nvdec.decoder import (
    DecoderKey,
    DecoderPool,
    NvDecoder,
    import_pynvvideocodec,
    nvdec_available,
    resolve_decode_device,
)
from lightning_vstream.decode.nvdec.session import child_env
from lightning_vstream.decode.nvdec.sources import PacketSource
from lightning_vstream.demos.synth import read_stamp, write_stamped_video
from lightning_vstream.errors import ConfigurationError, DecoderCapabilityError, GpuError, GpuMemoryError
from lightning_vstream.transforms import FrameTransform
from tests._tables import write_json_sidecar

FRAMES = 25
GOP = 10
SIZE = (256, 256)  # NVDEC's HEVC minimum is 144x144; even sizes encode as 4:2:0
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def fake_nvc(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """The stand-in module, with GPU 0's capability table read from a stand-in probe report."""
    module = fake_module()
    monkeypatch.setitem(sys.modules, "PyNvVideoCodec", module)
    monkeypatch.setattr(nvdec, "_caps_tables", {})
    nvdec.gpu_caps(0, runner=caps_runner())
    return module


def _decoder(path: Path, **kwargs: Any) -> NvDecoder:
    return NvDecoder(path, memory=StandInMemory(), pool=kwargs.pop("pool", DecoderPool()), **kwargs)


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
        "import sys, lightning_vstream.decode.nvdec.decoder, lightning_vstream.transforms, lightning_vstream.profiling\n"
        "print(sorted(m for m in ('PyNvVideoCodec', 'nvtx') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_missing_pynvvideocodec_explains_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "PyNvVideoCodec", None)
    with pytest.raises(ImportError, match=r"NVIDIA driver.*pip install lightning_vstream\[gpu\]"):
        import_pynvvideocodec()
    assert nvdec_available() is False


def test_available_with_the_module(fake_nvc: types.ModuleType) -> None:
    assert nvdec_available() is True
    assert import_pynvvideocodec() is fake_nvc


@pytest.mark.parametrize("version", ["2.0.0", "2.2.3", "1.0"])
def test_versions_exporting_wrong_p016_strides_are_refused(monkeypatch: pytest.MonkeyPatch, version: str) -> None:
    monkeypatch.setitem(sys.modules, "PyNvVideoCodec", fake_module(version=version))
    with pytest.raises(ImportError, match=rf"PyNvVideoCodec {version} is too old.*10-bit.*pynvvideocodec>=2\.2\.4"):
        import_pynvvideocodec()
    assert nvdec_available() is False
    assert pynvvideocodec_version("2.2.4.post1") == (2, 2, 4) and pynvvideocodec_version("dev") == (0, 0, 0)


def test_the_process_views_frames_on_the_gpu_unless_told_otherwise(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VSTREAM_NVDEC_HOST_MEMORY", raising=False)
    assert isinstance(frame_memory(), CudaMemory) and CudaMemory().device(1) == torch.device("cuda", 1)


def test_host_view_reads_a_capsule_with_its_own_layout() -> None:
    words = torch.arange(24, dtype=torch.int16).view(6, 4)
    view = host_view(torch.as_strided(words, (6, 2), (4, 2)).__dlpack__())
    assert view.stride() == (4, 2) and view.dtype == torch.int16 and view[1].tolist() == [4, 6]
    assert view.data_ptr() == words.data_ptr()  # a view, not a copy
    with pytest.raises(DecoderCapabilityError, match="DLPack dtype"):
        host_view(torch.zeros(2, dtype=torch.float64).__dlpack__())


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
    with pytest.raises(RuntimeError, match=r"torch.cuda.is_available\(\) is False.*decode.device='cpu'"):
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


def test_packet_source_names_the_demuxer_by_extension_and_probes_a_misnamed_file(
    tmp_path: Path, videos: dict[str, Path]
) -> None:
    """Naming the demuxer skips FFmpeg's format probing; the packets are those probing would give."""
    from av.bitstream import BitStreamFilterContext

    def packets(path: Path, info: Any) -> list[tuple[int, bytes]]:
        source = PacketSource(path, info)
        try:
            return [(p.pts, bytes(p)) for p in source.packets()]
        finally:
            source.close()

    def probed(path: Path) -> list[tuple[int, bytes]]:  # FFmpeg's own choice of demuxer, then the same filter
        with av.open(str(path)) as container:
            stream = container.streams.video[0]
            annexb = BitStreamFilterContext("hevc_mp4toannexb", stream)
            return [(q.pts, bytes(q)) for p in container.demux(stream) if p.size for q in annexb.filter(p)]

    mp4 = videos["hevc"]
    with nvdec_sources._open_input(mp4) as container:
        assert container.format.name == "mp4"  # the demuxer named, not probed for
    assert packets(mp4, probe_video(mp4)) == probed(mp4)
    mkv = write_stamped_video(tmp_path / "clip.mkv", clip=1, camera=0, frames=6, gop=3, codec="hevc", size=(64, 48))
    misnamed = tmp_path / "clip.mp4"
    misnamed.write_bytes(mkv.read_bytes())  # Matroska under an MP4 name: the named demuxer refuses it
    with nvdec_sources._open_input(misnamed) as container:
        assert container.format.name == "matroska,webm"
    assert packets(misnamed, probe_video(misnamed)) == packets(mkv, probe_video(mkv)) == probed(mkv)
    garbage = tmp_path / "garbage.mp4"
    garbage.write_bytes(b"not a video" * 100)
    with pytest.raises(VideoDecodeError, match=r"garbage\.mp4' is not a readable video file"):
        PacketSource(garbage, probe_video(mp4))


def test_packet_source_missing_file(tmp_path: Path, videos: dict[str, Path]) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        PacketSource(tmp_path / "nope.mp4", probe_video(videos["hevc"]))


# -- NvDecoder on the stand-in -------------------------------------------------------------------
@pytest.mark.parametrize("name", ["hevc", "h264_bframes", "hevc_bframes"])
def test_sequential_read_matches_the_cpu_decoder(
    fake_nvc: types.ModuleType, videos: dict[str, Path], name: str
) -> None:
    dec = _decoder(videos[name], label="clip 'x', camera 'CAM'")
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
    assert created.kwargs["outputColorType"] == "NATIVE" and created.kwargs["cudastream"] != 0
    # LOW latency only where the frame table records no reordering; NATIVE keeps B-frame streams correct.
    assert created.kwargs["latency"] == ("NATIVE" if "bframes" in name else "LOW")
    assert (created.kwargs["maxwidth"], created.kwargs["maxheight"]) == SIZE
    dec.close()
    cpu.close()


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_hwc_frames_written_into_batch_rows_match_the_cpu_decoder(
    fake_nvc: types.ModuleType, videos: dict[str, Path], backend: str, request: pytest.FixtureRequest
) -> None:
    """Both conversions on real pictures, written straight into rows of a channels-last batch."""
    if backend == "triton":
        request.getfixturevalue("triton_interpreter")  # Triton's interpreter runs the kernel on CPU tensors
    batch = torch.zeros(3, *SIZE[::-1], 3, dtype=torch.uint8)
    with (
        _decoder(videos["h264_bframes"], layout="hwc", backend=backend) as dec,
        PyAVDecoder(videos["h264_bframes"], layout="hwc") as cpu,
    ):
        row = batch[1]
        assert dec.get(7, out=row) is row
        diff = (row.int() - cpu.get(7).int()).abs()
    assert _stamp(batch[1], "hwc") == 7 and diff.max() <= 4 and diff.float().mean() < 1.0
    assert batch[0].count_nonzero() == 0 and batch[2].count_nonzero() == 0


@pytest.mark.parametrize(
    ("message", "error", "match"),
    [
        # A CUDA error inside NVDEC: the GPU's, fatal whatever on_error says.
        ("CUDA driver API error CUDA_ERROR_LAUNCH_FAILED", GpuError, r"frame 1: the GPU failed .*CUDA_ERROR_LAUNCH"),
        ("cuvidDecodePicture(m_hDecoder, pPicParams) returned error 700", GpuError, r"the GPU failed"),
        ("cuvidMapVideoFrame(m_hDecoder) returned error 2", GpuMemoryError, r"ran out of memory.*lower"),
        # NVDEC refusing the data: the file's.
        ("cuvidParseVideoData(m_hParser, &packet) returned error 1", VideoDecodeError, r"NVDEC decoding failed"),
    ],
)
def test_nvdec_failures_are_the_gpus_or_the_files_and_the_decoder_is_never_flushed_after_one(
    fake_nvc: types.ModuleType, videos: dict[str, Path], message: str, error: type[Exception], match: str
) -> None:
    pool = DecoderPool()
    dec = _decoder(videos["hevc"], pool=pool)
    dec.read()
    fake_nvc.fail_decode = message
    with pytest.raises(error, match=match) as raised:
        dec.read()
    assert isinstance(raised.value, GpuError) == (error is not VideoDecodeError)
    fake_nvc.fail_decode = ""
    dec.close()
    (decoder,) = fake_nvc.created
    assert decoder.flushes == 0 and pool.idle() == 0  # dropped: no Decode after the failure, never reused


def test_a_failed_conversion_drops_the_decoder_unflushed_and_a_cuda_error_there_is_the_gpus(
    fake_nvc: types.ModuleType, videos: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    from lightning_vstream.decode.nvdec import nv12

    pool = DecoderPool()
    dec = _decoder(videos["hevc"], pool=pool, stream="current")
    dec.read()

    def broken(self: Any, surface: Any, out: Any = None) -> Any:
        raise RuntimeError("Triton Error [CUDA]: an illegal memory access was encountered")

    monkeypatch.setattr(nv12.Nv12Converter, "__call__", broken)
    with pytest.raises(GpuError, match=r"hevc.mp4' frame 1: the GPU failed \(RuntimeError: Triton Error"):
        dec.read()
    dec.close()
    (decoder,) = fake_nvc.created
    assert decoder.flushes == 0 and pool.idle() == 0


def test_a_surface_on_another_device_than_the_decoders_is_refused(
    fake_nvc: types.ModuleType, videos: dict[str, Path]
) -> None:
    class ElsewhereMemory(StandInMemory):
        def import_surface(self, frame: Any, stream: Any) -> torch.Tensor:
            return super().import_surface(frame, stream).to("meta")  # anywhere but where the decoder decodes

    dec = NvDecoder(videos["hevc"], memory=ElsewhereMemory(), pool=DecoderPool(), stream="current")
    with pytest.raises(GpuError, match=r"frames live on meta, but this decoder was made for cpu.*set its device"):
        dec.read()


@pytest.mark.parametrize("index", [-1, FRAMES])
def test_out_of_range_frame(fake_nvc: types.ModuleType, videos: dict[str, Path], index: int) -> None:
    dec = _decoder(videos["hevc"])
    with pytest.raises(IndexError, match=rf"frame {index} is out of range .* holds {FRAMES} frames"):
        dec.seek(index)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        (dict(layout="nhwc"), ValueError, "layout='nhwc'"),
        (dict(device="cpu"), ValueError, "device='cpu'.*PyAVDecoder"),
        (dict(device=-1), ValueError, "GPU ordinal must be >= 0"),
        (dict(device=True), TypeError, "device=True"),
        (dict(stream="default"), ValueError, "stream='default'"),
        (dict(backend="cuda"), ValueError, "backend='cuda'"),
    ],
)
def test_constructor_rejects(kwargs: dict[str, Any], error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        NvDecoder("missing.mp4", **kwargs)


def test_constructor_opens_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "PyNvVideoCodec", None)  # importing it would fail
    dec = NvDecoder(tmp_path / "missing.mp4")
    assert dec.position == 0 and "closed" in repr(dec)


def test_unsupported_format_and_caps_are_asked_once_per_gpu(
    fake_nvc: types.ModuleType, videos: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(nvdec, "_caps_tables", {})
    calls: list[list[str]] = []
    runner = caps_runner(calls, supported=0, num_decoder_engines=5)
    assert nvdec.num_decoder_engines(2, runner=runner) == 5
    for _ in range(2):
        with pytest.raises(
            DecoderCapabilityError, match="hevc 256x256 8-bit 4:2:0, which NVDEC on GPU 2 cannot decode"
        ):
            NvDecoder(videos["hevc"], device=2, memory=StandInMemory(), pool=DecoderPool()).read()
    assert len(calls) == 1 and calls[0][-1] == "--caps-only"  # one child per GPU, whatever the formats
    assert nvdec.decoder_caps(2, "hevc", chroma="444") == nvdec.decoder_caps(2, "png") == nvdec._UNSUPPORTED


def test_a_child_sees_only_its_gpu() -> None:
    assert child_env(0, {})["CUDA_VISIBLE_DEVICES"] == "0"
    assert child_env(1, {"CUDA_VISIBLE_DEVICES": "GPU-a, GPU-b"})["CUDA_VISIBLE_DEVICES"] == "GPU-b"
    with pytest.raises(DecoderCapabilityError, match=r"GPU 2 is not visible to this process"):
        child_env(2, {"CUDA_VISIBLE_DEVICES": "4,6"})


def test_pool_keys_separate_bit_depth_chroma_and_latency() -> None:
    base = DecoderKey(0, "hevc", 1600, 900)
    assert len({base, replace(base, bit_depth=10), replace(base, chroma="422"), replace(base, latency="LOW")}) == 4


def test_packet_without_timestamps_raises_instead_of_reading_as_frame_zero(fake_nvc: types.ModuleType) -> None:
    packet = av.Packet(b"\x00\x00\x00\x01")
    with pytest.raises(VideoDecodeError, match="neither a presentation nor a decode timestamp"):
        nvdec_sources.packet_data(fake_nvc, packet, "'a.mp4'")


def test_read_writes_into_a_batch_row(fake_nvc: types.ModuleType, videos: dict[str, Path]) -> None:
    batch = torch.zeros(3, 3, 256, 256, dtype=torch.uint8)
    with _decoder(videos["hevc"]) as dec:
        row = batch[1]
        assert dec.get(6, out=row) is row
    assert _stamp(batch[1]) == 6 and batch[0].count_nonzero() == 0 and batch[2].count_nonzero() == 0


def test_probe_failure_is_an_error_with_the_child_output(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nvdec, "_probed", {})
    seen: list[tuple[list[str], dict[str, str]]] = []

    def crashed(cmd: list[str], timeout: float, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
        seen.append((cmd, env))
        return subprocess.CompletedProcess(cmd, 1, "", "CUDA_ERROR_ILLEGAL_ADDRESS in cuvidDecodePicture")

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    with pytest.raises(
        DecoderCapabilityError,
        match=r"(?s)GPU 5 failed in a child process \(exit code 1\).*"
        r"CUDA_ERROR_ILLEGAL_ADDRESS.*vstream doctor.*decode.device='cpu'",
    ):
        nvdec.probe_nvdec(5, runner=crashed)
    cmd, env = seen[0]
    assert cmd[-1] == "lightning_vstream.decode.nvdec.probe_child" and env["CUDA_VISIBLE_DEVICES"] == "5"


def test_probe_runs_once_per_gpu_and_fills_the_capabilities(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nvdec, "_probed", {})
    monkeypatch.setattr(nvdec, "_caps_tables", {})
    calls: list[list[str]] = []
    runner = caps_runner(calls, num_decoder_engines=3)
    report = nvdec.probe_nvdec(0, runner=runner)
    assert nvdec.probe_nvdec(0, runner=runner) is report and len(calls) == 1
    assert nvdec.num_decoder_engines(0) == 3 and len(calls) == 1  # the probe's table: no second child


def test_probe_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nvdec, "_probed", {})

    def hung(cmd: list[str], timeout: float, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
        raise subprocess.TimeoutExpired(cmd, timeout)

    with pytest.raises(DecoderCapabilityError, match=r"did not finish within 3 s.*probe=False"):
        nvdec.probe_nvdec(1, runner=hung, timeout=3)


def test_probe_child_reports_a_machine_without_a_driver() -> None:
    """Run for real here: without an NVIDIA driver the child fails, and says why."""
    done = subprocess.run(
        [sys.executable, "-m", "lightning_vstream.decode.nvdec.probe_child", "--caps-only"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**__import__("os").environ, "LD_LIBRARY_PATH": ""},
    )
    if done.returncode == 0:
        pytest.skip("this machine has an NVIDIA driver")
    assert "PyNvVideoCodec could not be imported" in done.stderr + done.stdout


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


def test_benchmark_reports_a_missing_datamodule(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    bench = _load_benchmark()
    monkeypatch.setitem(sys.modules, "lightning_vstream.stream.stream_datamodule", None)
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
        sys.modules,
        "lightning_vstream.stream.stream_datamodule",
        types.SimpleNamespace(StreamVideoDataModule=DataModule),
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
    caps = nvdec.decoder_caps(0, "hevc")
    assert caps.supported and caps.engines >= 1 and caps.min_width <= 256 <= caps.max_width
    assert nvdec.probe_nvdec(0, force=True)["pixels"] == "checked"
    small = write_stamped_video(tmp_path / "small.mp4", clip=1, camera=0, frames=4, gop=2, codec="hevc", size=(64, 48))
    with pytest.raises(DecoderCapabilityError, match="64x48"):
        NvDecoder(small, device=0, pool=DecoderPool()).read()


@pytest.mark.cuda
def test_stream_engine_trains_on_gpu_batches(make_dataset: Any, tmp_path: Path) -> None:
    import lightning.pytorch as pl
    from _stream_models import RecordingModel

    from lightning_vstream.stream.engine_loader import EngineLoader
    from lightning_vstream.stream.stream_datamodule import StreamVideoDataModule

    index = make_dataset(clips=4, cameras=3, frames=[16, 12, 20, 14], size=(256, 256), codec="hevc", gop=8)
    dm = StreamVideoDataModule(index_file=index, batch_size=2, decode=DecodeOptions(device="cuda"), seed=1)
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


# -- reorder depth, recorded at index time -----------------------------------------------------------
def test_reorder_depth_is_recorded_in_both_table_formats(tmp_path: Path) -> None:
    """Latency is chosen from the packets' real order, not the header's has_b_frames guess."""
    from lightning_vstream.indexing import build_index, load_index

    for name, bframes in (("scene-0000", 0), ("scene-0001", 3)):
        write_stamped_video(tmp_path / "videos" / name / "CAM_FRONT.mp4", clip=0, camera=0, frames=12, bframes=bframes)
    for table_format in ("binary", "json"):
        path = build_index(tmp_path, output=tmp_path / f"{table_format}.json", progress=False)
        if table_format == "json":
            write_json_sidecar(path)  # as earlier releases wrote them: still read
        index = load_index(path)
        depths = [clip.cameras[0].info.reorder_depth for clip in index.clips]  # type: ignore[union-attr]
        assert depths[0] == 0 and depths[1] is not None and depths[1] > 0, (table_format, depths)


def test_frame_tables_of_version_1_still_load_with_the_depth_unknown(tmp_path: Path) -> None:
    import struct

    from lightning_vstream.index.table_file import FrameTables
    from lightning_vstream.index.table_write import write_tables

    path = write_stamped_video(tmp_path / "a.mp4", clip=0, camera=0, frames=6, bframes=2)
    tables = write_tables(tmp_path / "t.tables.bin", {"a.mp4": probe_video(path)})
    data = bytearray(tables.read_bytes())
    prefix = struct.Struct("<8sII")
    magic, _, length = prefix.unpack_from(data)
    header = json.loads(data[prefix.size : prefix.size + length])
    del header["arrays"]["reorder_depth"]  # what version 1 wrote
    header["version"] = 1
    encoded = json.dumps(header).encode().ljust(length)
    data[: prefix.size + length] = prefix.pack(magic, 1, length) + encoded
    tables.write_bytes(bytes(data))
    info = FrameTables(tables).get("a.mp4")
    assert info is not None and info.reorder_depth is None and info.frame_count == 6


def test_the_decoder_chooses_latency_from_the_recorded_depth(
    fake_nvc: types.ModuleType, videos: dict[str, Path]
) -> None:
    info = probe_video(videos["h264"])
    for depth, latency in ((0, "LOW"), (2, "NATIVE"), (None, "NATIVE")):
        with _decoder(videos["h264"], info=replace(info, reorder_depth=depth)) as dec:
            dec.read()
            assert dec.key is not None and dec.key.latency == latency
    with pytest.raises(ConfigurationError, match=r"latency='low' needs to know.*`vstream index`"):
        _decoder(videos["h264"], info=replace(info, reorder_depth=None), latency="low").read()


# -- vstream doctor without a GPU ----------------------------------------------------------------------
def test_doctor_without_a_gpu_says_so_in_one_line_and_exits_0(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from lightning_vstream.cli import main

    monkeypatch.delenv("VSTREAM_NVDEC_HOST_MEMORY", raising=False)
    monkeypatch.setitem(sys.modules, "PyNvVideoCodec", None)  # what a machine without the driver sees
    assert main(["doctor", "--json", str(tmp_path / "doctor.json")]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and out.startswith("vstream doctor: no usable NVIDIA GPU here (PyNvVideoCodec")
    assert "decode.device='cpu'" in out and not (tmp_path / "doctor.json").exists()

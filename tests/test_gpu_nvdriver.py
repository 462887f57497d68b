"""The GPU path over the real PyNvVideoCodec wheel and the fake NVIDIA driver (`nvdriver` tests).

Everything above the driver is NVIDIA's own code: argument parsing, ``PacketData``, decoder creation,
the parser callbacks, latency modes, surface allocation and cropping, ``DecodedFrame`` and its DLPack
export. The fake decodes no pixels, so frames are proven by stamps written into each frame's output
buffer right after ``Decode`` (see ``tests/_nvdriver.py``), and crop and plane offsets by the fake's
row pattern. Run with ``VSTREAM_FAKE_NVDRIVER=<folder of the built fake driver> pytest -m nvdriver``
(tests/conftest.py starts them in a child process with the library path set).
"""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path
from typing import Any

import av
import pytest
import torch
from _nvdriver import (
    FakeLog,
    Marker,
    decode_stream_waits,
    encode,
    fake_format,
    install_marker,
    pattern_nv12,
    probed,
    stamped_rgb,
)
from conftest import cut_decodes

from lightning_vstream.decode.cpu.probe import probe_video
from lightning_vstream.decode.device import frame_memory, host_view, import_pynvvideocodec, pynvvideocodec_version
from lightning_vstream.decode.nvdec import session as nvdec
from lightning_vstream.decode.nvdec import sources as nvdec_sources
from lightning_vstream.decode.nvdec.decoder import NvDecoder
from lightning_vstream.decode.nvdec.nv12 import Nv12Converter
from lightning_vstream.decode.nvdec.pool import DecoderPool
from lightning_vstream.decode.nvdec.sources import PacketSource, packet_data
from lightning_vstream.errors import ConfigurationError, DecoderCapabilityError, VideoDecodeError
from lightning_vstream.options import EngineOptions, ErrorOptions, GpuOptions, OutputOptions

pytestmark = pytest.mark.nvdriver

#: Every kind of file the project feeds NVDEC; each starts at its own time so timestamps never collide.
KINDS: dict[str, dict[str, Any]] = {
    "hevc": dict(codec="hevc", start=0.0),
    "hevc_open_gop_bframes": dict(codec="hevc", bframes=3, start=10.0),  # x265's default open GOP (CRA)
    "h264": dict(codec="h264", start=20.0),
    "h264_bframes": dict(codec="h264", bframes=3, start=30.0),
    "av1": dict(codec="av1", start=40.0),
    "vp9": dict(codec="vp9", start=50.0),
    "mpeg2_bframes": dict(codec="mpeg2", bframes=2, start=60.0),
}
WITHOUT_REORDERING = [name for name, kind in KINDS.items() if not kind.get("bframes")]


@pytest.fixture
def marker(monkeypatch: pytest.MonkeyPatch) -> Marker:
    """Stamps every frame the GPU readers decode (see tests/_nvdriver.py)."""
    return install_marker(monkeypatch)


@pytest.fixture(params=["from_the_tables_places", "through_the_demuxer"])
def reading(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both ways NvDecoder gets its packets: from the file's bytes at the places the frame tables record, or
    from PyAV's demuxer (tables that record none, or a format the codec configuration does not give)."""
    if request.param == "through_the_demuxer":
        monkeypatch.setattr(nvdec_sources, "config_format", lambda info: None)
    return str(request.param)


@pytest.fixture
def fake_log() -> FakeLog:
    """The fake driver's call log from the start of the test."""
    return FakeLog()


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("nvdriver")
    return {name: encode(root / f"{name}.mp4", **kind) for name, kind in KINDS.items()}


def _spec(path: Path) -> Any:
    return probed(path)[1]


def _read_all(dec: NvDecoder, count: int) -> list[torch.Tensor]:
    return [dec.read().clone() for _ in range(count)]


def _assert_stamped(frames: dict[int, torch.Tensor], clip: int, path: Path, *, sixteen: bool = False) -> None:
    info, spec = probed(path)
    for index, frame in frames.items():
        expected = stamped_rgb((clip, 0, index), info.height, info.width, spec, sixteen=sixteen)
        assert torch.equal(frame, expected), f"{path.name}: frame {index} does not carry its own stamp"


# -- the library itself ---------------------------------------------------------------------------
def test_the_real_library_imports_and_older_versions_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    nvc = import_pynvvideocodec()
    assert pynvvideocodec_version(nvc.__version__) >= (2, 2, 4)
    assert frame_memory().host  # the fake driver's device memory is host memory
    monkeypatch.setattr(nvc, "__version__", "2.2.3")
    with pytest.raises(ImportError, match=r"PyNvVideoCodec 2\.2\.3 is too old.*pynvvideocodec>=2\.2\.4"):
        import_pynvvideocodec()


def test_reorder_depth_is_measured_from_the_packets(files: dict[str, Path]) -> None:
    depths = {name: probe_video(path).reorder_depth for name, path in files.items()}
    assert all(depths[name] == 0 for name in WITHOUT_REORDERING), depths
    assert all(depths[name] and depths[name] > 0 for name in KINDS if name not in WITHOUT_REORDERING), depths


# -- every file kind -----------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(KINDS))
def test_every_file_kind_decodes_exactly_in_native_latency(
    files: dict[str, Path], name: str, marker: Marker, monkeypatch: pytest.MonkeyPatch, fake_log: FakeLog, reading: str
) -> None:
    path = files[name]
    info = probe_video(path)
    fake_format(monkeypatch, info)
    marker.add(info, 1, 0)
    with NvDecoder(path, info=info, latency="native", pool=DecoderPool()) as dec:
        frames = dict(enumerate(_read_all(dec, info.frame_count)))
        assert dec.key is not None and dec.key.latency == "NATIVE" and dec.frames_decoded == info.frame_count
    _assert_stamped(frames, 1, path)
    sent = [line for line in fake_log.calls("cuvidParseVideoData") if " size=0 " not in line]
    assert len(sent) == info.frame_count  # one packet per frame, no packet lost or repeated
    assert not list(fake_log.calls("cuStreamSynchronize"))  # never the NULL stream: nothing synchronises


@pytest.mark.parametrize("name", WITHOUT_REORDERING)
def test_streams_without_reordering_use_low_latency(
    files: dict[str, Path], name: str, marker: Marker, monkeypatch: pytest.MonkeyPatch, fake_log: FakeLog
) -> None:
    path = files[name]
    info = probe_video(path)
    fake_format(monkeypatch, info)
    marker.add(info, 1, 0)
    with NvDecoder(path, info=info, pool=DecoderPool()) as dec:
        frames = dict(enumerate(_read_all(dec, info.frame_count)))
        assert dec.key is not None and dec.key.latency == "LOW"
    _assert_stamped(frames, 1, path)
    sent = [line for line in fake_log.calls("cuvidParseVideoData") if " size=0 " not in line]
    flags = [int(line.split("flags=")[1].split()[0], 16) for line in sent]
    assert len(flags) == info.frame_count and all(
        f & 0x08 for f in flags
    )  # CUVID_PKT_ENDOFPICTURE on every packet, as LOW needs
    assert "maxDisplayDelay=0" in next(fake_log.calls("cuvidCreateVideoParser"))


def test_low_latency_emits_decode_order_on_b_frames_so_it_is_refused(
    files: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = files["h264_bframes"]
    info = probe_video(path)
    fake_format(monkeypatch, info)
    monkeypatch.setenv("FAKE_REORDER", "0")  # what LOW latency does: no display delay at all
    nvc = import_pynvvideocodec()
    stream = frame_memory().new_stream(0)
    raw = nvc.CreateDecoder(
        gpuid=0,
        codec=nvc.cudaVideoCodec.H264,
        cudacontext=0,
        cudastream=stream.cuda_stream,
        usedevicememory=True,
        maxwidth=info.width,
        maxheight=info.height,
        outputColorType=nvc.OutputColorType.NATIVE,
        latency=nvc.DisplayDecodeLatencyType.LOW,
    )
    source = PacketSource(path, info)
    shown, sent = [], []
    for packet in source.packets():
        sent.append(packet.pts)
        shown += [info.index_of_pts(f.getPTS()) for f in raw.Decode(packet_data(nvc, packet, "x", end_of_picture=True))]
    source.close()
    assert shown == [info.index_of_pts(p) for p in sent] != sorted(shown)  # decode order, not presentation order
    with pytest.raises(ConfigurationError, match=r"reorders frames \(B-frames\), so latency='low'"):
        NvDecoder(path, info=info, latency="low", pool=DecoderPool()).read()
    unknown = replace(info, reorder_depth=None)  # an index built before the depth was recorded
    with pytest.raises(ConfigurationError, match=r"does not record it; rebuild the index with `vstream index`"):
        NvDecoder(path, info=unknown, latency="low", pool=DecoderPool()).read()
    monkeypatch.setenv("FAKE_REORDER", str(info.reorder_depth))
    for table in (info, unknown):  # auto: NATIVE whenever reordering is possible or unknown
        with NvDecoder(path, info=table, pool=DecoderPool()) as dec:
            dec.read()
            assert dec.key is not None and dec.key.latency == "NATIVE"


# -- surfaces: bit depth, crop, strides, reuse --------------------------------------------------------
def test_ten_bit_frames_export_p016_and_convert_from_16_bit_samples(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, marker: Marker
) -> None:
    path = encode(tmp_path / "hevc10.mp4", "hevc", frames=6, gop=3, pix_fmt="yuv420p10le", start=70.0)
    info = probe_video(path)
    fake_format(monkeypatch, info, depth=10)
    spec = _spec(path)
    with NvDecoder(path, info=info, latency="native", pool=DecoderPool()) as dec:
        pattern = dec.get(0)
        assert dec.key is not None and dec.key.bit_depth == 10
    expected = Nv12Converter(spec, info.height, info.width, backend="torch")(
        pattern_nv12(info.height, info.width, sixteen=True)
    )
    assert torch.equal(pattern, expected)  # 16-bit samples, rows of W samples: P016 read right
    marker.add(info, 2, 0)
    with NvDecoder(path, info=info, latency="native", pool=DecoderPool()) as dec:
        frames = dict(enumerate(_read_all(dec, info.frame_count)))
    _assert_stamped(frames, 2, path, sixteen=True)


def test_a_912_row_coded_surface_is_cropped_to_900(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fake_log: FakeLog
) -> None:
    path = encode(tmp_path / "wide.mp4", "h264", frames=3, gop=3, size=(1600, 900), start=80.0)
    info = probe_video(path)
    fake_format(monkeypatch, info, coded_height=912)
    with NvDecoder(path, info=info, pool=DecoderPool()) as dec:
        frame = dec.get(2)
    expected = Nv12Converter(_spec(path), 900, 1600, backend="torch")(pattern_nv12(900, 1600))
    assert torch.equal(frame, expected)  # luma rows 0..899, then chroma: the 12 padding rows never read
    assert "coded=1600x912" in next(fake_log.calls("cuvidCreateDecoder"))
    copies = {line.split(" srcPitch")[0] for line in fake_log.calls("cuMemcpy2DAsync")}
    assert copies == {"cuMemcpy2DAsync w=1600 h=900", "cuMemcpy2DAsync w=1600 h=450"}  # the library crops


def test_a_p016_export_with_8_bit_strides_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What PyNvVideoCodec 2.0-2.2.3 export for 10-bit frames: strides (W, 2), a wrong view of the buffer."""
    path = encode(tmp_path / "hevc10.mp4", "hevc", frames=4, gop=2, pix_fmt="yuv420p10le", start=90.0)
    info = probe_video(path)
    fake_format(monkeypatch, info, depth=10)

    class OldExport:
        def __init__(self, frame: Any) -> None:
            self.frame = frame

        def getPTS(self) -> int:
            return int(self.frame.getPTS())

        def GetPtrToPlane(self, plane: int) -> int:
            return int(self.frame.GetPtrToPlane(plane))

        def __dlpack__(self, stream: Any = None) -> Any:
            rows, width = host_view(self.frame.__dlpack__(stream=stream)).shape
            words = torch.zeros(rows * width * 2, dtype=torch.int16)  # room for the wrong view
            return torch.as_strided(words, (rows, width), (width, 2)).__dlpack__()

    class OldDecoder:
        def __init__(self, real: Any) -> None:
            self.real = real

        def Decode(self, data: Any) -> list[Any]:
            return [OldExport(f) for f in self.real.Decode(data)]

    from lightning_vstream.decode.nvdec import decoder as decode_gpu

    def create(*args: Any, **kwargs: Any) -> Any:
        session = nvdec.create_session(*args, **kwargs)
        session.decoder = OldDecoder(session.decoder)
        return session

    monkeypatch.setattr(decode_gpu, "create_session", create)
    dec = NvDecoder(path, info=info, latency="native", pool=DecoderPool(), label="clip 'a', camera 'CAM'")
    with pytest.raises(
        DecoderCapabilityError,
        match=r"strides \(256, 2\); expected P016 \(384, 256\) with strides \(256, 1\).*pynvvideocodec>=2\.2\.4",
    ):
        dec.get(0)


def test_the_output_buffer_is_reused_by_the_next_decode_and_frames_never_read_it_late(
    files: dict[str, Path], monkeypatch: pytest.MonkeyPatch, marker: Marker
) -> None:
    path = files["hevc"]
    info = probe_video(path)
    fake_format(monkeypatch, info)
    marker.add(info, 3, 0)
    # The hazard is real: a view of frame 0 read after the next Decode shows frame 1.
    nvc = import_pynvvideocodec()
    session = marker.wrap(
        nvdec.create_session(nvc, nvdec.DecoderKey(0, "hevc", 256, 256, latency="LOW"), frame_memory())
    )
    source = PacketSource(path, info)
    packets = source.packets()
    first = session.decoder.Decode(packet_data(nvc, next(packets), "x", end_of_picture=True))[0]
    view = host_view(first.__dlpack__(stream=session.stream.cuda_stream))
    session.decoder.Decode(packet_data(nvc, next(packets), "x", end_of_picture=True))
    assert int(view[info.height - 1, 0]) == 16 + 1  # the last luma rows hold the frame number: frame 1 now
    source.close()
    # The decoder converts each frame before the next Decode: every frame carries its own stamp,
    # although the library hands out one or two buffers for all of them.
    with NvDecoder(path, info=info, latency="native", pool=DecoderPool()) as dec:
        frames = dict(enumerate(_read_all(dec, info.frame_count)))
    _assert_stamped(frames, 3, path)
    assert len(marker.decoders[-1].pointers) <= 2 < info.frame_count


# -- seeking, end of stream, reuse ----------------------------------------------------------------
@pytest.mark.parametrize("name", ["hevc", "hevc_open_gop_bframes", "h264_bframes"])
def test_random_access_returns_each_requested_frame(
    files: dict[str, Path], name: str, marker: Marker, monkeypatch: pytest.MonkeyPatch, reading: str
) -> None:
    path = files[name]
    info = probe_video(path)
    fake_format(monkeypatch, info)
    marker.add(info, 4, 0)
    order = list(range(info.frame_count)) * 2
    random.Random(5).shuffle(order)
    frames: dict[int, torch.Tensor] = {}
    with NvDecoder(path, info=info, pool=DecoderPool()) as dec:
        for i in order:
            frames[i] = dec.get(i).clone()
            _assert_stamped({i: frames[i]}, 4, path)
        assert dec.seeks > 0


def test_end_of_stream_returns_the_last_frames_and_a_longer_table_fails(
    files: dict[str, Path], marker: Marker, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = files["h264_bframes"]
    info = probe_video(path)
    fake_format(monkeypatch, info)
    marker.add(info, 5, 0)
    last = info.frame_count - 1
    with NvDecoder(path, info=info, pool=DecoderPool()) as dec:
        frames = {i: dec.get(i).clone() for i in (last - 2, last - 1, last)}  # the flush hands these out
    _assert_stamped(frames, 5, path)
    step = info.pts[1] - info.pts[0]
    longer = replace(info, pts=(*info.pts, info.pts[-1] + step), crc32=None)
    with NvDecoder(path, info=longer, pool=DecoderPool()) as dec:
        with pytest.raises(VideoDecodeError, match=rf"frame {last + 1}: the file ended before this frame"):
            dec.get(last + 1)


def test_closed_decoders_are_flushed_and_reused_for_the_next_file(
    files: dict[str, Path], tmp_path: Path, marker: Marker, monkeypatch: pytest.MonkeyPatch, fake_log: FakeLog
) -> None:
    pool = DecoderPool()
    first, second = files["hevc"], files["hevc_open_gop_bframes"]
    for clip, path in enumerate((first, second)):
        info = probe_video(path)
        marker.add(info, 6 + clip, 0)
        fake_format(monkeypatch, info)
        with NvDecoder(path, info=info, latency="native", pool=pool) as dec:
            _assert_stamped({5: dec.get(5), 6: dec.read()}, 6 + clip, path)
    assert pool.stats == {"created": 1, "reused": 1, "dropped": 0, "idle": 1}
    flushes = [
        line for line in fake_log.calls("cuvidParseVideoData") if int(line.split("flags=")[1].split()[0], 16) & 1
    ]
    assert len(flushes) == 2  # end of stream before going back to the pool, each time
    assert len(list(fake_log.calls("sequence callback"))) == 2  # the next file starts with its own sequence
    ten = encode(tmp_path / "hevc10.mp4", "hevc", frames=4, gop=2, pix_fmt="yuv420p10le", start=100.0)
    fake_format(monkeypatch, probe_video(ten), depth=10)
    with NvDecoder(ten, latency="native", pool=pool) as dec:
        dec.get(0)
    assert pool.stats["created"] == 2  # PyNvVideoCodec cannot reconfigure across a bit-depth change


# -- capabilities of another GPU ------------------------------------------------------------------
def test_capabilities_of_gpu_1_are_asked_in_a_child_that_sees_only_gpu_1(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, fake_log: FakeLog
) -> None:
    monkeypatch.setattr(nvdec, "_caps_tables", {})
    monkeypatch.setattr(nvdec, "_probed", {})
    children: list[dict[str, str]] = []
    child_log = tmp_path / "child.log"

    def runner(cmd: list[str], timeout: float, env: dict[str, str]) -> Any:
        children.append(env)
        # The probe decodes a 256x256 clip: the fake driver must announce that size.
        fake = {
            "FAKE_LOG": str(child_log),
            "FAKE_W": "256",
            "FAKE_H": "256",
            "FAKE_CODED_W": "256",
            "FAKE_CODED_H": "256",
        }
        return nvdec._run(cmd, timeout, {**env, **fake})

    caps = nvdec.decoder_caps(1, "hevc", bit_depth=10, runner=runner)
    assert caps.supported and caps.engines == 7 and (caps.min_width, caps.max_width) == (144, 8192)
    assert nvdec.decoder_caps(1, "av1", runner=runner).supported and len(children) == 1  # one table per GPU
    assert children[0]["CUDA_VISIBLE_DEVICES"] == "1"
    asked = child_log.read_text()
    assert "cuvidGetDecoderCaps codec=8 chroma=1 bitdepth_minus8=2" in asked and "cuCtxCreate dev=0" in asked
    assert fake_log.lines() == []  # this process touched no device at all
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    report = nvdec.probe_nvdec(1, force=True, runner=runner)
    assert children[-1]["CUDA_VISIBLE_DEVICES"] == "5" and report["visible_devices"] == "5"
    assert report["decode"] == "ok" and report["pixels"].startswith("not checked")
    with pytest.raises(
        DecoderCapabilityError, match=r"GPU 2 is not visible to this process \(CUDA_VISIBLE_DEVICES='3,5'\)"
    ):
        nvdec.decoder_caps(2, "hevc", runner=runner)


# -- whole paths: the stream engine and random access ------------------------------------------------
@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three clips of two cameras (HEVC 256x256), every file starting at its own time."""
    from lightning_vstream.indexing.build import build_index

    root = tmp_path_factory.mktemp("nvdriver_dataset")
    for clip, frames in enumerate((12, 9, 15)):
        for camera in range(2):
            path = root / "videos" / f"scene-{clip:04d}" / f"CAM_{camera}.mp4"
            path.parent.mkdir(parents=True, exist_ok=True)
            encode(path, "hevc", frames=frames, gop=6, start=200.0 + 20 * clip + 10 * camera)
    return build_index(root, output=root / "index.json", progress=False)


def _mark_dataset(marker: Marker, index: Any) -> dict[str, int]:
    clips = {}
    for number, clip in enumerate(index.clips):
        clips[clip.clip_id] = number
        for camera_number, camera in enumerate(clip.cameras):
            assert camera.info is not None
            marker.add(camera.info, number, camera_number)
    return clips


def test_stream_engine_runs_from_packet_to_batch_over_the_real_library(
    dataset: Path, marker: Marker, monkeypatch: pytest.MonkeyPatch, fake_log: FakeLog
) -> None:
    from lightning_vstream.indexing import load_index
    from lightning_vstream.stream.engine_loader import build_engine_loader
    from lightning_vstream.stream.sampler import StreamSampler

    index = load_index(dataset)
    fake_format(monkeypatch, index.clips[0].cameras[0].info)
    clips = _mark_dataset(marker, index)
    sampler = StreamSampler([c.frame_count for c in index.clips], num_cameras=2, batch_size=2, shuffle=False)
    loader = build_engine_loader(
        index, sampler, "cuda:0", engine=EngineOptions(threads=2)
    )  # probes NVDEC in a child first
    steps = 0
    for batch in loader:
        steps += 1
        for slot in range(2):
            if not batch["valid"][slot]:
                continue
            stamp = (clips[batch["clip_id"][slot]], int(batch["frame_index"][slot]))
            for camera in range(2):
                expected = stamped_rgb((stamp[0], camera, stamp[1]), 256, 256, _spec(index.clips[0].cameras[0].path))
                assert torch.equal(batch["frames"][slot, camera], expected), (slot, camera, stamp)
                # Each camera's own timestamp, from its own frame table (every file starts at its own time).
                info = index.clips[stamp[0]].cameras[camera].info
                assert float(batch["camera_timestamp"][slot, camera]) == info.timestamp(stamp[1])
            assert float(batch["timestamp"][slot]) == float(batch["camera_timestamp"][slot, 0])
    assert steps == len(sampler.schedule())
    assert loader.stats.frames_decoded == loader.stats.frames_delivered + cut_decodes(sampler.schedule(), 6, 2)
    # One decoder per (slot, camera) stream, each on its decode thread's own stream, reused across clips.
    assert len(marker.decoders) == 4
    streams = {d.stream.cuda_stream for d in marker.decoders}
    assert len(streams) == 2 and 0 not in streams
    assert not list(fake_log.calls("cuStreamSynchronize"))


def _engine_loader(index: Any, **kwargs: Any) -> Any:
    from lightning_vstream.stream.engine_loader import build_engine_loader
    from lightning_vstream.stream.sampler import StreamSampler

    sampler = StreamSampler([c.frame_count for c in index.clips], num_cameras=2, batch_size=2, shuffle=False)
    return build_engine_loader(
        index, sampler, "cuda:0", engine=EngineOptions(threads=2), gpu=GpuOptions(probe=False), **kwargs
    )


def _batch_errors(batch: dict[str, Any], clips: dict[str, int], spec: Any) -> list[str]:
    """Rows of a 2 x 2 camera batch that do not hold their own stamped frame."""
    wrong = []
    for slot in range(2):
        if not batch["valid"][slot]:
            continue
        clip, frame = clips[batch["clip_id"][slot]], int(batch["frame_index"][slot])
        for camera in range(2):
            if not torch.equal(batch["frames"][slot, camera], stamped_rgb((clip, camera, frame), 256, 256, spec)):
                wrong.append(f"step {batch['step']} slot {slot} camera {camera} (clip {clip}, frame {frame})")
    return wrong


def test_no_decode_stream_ever_waits_for_an_event_of_the_consumers_stream(
    dataset: Path, files: dict[str, Path], marker: Marker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """NVDEC copies each frame out on its decoder's stream; a decode stream made to wait for the consumer's
    work could leave that copy queued behind a slow training step. Over two epochs of the engine (the second
    starts by releasing the ring) and a random-access batch, the consumer's stream waits for the decode
    streams (and decode threads wait for released batches on the host), never a decode stream for another."""
    from lightning_vstream.clips.gpu_reader import BatchReader, PlannedSample
    from lightning_vstream.indexing import load_index
    from lightning_vstream.stream.engine_device import HostNvdecDevice

    index = load_index(dataset)
    fake_format(monkeypatch, index.clips[0].cameras[0].info)
    clips = _mark_dataset(marker, index)
    spec = _spec(index.clips[0].cameras[0].path)
    log = FakeLog()
    loader = _engine_loader(index)
    for epoch in range(2):
        loader.sampler.set_epoch(epoch)
        for batch in loader:
            assert not _batch_errors(batch, clips, spec)
    info = probed(files["hevc"])[0]
    marker.add(info, 7, 0)
    reader = BatchReader(gpu=0, device="cpu", threads=2, pool=DecoderPool())
    try:
        out = reader.read([PlannedSample("c", ("CAM",), (files["hevc"],), (info,), ("clip c",), (3, 14))])
    finally:
        reader.close()
    assert torch.equal(out[0][1, 0], stamped_rgb((7, 0, 14), 256, 256, _spec(files["hevc"])))
    bad, counts = decode_stream_waits(log.lines())
    assert bad == []
    assert counts["decode_streams"] >= 4 and counts["waits_on_decode_events"] > 0 and counts["host_waits"] > 0
    # Every thread that decoded had set its device first (engine threads and GOP threads alike).
    assert marker.devices and {device for _, device in marker.devices} == {0}
    # The check catches a decode stream that waits for a batch's release on the device, as the engine once did.
    log = FakeLog()
    monkeypatch.setattr(
        HostNvdecDevice,
        "synchronize",
        lambda self, event: self.memory.wait(self.memory.current_stream(self.gpu), event),
    )
    for _ in _engine_loader(index):
        pass
    bad, _ = decode_stream_waits(log.lines())
    assert bad and all(line.startswith("cuStreamWaitEvent") for line in bad)


def test_a_consumer_that_takes_20_ms_per_step_gets_every_stamp_and_keeps_the_batches_it_holds(
    dataset: Path, marker: Marker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A slow training step: the decode threads run ahead to the ring's end and wait there; every batch holds its
    own frames, and the batch before the current one (held, as Lightning holds one) is intact after the step."""
    import time

    from lightning_vstream.indexing import load_index

    index = load_index(dataset)
    fake_format(monkeypatch, index.clips[0].cameras[0].info)
    clips = _mark_dataset(marker, index)
    spec = _spec(index.clips[0].cameras[0].path)
    loader = _engine_loader(index)
    assert loader.executor.hold == 2
    previous: dict[str, Any] | None = None
    steps = 0
    for batch in loader:
        time.sleep(0.02)  # the training step
        assert not _batch_errors(batch, clips, spec)
        if previous is not None:
            assert not _batch_errors(previous, clips, spec), "a held batch was overwritten"
        previous = batch
        steps += 1
    plan = loader.engine.sampler.schedule()
    assert steps == len(plan)
    assert loader.stats.frames_decoded == loader.stats.frames_delivered + cut_decodes(plan, 6, 2)


def test_nvdec_memory_is_checked_before_the_first_step_for_the_engine_and_random_access(
    dataset: Path, files: dict[str, Path], marker: Marker, monkeypatch: pytest.MonkeyPatch, fake_log: FakeLog
) -> None:
    from lightning_vstream.clips.gpu_reader import make_reader
    from lightning_vstream.decode.device import HostMemory
    from lightning_vstream.errors import GpuMemoryError
    from lightning_vstream.indexing import load_index

    index = load_index(dataset)
    fake_format(monkeypatch, index.clips[0].cameras[0].info)
    monkeypatch.setattr(HostMemory, "mem_get_info", lambda self, gpu: (16 << 20, 1 << 30))
    with pytest.raises(
        GpuMemoryError,
        match=r"GPU 0 has 0.02 GiB free of 1.00 GiB, but NVDEC needs about 0.03 GiB for 4 decoders "
        r"\(4 x hevc 256x256 \(\d+ MiB each\)\).*Lower engine\.threads, batch_size or the cameras per step",
    ):
        _engine_loader(index)
    info = probed(files["hevc"])[0]
    with pytest.raises(
        GpuMemoryError,
        match=r"for 16 decoders \(8 x hevc 256x256.*Lower gop_threads \(engine\.threads of ClipVideoDataModule\) or decode\.max_open",
    ):
        make_reader("cuda:0", 2, 4, formats=[(files["hevc"], info)])
    assert not marker.decoders and not list(fake_log.calls("cuvidCreateDecoder"))  # refused before any existed


def test_the_memory_estimate_covers_what_a_decoder_asks_nvdec_and_the_driver_for(
    files: dict[str, Path], monkeypatch: pytest.MonkeyPatch, fake_log: FakeLog
) -> None:
    import re

    from lightning_vstream.decode.nvdec.memory import nvdec_bytes

    for name in ("hevc", "h264_bframes"):
        path = files[name]
        info = probe_video(path)
        fake_format(monkeypatch, info)
        log = FakeLog()
        with NvDecoder(path, info=info, pool=DecoderPool()) as dec:
            _read_all(dec, info.frame_count)
        lines = log.lines()
        created = [re.search(r"coded=\d+x(\d+) .*surfaces=(\d+) outSurfaces=(\d+) .*pitch=(\d+)", x) for x in lines]
        (found,) = [m for m in created if m]
        rows, surfaces, outputs, pitch = (int(v) for v in found.groups())
        allocated = (surfaces + outputs) * pitch * rows * 3 // 2
        allocated += sum(int(m.group(1)) for m in (re.match(r"cuMemAlloc (\d+)", x) for x in lines) if m)
        assert 0 < allocated <= nvdec_bytes(info.codec, info.width, info.height, 8), name


def test_stream_engine_skips_a_damaged_file_and_counts_it_over_the_real_library(
    dataset: Path, tmp_path: Path, marker: Marker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """on_error='skip' when every frame goes straight from NVDEC into its batch row: the damaged clip
    delivers its intact frames exactly, then its slot moves on, and the skip is counted once."""
    from lightning_vstream.index import CameraStream
    from lightning_vstream.indexing import load_index
    from lightning_vstream.stream.engine_loader import build_engine_loader
    from lightning_vstream.stream.sampler import StreamSampler

    index = load_index(dataset)
    fake_format(monkeypatch, index.clips[0].cameras[0].info)
    clips = _mark_dataset(marker, index)
    bad = index.clips[2]  # 15 frames: its packets from frame 7 on are damaged
    camera = bad.cameras[1]
    data = bytearray(camera.path.read_bytes())
    container = av.open(str(camera.path))
    positions = {packet.pts: packet.pos for packet in container.demux(video=0) if packet.size}
    container.close()
    assert camera.info is not None
    where = positions[camera.info.pts[7]] + 16
    data[where : where + 32] = bytes(32)
    damaged = tmp_path / camera.path.name
    damaged.write_bytes(bytes(data))
    cameras = (bad.cameras[0], CameraStream(camera.name, damaged, camera.info))
    index = replace(index, clips=(*list(index.clips)[:2], replace(bad, cameras=cameras)))
    sampler = StreamSampler([c.frame_count for c in index.clips], num_cameras=2, batch_size=2, shuffle=False)
    loader = build_engine_loader(
        index,
        sampler,
        "cuda:0",
        engine=EngineOptions(threads=2),
        gpu=GpuOptions(probe=False),
        errors=ErrorOptions(on_error="skip"),
    )
    spec = _spec(index.clips[0].cameras[0].path)
    delivered = []
    for batch in loader:
        for slot in range(2):
            if not batch["valid"][slot]:
                assert not batch["frames"][slot].any() and torch.isnan(batch["camera_timestamp"][slot]).all()
                continue
            stamp = (clips[batch["clip_id"][slot]], int(batch["frame_index"][slot]))
            for cam in range(2):
                expected = stamped_rgb((stamp[0], cam, stamp[1]), 256, 256, spec)
                assert torch.equal(batch["frames"][slot, cam], expected), (batch["step"], slot, cam, stamp)
            if stamp[0] == 2:
                delivered.append(stamp[1])
    # Frame 7's packet is demuxed while an earlier frame is read (NATIVE latency holds pictures back).
    assert delivered == list(range(len(delivered))) and 0 < len(delivered) <= 7
    stats = loader.stats
    assert (stats.read_errors, stats.skipped_clips, stats.bad_files) == (1, 1, 1)


@pytest.mark.parametrize("transform", [None, "resize"], ids=["decoded_into_the_ring", "transformed"])
def test_stream_engine_delivers_two_outputs_of_each_decoded_frame_over_the_real_library(
    dataset: Path, marker: Marker, monkeypatch: pytest.MonkeyPatch, fake_log: FakeLog, transform: str | None
) -> None:
    """``outputs`` on the GPU path: one decode per frame, every output made on the decode thread's stream.

    Without a transform the default output is converted straight into its ring row and the named
    outputs are made from that row; with one, every output is made from the decoded frame.
    """
    from lightning_vstream.indexing import load_index
    from lightning_vstream.stream.engine_loader import build_engine_loader
    from lightning_vstream.stream.sampler import StreamSampler
    from lightning_vstream.transforms import FrameTransform

    index = load_index(dataset)
    fake_format(monkeypatch, index.clips[0].cameras[0].info)
    clips = _mark_dataset(marker, index)
    default = FrameTransform(resize=(160, 160)) if transform else None
    outputs = {
        "small": FrameTransform(resize=(64, 96)),
        "normalized": FrameTransform(dtype="float32", mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25)),
    }
    sampler = StreamSampler([c.frame_count for c in index.clips], num_cameras=2, batch_size=2, shuffle=False)
    output = OutputOptions(transform=default, outputs=outputs)
    loader = build_engine_loader(
        index, sampler, "cuda:0", engine=EngineOptions(threads=2), gpu=GpuOptions(probe=False), output=output
    )
    assert loader.executor.steps.direct == (default is None)
    spec = _spec(index.clips[0].cameras[0].path)
    steps = 0
    pointers: dict[str, set[int]] = {"frames": set(), "small": set(), "normalized": set()}
    for batch in loader:
        steps += 1
        assert set(batch["outputs"]) == {"small", "normalized"}
        pointers["frames"].add(batch["frames"].data_ptr())
        for name in outputs:
            pointers[name].add(batch["outputs"][name]["frames"].data_ptr())
        assert batch["outputs"]["small"]["frames"].shape == (2, 2, 3, 64, 96)
        assert batch["outputs"]["normalized"]["frames"].dtype == torch.float32
        for slot in range(2):
            if not batch["valid"][slot]:  # padding: zero in every output
                assert not batch["frames"][slot].any()
                assert all(not batch["outputs"][name]["frames"][slot].any() for name in outputs)
                continue
            stamp = (clips[batch["clip_id"][slot]], int(batch["frame_index"][slot]))
            for camera in range(2):
                decoded = stamped_rgb((stamp[0], camera, stamp[1]), 256, 256, spec)
                expected = decoded if default is None else default(decoded[None])[0]
                assert torch.equal(batch["frames"][slot, camera], expected), (slot, camera, stamp)
                for name, made in outputs.items():
                    got = batch["outputs"][name]["frames"][slot, camera]
                    assert torch.equal(got, made(decoded[None])[0]), (name, slot, camera, stamp)
    assert steps == len(sampler.schedule())
    assert loader.stats.frames_decoded == loader.stats.frames_delivered + cut_decodes(sampler.schedule(), 6, 2)
    assert marker.decode_calls > 0 and len(marker.decoders) == 4  # each frame decoded once, for all outputs
    # Every output has a ring of its own, reused as the default output's is.
    ring = loader.executor.ring_size
    assert all(len(p) == ring for p in pointers.values()) and not set.intersection(*pointers.values())
    assert not list(fake_log.calls("cuStreamSynchronize"))


def test_random_access_batches_over_the_real_library(
    files: dict[str, Path], marker: Marker, monkeypatch: pytest.MonkeyPatch
) -> None:
    from lightning_vstream.clips.gpu_reader import BatchReader, PlannedSample

    names = ["hevc_open_gop_bframes", "h264_bframes"]
    infos = [probed(files[n])[0] for n in names]
    for number, info in enumerate(infos):
        marker.add(info, number, 0)
    # Both files are 256x256; the fake must reorder as deep as the deeper of them.
    fake_format(monkeypatch, max(infos, key=lambda i: i.reorder_depth or 0))
    reader = BatchReader(gpu=0, device="cpu", threads=2, pool=DecoderPool())
    samples = [
        PlannedSample(f"c{n}", ("CAM",), (files[name],), (infos[n],), (f"clip {n}",), (17, 3, 9, 10))
        for n, name in enumerate(names)
    ]
    try:
        out = reader.read(samples)
    finally:
        reader.close()
    for n, sample in enumerate(out):
        for t, index in enumerate((17, 3, 9, 10)):
            expected = stamped_rgb((n, 0, index), 256, 256, _spec(files[names[n]]))
            assert torch.equal(sample[t, 0], expected), (names[n], index)
    assert len(marker.decoders) == 2


# -- NvDecoder's own logic, over the real library ------------------------------------------------------
def test_forward_reads_within_a_gop_and_seeks_across_gops(
    files: dict[str, Path], marker: Marker, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = files["hevc"]
    info = probe_video(path)
    fake_format(monkeypatch, info)
    marker.add(info, 8, 0)
    dec = NvDecoder(path, info=info, pool=DecoderPool())
    got = {}
    got[2] = dec.get(2).clone()
    assert dec.seeks == 0  # first GOP: decoded from the start
    got[7] = dec.get(7).clone()
    assert dec.seeks == 0
    got[15] = dec.get(15).clone()
    assert dec.seeks == 1  # next GOP: one jump
    got[11] = dec.get(11).clone()
    assert dec.seeks == 2  # backwards: jump to its keyframe
    got[12] = dec.read().clone()
    assert dec.seeks == 2 and dec.position == 13
    dec.close()
    assert dec.position == 13 and "closed" in repr(dec)
    got[13] = dec.read().clone()  # reopens where it was
    dec.close()
    _assert_stamped(got, 8, path)


def test_a_demuxer_landing_past_the_keyframe_steps_back_one_gop(
    tmp_path: Path, marker: Marker, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = encode(tmp_path / "three_gops.mp4", "hevc", frames=30, gop=10, start=110.0)
    info = probe_video(path)
    fake_format(monkeypatch, info)
    marker.add(info, 9, 0)
    # A seek target for keyframe 1 that lands on keyframe 2, as some demuxers do.
    overshooting = replace(info, key_seek=(info.key_seek[0], info.pts[20], info.key_seek[2]))
    with NvDecoder(path, info=replace(overshooting, layout=None), pool=DecoderPool()) as dec:  # PyAV's demuxer
        frame = dec.get(12)
        assert dec.seeks == 2
    _assert_stamped({12: frame}, 9, path)
    # Read at the tables' places, the keyframe's packet is the frame table's own: one jump.
    with NvDecoder(path, info=overshooting, pool=DecoderPool()) as dec:
        frame = dec.get(12)
        assert dec.seeks == 1 and isinstance(dec._source, nvdec_sources.TableSource)
    _assert_stamped({12: frame}, 9, path)


@pytest.mark.parametrize("name", ["hevc", "hevc_open_gop_bframes", "h264_bframes"])
def test_frames_read_in_order_into_rows_are_exact_and_a_seek_after_them_lands_exactly(
    files: dict[str, Path], name: str, marker: Marker, monkeypatch: pytest.MonkeyPatch, reading: str
) -> None:
    """The streaming case (each frame the one after the last, written into a batch row) checks every frame as a
    seek does: its stamp, its timestamp and its export; then a seek back and reading on from there."""
    path = files[name]
    info = probe_video(path)
    fake_format(monkeypatch, info)
    marker.add(info, 12, 0)
    rows = torch.zeros((info.frame_count, 3, 256, 256), dtype=torch.uint8)
    pool = DecoderPool()
    dec = NvDecoder(path, info=info, pool=pool, stream="current")
    for i in range(info.frame_count):
        assert dec.get(i, out=rows[i]).data_ptr() == rows[i].data_ptr()  # written into the row itself
    assert dec.seeks == 0 and dec.position == info.frame_count
    _assert_stamped(dict(enumerate(rows)), 12, path)
    again = {i: dec.get(i).clone() for i in (3, 4, 5, 13, 14)}  # back to GOP 0, then on to GOP 1
    assert dec.seeks == 2
    _assert_stamped(again, 12, path)
    with pytest.raises(IndexError, match=r"frame 20 is out of range .* holds 20 frames"):
        dec.get(info.frame_count)
    dec.close()
    assert pool.idle() == 1


@pytest.mark.parametrize(("latency", "before"), [("native", 11), ("low", 13)])
def test_a_corrupt_packet_met_while_streaming_is_caught_and_its_decoder_dropped(
    files: dict[str, Path], marker: Marker, monkeypatch: pytest.MonkeyPatch, latency: Any, before: int, reading: str
) -> None:
    path = files["hevc"]
    info = probe_video(path)
    fake_format(monkeypatch, info)
    marker.add(info, 13, 0)
    assert info.crc32 is not None
    wrong = replace(info, crc32=tuple(c ^ 1 if i == 13 else c for i, c in enumerate(info.crc32)))
    pool = DecoderPool()
    dec = NvDecoder(path, info=wrong, pool=pool, stream="current", latency=latency, label="clip 'x', camera 'CAM'")
    row = torch.zeros((3, 256, 256), dtype=torch.uint8)
    got = {}
    with pytest.raises(
        VideoDecodeError, match=r"camera 'CAM'\) frame 13: the compressed data differs from the checksum"
    ):
        for i in range(info.frame_count):
            got[i] = dec.get(i, out=row).clone()
    # In NATIVE latency the library hands a picture out two Decode calls after its packet: frame 13's packet
    # is demuxed while frame 11 is read. In LOW latency each packet's picture comes out of its own Decode.
    assert sorted(got) == list(range(before))
    _assert_stamped(got, 13, path)
    assert pool.idle() == 0  # the decoder that met it is dropped, not reused


def test_packets_read_from_the_file_are_pynvvideocodecs_own_demuxers_byte_for_byte(files: dict[str, Path]) -> None:
    """What NVDEC is fed, from a file's bytes at the tables' places (or, for VP9 and MPEG-2, from PyAV's
    demuxer), is what PyNvVideoCodec's demuxer (FFmpeg's, with its Annex-B filters) hands out for the same
    file: the same bytes and timestamps, packet by packet."""
    import ctypes
    from types import SimpleNamespace

    nvc = import_pynvvideocodec()
    for name, path in files.items():
        info = probe_video(path)
        theirs = []
        demuxer = nvc.CreateDemuxer(str(path))
        while (packet := demuxer.Demux()).bsl:
            theirs.append((packet.pts, ctypes.string_at(packet.bsl_data, packet.bsl)))
        ours, data = [], SimpleNamespace()
        reader = nvdec_sources.packet_source(path, info, name)
        assert isinstance(reader, nvdec_sources.TableSource) == (name not in ("vp9", "mpeg2_bframes")), name
        while reader.fill(data):
            ours.append((data.pts, ctypes.string_at(data.bsl_data, data.bsl)))
        reader.close()
        assert ours == theirs, name


def test_a_file_is_read_at_its_tables_places_from_the_first_reading_on_and_a_replaced_file_is_refused(
    files: dict[str, Path], tmp_path: Path, marker: Marker, monkeypatch: pytest.MonkeyPatch
) -> None:
    from lightning_vstream.errors import FileChangedError
    from lightning_vstream.index.identity import file_identity

    path = tmp_path / "CAM_FRONT.mp4"
    path.write_bytes(files["hevc"].read_bytes())
    info = replace(probe_video(path), identity=file_identity(path))
    fake_format(monkeypatch, info)
    marker.add(info, 14, 0)
    opened = []
    real_open = nvdec_sources._open_input
    monkeypatch.setattr(nvdec_sources, "_open_input", lambda p: opened.append(p) or real_open(p))
    read = []
    for wanted in ((0, 1, 2, 15, 16), range(10), range(10, 20), (0, 1, 2, 15, 16)):
        with NvDecoder(path, info=info, pool=DecoderPool()) as dec:
            read.append({i: dec.get(i).clone() for i in wanted})
            assert isinstance(dec._source, nvdec_sources.TableSource)
    assert opened == []  # no demuxer, from the first reading on
    for frames in read:
        _assert_stamped(frames, 14, path)
    # Another file under the indexed name is caught when it is opened, not read at the old places.
    path.write_bytes(files["h264"].read_bytes())
    with pytest.raises(FileChangedError, match="CAM_FRONT.mp4"):
        NvDecoder(path, info=info, pool=DecoderPool()).get(0)


def test_hwc_layout_and_the_gpu_the_decoder_runs_on(
    files: dict[str, Path], marker: Marker, monkeypatch: pytest.MonkeyPatch, fake_log: FakeLog
) -> None:
    path = files["h264"]
    info = probe_video(path)
    fake_format(monkeypatch, info)
    marker.add(info, 10, 0)
    with NvDecoder(path, info=info, layout="hwc", pool=DecoderPool()) as dec:
        frame = dec.get(4)
        assert frame.shape == (256, 256, 3)
    _assert_stamped({4: frame.permute(2, 0, 1)}, 10, path)
    # device=1 reaches the library as gpuid=1: it retains GPU 1's primary context, then checks that the
    # decoder's stream belongs to it. The fake driver places every stream in GPU 0's context, so the check
    # fails here; on a GPU the stream is created on GPU 1 (torch.cuda.Stream(device=1)) and passes.
    with pytest.raises(VideoDecodeError, match="cudastream input argument does not correspond to cudacontext"):
        NvDecoder(path, info=info, device="cuda:1", pool=DecoderPool()).get(0)
    assert "cuDevicePrimaryCtxRetain dev=1" in fake_log.lines()


def test_wrong_timestamps_fail_and_drop_the_decoder(files: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    path = files["hevc"]
    info = probe_video(path)
    fake_format(monkeypatch, info)
    # Timestamps that are not the file's, read through the demuxer (at the tables' places a packet carries the
    # table's own timestamp, and its checksum proves it is the frame's packet).
    stale = replace(info, pts=tuple(p + 1 for p in info.pts), crc32=None, layout=None)
    pool = DecoderPool()
    dec = NvDecoder(path, info=stale, pool=pool, label="clip 'x', camera 'CAM'")
    with pytest.raises(VideoDecodeError, match=r"\(clip 'x', camera 'CAM'\) frame 0: .*timestamp 0, which is not in"):
        dec.read()
    assert pool.idle() == 0


def test_corrupt_packets_and_replaced_files_are_refused_before_decoding(
    files: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fake_log: FakeLog
) -> None:
    from lightning_vstream.errors import FileChangedError
    from lightning_vstream.index.identity import file_identity

    path = files["hevc"]
    info = probe_video(path)
    fake_format(monkeypatch, info)
    assert info.crc32 is not None
    wrong = replace(info, crc32=(info.crc32[0], info.crc32[1] ^ 1, *info.crc32[2:]))
    dec = NvDecoder(path, info=wrong, latency="native", pool=DecoderPool())
    with pytest.raises(VideoDecodeError, match=r"frame 1: the compressed data differs from the checksum"):
        dec.get(0)
    copy = tmp_path / "CAM_FRONT.mp4"
    copy.write_bytes(path.read_bytes())
    indexed = replace(probe_video(copy), identity=file_identity(copy))
    copy.write_bytes(files["h264"].read_bytes())  # another file under the indexed name
    created = len(list(fake_log.calls("cuvidCreateDecoder")))
    with pytest.raises(FileChangedError, match="CAM_FRONT.mp4"):
        NvDecoder(copy, info=indexed, pool=DecoderPool()).get(0)
    assert len(list(fake_log.calls("cuvidCreateDecoder"))) == created  # refused before a decoder existed


def test_formats_nvdec_or_the_conversion_cannot_take_are_refused_or_fall_back_to_the_cpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from lightning_vstream.decode.factory import nvdec_factory
    from lightning_vstream.demos.synth import read_stamp, write_stamped_video

    small = write_stamped_video(tmp_path / "small.mp4", clip=1, camera=0, frames=4, gop=2, codec="hevc", size=(64, 48))
    with pytest.raises(
        DecoderCapabilityError,
        match=r"\(clip 'x', camera 'CAM'\) is hevc 64x48 8-bit 4:2:0, outside what NVDEC on GPU 0 decodes "
        r".*144x144 to 8192x8192.*fallback=.cpu.",
    ):
        NvDecoder(small, pool=DecoderPool(), label="clip 'x', camera 'CAM'").read()
    odd = write_stamped_video(tmp_path / "odd.mp4", clip=1, camera=0, frames=4, gop=2, codec="hevc", size=(257, 255))
    with pytest.raises(DecoderCapabilityError, match=r"4:4:4: the GPU path converts only 4:2:0 frames"):
        NvDecoder(odd, pool=DecoderPool()).read()
    fallback = nvdec_factory(0, fallback="cpu")(small, None, "clip 'x', camera 'CAM'")
    assert [read_stamp(fallback.get(i)).frame for i in range(4)] == [0, 1, 2, 3]  # PyAV decoded them


def test_reading_frames_emits_no_nvtx_range_per_frame(files: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    from lightning_vstream import profiling

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
    path = files["hevc"]
    info = probe_video(path)
    fake_format(monkeypatch, info)
    with NvDecoder(path, info=info, pool=DecoderPool()) as dec:
        _read_all(dec, info.frame_count)
        assert pushed == []
        dec.get(2)  # a seek is rare: it shows as a demux range
    assert pushed == [profiling.RANGE_DEMUX]


def test_gop_decoder_latency_reuse_and_refusals(
    files: dict[str, Path], marker: Marker, monkeypatch: pytest.MonkeyPatch, fake_log: FakeLog
) -> None:
    from lightning_vstream.decode.gops import GopPlanner
    from lightning_vstream.decode.nvdec.decoder import NvGopDecoder

    def collect(decoder: NvGopDecoder, wanted: list[int]) -> dict[int, torch.Tensor]:
        planner = GopPlanner()
        planner.add_many(str(decoder.path), decoder.info, wanted, range(len(wanted)))
        out: dict[int, torch.Tensor] = {}
        for task in planner.tasks():
            decoder.decode_gop(task, lambda i, f: out.__setitem__(i, f.convert(f.surface)))
        return out

    pool = DecoderPool()
    for clip, name in enumerate(("hevc", "hevc_open_gop_bframes")):
        path = files[name]
        info = probe_video(path)
        fake_format(monkeypatch, info)
        marker.add(info, 11 + clip, 0)
        decoder = NvGopDecoder(path, info=info, gpu=0, pool=pool)
        _assert_stamped(collect(decoder, [13, 2, 5]), 11 + clip, path)
        assert decoder.frames_converted == 3 and decoder._key is not None
        assert decoder._key.latency == ("LOW" if info.reorder_depth == 0 else "NATIVE")
        decoder.close()
        decoder = NvGopDecoder(path, info=info, gpu=0, pool=pool)  # same file again: the pooled decoder
        _assert_stamped(collect(decoder, [7]), 11 + clip, path)
        decoder.close()
    assert pool.stats["created"] == 2 and pool.stats["reused"] == 2
    info = probe_video(files["h264"])
    fake_format(monkeypatch, info)
    # Timestamps that are not the file's, read through the demuxer (at the tables' places a packet carries the
    # table's own timestamp, and its checksum proves it is the frame's packet).
    stale = replace(info, pts=tuple(p + 1 for p in info.pts), crc32=None, layout=None)
    with pytest.raises(VideoDecodeError, match=r"h264\.mp4.*produced a frame with timestamp \d+, which is not in"):
        collect(NvGopDecoder(files["h264"], info=stale, gpu=0, pool=DecoderPool()), [3])
    assert info.crc32 is not None
    bad = replace(info, crc32=tuple(c ^ 1 if i == 12 else c for i, c in enumerate(info.crc32)))
    decoder = NvGopDecoder(files["h264"], info=bad, gpu=0, pool=DecoderPool(), label="clip 'x', camera 'CAM'")
    collect(decoder, [9])  # GOP 0 ends before frame 12
    with pytest.raises(
        VideoDecodeError, match=r"camera 'CAM'\) frame 12: the compressed data differs from the checksum"
    ):
        collect(decoder, [14])


def test_host_cost_benchmark_measures_bare_loop_and_engine_in_one_run(tmp_path: Path) -> None:
    import importlib.util
    import json

    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("gpu_host_cost", root / "benchmarks" / "gpu_host_cost.py")
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "host_cost.json"
    argv = ["--json", str(out), "--clips", "2", "--cameras", "2", "--frames", "12", "--gop", "6", "--repeats", "1"]
    assert bench.main([*argv, "--data-dir", str(tmp_path / "data")]) == 0
    result = json.loads(out.read_text())
    assert result["status"] == "ok" and result["rows"]["engine"]["frames_per_run"] == 48
    for key in ("bare_us_per_frame", "engine_us_per_frame", "ratio", "python_calls_per_frame", "torch_ops_per_frame"):
        assert result[key] > 0 or key == "torch_ops_per_frame", key
    assert result["ratio"] == result["engine_us_per_frame"] / result["bare_us_per_frame"]
    # The threaded bare loop decodes every frame the engine delivers, on a thread beside the caller.
    assert (
        result["rows"]["bare_threaded"]["frames_per_run"] == result["rows"]["bare_per_stream"]["frames_per_run"] == 48
    )
    assert result["ratio_to_bare_threaded"] == (
        result["engine_us_per_frame"] / result["rows"]["bare_threaded"]["cpu_us_per_frame"]["median"]
    )
    assert result["host_cores_at"]["4000"] == result["engine_us_per_frame"] * 4000 / 1e6
    assert result["conversion"]["calls"] > 0 and result["profile"]
    contended = result["contended"]
    assert set(contended["rows"]) == set(result["rows"]) and contended["ratio"] > 0
    assert contended["ratio"] == (
        contended["rows"]["engine"]["wall_us_per_frame"]["median"]
        / contended["rows"]["bare"]["wall_us_per_frame"]["median"]
    )
    imports = result["dlpack_import"]
    assert imports["seam_extra_us_per_frame"] == imports["seam_us"] - imports["gpu_us"]


def test_the_engine_creates_every_decoder_it_needs_before_the_first_step(
    tmp_path: Path, marker: Marker, monkeypatch: pytest.MonkeyPatch
) -> None:
    from lightning_vstream.decode.nvdec import memory as nvdec_memory
    from lightning_vstream.indexing import load_index
    from lightning_vstream.indexing.build import build_index
    from lightning_vstream.stream.engine_loader import build_engine_loader
    from lightning_vstream.stream.sampler import StreamSampler

    for clip, codec in enumerate(("hevc", "h264", "hevc")):  # two formats: the H.264 clip comes second
        for camera in range(2):
            path = tmp_path / "videos" / f"scene-{clip:04d}" / f"CAM_{camera}.mp4"
            path.parent.mkdir(parents=True, exist_ok=True)
            encode(path, codec, frames=8, gop=4, start=300.0 + 20 * clip + 10 * camera)
    index = load_index(build_index(tmp_path, output=tmp_path / "index.json", progress=False))
    fake_format(monkeypatch, index.clips[0].cameras[0].info)
    clips = _mark_dataset(marker, index)
    sampler = StreamSampler([c.frame_count for c in index.clips], num_cameras=2, batch_size=1, shuffle=False)
    loader = build_engine_loader(index, sampler, "cuda:0", engine=EngineOptions(threads=2), gpu=GpuOptions(probe=False))
    batches = iter(loader)
    first = next(batches)
    before_first_step = len(marker.decoders)
    assert before_first_step == 4  # 2 threads x 1 stream each x 2 formats, all before the first batch
    seen = [first, *batches]
    assert len(marker.decoders) == before_first_step  # no decoder created at a clip switch
    assert [clips[b["clip_id"][0]] for b in seen] == [0] * 8 + [1] * 8 + [2] * 8
    # A second epoch's threads use the first's streams: no decoder is created, none is prepared again.
    prepared = []
    real_prepare = nvdec_memory.prepare_decoders
    monkeypatch.setattr(nvdec_memory, "prepare_decoders", lambda *a, **k: prepared.append(1) or real_prepare(*a, **k))
    sampler.set_epoch(1)
    assert len(list(loader)) == 24
    assert len(marker.decoders) == before_first_step and not prepared


# -- vstream doctor over the test driver ---------------------------------------------------------------
def test_doctor_runs_every_check_it_can_and_says_what_it_cannot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import json
    import os

    from lightning_vstream import doctor

    monkeypatch.setenv("FAKE_W", "256")
    monkeypatch.setenv("FAKE_H", "256")
    monkeypatch.setenv("FAKE_CODED_W", "256")
    monkeypatch.setenv("FAKE_CODED_H", "256")
    real = doctor._compare

    def compare(entry: dict[str, Any], gpu: int, host: bool) -> dict[str, Any]:
        # The fake driver announces one bit depth and reorders as told: as each file needs.
        os.environ["FAKE_DEPTH"] = str(entry["depth"])
        os.environ["FAKE_REORDER"] = str(probe_video(entry["path"]).reorder_depth or 0)
        try:
            return real(entry, gpu, host)
        finally:
            os.environ["FAKE_DEPTH"], os.environ["FAKE_REORDER"] = "8", "0"

    monkeypatch.setattr(doctor, "_compare", compare)
    monkeypatch.setattr(nvdec, "_probed", {})
    out = tmp_path / "doctor.json"
    assert doctor.run_doctor(json_path=out, size=(256, 256), frames=12, timing_frames=12) == 0
    printed = capsys.readouterr().out
    assert "MODE: a test driver stands in for the GPU" in printed and "pixels not checked" in printed
    report = json.loads(out.read_text())
    assert report["schema"] == doctor.SCHEMA and report["mode"] == "test-driver" and report["status"] == "limited"
    assert report["environment"]["pynvvideocodec"] == "2.2.4" and report["nvdec"]["engines"] == 7
    assert report["nvdec"]["codecs"]["hevc"]["10-bit"] == {
        "supported": True,
        "engines": 7,
        "min": "144x144",
        "max": "8192x8192",
    }
    assert [r["file"] for r in report["frames"]] == [
        "hevc 8-bit",
        "hevc 8-bit, B-frames (open GOP)",
        "h264 8-bit",
        "h264 8-bit, B-frames",
        "hevc 10-bit, B-frames",
    ]
    assert all(r["status"] == "limited" and r["stamps"].startswith("not checked") for r in report["frames"])
    assert [r["latency"] for r in report["frames"]] == ["LOW", "NATIVE", "LOW", "NATIVE", "NATIVE"]
    throughput = report["throughput"]
    assert throughput["raw_nvdec_1"]["frames"] == throughput["engine"]["frames"] == 2 * 6 * 12
    assert throughput["workers"]["status"] == "skipped"


# -- the GPU first run, end to end over the test driver -------------------------------------------------
@pytest.mark.slow
def test_the_gpu_first_run_suite_runs_every_section_over_the_test_driver(tmp_path: Path) -> None:
    """``benchmarks/gpu_first_run.py`` as a lent GPU runs it: every section in a process of its own, the JSON
    written after each; pixels and timings are "not checked" here. One section's abort loses only that section."""
    import json
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    script = str(root / "benchmarks" / "gpu_first_run.py")
    env = {**os.environ, "FAKE_LOG": os.devnull}
    out = tmp_path / "out"
    command = [sys.executable, script, "--budget", "110", "--out", str(out), "--data-dir", str(tmp_path / "data")]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env, check=False)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    report = json.loads((out / "gpu_first_run.json").read_text())
    sections = report["sections"]
    names = [
        "environment",
        "data",
        "kernel",
        "stamps",
        "stride",
        "raw_nvdec",
        "engine",
        "slow_consumer",
        "random_access",
    ]
    assert report["mode"] == "test-driver" and list(sections) == names
    assert {name: s["status"] for name, s in sections.items()} == {
        name: "ok" if name == "data" else "limited" for name in names
    }
    not_checked = "not checked: the test driver decodes no pixels and times no GPU work"
    assert sections["environment"]["pynvvideocodec"] == "2.2.4" and sections["environment"]["nvdec"]["engines"] == 7
    assert sections["data"]["files"] == 5 + 12 + 1 and "sm_90" in sections["kernel"]["compiled"]
    files = sections["stamps"]["files"]
    assert [f["file"] for f in files][-1] == "hevc 10-bit, B-frames" and sections["stamps"]["stamps"] == not_checked
    assert all(f["in_order"]["stamps"] == f["shuffled"]["stamps"] == not_checked for f in files)
    assert all(f["shuffled_seeks"] > 0 for f in files)  # the shuffled order jumps between GOPs
    assert all(f["in_order"]["packets_skipped"] == 0 for f in files)  # every frame read: every packet fed
    assert any(f["shuffled"]["packets_skipped"] > 0 for f in files)  # B-frames before a frame read: never fed
    # The stride layout read at its stride: NVDEC is fed the frames read (and the stream's last reference, to bring
    # the last one out); the usual layout read at the same stride decodes every frame up to the last one read.
    stride = sections["stride"]
    ours, usual = stride["stride_layout_stride_6"], stride["usual_layout_stride_6"]
    assert ours["packets_fed"] + ours["packets_skipped"] == stride["stride_layout_stride_1"]["packets_fed"] == 12
    assert ours["packets_skipped"] == stride["stride6_packets_skipped"] > 0 and usual["packets_skipped"] == 0
    assert ours["frames_decoded"] < usual["frames_decoded"] and ours["seeks"] == 0
    assert stride["stride_layout_stride_1"]["packets_skipped"] == 0 and stride["random_access"]["packets_skipped"] > 0
    assert stride["stamps"] == stride["stride6_over_ippp"] == not_checked
    assert sorted(int(n) for n in sections["raw_nvdec"]["rows"]) == [1, 7, 14, 28]
    assert all(r["frames"] > 0 and r["frames_per_s"] == not_checked for r in sections["raw_nvdec"]["rows"].values())
    engine = sections["engine"]
    assert engine["light"]["camera_frames"] > 0 and engine["heavy"]["python_ms_per_step"] == 2.0
    assert engine["over_raw"] == engine["light_camera_frames_per_s"] == not_checked
    assert sections["slow_consumer"]["steps"] > 0 and sections["random_access"]["samples"] > 0
    assert engine["light"]["frames_decoded"] > 0 and engine["light"]["packets_skipped"] == 0  # no B-frames
    assert sections["random_access"]["frames_decoded"] > 0 and sections["random_access"]["packets_skipped"] == 0
    summary = report["summary"]
    assert summary["every_stamp_exact"] == summary["colour_within_tolerance"] == not_checked
    assert summary["stream_camera_frames_per_s"]["met"] == summary["stride6_over_ippp"]["met"] == not_checked
    assert summary["nvdec_work_saved"]["stride_layout_at_stride_6"] == ours["nvdec_work_saved"] > 0.5
    # A section that aborts (as a CUDA fault inside the library ends its process) loses only itself. The section
    # beside it is the cheapest one (making the data again), which a crash must leave as it was.
    crashed = tmp_path / "crashed"
    command = [sys.executable, script, "--budget", "60", "--out", str(crashed), "--only", "data,kernel"]
    command += ["--data-dir", str(tmp_path / "data")]
    env["VSTREAM_FIRST_RUN_ABORT"] = "kernel"
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env, check=False)
    report = json.loads((crashed / "gpu_first_run.json").read_text())
    assert done.returncode == 1 and report["sections"]["data"]["status"] == "ok"
    assert (
        report["sections"]["kernel"]["status"] == "crashed" and "exit code -6" in report["sections"]["kernel"]["reason"]
    )

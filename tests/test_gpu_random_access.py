"""GPU random access: the NVDEC GOP decoder, batched reads and GPU image decoding.

The GOP decoder and the batch reader run against the real PyNvVideoCodec over the fake NVIDIA driver
in ``tests/test_gpu_nvdriver.py``; here they decode real pictures on the one stand-in
(``tests/_fake_nvc.py``: FFmpeg behind the library's call names, output buffers reused as the
library reuses them), which also stands in for CUDA errors inside ``Decode``. ``decode_images`` runs
through a stand-in torchvision. The ``cuda`` tests use real NVDEC / nvJPEG on 256x256 H.264 and HEVC
4:2:0 files.
"""

from __future__ import annotations

import random
import sys
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from _fake_nvc import StandInMemory, caps_runner, fake_module

from lightning_vstream import DecodeOptions
from lightning_vstream.clips.batch import collate_clips
from lightning_vstream.clips.dataset import VideoClipDataset
from lightning_vstream.clips.gpu_reader import BatchReader, PlannedSample
from lightning_vstream.clips.selection import at_indices
from lightning_vstream.decode.base import VideoDecodeError
from lightning_vstream.decode.cpu.probe import probe_video
from lightning_vstream.decode.cpu.pyav import PyAVDecoder
from lightning_vstream.decode.gops import GopPlanner, GopTask
from lightning_vstream.decode.images import decode_images
from lightning_vstream.decode.nvdec import decoder as decode_gpu
from lightning_vstream.decode.nvdec import session as nvdec
from lightning_vstream.decode.nvdec.decoder import NvGopDecoder
from lightning_vstream.decode.nvdec.nv12 import ColorSpec, nv12_to_rgb
from lightning_vstream.decode.nvdec.pool import DecoderPool
from lightning_vstream.decode.threads import GopExecutor
from lightning_vstream.demos.synth import read_stamp, write_dataset, write_stamped_video
from lightning_vstream.errors import DecoderCapabilityError, WorkerError
from lightning_vstream.indexing import load_index

FRAMES = 24
GOP = 8


@pytest.fixture
def fake_nvc(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    module = fake_module()
    monkeypatch.setitem(sys.modules, "PyNvVideoCodec", module)
    monkeypatch.setattr(nvdec, "_caps_tables", {})
    nvdec.gpu_caps(0, runner=caps_runner(num_decoder_engines=3))
    return module


@pytest.fixture(scope="module")
def videos(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("gpu_ra")
    specs = {
        "h264": {"clip": 1, "codec": "h264"},
        "hevc": {"clip": 2, "codec": "hevc"},
        "h264_bframes": {"clip": 3, "codec": "h264", "bframes": 2},
        "hevc_bframes": {"clip": 4, "codec": "hevc", "bframes": 2},
    }
    return {
        name: write_stamped_video(root / f"{name}.mp4", camera=0, frames=FRAMES, gop=GOP, size=(256, 256), **spec)  # type: ignore[arg-type]
        for name, spec in specs.items()
    }


def _gop_decoder(path: Path, **kwargs: Any) -> NvGopDecoder:
    return NvGopDecoder(
        path, info=kwargs.pop("info", None) or probe_video(path), gpu=0, memory=StandInMemory(), **kwargs
    )


def _collect(decoder: NvGopDecoder, frames: list[int]) -> dict[int, torch.Tensor]:
    planner = GopPlanner()
    planner.add_many(str(decoder.path), decoder.info, frames, range(len(frames)))
    out: dict[int, torch.Tensor] = {}
    for task in planner.tasks():

        def emit(index: int, frame: Any) -> None:
            image = torch.empty((3, decoder.info.height, decoder.info.width), dtype=torch.uint8)
            frame.write_into(image)
            out[index] = image

        decoder.decode_gop(task, emit)
    return out


# -- colour conversion (the shared converter, on this path's surfaces) ----------------------------
def test_nv12_surfaces_convert_like_ffmpeg(videos: dict[str, Path]) -> None:
    import av

    with av.open(str(videos["h264"])) as container:
        frame = next(container.decode(video=0))
        nv12 = torch.from_numpy(frame.to_ndarray(format="nv12").copy())
        reference = torch.from_numpy(frame.to_ndarray(format="rgb24")).permute(2, 0, 1).to(torch.int16)
    out = nv12_to_rgb(nv12, ColorSpec("bt601", False), out=torch.empty(3, 256, 256, dtype=torch.uint8))
    diff = (out.to(torch.int16) - reference).abs()
    assert diff.float().mean() < 3.0 and read_stamp(out).frame == 0


# -- the GOP decoder on real pictures (the stand-in) ---------------------------------------------------
@pytest.mark.parametrize("name", ["h264", "hevc", "h264_bframes", "hevc_bframes"])
def test_gop_decoder_returns_exact_frames(fake_nvc: types.ModuleType, videos: dict[str, Path], name: str) -> None:
    decoder = _gop_decoder(videos[name], pool=DecoderPool())
    wanted = [23, 2, 9, 10, 15, 0, 7]
    frames = _collect(decoder, wanted)
    assert sorted(frames) == sorted(set(wanted))
    with PyAVDecoder(videos[name]) as cpu:
        for index, image in frames.items():
            assert read_stamp(image).frame == index
            assert (image.int() - cpu.get(index).int()).abs().float().mean() < 1.0  # the CPU decoder's picture
    # Only the wanted frames were converted; the others of their GOPs only decoded.
    assert decoder.frames_converted == len(set(wanted))
    decoder.close()


def test_nvdec_failures_are_the_gpus_or_the_files_and_the_decoder_is_dropped_unflushed(
    fake_nvc: types.ModuleType, videos: dict[str, Path]
) -> None:
    from lightning_vstream.errors import GpuError

    for message, error, match in (
        ("CUDA driver API error CUDA_ERROR_LAUNCH_FAILED", GpuError, r"hevc\.mp4.* frame 4: the GPU failed"),
        ("cuvidParseVideoData(m_hParser, &packet) returned error 1", VideoDecodeError, r"frame 4: decoding failed"),
    ):
        pool = DecoderPool()
        decoder = _gop_decoder(videos["hevc"], pool=pool)
        _collect(decoder, [1])
        fake_nvc.fail_decode = message
        with pytest.raises(error, match=match) as raised:
            _collect(decoder, [4])
        assert isinstance(raised.value, GpuError) == (error is GpuError)
        fake_nvc.fail_decode = ""
        decoder.close()
        assert fake_nvc.created[-1].flushes == 1 and pool.idle() == 0  # flushed before GOP 0's read, never after


def test_unsupported_formats_are_refused_clearly(
    fake_nvc: types.ModuleType, videos: dict[str, Path], tmp_path: Path
) -> None:
    odd = write_stamped_video(tmp_path / "odd.mp4", clip=1, camera=0, frames=4, size=(255, 255))  # 4:4:4
    with pytest.raises(
        DecoderCapabilityError, match=r"odd\.mp4.* is h264 255x255 8-bit 4:4:4.*the GPU path converts only 4:2:0 frames"
    ):
        _collect(_gop_decoder(odd, pool=DecoderPool()), [0])
    nvdec._caps_tables.clear()
    nvdec.gpu_caps(0, runner=caps_runner(width_min=512))
    with pytest.raises(
        DecoderCapabilityError, match=r"hevc\.mp4.* is hevc 256x256 8-bit .*outside what NVDEC on GPU 0 decodes"
    ):
        _collect(_gop_decoder(videos["hevc"], pool=DecoderPool()), [0])


def test_engine_count_comes_from_the_capabilities(fake_nvc: types.ModuleType) -> None:
    assert nvdec.num_decoder_engines(0, "hevc") == 3


def test_a_hung_decoder_times_out_instead_of_hanging_the_batch() -> None:
    import threading

    release = threading.Event()

    class Hung:
        def decode_gop(self, task: GopTask, emit: Any) -> None:
            release.wait(30)

        def close(self) -> None:
            pass

    executor = GopExecutor(lambda task: Hung(), workers=2)
    planner = GopPlanner()
    from lightning_vstream.index.tables import VideoInfo

    table = VideoInfo("hevc", 256, 256, (1, 12), tuple(range(16)), (0, 8), (0, 8), 12.0)
    planner.add_many("a.mp4", table, [1, 9], [0, 1])
    try:
        with pytest.raises(WorkerError, match=r"2 of 2 GOP decoding threads did not finish within timeout=0\.2 s"):
            executor.run(planner.tasks(), lambda *a: None, timeout=0.2)
    finally:
        release.set()
        executor.close()


# -- batched reads on the GPU path (stand-in decoder, CPU tensors) --------------------------------
def test_batch_reader_gpu_path_is_frame_exact(
    fake_nvc: types.ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    index_path = write_dataset(tmp_path, clips=2, cameras=3, frames=FRAMES, size=(256, 256), codec="hevc", gop=GOP)
    index = load_index(index_path)
    rng = random.Random(11)
    samples = []
    for clip in index.clips:
        for _ in range(2):
            indices = tuple(rng.randrange(FRAMES) for _ in range(3))
            samples.append(
                PlannedSample(
                    clip.clip_id,
                    tuple(c.name for c in clip.cameras),
                    tuple(c.path for c in clip.cameras),
                    tuple(c.info for c in clip.cameras),
                    tuple(c.name for c in clip.cameras),
                    indices,
                )
            )
    reader = BatchReader(gpu=0, device="cpu", threads=3, pool=DecoderPool())
    import lightning_vstream.decode.device as device_module

    monkeypatch.setattr(device_module, "frame_memory", StandInMemory)
    monkeypatch.setattr(decode_gpu, "frame_memory", StandInMemory)
    try:
        out = reader.read(samples)
        for sample, got in zip(samples, out):
            for t, index_ in enumerate(sample.indices):
                for c in range(3):
                    stamp = read_stamp(got[t, c])
                    assert (stamp.camera, stamp.frame) == (c, index_)
        assert out[0].untyped_storage().data_ptr() == out[1].untyped_storage().data_ptr()
    finally:
        reader.close()


# -- GPU image decoding with a stand-in torchvision ----------------------------------------------
@pytest.fixture
def image_folder(tmp_path: Path) -> list[Path]:
    from PIL import Image

    files = []
    for i in range(3):
        image = np.zeros((32, 48, 3), dtype=np.uint8)
        image[:, :, 0] = 40 * i
        path = tmp_path / f"frame_{i}.jpg"
        Image.fromarray(image).save(path, quality=95)
        files.append(path)
    png = tmp_path / "frame_3.png"
    Image.fromarray(np.full((32, 48, 3), 200, dtype=np.uint8)).save(png)
    return [*files, png]


def _fake_torchvision(calls: list[Any]) -> types.ModuleType:
    from PIL import Image

    io = types.ModuleType("torchvision.io")
    io.ImageReadMode = types.SimpleNamespace(RGB="RGB")  # type: ignore[attr-defined]

    def decode_jpeg(data: Any, mode: Any = None, device: Any = "cpu") -> Any:
        calls.append((len(data) if isinstance(data, list) else 1, mode, str(device)))
        import io as stdio

        def one(raw: torch.Tensor) -> torch.Tensor:
            with Image.open(stdio.BytesIO(raw.numpy().tobytes())) as image:
                return torch.from_numpy(np.array(image.convert("RGB"))).permute(2, 0, 1)

        return [one(d) for d in data] if isinstance(data, list) else one(data)

    io.decode_jpeg = decode_jpeg  # type: ignore[attr-defined]
    package = types.ModuleType("torchvision")
    package.io = io  # type: ignore[attr-defined]
    return package


def test_gpu_images_decode_jpegs_in_one_batched_call(image_folder: list[Path], monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[Any] = []
    package = _fake_torchvision(calls)
    monkeypatch.setitem(sys.modules, "torchvision", package)
    monkeypatch.setitem(sys.modules, "torchvision.io", package.io)
    # The stand-in decodes on the CPU; the device only has to say "cuda" to choose the GPU path.
    monkeypatch.setattr(torch.Tensor, "to", lambda self, *a, **k: self)
    out = decode_images(image_folder, device=torch.device("cuda", 0))
    assert calls == [(3, "RGB", "cuda:0")]
    assert [tuple(t.shape) for t in out] == [(3, 32, 48)] * 4
    for i, image in enumerate(out[:3]):
        assert abs(float(image[0].float().mean()) - 40 * i) < 4  # JPEG's red channel, in frame order
    assert abs(float(out[3].float().mean()) - 200) < 1  # the PNG, through Pillow


def test_gpu_images_without_torchvision(image_folder: list[Path], monkeypatch: pytest.MonkeyPatch) -> None:
    from lightning_vstream.decode import images

    monkeypatch.setitem(sys.modules, "torchvision", None)
    monkeypatch.setitem(sys.modules, "torchvision.io", None)
    with pytest.raises(ImportError, match=r"GPU JPEG decoding needs torchvision >= 0\.19.*jpeg='pillow'"):
        decode_images(image_folder, device=torch.device("cuda", 0), jpeg="nvjpeg")
    monkeypatch.setattr(images, "_warned_no_nvjpeg", False)
    monkeypatch.setattr(torch.Tensor, "to", lambda self, *a, **k: self)
    with pytest.warns(UserWarning, match=r"torchvision is not available: JPEG frames decode on the CPU with Pillow"):
        out = decode_images(image_folder, device=torch.device("cuda", 0))
    assert len(out) == 4
    with pytest.raises(ValueError, match=r"jpeg='turbo' is not supported"):
        decode_images(image_folder, jpeg="turbo")  # type: ignore[arg-type]


def test_gpu_image_decoder_failure_names_the_file(image_folder: list[Path], monkeypatch: pytest.MonkeyPatch) -> None:
    image_folder[1].write_bytes(b"\xff\xd8 not a jpeg")
    calls: list[Any] = []
    package = _fake_torchvision(calls)

    def failing(data: Any, mode: Any = None, device: Any = "cpu") -> Any:
        if isinstance(data, list) or data.numel() < 20:
            raise RuntimeError("nvjpeg: bad bitstream")
        return torch.zeros(3, 32, 48, dtype=torch.uint8)

    package.io.decode_jpeg = failing  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torchvision", package)
    monkeypatch.setitem(sys.modules, "torchvision.io", package.io)
    with pytest.raises(VideoDecodeError, match=r"frame_1\.jpg'.*GPU JPEG decoder failed: nvjpeg: bad bitstream"):
        decode_images(image_folder, device=torch.device("cuda", 0))


# -- the benchmark without CUDA -------------------------------------------------------------------
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU path")
def test_benchmark_without_cuda_exits_cleanly(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import importlib.util
    import json

    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("gpu_random_access", root / "benchmarks" / "gpu_random_access.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = tmp_path / "result.json"
    assert module.main(["--out", str(out)]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err
    assert json.loads(out.read_text())["status"] == "skipped"


def test_benchmark_cpu_mode_measures_and_checks_frames(
    tmp_path: Path, make_dataset: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib.util
    import json

    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("gpu_random_access_cpu", root / "benchmarks" / "gpu_random_access.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    index = make_dataset(clips=2, cameras=6, frames=12, size=(64, 48), gop=4)
    monkeypatch.setattr(module, "prepare_random", lambda args: index)  # small data; the measuring is under test
    out = tmp_path / "cpu.json"
    argv = [
        "--cpu-only",
        "--samples",
        "4",
        "--batch-size",
        "2",
        "--threads",
        "2",
        "--repeats",
        "1",
        "--data-dir",
        str(tmp_path / "data"),
        "--out",
        str(out),
    ]
    assert module.main(argv) == 0
    rows = json.loads(out.read_text())["random_cpu"]["rows"]
    assert [r["peer"] for r in rows] == ["vstream_cpu_per_sample", "vstream_cpu_gop_threads_2", "vstream_cpu_keyframe"]
    assert all(r["camera_frames_per_s"]["median"] > 0 and r["frames_per_repeat"] == 24 for r in rows)


# -- real GPU -------------------------------------------------------------------------------------
@pytest.mark.cuda
@pytest.mark.parametrize("codec", ["h264", "hevc"])
def test_cuda_random_access_is_frame_exact(tmp_path: Path, codec: str) -> None:
    index_path = write_dataset(
        tmp_path, clips=2, cameras=3, frames=FRAMES, size=(256, 256), codec=codec, gop=GOP, bframes=2
    )
    index = load_index(index_path)
    rng = random.Random(5)
    requests = [at_indices(c.clip_id, [rng.randrange(FRAMES) for _ in range(4)]) for c in index.clips for _ in range(3)]
    gpu = VideoClipDataset(index=index, requests=requests, decode=DecodeOptions(device="cuda"))
    cpu = VideoClipDataset(index=index, requests=requests)
    from torch.utils.data import DataLoader

    try:
        batch = next(iter(DataLoader(gpu, batch_size=len(requests), collate_fn=collate_clips, num_workers=0)))
        assert batch["frames"].is_cuda
        frames = batch["frames"].cpu()
        for b in range(len(requests)):
            reference = cpu[b]
            assert batch["frame_index"][b].tolist() == reference["frame_index"].tolist()
            for t, index_ in enumerate(reference["frame_index"].tolist()):
                for c in range(3):
                    assert read_stamp(frames[b, t, c]).frame == index_
            diff = (frames[b].to(torch.int16) - reference["frames"].to(torch.int16)).abs().float().mean()
            assert diff < 4.0  # colour within the documented tolerance of the CPU path
    finally:
        gpu.close()


@pytest.mark.cuda
def test_cuda_nearest_keyframe_policy(tmp_path: Path) -> None:
    index_path = write_dataset(tmp_path, clips=1, cameras=2, frames=FRAMES, size=(256, 256), codec="hevc", gop=GOP)
    index = load_index(index_path)
    dataset = VideoClipDataset(
        index=index,
        requests=[at_indices(index.clips[0].clip_id, [3, 13, 21])],
        decode=DecodeOptions(device="cuda"),
        frame_policy="nearest_keyframe",
    )
    try:
        sample = dataset[0]
        assert sample["frame_index"].tolist() == [0, 16, 16]  # keyframes 0, 8, 16: nearest, ties to the earlier
        for t, index_ in enumerate(sample["frame_index"].tolist()):
            assert read_stamp(sample["frames"][t, 0].cpu()).frame == index_
    finally:
        dataset.close()


@pytest.mark.cuda
def test_cuda_images_decode_on_the_gpu(tmp_path: Path) -> None:
    pytest.importorskip("torchvision")
    index_path = write_dataset(tmp_path, clips=1, cameras=2, frames=6, size=(256, 256))
    # Convert each camera to a folder of JPEGs.
    from PIL import Image

    index = load_index(index_path)
    files = []
    for cam in index.clips[0].cameras:
        decoder = PyAVDecoder(cam.path)
        folder = tmp_path / "jpg" / cam.name
        folder.mkdir(parents=True)
        for i in range(6):
            path = folder / f"{i:04d}.jpg"
            Image.fromarray(decoder.get(i).permute(1, 2, 0).numpy()).save(path, quality=95)
            files.append(path)
    out = decode_images(files, device="cuda", jpeg="nvjpeg")
    assert all(t.is_cuda for t in out)
    assert [read_stamp(t.cpu()).frame for t in out] == list(range(6)) * 2

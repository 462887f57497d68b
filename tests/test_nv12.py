"""NV12 / P016 -> RGB, torch and the fused Triton kernel, against each other and FFmpeg's conversion (PyAV)."""

from __future__ import annotations

from pathlib import Path

import av
import numpy as np
import pytest
import torch

from lightning_vstream.decode.nv12 import (
    ColorSpec,
    Nv12Converter,
    color_spec_from_stream,
    nv12_to_rgb,
)
from lightning_vstream.demos.synth import read_stamp, write_stamped_video
from lightning_vstream.errors import DecoderCapabilityError


@pytest.fixture(scope="module")
def frame(tmp_path_factory: pytest.TempPathFactory) -> av.VideoFrame:
    path = write_stamped_video(
        tmp_path_factory.mktemp("color") / "v.mp4", clip=3, camera=1, frames=2, gop=2, codec="hevc", size=(256, 256)
    )
    with av.open(str(path)) as container:
        return next(container.decode(video=0))


def _reference(frame: av.VideoFrame, matrix: str, full: bool) -> torch.Tensor:
    colorspace = {"bt601": "ITU601", "bt709": "ITU709"}[matrix]
    rgb = frame.reformat(format="rgb24", src_colorspace=colorspace, src_color_range="JPEG" if full else "MPEG")
    return torch.from_numpy(rgb.to_ndarray()).permute(2, 0, 1)


@pytest.mark.parametrize("matrix", ["bt601", "bt709"])
@pytest.mark.parametrize("full", [False, True])
def test_matches_ffmpeg_for_each_matrix_and_range(frame: av.VideoFrame, matrix: str, full: bool) -> None:
    nv12 = torch.from_numpy(frame.to_ndarray(format="nv12"))
    ours = nv12_to_rgb(nv12, ColorSpec(matrix, full_range=full)).int()  # type: ignore[arg-type]
    diff = (ours - _reference(frame, matrix, full).int()).abs()
    assert diff.max() <= 3 and diff.float().mean() < 0.5
    assert read_stamp(ours.to(torch.uint8)).frame == 0


def test_wrong_matrix_is_visibly_different(frame: av.VideoFrame) -> None:
    """Why the matrix matters: BT.709 read as BT.601 shifts colours by more than the tolerance."""
    nv12 = torch.from_numpy(frame.to_ndarray(format="nv12"))
    wrong = nv12_to_rgb(nv12, ColorSpec("bt709")).int()
    assert (wrong - _reference(frame, "bt601", False).int()).abs().max() > 3


def test_untagged_stream_uses_bt601_like_ffmpeg(frame: av.VideoFrame) -> None:
    spec = color_spec_from_stream(frame.colorspace, frame.color_range, frame.format.name)
    assert spec == ColorSpec("bt601", full_range=False)
    ours = nv12_to_rgb(torch.from_numpy(frame.to_ndarray(format="nv12")), spec).int()
    assert (ours - torch.from_numpy(frame.to_ndarray(format="rgb24")).permute(2, 0, 1).int()).abs().max() <= 3


@pytest.mark.parametrize(
    ("colorspace", "color_range", "pix_fmt", "expected"),
    [
        (1, 1, "yuv420p", ColorSpec("bt709", False)),
        (5, 0, "yuv420p", ColorSpec("bt601", False)),
        (9, 2, "yuv420p10le", ColorSpec("bt2020", True)),
        (None, None, "yuvj420p", ColorSpec("bt601", True)),
    ],
)
def test_color_spec_follows_the_tags(
    colorspace: int | None, color_range: int | None, pix_fmt: str, expected: ColorSpec
) -> None:
    assert color_spec_from_stream(colorspace, color_range, pix_fmt) == expected


def test_hwc_layout_and_writing_into_a_batch_row(frame: av.VideoFrame) -> None:
    nv12 = torch.from_numpy(frame.to_ndarray(format="nv12"))
    chw = nv12_to_rgb(nv12)
    hwc = nv12_to_rgb(nv12, layout="hwc")
    assert torch.equal(hwc.permute(2, 0, 1), chw)
    batch = torch.zeros(2, 3, 256, 256, dtype=torch.uint8)
    row = batch[1]
    assert nv12_to_rgb(nv12, out=row) is row
    assert torch.equal(batch[1], chw) and batch[0].count_nonzero() == 0


def test_p016_ten_bit_frames(tmp_path: Path) -> None:
    """10-bit samples in the high bits of 16-bit words (NVDEC's P016) convert like 8-bit ones."""
    rng = np.random.default_rng(0)
    image = np.repeat(np.repeat(rng.integers(30, 220, (8, 8, 3), dtype=np.uint8), 16, 0), 16, 1)
    source = av.VideoFrame.from_ndarray(image, format="rgb24").reformat(format="yuv420p10le")
    y = np.frombuffer(source.planes[0], np.uint16).reshape(128, -1)[:, :128]
    u = np.frombuffer(source.planes[1], np.uint16).reshape(64, -1)[:, :64]
    v = np.frombuffer(source.planes[2], np.uint16).reshape(64, -1)[:, :64]
    p016 = np.concatenate([y << 6, np.stack([u << 6, v << 6], -1).reshape(64, 128)]).astype(np.uint16)
    ours = nv12_to_rgb(torch.from_numpy(p016.view(np.int16))).int()
    reference = torch.from_numpy(source.to_ndarray(format="rgb24")).permute(2, 0, 1).int()
    # Away from the colour blocks' edges, where FFmpeg interpolates chroma and NVDEC's kernels repeat it.
    inner = (torch.arange(128) % 16 >= 4) & (torch.arange(128) % 16 < 12)
    diff = (ours - reference).abs()[:, inner][:, :, inner]
    assert diff.max() <= 3


@pytest.mark.parametrize(
    ("shape", "dtype", "message"),
    [
        (
            (256, 256),
            torch.uint8,
            r"expected an NV12 frame of shape \[1.5 \* H, W\].*4:2:2 / 4:4:4.*decode_device='cpu'",
        ),
        ((3, 24, 16), torch.uint8, "expected an NV12 frame"),
        ((24, 16), torch.float32, "8- or 16-bit"),
    ],
)
def test_refuses_what_it_cannot_convert(shape: tuple[int, ...], dtype: torch.dtype, message: str) -> None:
    with pytest.raises(DecoderCapabilityError, match=message):
        nv12_to_rgb(torch.zeros(shape, dtype=dtype))


def test_rejects_an_out_of_the_wrong_shape() -> None:
    with pytest.raises(ValueError, match=r"out has shape \(3, 8, 8\) but the converted frame is \(3, 16, 16\)"):
        nv12_to_rgb(torch.zeros(24, 16, dtype=torch.uint8), out=torch.empty(3, 8, 8, dtype=torch.uint8))


# -- the fused Triton kernel, in Triton's interpreter on CPU tensors -------------------------------------
@pytest.fixture
def triton_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """Build the kernel under ``TRITON_INTERPRET=1``, so it runs on CPU tensors."""
    from lightning_vstream.decode import nv12_kernel

    if not nv12_kernel.triton_available():
        pytest.skip("Triton is not installed")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(nv12_kernel, "_kernel", None)


def _random_surface(height: int, width: int, *, sixteen: bool, seed: int) -> torch.Tensor:
    rng = np.random.default_rng(seed)
    if not sixteen:
        return torch.from_numpy(rng.integers(0, 256, (height * 3 // 2, width), dtype=np.uint8))
    words = rng.integers(0, 1024, (height * 3 // 2, width), dtype=np.int64) << 6  # 10-bit data, high bits
    return torch.from_numpy(np.where(words >= 32768, words - 65536, words).astype(np.int16))


@pytest.mark.parametrize("sixteen", [False, True])
@pytest.mark.parametrize("layout", ["chw", "hwc"])
def test_triton_kernel_equals_the_torch_conversion(triton_kernel: None, sixteen: bool, layout: str) -> None:
    height, width = 36, 100  # not a multiple of the block: the masks matter
    surface = _random_surface(height, width, sixteen=sixteen, seed=3)
    for spec in (ColorSpec("bt601", False), ColorSpec("bt709", True), ColorSpec("bt2020", False)):
        reference = Nv12Converter(spec, height, width, layout=layout, backend="torch")(surface)  # type: ignore[arg-type]
        # Straight into a row of a batch, with the batch's strides.
        shape = (3, height, width) if layout == "chw" else (height, width, 3)
        batch = torch.zeros((3, *shape), dtype=torch.uint8)
        convert = Nv12Converter(spec, height, width, layout=layout, backend="triton")  # type: ignore[arg-type]
        assert convert.backend == "triton"
        convert(surface, batch[1])
        assert torch.equal(batch[1], reference), spec
        assert batch[0].count_nonzero() == 0 and batch[2].count_nonzero() == 0


@pytest.mark.parametrize("matrix", ["bt601", "bt709"])
@pytest.mark.parametrize("full", [False, True])
def test_triton_kernel_matches_ffmpeg_on_real_frames(
    triton_kernel: None, frame: av.VideoFrame, matrix: str, full: bool
) -> None:
    nv12 = torch.from_numpy(frame.to_ndarray(format="nv12"))
    ours = nv12_to_rgb(nv12, ColorSpec(matrix, full_range=full), backend="triton").int()  # type: ignore[arg-type]
    diff = (ours - _reference(frame, matrix, full).int()).abs()
    assert diff.max() <= 3 and diff.float().mean() < 0.5
    assert read_stamp(ours.to(torch.uint8)).frame == 0


def test_triton_kernel_converts_ten_bit_frames_like_ffmpeg(triton_kernel: None) -> None:
    rng = np.random.default_rng(0)
    image = np.repeat(np.repeat(rng.integers(30, 220, (8, 8, 3), dtype=np.uint8), 16, 0), 16, 1)
    source = av.VideoFrame.from_ndarray(image, format="rgb24").reformat(format="yuv420p10le")
    y = np.frombuffer(source.planes[0], np.uint16).reshape(128, -1)[:, :128]
    u = np.frombuffer(source.planes[1], np.uint16).reshape(64, -1)[:, :64]
    v = np.frombuffer(source.planes[2], np.uint16).reshape(64, -1)[:, :64]
    p016 = np.concatenate([y << 6, np.stack([u << 6, v << 6], -1).reshape(64, 128)]).astype(np.uint16)
    surface = torch.from_numpy(p016.view(np.int16))
    ours = nv12_to_rgb(surface, backend="triton")
    assert torch.equal(ours, nv12_to_rgb(surface, backend="torch"))
    reference = torch.from_numpy(source.to_ndarray(format="rgb24")).permute(2, 0, 1).int()
    inner = (torch.arange(128) % 16 >= 4) & (torch.arange(128) % 16 < 12)
    assert (ours.int() - reference).abs()[:, inner][:, :, inner].max() <= 3


def test_backend_choice() -> None:
    from lightning_vstream.decode import nv12_kernel

    assert Nv12Converter(ColorSpec(), 4, 4, device=torch.device("cpu")).backend == "torch"  # "auto" on the CPU
    with pytest.raises(ValueError, match="backend='cuda' is not supported"):
        Nv12Converter(ColorSpec(), 4, 4, backend="cuda")  # type: ignore[arg-type]
    if not nv12_kernel.triton_available():
        with pytest.raises(ImportError, match="backend='triton' needs Triton"):
            Nv12Converter(ColorSpec(), 4, 4, backend="triton")

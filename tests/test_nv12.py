"""NV12 / P016 -> RGB, torch and the fused Triton kernel, against each other and FFmpeg's conversion (PyAV)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import av
import numpy as np
import pytest
import torch

from lightning_vstream.decode.nvdec.nv12 import (
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
            r"expected an NV12 frame of shape \[1.5 \* H, W\].*4:2:2 / 4:4:4.*decode.device='cpu'",
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
def triton_kernel(triton_interpreter: Any) -> None:
    """The kernel module imported under ``TRITON_INTERPRET=1``, so the kernel runs on CPU tensors."""


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
    from lightning_vstream.decode.nvdec import nv12

    assert Nv12Converter(ColorSpec(), 4, 4, device=torch.device("cpu")).backend == "torch"  # "auto" on the CPU
    with pytest.raises(ValueError, match="backend='cuda' is not supported"):
        Nv12Converter(ColorSpec(), 4, 4, backend="cuda")  # type: ignore[arg-type]
    if not nv12.triton_available():
        with pytest.raises(ImportError, match="backend='triton' needs Triton"):
            Nv12Converter(ColorSpec(), 4, 4, backend="triton")


# -- the check at setup: compiled once, compared with torch, torch when it fails --------------------------
def test_the_kernel_is_defined_at_module_level_and_specialised_on_no_argument(triton_interpreter: Any) -> None:
    """One compilation per sample width, made at setup: no argument is specialised on its value or alignment,
    and the block width is fixed, so no later launch (from a decode thread) compiles again."""
    import inspect

    import triton

    kernel = triton_interpreter.nv12_to_rgb_kernel
    source = inspect.getsource(triton_interpreter)
    assert "\n@triton.jit(do_not_specialize=PARAMETERS)\ndef nv12_to_rgb_kernel(" in source  # not in a closure
    params = list(inspect.signature(kernel.fn).parameters)
    assert tuple(params[:-2]) == triton_interpreter.PARAMETERS and params[-2:] == ["SIXTEEN", "BLOCK"]
    assert triton_interpreter.BLOCK & (triton_interpreter.BLOCK - 1) == 0
    assert triton.__version__


@pytest.mark.slow
def test_the_kernel_compiles_for_a_gpu_here_without_one(kernel_module: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Triton's whole compiler, Python to cubin for sm_90, runs without a GPU: both variants (NV12, P016)
    compile with the Triton installed here (the oldest pyproject accepts, 3.2, compiles them too)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    monkeypatch.setenv("TRITON_DEFAULT_FP_FUSION", "1")  # the default; set, so Triton does not warn about it
    module = kernel_module(False)
    BLOCK, PARAMETERS, nv12_to_rgb_kernel = module.BLOCK, module.PARAMETERS, module.nv12_to_rgb_kernel

    for sixteen, sample in ((False, "*u8"), (True, "*i16")):
        types = {"src": sample, "dst": "*u8", **dict.fromkeys(PARAMETERS[2:8], "i32")}
        signature = {**types, **dict.fromkeys(PARAMETERS[8:], "fp32"), "SIXTEEN": "constexpr", "BLOCK": "constexpr"}
        constants = {"SIXTEEN": sixteen, "BLOCK": BLOCK}
        try:
            source = ASTSource(fn=nv12_to_rgb_kernel, signature=signature, constexprs=constants)
        except TypeError:  # Triton before 3.3 names them constants
            source = ASTSource(fn=nv12_to_rgb_kernel, signature=signature, constants=constants)  # type: ignore[call-arg]
        compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32))
        assert len(compiled.asm["cubin"]) > 1000


def test_prepare_conversion_checks_the_kernel_once_per_device(triton_interpreter: Any) -> None:
    from lightning_vstream.decode.nvdec import nv12

    launches: list[int] = []
    real = triton_interpreter.launch_nv12_to_rgb

    def counting(*args: Any, **kwargs: Any) -> None:
        launches.append(1)
        real(*args, **kwargs)

    triton_interpreter.launch_nv12_to_rgb = counting
    try:
        assert nv12._check_kernel(torch.device("cpu")) == "triton"  # the interpreter runs it on the CPU
    finally:
        triton_interpreter.launch_nv12_to_rgb = real
    # NV12 and P016, widths past one block and not a multiple of it, padded rows, both layouts, batch rows.
    assert len(launches) == 2 * len(nv12._CHECK_CASES)
    assert {c[1] for c in nv12._CHECK_CASES} == {8, 10} and any(c[4] for c in nv12._CHECK_CASES)
    assert all(c[2] > triton_interpreter.BLOCK and c[2] % triton_interpreter.BLOCK for c in nv12._CHECK_CASES)
    assert nv12.prepare_conversion("cpu") == "torch"  # not a GPU: no check


@pytest.mark.parametrize("failure", ["wrong pixels", "launch fails", "no triton"])
def test_a_kernel_that_fails_its_check_falls_back_to_torch_with_one_warning(
    triton_interpreter: Any, monkeypatch: pytest.MonkeyPatch, failure: str
) -> None:
    from lightning_vstream.decode.nvdec import nv12
    from lightning_vstream.errors import VStreamWarning

    real = triton_interpreter.launch_nv12_to_rgb

    def wrong(surface: Any, out: Any, *args: Any, **kwargs: Any) -> None:
        real(surface, out, *args, **kwargs)
        out[0, 0] = out[0, 0] ^ 64  # one row (or pixel) of one channel, 64 levels off

    def broken(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("PTX .version 8.7 does not support .target sm_120")

    if failure == "wrong pixels":
        monkeypatch.setattr(triton_interpreter, "launch_nv12_to_rgb", wrong)
        message = r"differs from the torch conversion by up to 64 levels"
    elif failure == "launch fails":
        monkeypatch.setattr(triton_interpreter, "launch_nv12_to_rgb", broken)
        message = r"failed to compile or run \(RuntimeError: PTX .version 8.7"
    else:
        monkeypatch.setattr(nv12, "triton_available", lambda: False)
        message = r"Triton is not installed"
    checked: dict[str, str] = {}
    monkeypatch.setattr(nv12, "_checked", checked)
    monkeypatch.setattr(nv12, "_check_kernel", lambda device, real=nv12._check_kernel: real(torch.device("cpu")))
    cuda = torch.device("cuda", 3)
    with pytest.warns(VStreamWarning, match=rf"kernel is not used on cpu: .*{message}.*converted with torch"):
        assert nv12.prepare_conversion(cuda) == "torch"
    assert nv12.prepare_conversion(cuda) == "torch" and checked == {"cuda:3": "torch"}  # once: no second warning

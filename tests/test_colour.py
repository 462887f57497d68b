"""CPU colour conversion and stream choice: both layouts give the same pixels at every bit depth,
the pixels match a numpy YUV -> RGB reference (matrix and range as tagged), resizing happens in the
conversion, and the best video stream is used unless another is asked for.

Reference: BT.601 or BT.709 coefficients as the stream is tagged (BT.601 when untagged), limited
or full range as tagged, chroma repeated to full resolution. swscale interpolates chroma on some
paths, so the comparison covers the flat inside of 16 x 16 colour blocks, where both agree; the
tolerance there is 4 levels (swscale works in fixed point), and the mean error must stay below 1.5.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from lightning_vstream.decode import make_decoder
from lightning_vstream.decode.cpu.colour import RGBConverter
from lightning_vstream.decode.cpu.probe import probe_video
from lightning_vstream.decode.cpu.pyav import PyAVDecoder
from lightning_vstream.demos.synth import (
    Stamp,
    _frame,
    _texture,
    read_stamp,
    write_stamped_video,
)
from lightning_vstream.errors import ConfigurationError

WIDTH, HEIGHT, BLOCK = 128, 96, 16
TOLERANCE = 4
# (encoder, pixel format, colorspace tag, range tag): 1 = BT.709, 6 = SMPTE 170M (BT.601); range 1 limited, 2 full.
CASES = {
    "8bit-untagged": ("libx264", "yuv420p", None, None),
    "8bit-bt709-full": ("libx264", "yuv420p", 1, 2),
    "10bit-untagged": ("libx265", "yuv420p10le", None, None),
    "10bit-bt709-limited": ("libx265", "yuv420p10le", 1, 1),
    "10bit-bt601-full": ("libx265", "yuv420p10le", 6, 2),
}


def _blocks(seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    colours = rng.integers(0, 256, size=(HEIGHT // BLOCK, WIDTH // BLOCK, 3), dtype=np.uint8)
    return np.kron(colours, np.ones((BLOCK, BLOCK, 1), dtype=np.uint8))


def write_colour_video(path: Path, case: str, frames: int = 2) -> Path:
    import av

    # In some processes this FFmpeg build's MP4 muxer refuses the first 10-bit HEVC packet
    # (PatchWelcomeError while writing the header, or EINVAL from the muxer) and keeps refusing it
    # for the life of the process; a fresh process writes the same file. Only test data is affected: the decoding
    # under test never sees a refused file.
    try:
        return _write_colour_video(path, case, frames)
    except (av.error.PatchWelcomeError, av.error.ArgumentError):
        pass
    import subprocess
    import sys

    script = (
        "import sys; from pathlib import Path; sys.path.insert(0, sys.argv[1]); "
        "from test_colour import _write_colour_video; _write_colour_video(Path(sys.argv[2]), sys.argv[3], int(sys.argv[4]))"
    )
    for _ in range(5):
        result = subprocess.run(
            [sys.executable, "-c", script, str(Path(__file__).parent), str(path), case, str(frames)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if result.returncode == 0:
            return path
    raise RuntimeError(f"could not write the {case} test video: {result.stderr[-500:]}")


def _write_colour_video(path: Path, case: str, frames: int) -> Path:
    import av

    encoder, pix_fmt, colorspace, color_range = CASES[case]
    options = {"preset": "ultrafast", "crf": "8"}
    if encoder == "libx265":
        options["x265-params"] = "log-level=error:info=0"  # no version SEI in the headers
    with av.open(str(path), mode="w") as container:
        stream = container.add_stream(encoder, rate=12, options=options)
        stream.width, stream.height, stream.pix_fmt = WIDTH, HEIGHT, pix_fmt
        if colorspace is not None:
            stream.codec_context.colorspace = colorspace
            stream.codec_context.color_range = color_range
        for i in range(frames):
            frame = av.VideoFrame.from_ndarray(_blocks(i), format="rgb24").reformat(format=pix_fmt)
            if colorspace is not None:
                # The frame's tags must agree with the stream's: libx265 refuses a mismatch at random.
                frame.colorspace, frame.color_range = colorspace, color_range
            frame.pts = i
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


def reference_rgb(frame: object) -> np.ndarray:
    """HWC float RGB 0..255 from a decoded PyAV frame's YUV planes, matrix and range as tagged."""
    bits = frame.format.components[0].bits  # type: ignore[attr-defined]
    dtype = np.uint16 if bits > 8 else np.uint8
    y, u, v = (
        np.frombuffer(p, dtype=dtype)
        .reshape(p.height, p.line_size // dtype().itemsize)[:, : p.width]
        .astype(np.float64)
        for p in frame.planes[:3]  # type: ignore[attr-defined]
    )
    u = np.repeat(np.repeat(u, 2, 0), 2, 1)[: y.shape[0], : y.shape[1]]
    v = np.repeat(np.repeat(v, 2, 0), 2, 1)[: y.shape[0], : y.shape[1]]
    n = 2 ** (bits - 8)
    if int(frame.color_range) == 2 or frame.format.name.startswith("yuvj"):  # type: ignore[attr-defined]
        top = 2**bits - 1
        luma, cb, cr = y / top, (u - 128 * n) / top, (v - 128 * n) / top
    else:
        luma, cb, cr = (y - 16 * n) / (219 * n), (u - 128 * n) / (224 * n), (v - 128 * n) / (224 * n)
    kr, kb = (0.2126, 0.0722) if int(frame.colorspace) == 1 else (0.299, 0.114)  # type: ignore[attr-defined]
    red = luma + 2 * (1 - kr) * cr
    blue = luma + 2 * (1 - kb) * cb
    green = (luma - kr * red - kb * blue) / (1 - kr - kb)
    return np.clip(np.rint(np.stack([red, green, blue], -1) * 255), 0, 255)


def _flat_inside() -> np.ndarray:
    rows, cols = np.mgrid[:HEIGHT, :WIDTH]
    return (rows % BLOCK >= 3) & (rows % BLOCK <= BLOCK - 4) & (cols % BLOCK >= 3) & (cols % BLOCK <= BLOCK - 4)


@pytest.fixture(scope="module")
def colour_videos(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("colour")
    return {case: write_colour_video(root / f"{case}.mp4", case) for case in CASES}


@pytest.mark.parametrize("case", list(CASES))
def test_both_layouts_match_each_other_and_a_numpy_reference(colour_videos: dict[str, Path], case: str) -> None:
    import av

    path = colour_videos[case]
    with av.open(str(path)) as container:
        raw = [reference_rgb(f) for f in container.decode(video=0)]
    chw = PyAVDecoder(path, layout="chw")
    hwc = PyAVDecoder(path, layout="hwc")
    flat = _flat_inside()
    for index, expected in enumerate(raw):
        planar, packed = chw.get(index), hwc.get(index)
        assert torch.equal(planar.permute(1, 2, 0), packed), f"{case} frame {index}: layouts differ"
        out = torch.empty_like(packed)
        assert torch.equal(PyAVDecoder(path, layout="hwc").get(index, out=out), packed)
        error = np.abs(packed.numpy().astype(np.float64) - expected)
        assert error[flat].max() <= TOLERANCE, f"{case} frame {index}: {error[flat].max()} levels off the reference"
        assert error[flat].mean() < 1.5


def test_the_colour_tag_is_honoured(colour_videos: dict[str, Path]) -> None:
    import av

    path = colour_videos["10bit-bt709-limited"]
    with av.open(str(path)) as container:
        frame = next(container.decode(video=0))
        assert int(frame.colorspace) == 1
        as_tagged = reference_rgb(frame)
        frame.colorspace = 2  # the same samples read as untagged (BT.601)
        as_bt601 = reference_rgb(frame)
    decoded = PyAVDecoder(path, layout="hwc").get(0).numpy().astype(np.float64)
    flat = _flat_inside()
    assert np.abs(as_tagged - as_bt601)[flat].max() > 10  # the two matrices really differ on this content
    assert np.abs(decoded - as_tagged)[flat].max() <= TOLERANCE


@pytest.mark.parametrize("case", ["8bit-untagged", "10bit-untagged"])
@pytest.mark.parametrize("interpolation", ["bilinear", "area"])
def test_resize_in_the_conversion_gives_the_same_pixels_in_both_layouts(
    colour_videos: dict[str, Path], case: str, interpolation: str
) -> None:
    path = colour_videos[case]
    size = (HEIGHT // 2, WIDTH // 2)
    chw = PyAVDecoder(path, layout="chw", size=size, interpolation=interpolation)  # type: ignore[arg-type]
    hwc = PyAVDecoder(path, layout="hwc", size=size, interpolation=interpolation)  # type: ignore[arg-type]
    small = chw.get(1)
    assert small.shape == (3, *size) and chw.output_size == size
    assert torch.equal(small.permute(1, 2, 0), hwc.get(1))
    # Each 16 x 16 block becomes 8 x 8 of the same colour: compare the blocks' centres.
    full = PyAVDecoder(path).get(1).float()[:, 8::16, 8::16]
    assert (small.float()[:, 4::8, 4::8] - full).abs().max() <= TOLERANCE


@pytest.mark.parametrize("layout", ["chw", "hwc"])
def test_resized_stamped_frames_read_the_right_stamp(tmp_path: Path, layout: str) -> None:
    path = write_stamped_video(tmp_path / "cam.mp4", clip=5, camera=2, frames=12, size=(256, 192), gop=4)
    dec = PyAVDecoder(path, layout=layout, size=(96, 128))  # type: ignore[arg-type]
    for index in (0, 7, 3, 11):
        frame = dec.get(index)
        assert tuple(frame.shape) == ((3, 96, 128) if layout == "chw" else (96, 128, 3))
        assert read_stamp(frame, layout=layout, source_size=(256, 192)) == Stamp(5, 2, index)  # type: ignore[arg-type]
    frames = dec.get_many([9, 2, 9])
    assert [read_stamp(f, layout=layout, source_size=(256, 192)).frame for f in frames] == [9, 2, 9]  # type: ignore[arg-type]


def test_converter_and_size_errors(colour_videos: dict[str, Path]) -> None:
    with pytest.raises(ConfigurationError, match=r"size=\(0, 10\) must hold two positive integers"):
        PyAVDecoder(colour_videos["8bit-untagged"], size=(0, 10))
    with pytest.raises(ConfigurationError, match=r"size=\[10\] must be \(height, width\)"):
        PyAVDecoder(colour_videos["8bit-untagged"], size=[10])  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="interpolation='cubic' is not supported"):
        RGBConverter(interpolation="cubic")  # type: ignore[arg-type]
    dec = PyAVDecoder(colour_videos["8bit-untagged"], size=(24, 32))
    with pytest.raises(ValueError, match=r"out must be a contiguous uint8 tensor of shape \(3, 24, 32\)"):
        dec.get(0, out=torch.empty((3, HEIGHT, WIDTH), dtype=torch.uint8))


# -- stream choice ------------------------------------------------------------------------------
def write_two_stream_video(path: Path) -> Path:
    """A small stream (camera 0, 64x48) first, then a larger one (camera 1, 128x96); both default."""
    import av

    with av.open(str(path), mode="w") as container:
        streams = []
        for camera, (width, height) in enumerate(((64, 48), (128, 96))):
            stream = container.add_stream("libx264", rate=12, options={"preset": "ultrafast"})
            stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
            stream.disposition = av.stream.Disposition.default.value  # an int: older PyAV takes no flag object
            streams.append((stream, camera, _texture(width, height, camera)))
        for i in range(8):
            for stream, camera, texture in streams:
                image = _frame(texture, stream.width, stream.height, i, Stamp(1, camera, i))
                frame = av.VideoFrame.from_ndarray(image, format="rgb24")
                frame.pts = i
                for packet in stream.encode(frame):
                    container.mux(packet)
        for stream, _, _ in streams:
            for packet in stream.encode():
                container.mux(packet)
    return path


def test_the_best_video_stream_is_used_unless_one_is_chosen(tmp_path: Path) -> None:
    path = write_two_stream_video(tmp_path / "two.mp4")
    best = probe_video(path)
    assert (best.width, best.height) == (128, 96)
    assert (probe_video(path, stream=0).width, probe_video(path, stream=1).width) == (64, 128)
    dec = make_decoder(path)
    assert read_stamp(dec.get(5)) == Stamp(1, 1, 5)
    first = make_decoder(path, stream=0)
    assert first.info.width == 64
    assert [read_stamp(f) for f in first.get_many([6, 1])] == [Stamp(1, 0, 6), Stamp(1, 0, 1)]  # type: ignore[attr-defined]
    with pytest.raises(
        ConfigurationError,
        match=r"stream=2 asks for video stream 2 of '.*two.mp4', which holds 2 "
        r"video stream\(s\) \(valid: 0\.\.1, or None for FFmpeg's best\)",
    ):
        probe_video(path, stream=2)
    with pytest.raises(ConfigurationError, match=r"stream=-1 must be None \(FFmpeg's best video stream\)"):
        PyAVDecoder(path, stream=-1)

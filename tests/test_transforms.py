"""FrameTransform: exact pixels for crop, resize, normalize, dtype and layout; precise errors."""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from lightning_vstream.demos.synth import Stamp, draw_stamp, read_stamp
from lightning_vstream.transforms import FrameTransform


def _ramp(*lead: int, height: int = 6, width: int = 8) -> torch.Tensor:
    """uint8 frames whose every pixel value says where it is."""
    count = int(np.prod(lead)) * 3 * height * width if lead else 3 * height * width
    return (torch.arange(count) % 251).to(torch.uint8).reshape(*lead, 3, height, width)


def _stamped(width: int, height: int, stamp: Stamp) -> torch.Tensor:
    rng = np.random.default_rng(0)
    image = rng.integers(0, 256, size=(height, width, 3), dtype=np.uint8)
    draw_stamp(image, stamp)
    return torch.from_numpy(image).permute(2, 0, 1).contiguous()


# -- identity and geometry -----------------------------------------------------------------------
def test_default_changes_nothing() -> None:
    frames = _ramp(2)
    transform = FrameTransform()
    assert transform.is_identity
    assert transform(frames) is frames
    assert transform.output_shape(6, 8) == (3, 6, 8)


def test_crop_selects_the_region() -> None:
    frames = _ramp(2, 4)
    out = FrameTransform(crop=(1, 2, 3, 5))(frames)
    assert out.shape == (2, 4, 3, 3, 5) and out.is_contiguous()
    assert torch.equal(out, frames[..., 1:4, 2:7])


def test_crop_outside_the_frame_names_the_sizes() -> None:
    transform = FrameTransform(crop=(40, 0, 10, 64))
    message = r"reaches row 50 and column 64, but the frames are 48 x 64 \(height x width\)"
    with pytest.raises(ValueError, match=message):
        transform(torch.zeros((3, 48, 64), dtype=torch.uint8))
    with pytest.raises(ValueError, match=message):
        transform.output_shape(48, 64)


@pytest.mark.parametrize(
    ("kwargs", "shape"),
    [
        (dict(crop=(0, 0, 20, 30)), (3, 20, 30)),
        (dict(resize=(12, 16)), (3, 12, 16)),
        (dict(crop=(0, 0, 20, 30), resize=(10, 15), layout="hwc"), (10, 15, 3)),
    ],
)
def test_output_shape_matches_the_output(kwargs: dict[str, Any], shape: tuple[int, int, int]) -> None:
    transform = FrameTransform(**kwargs)
    assert transform.output_shape(48, 64) == shape
    assert transform(torch.zeros((2, 3, 48, 64), dtype=torch.uint8)).shape == (2, *shape)


# -- resize --------------------------------------------------------------------------------------
@pytest.mark.parametrize("size", [(3, 5), (24, 40), (7, 64)])
@pytest.mark.parametrize("antialias", [True, False])
def test_resize_keeps_a_constant_image_constant(size: tuple[int, int], antialias: bool) -> None:
    frames = torch.full((2, 3, 12, 20), 201, dtype=torch.uint8)
    frames[:, 1] = 7
    out = FrameTransform(resize=size, antialias=antialias)(frames)
    assert out.dtype == torch.uint8 and out.shape == (2, 3, *size)
    assert (out[:, 0] == 201).all() and (out[:, 1] == 7).all() and (out[:, 2] == 201).all()


@pytest.mark.parametrize("antialias", [True, False])
def test_uint8_resize_rounds_and_clamps_bilinear(antialias: bool) -> None:
    frames = torch.from_numpy(np.random.default_rng(1).integers(0, 256, (2, 3, 9, 13), dtype=np.uint8))
    expected = F.interpolate(frames.float(), size=(4, 6), mode="bilinear", align_corners=False, antialias=antialias)
    out = FrameTransform(resize=(4, 6), antialias=antialias)(frames)
    assert torch.equal(out, expected.round().clamp(0, 255).to(torch.uint8))


def test_float_resize_is_not_rounded() -> None:
    frames = torch.tensor([0, 255], dtype=torch.uint8).reshape(1, 1, 2).expand(3, 1, 2).contiguous()
    out = FrameTransform(resize=(1, 4), antialias=False, dtype="float32")(frames)
    expected = F.interpolate(frames[None].float(), size=(1, 4), mode="bilinear", align_corners=False)[0] / 255
    torch.testing.assert_close(out, expected)
    assert 0 < out[0, 0, 1].item() < 1


def test_stamp_reads_after_integer_upscale() -> None:
    frame = _stamped(64, 48, Stamp(clip=3, camera=2, frame=41))
    out = FrameTransform(resize=(96, 128))(frame)
    assert read_stamp(out) == Stamp(3, 2, 41)


def test_stamp_reads_after_cropping_away_the_rest_of_the_frame() -> None:
    # At 512 x 384 the stamp's cells are 32 px, so it covers the top-left 256 x 192.
    frame = _stamped(512, 384, Stamp(clip=5, camera=1, frame=1234))
    out = FrameTransform(crop=(0, 0, 300, 400))(frame)
    assert out.shape == (3, 300, 400)
    assert read_stamp(out) == Stamp(5, 1, 1234)


def test_empty_batch_resizes_to_an_empty_batch() -> None:
    out = FrameTransform(resize=(4, 5), dtype="float16")(torch.zeros((0, 3, 8, 8), dtype=torch.uint8))
    assert out.shape == (0, 3, 4, 5) and out.dtype == torch.float16


# -- values, dtype, layout -----------------------------------------------------------------------
def test_float_output_is_scaled_to_unit_range() -> None:
    frames = torch.tensor([0, 51, 255], dtype=torch.uint8).reshape(3, 1, 1)
    out = FrameTransform(dtype="float32")(frames)
    assert out.dtype == torch.float32
    assert out.flatten().tolist() == [0.0, pytest.approx(0.2), 1.0]


def test_normalize_math() -> None:
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    frames = torch.stack([torch.full((4, 5), v, dtype=torch.uint8) for v in (10, 128, 250)])[None]
    out = FrameTransform(mean=mean, std=std, dtype="float32")(frames)
    for c, value in enumerate((10, 128, 250)):
        expected = (value / 255 - mean[c]) / std[c]
        torch.testing.assert_close(out[0, c], torch.full((4, 5), expected), atol=1e-6, rtol=0)


@pytest.mark.parametrize("dtype", ["uint8", "float16", "bfloat16", "float32"])
def test_dtype(dtype: str) -> None:
    transform = FrameTransform(dtype=dtype)  # type: ignore[arg-type]
    out = transform(torch.full((2, 3, 4, 4), 255, dtype=torch.uint8))
    assert out.dtype == getattr(torch, dtype) == transform.torch_dtype
    assert out.float().max().item() == (255.0 if dtype == "uint8" else 1.0)


def test_hwc_layout_permutes_channels_last() -> None:
    frames = _ramp(2)
    out = FrameTransform(layout="hwc")(frames)
    assert out.shape == (2, 6, 8, 3) and out.is_contiguous()
    assert torch.equal(out, frames.permute(0, 2, 3, 1))
    assert out[1, 4, 5, 2].item() == frames[1, 2, 4, 5].item()


def test_input_is_never_modified() -> None:
    frames = _ramp(2)
    before = frames.clone()
    FrameTransform(mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5), dtype="float32")(frames)
    FrameTransform(crop=(0, 0, 4, 4), dtype="float16")(frames)
    assert torch.equal(frames, before)


# -- configuration -------------------------------------------------------------------------------
def test_picklable_hashable_and_list_friendly() -> None:
    transform = FrameTransform(crop=[0, 0, 4, 4], resize=[2, 2], mean=[0.5, 0.5, 0.5], std=[1, 1, 1], dtype="float32")  # type: ignore[arg-type]
    assert transform.crop == (0, 0, 4, 4) and transform.resize == (2, 2) and transform.std == (1.0, 1.0, 1.0)
    clone = pickle.loads(pickle.dumps(transform))
    assert clone == transform and hash(clone) == hash(transform)


def test_fields_are_keyword_only() -> None:
    with pytest.raises(TypeError):
        FrameTransform((0, 0, 4, 4))  # type: ignore[misc]


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        (dict(mean=(0.5, 0.5, 0.5), std=(0.2, 0.2, 0.2)), ValueError, r"dtype='uint8'.*pick dtype='float32'"),
        (dict(mean=(0.5, 0.5, 0.5), dtype="float32"), ValueError, "give both to normalize, or neither"),
        (dict(mean=(0.5, 0.5), std=(1, 1), dtype="float32"), ValueError, r"mean=\(0.5, 0.5\) must be 3 numbers"),
        (dict(mean=(0, 0, 0), std=(1, 0, 1), dtype="float32"), ValueError, r"std=\(1.0, 0.0, 1.0\) must be positive"),
        (dict(crop=(0, 0, 4)), ValueError, r"crop=\(0, 0, 4\) must be 4 integers \(top, left, height, width\)"),
        (dict(crop=(-1, 0, 4, 4)), ValueError, "top and left must be >= 0"),
        (dict(crop=(0, 0, 0, 4)), ValueError, "height and width must be positive"),
        (dict(resize=(0, 4)), ValueError, r"resize=\(0, 4\): height and width must be positive"),
        (dict(resize=(2.5, 4)), TypeError, r"resize=\(2.5, 4\) must hold integers"),
        (dict(resize="224"), ValueError, "must be 2 integers"),
        (dict(dtype="float64"), ValueError, r"dtype='float64' is not supported; use one of \['uint8'"),
        (dict(layout="nchw"), ValueError, "layout='nchw' is not supported"),
        (dict(antialias="yes"), TypeError, "antialias='yes' must be True or False"),
    ],
)
def test_invalid_arguments(kwargs: dict[str, Any], error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        FrameTransform(**kwargs)


@pytest.mark.parametrize(
    ("frames", "error", "message"),
    [
        (np.zeros((3, 4, 4), np.uint8), TypeError, "expects a torch.Tensor of frames, got ndarray"),
        (torch.zeros((3, 4, 4)), TypeError, "expects uint8 frames .* got torch.float32"),
        (torch.zeros((4, 4, 3), dtype=torch.uint8), ValueError, r"\[\.\.\., 3, H, W\].*got \(4, 4, 3\)"),
        (torch.zeros((4, 4), dtype=torch.uint8), ValueError, r"got \(4, 4\)"),
    ],
)
def test_invalid_frames(frames: Any, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        FrameTransform(resize=(2, 2))(frames)


def test_configurable_from_yaml_like_a_datamodule_argument() -> None:
    from jsonargparse import ArgumentParser

    class DataModule:
        def __init__(self, *, transform: FrameTransform | None = None) -> None:
            self.transform = transform

    parser = ArgumentParser(exit_on_error=False)
    parser.add_class_arguments(DataModule, "data")
    config = parser.parse_string(
        "data:\n  transform:\n    resize: [448, 800]\n    mean: [0.485, 0.456, 0.406]\n"
        "    std: [0.229, 0.224, 0.225]\n    dtype: bfloat16\n"
    )
    instantiate = getattr(parser, "instantiate", None) or parser.instantiate_classes  # renamed in 4.49
    transform = instantiate(config).data.transform
    assert transform == FrameTransform(
        resize=(448, 800), mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225), dtype="bfloat16"
    )


# -- resize inside CPU decoders --------------------------------------------------------------------
def test_decoder_size_moves_only_a_leading_antialiased_resize() -> None:
    assert FrameTransform(resize=(24, 32)).decoder_size() == (24, 32)
    assert FrameTransform(resize=(24, 32), dtype="float32").decoder_size() == (24, 32)
    assert FrameTransform(crop=(0, 0, 40, 40), resize=(24, 32)).decoder_size() is None
    assert FrameTransform(resize=(24, 32), antialias=False).decoder_size() is None
    assert FrameTransform().decoder_size() is None
    assert FrameTransform(resize=(24, 32)).is_resize_only
    assert not FrameTransform(resize=(24, 32), layout="hwc").is_resize_only


def _stream_loader(index_path: Any, transform: Any, num_workers: int) -> Any:
    from lightning_vstream.indexing import load_index
    from lightning_vstream.options import OutputOptions
    from lightning_vstream.stream.sampler import StreamSampler
    from lightning_vstream.stream.worker import StreamDataset
    from lightning_vstream.stream.worker_loader import StreamDataLoader

    index = load_index(index_path)
    sampler = StreamSampler(
        [c.frame_count for c in index.clips],
        num_cameras=len(index.camera_names),
        batch_size=2,
        seed=0,
        num_parts=max(1, num_workers),
    )
    return StreamDataLoader(
        StreamDataset(index=index, output=OutputOptions(transform=transform)), sampler=sampler, num_workers=num_workers
    )


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("dtype", ["uint8", "float32"])
def test_stream_loader_resizes_in_the_decoder(make_dataset: Any, num_workers: int, dtype: str) -> None:
    from lightning_vstream.decode.cpu.pyav import PyAVDecoder
    from lightning_vstream.demos.synth import clip_number
    from lightning_vstream.indexing import load_index

    index_path = make_dataset(clips=3, cameras=2, frames=[9, 7, 8], size=(128, 96), gop=4)
    index = load_index(index_path)
    transform = FrameTransform(resize=(48, 64), dtype=dtype)  # type: ignore[arg-type]
    batches = list(_stream_loader(index_path, transform, num_workers))
    assert len(batches) >= 3
    for batch in batches:
        frames = batch["frames"]
        assert frames.shape[2:] == (3, 48, 64) and frames.dtype == getattr(torch, dtype)
        for slot in range(frames.shape[0]):
            if not batch["valid"][slot]:
                continue
            clip, frame = batch["clip_id"][slot], int(batch["frame_index"][slot])
            for camera in range(frames.shape[1]):
                image = frames[slot, camera]
                if dtype == "float32":
                    image = (image * 255).round().to(torch.uint8)
                assert read_stamp(image, source_size=(128, 96)) == Stamp(clip_number(clip), camera, frame)
                # The very pixels the decoder's own resize gives: no float resize ran after it.
                cam = index.clips[clip_number(clip)].cameras[camera]
                assert torch.equal(image, PyAVDecoder(cam.path, size=(48, 64)).get(frame))


def test_clip_dataset_output_size_lets_cameras_of_different_sizes_share_a_sample(tmp_path: Any) -> None:
    from lightning_vstream.clips.dataset import VideoClipDataset
    from lightning_vstream.clips.selection import at_indices
    from lightning_vstream.demos.synth import write_dataset, write_stamped_video
    from lightning_vstream.indexing import build_index

    write_dataset(tmp_path, clips=1, cameras=2, frames=8, size=(128, 96), gop=4)
    big = tmp_path / "videos/scene-0000/CAM_BACK_LEFT.mp4"
    write_stamped_video(big, clip=0, camera=1, frames=8, size=(256, 192), gop=4)
    index = build_index(tmp_path, output=tmp_path / "index.json", video_dirs=["videos"], progress=False)
    request = at_indices("scene-0000", [6, 1, 5])
    with pytest.raises(ValueError, match=r"different frame sizes .* pass size=\(height, width\) to resize"):
        VideoClipDataset(index=index)[request]
    sample = VideoClipDataset(index=index, size=(48, 64))[request]
    assert sample["frames"].shape == (3, 2, 3, 48, 64)
    for t, frame in enumerate([6, 1, 5]):
        for camera, source in enumerate([(128, 96), (256, 192)]):
            assert read_stamp(sample["frames"][t, camera], source_size=source) == Stamp(0, camera, frame)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_resize_in_the_decoder_lets_files_of_different_sizes_share_a_batch(tmp_path: Any, num_workers: int) -> None:
    from lightning_vstream.demos.synth import clip_number, write_dataset, write_stamped_video
    from lightning_vstream.indexing import build_index

    write_dataset(tmp_path, clips=2, cameras=1, frames=6, size=(128, 96), gop=3)
    write_stamped_video(tmp_path / "videos/scene-0001/CAM_BACK.mp4", clip=1, camera=0, frames=6, size=(256, 192), gop=3)
    build_index(tmp_path, output=tmp_path / "index.json", video_dirs=["videos"], progress=False)  # the new file
    sources = {0: (128, 96), 1: (256, 192)}
    loader = _stream_loader(tmp_path / "index.json", FrameTransform(resize=(48, 64)), num_workers)
    count = 0
    for batch in loader:
        for slot in range(batch["frames"].shape[0]):
            clip = clip_number(batch["clip_id"][slot])
            stamp = read_stamp(batch["frames"][slot, 0], source_size=sources[clip])
            assert stamp == Stamp(clip, 0, int(batch["frame_index"][slot]))
            count += 1
    assert count == 12

"""Decoders are fed only the pictures the frames read need, and every frame they return equals a full decode.

Every GOP shape of tests/_gop_shapes.py (B-frame pyramids, open GOPs, H.265 temporal sub-layers, the
stride layout, MPEG-TS, AV1), read by both CPU decoders (through the container, and from GOP byte
ranges over ``file://``) at strides 1, 2, 3 and 6, by random access, and by reads that leave what the
decoder expected. The reference is the same decoder with the reference codes taken away, which feeds
every packet; the stamps name each frame.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
import torch

from lightning_vstream import EngineOptions, PlanOptions, StreamVideoDataModule
from lightning_vstream.decode import make_decoder
from lightning_vstream.decode.base import VideoInfo
from lightning_vstream.decode.cpu.probe import probe_video
from lightning_vstream.decode.cpu.pyav import PyAVDecoder
from lightning_vstream.decode.ranged.gop_reads import GopDecoder
from lightning_vstream.demos.synth import Stamp, read_stamp
from lightning_vstream.encode import encode_index
from lightning_vstream.indexing import load_index
from tests._gop_shapes import SHAPES, gop_shapes
from tests.conftest import batch_stamp_errors

__all__ = ["gop_shapes"]  # the fixture, imported for pytest

_STRIDE_LAYOUTS = ("hevc-stride6", "h264-stride6-open-gop")
FullDecode = Callable[[str, str], tuple[Path, VideoInfo, list[torch.Tensor]]]


def _decoder(kind: str, path: Path, info: VideoInfo) -> PyAVDecoder | GopDecoder:
    if kind == "container":
        return PyAVDecoder(path, info=info, threads=1)
    if info.layout is None:
        pytest.skip(f"{path.name}: no packet places (read through its container)")
    dec = make_decoder(f"file://{path}", info=info, threads=1)
    assert isinstance(dec, GopDecoder)
    return dec


@pytest.fixture(scope="module")
def full_decode(gop_shapes: Callable[[str], Path]) -> Callable[[str, str], tuple[Path, VideoInfo, list[torch.Tensor]]]:
    """``(shape, decoder kind) -> (path, frame table, every frame decoded with every packet fed)``, once each."""
    made: dict[tuple[str, str], tuple[Path, VideoInfo, list[torch.Tensor]]] = {}

    def get(shape: str, kind: str) -> tuple[Path, VideoInfo, list[torch.Tensor]]:
        if (shape, kind) not in made:
            path = gop_shapes(shape)
            info = probe_video(path)
            assert info.references is not None
            everything = _decoder(kind, path, dataclasses.replace(info, references=None))
            frames = [everything.read() for _ in range(info.frame_count)]
            assert everything.packets_skipped == 0 and everything.frames_decoded == info.frame_count
            everything.close()
            made[shape, kind] = (path, info, frames)
        return made[shape, kind]

    return get


def _check(got: torch.Tensor, full: list[torch.Tensor], index: int, what: str) -> None:
    assert read_stamp(got) == Stamp(5, 0, index), f"{what}: frame {index} carries another stamp"
    assert torch.equal(got, full[index]), f"{what}: frame {index} differs from the full decode"


@pytest.mark.parametrize("kind", ["container", "gop-ranges"])
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_every_frame_read_equals_a_full_decode(full_decode: FullDecode, shape: str, kind: str) -> None:
    path, info, full = full_decode(shape, kind)
    n = info.frame_count
    rng = random.Random(shape)
    skipped_at_stride = {}
    for stride in (1, 2, 3, 6):
        for phase in (0, stride - 1):
            dec = _decoder(kind, path, info)
            wanted = range(phase, n, stride)
            for i in wanted:
                _check(dec.get(i), full, i, f"stride {stride} from {phase}")
            # Nothing decoded twice (a packet passed over again after a jump counts again as skipped).
            assert len(wanted) <= dec.frames_decoded <= n
            skipped_at_stride[stride, phase] = dec.packets_skipped
            dec.close()
    assert skipped_at_stride[1, 0] == 0  # at stride 1 every picture is read
    # Random access: a sample's frames at once (announced), and single frames in any order (not announced).
    dec = _decoder(kind, path, info)
    for _ in range(6):
        wanted = rng.sample(range(n), rng.randint(1, 6))
        for i, got in zip(wanted, dec.get_many(wanted)):
            _check(got, full, i, f"get_many({wanted})")
    for i in rng.sample(range(n), 12):
        _check(dec.get(i), full, i, "random get")
    # A stride the reads keep, then frames it leaves out: the decoder restarts where it must.
    for i in (*range(0, 24, 6), 25, 26, 30, 29, 36, 42, 43):
        _check(dec.get(i), full, i, "stride left")
    dec.close()
    if shape in _STRIDE_LAYOUTS:
        assert skipped_at_stride[6, 0] > 0


@pytest.mark.parametrize("kind", ["container", "gop-ranges"])
@pytest.mark.parametrize("shape", _STRIDE_LAYOUTS)
def test_the_stride_layout_at_its_stride_decodes_about_the_frames_read(
    full_decode: FullDecode, shape: str, kind: str
) -> None:
    path, info, full = full_decode(shape, kind)
    wanted = range(0, info.frame_count, 6)
    # Announced (a GOP task, a sample): exactly the frames read are decoded.
    dec = _decoder(kind, path, info)
    dec.expect(wanted)
    for i in wanted:
        _check(dec.get(i), full, i, "announced stride 6")
    assert dec.frames_decoded == len(wanted)
    # Every off-stride picture up to the last frame read is left out (those after it are never reached).
    assert dec.packets_skipped >= wanted[-1] + 1 - len(wanted)
    dec.close()
    # Learnt from the reads (a stream): the first reads may decode what lies in the reorder window.
    dec = _decoder(kind, path, info)
    for i in wanted:
        _check(dec.get(i), full, i, "learnt stride 6")
    assert len(wanted) <= dec.frames_decoded <= len(wanted) + 2 * (info.reorder_depth or 0)
    assert dec.seeks == 0
    dec.close()


@pytest.fixture(scope="module")
def stride_dataset(make_dataset: Callable[..., Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two clips of two cameras, 96 frames, encoded again in the stride layout of stride 6 (H.265, GOP 12)."""
    source = make_dataset(clips=2, cameras=2, frames=96, size=(64, 48), gop=12)
    out = tmp_path_factory.mktemp("stride6")
    summary = encode_index(source, out, codec="hevc", gop=12, keyframe_stride=6, progress=False)
    return Path(summary.index)


@pytest.mark.parametrize("engine", ["threads", "workers"])
def test_a_stream_at_the_layout_stride_decodes_fewer_frames_than_it_delivers_of_the_file(
    stride_dataset: Path, engine: str
) -> None:
    """The stream loaders leave out the off-stride pictures: amplification about 1.0, the rest counted as skipped."""
    clips = load_index(stride_dataset)
    frames_in_files = sum(c.frame_count for c in clips) * len(clips[0].cameras)
    dm = StreamVideoDataModule(
        index_file=stride_dataset,
        batch_size=2,
        plan=PlanOptions(frame_stride=6, shuffle=False),
        engine=EngineOptions(kind=engine, num_workers=1 if engine == "workers" else None),
    )
    dm.setup("fit")
    loader = dm.train_dataloader()
    batches = list(loader)
    assert batches and all(not batch_stamp_errors(b) for b in batches)
    stats = loader.stats
    streams = len(clips) * len(clips[0].cameras)
    assert stats.frames_delivered == frames_in_files // 6
    # Each stream's decoder is told the plan's stride: exactly the frames delivered are decoded.
    assert stats.frames_decoded == stats.frames_delivered
    # Every off-stride picture is left out, but for those after a stream's last frame read (never reached).
    assert stats.packets_skipped >= frames_in_files - stats.frames_decoded - 5 * streams


def test_reads_in_any_order_stay_exact(full_decode: FullDecode) -> None:
    """Long random walks (forward runs, strides, jumps back, repeats) over a B-pyramid with open GOPs."""
    path, info, full = full_decode("hevc-b3-pyramid-open-gop", "container")
    rng = random.Random(7)
    dec = _decoder("container", path, info)
    reads: list[int] = []
    at = 0
    for _ in range(150):
        step = rng.choice([1, 1, 2, 3, 6, -1, -5, 0, 11])
        at = min(max(at + step, 0), info.frame_count - 1)
        reads.append(at)
    _walk(dec, full, reads)
    dec.close()


def _walk(dec: PyAVDecoder | GopDecoder, full: list[torch.Tensor], reads: Sequence[int]) -> None:
    for n, i in enumerate(reads):
        _check(dec.get(i), full, i, f"read {n} of {list(reads[max(0, n - 5) : n + 1])}")

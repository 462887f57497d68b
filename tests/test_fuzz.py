"""Fuzzing: malformed index files and damaged videos raise only the documented errors, never hang.

Hypothesis feeds arbitrary text, JSON of every shape and malformed metadata sidecars to
``load_index``, and truncated, bit-flipped, overwritten, cut and spliced video files to
``probe_video`` and ``PyAVDecoder``. The contract checked:

- ``load_index`` returns a :class:`VideoIndex` or raises ``ValueError`` (``IndexValidationError``
  included) or ``FileNotFoundError``;
- ``probe_video`` returns a :class:`VideoInfo` or raises ``VideoDecodeError`` / ``FileNotFoundError``;
- decoding returns frames or raises ``VideoDecodeError`` / ``IndexError``, and with the pristine
  file's frame table (as an index holds it, checksums included) every frame returned carries
  the stamp of the frame asked for.

Runs are derandomized (the same examples every run) and every example has a deadline; a
watchdog turns a hang into a traceback and a failed run instead of a stuck CI job. Inputs that
once escaped as the wrong exception type, or decoded into wrong pixels, are kept as plain
regression tests at the end.
"""

from __future__ import annotations

import faulthandler
import json
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, note, settings
from hypothesis import strategies as st

from lightning_vstream import VStreamWarning
from lightning_vstream.decode.base import VideoDecodeError, VideoInfo
from lightning_vstream.decode.cpu.probe import probe_video
from lightning_vstream.decode.cpu.pyav import PyAVDecoder
from lightning_vstream.demos.synth import (
    Stamp,
    read_stamp,
    write_dataset,
    write_stamped_video,
)
from lightning_vstream.index import IndexValidationError, VideoIndex, metadata_path
from lightning_vstream.indexing import load_index
from tests._tables import build_index_with_json_tables

CLIP, CAMERA, FRAMES, GOP = 9, 2, 24, 6
HANG_SECONDS = 240  # a whole test, not one example: far above any sane run time

FUZZ = settings(
    derandomize=True,
    database=None,
    deadline=5000,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)


@pytest.fixture(autouse=True)
def _watchdog() -> Iterator[None]:
    """Dump every thread's stack and exit if a test hangs (a decoder stuck in FFmpeg)."""
    faulthandler.dump_traceback_later(HANG_SECONDS, exit=True)
    yield
    faulthandler.cancel_dump_traceback_later()


# -- index parsing ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Dataset:
    root: Path
    index_text: str
    sidecar: dict[str, Any]

    @property
    def file_keys(self) -> list[str]:
        return sorted(self.sidecar["files"])


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Dataset:
    """Two clips x two cameras with an index and sidecar, so fuzzed entries can resolve to real files."""
    root = tmp_path_factory.mktemp("fuzz-index")
    index = write_dataset(root, clips=2, cameras=2, frames=8, size=(64, 48), gop=4)
    build_index_with_json_tables(root, output=index, video_dirs=["videos"], progress=False)
    return Dataset(root, index.read_text(), json.loads(metadata_path(index).read_text()))


def _obj(pairs: list[tuple[str, str]]) -> str:
    """A JSON object from (key, value text) pairs, duplicate keys kept."""
    return "{" + ", ".join(f"{json.dumps(k)}: {v}" for k, v in pairs) + "}"


_scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=2**63, max_value=10**40)
    | st.floats()  # NaN and infinities too: Python's json writes and reads them
    | st.text(max_size=12)
)
json_values = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
_names = st.text(max_size=100)  # up to 400 UTF-8 bytes: past the 255-byte limit on file names
video_dirs = (
    st.sampled_from(
        [
            "videos",
            "./videos",
            "videos/",
            "videos/../videos",
            "..",
            ".",
            "",
            "/",
            "missing",
            "videos/scene-0000",
            "index.json",
        ]
    )
    | _names
)
clip_ids = (
    st.sampled_from(
        [
            "scene-0000",
            "scene-0001",
            "scene-0002",
            "../videos/scene-0000",
            "",
            ".",
            "..",
            "scene-0000/CAM_BACK.mp4",
            "scene-0000/",
        ]
    )
    | _names
)
counts = (st.sampled_from([1, 8, 9, 0, -1]) | st.integers(min_value=-(2**40), max_value=2**70) | json_values).map(
    json.dumps
)
index_texts = st.one_of(
    st.lists(
        st.tuples(
            video_dirs, st.lists(st.tuples(clip_ids, counts), max_size=4).map(_obj) | json_values.map(json.dumps)
        ),
        max_size=3,
    ).map(_obj),
    json_values.map(json.dumps),
)
cameras_args = st.none() | st.lists(st.sampled_from(["CAM_BACK", "CAM_BACK_LEFT", "CAM_FRONT", ""]), max_size=3)


def _load(path: Path, cameras: list[str] | None, check: str) -> VideoIndex | None:
    try:
        with warnings.catch_warnings():  # a fuzzed index may have no frame tables, which load_index warns about
            warnings.simplefilter("ignore", VStreamWarning)
            index = load_index(path, cameras=cameras, check=check)  # type: ignore[arg-type]
    except (ValueError, FileNotFoundError) as err:  # IndexValidationError and UnicodeDecodeError are ValueErrors
        note(f"{type(err).__name__}: {err}")
        return None
    assert len(index) >= 1
    for clip in index:
        assert isinstance(clip.frame_count, int) and clip.frame_count > 0
        assert tuple(c.name for c in clip.cameras) == index.camera_names
        assert all(c.path.exists() for c in clip.cameras)
    return index


def _write_index(dataset: Dataset, text: str | bytes, sidecar: str | None = None) -> Path:
    path = dataset.root / "fuzz.json"
    path.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8"))
    meta = metadata_path(path)
    if sidecar is None:
        meta.unlink(missing_ok=True)
    else:
        meta.write_text(sidecar, encoding="utf-8")
    return path


@FUZZ
@given(raw=st.binary(max_size=300) | st.text(max_size=300).map(lambda s: s.encode("utf-8", "surrogatepass")))
def test_load_index_on_arbitrary_bytes(dataset: Dataset, raw: bytes) -> None:
    _load(_write_index(dataset, raw), None, "fast")


@FUZZ
@given(case=st.data())
def test_load_index_on_truncated_index_and_sidecar(dataset: Dataset, case: st.DataObject) -> None:
    text = dataset.index_text
    sidecar = json.dumps(dataset.sidecar)
    cut_index = case.draw(st.integers(0, len(text)), label="index cut")
    cut_sidecar = case.draw(st.none() | st.integers(0, len(sidecar)), label="sidecar cut")
    path = _write_index(dataset, text[:cut_index], None if cut_sidecar is None else sidecar[:cut_sidecar])
    _load(path, None, case.draw(st.sampled_from(["fast", "thorough"]), label="check"))


@FUZZ
@given(text=index_texts, cameras=cameras_args, check=st.sampled_from(["fast", "thorough"]))
def test_load_index_on_json_of_any_shape(dataset: Dataset, text: str, cameras: list[str] | None, check: str) -> None:
    _load(_write_index(dataset, text), cameras, check)


def _info_dicts(real: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
    """A real serialised VideoInfo with fields dropped, replaced or mangled."""
    fields = sorted(real)
    mangled = st.fixed_dictionaries(
        {},
        optional={
            key: st.just(real[key])
            | json_values
            | (
                st.lists(st.integers(-5, 10**6) | st.floats(), max_size=30)
                if isinstance(real[key], list)
                else st.nothing()
            )
            for key in fields
        },
    )
    return mangled | st.just(real)


@FUZZ
@given(case=st.data(), check=st.sampled_from(["fast", "thorough"]))
def test_load_index_with_a_malformed_sidecar(dataset: Dataset, case: st.DataObject, check: str) -> None:
    real = dataset.sidecar["files"]
    keys = st.sampled_from(dataset.file_keys) | _names
    entries = json_values | st.fixed_dictionaries(
        {},
        optional={
            "size": st.sampled_from(sorted({e["size"] for e in real.values()})) | json_values,
            "info": _info_dicts(next(iter(real.values()))["info"]) | json_values,
        },
    )
    files = st.dictionaries(keys, entries, max_size=4) | json_values
    header = st.fixed_dictionaries(
        {
            "format": st.just("lightning_vstream.meta") | st.text(max_size=8),
            "version": st.just(1) | json_values,
            "files": files,
        }
    )
    sidecar = case.draw(header.map(json.dumps) | json_values.map(json.dumps), label="sidecar")
    _load(_write_index(dataset, dataset.index_text, sidecar), None, check)


# -- probing and decoding -----------------------------------------------------------------------


@dataclass(frozen=True)
class Video:
    """A pristine stamped file, its frame table, and where its MP4 index lies."""

    name: str
    data: bytes
    info: VideoInfo
    moov: tuple[int, int]


VIDEOS: dict[str, dict[str, Any]] = {
    "h264": {"codec": "h264"},
    "h264-faststart": {"codec": "h264", "faststart": True},
    "h264-bframes2-faststart": {"codec": "h264", "bframes": 2, "faststart": True},
    "hevc": {"codec": "hevc"},
    "hevc-faststart": {"codec": "hevc", "faststart": True},
}


def _top_level_box(data: bytes, fourcc: bytes) -> tuple[int, int]:
    offset = 0
    while offset + 8 <= len(data):
        size = int.from_bytes(data[offset : offset + 4], "big")
        if data[offset + 4 : offset + 8] == fourcc:
            return offset, offset + size
        if size < 8:
            break
        offset += size
    raise AssertionError(f"no {fourcc!r} box")


@pytest.fixture(scope="module")
def videos(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Video]:
    folder = tmp_path_factory.mktemp("fuzz-videos")
    result = {}
    for name, options in VIDEOS.items():
        path = write_stamped_video(folder / f"{name}.mp4", clip=CLIP, camera=CAMERA, frames=FRAMES, gop=GOP, **options)  # type: ignore[arg-type]
        data = path.read_bytes()
        result[name] = Video(name, data, probe_video(path), _top_level_box(data, b"moov"))
    return result


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz-damaged")


Op = tuple[Any, ...]


@st.composite
def damage(draw: st.DrawFn, video: Video) -> list[Op]:
    """One to three edits; a third of the positions fall in the MP4 index (moov), small but vital."""
    size = len(video.data)
    anywhere = st.integers(0, size - 1)
    position = st.one_of(anywhere, anywhere, st.integers(*video.moov).map(lambda p: min(p, size - 1)))
    chunk = st.integers(1, 512)
    op = st.one_of(
        st.tuples(st.just("truncate"), st.integers(0, size)),
        st.tuples(st.just("flip"), st.lists(st.tuples(position, st.integers(0, 7)), min_size=1, max_size=16)),
        st.tuples(st.just("set"), st.lists(st.tuples(position, st.integers(0, 255)), min_size=1, max_size=16)),
        st.tuples(st.just("delete"), position, chunk),
        st.tuples(st.just("duplicate"), position, chunk, anywhere),
    )
    return draw(st.lists(op, min_size=1, max_size=3))


def _apply(data: bytes, ops: list[Op]) -> bytes:
    out = bytearray(data)
    for op in ops:
        kind, *args = op
        if kind == "truncate":
            del out[args[0] :]
        elif not out:
            continue
        elif kind == "flip":
            for pos, bit in args[0]:
                out[pos % len(out)] ^= 1 << bit
        elif kind == "set":
            for pos, value in args[0]:
                out[pos % len(out)] = value
        elif kind == "delete":
            start = args[0] % len(out)
            del out[start : start + args[1]]
        elif kind == "duplicate":
            start = args[0] % len(out)
            piece = out[start : start + args[1]]
            at = args[2] % (len(out) + 1)
            out[at:at] = piece
    return bytes(out)


def _damaged(case: st.DataObject, videos: dict[str, Video], workdir: Path) -> tuple[Video, Path]:
    video = videos[case.draw(st.sampled_from(sorted(videos)), label="video")]
    ops = case.draw(damage(video), label="damage")
    path = workdir / "damaged.mp4"
    path.write_bytes(_apply(video.data, ops))
    return video, path


def _check_info(info: VideoInfo) -> None:
    assert info.frame_count >= 1
    assert all(b > a for a, b in zip(info.pts, info.pts[1:]))
    assert info.key_indices[0] == 0 and len(info.key_indices) == len(info.key_seek)
    assert info.crc32 is not None and len(info.crc32) == info.frame_count


@settings(FUZZ, max_examples=300)
@given(case=st.data())
def test_probe_damaged_video(videos: dict[str, Video], workdir: Path, case: st.DataObject) -> None:
    _, path = _damaged(case, videos, workdir)
    try:
        info = probe_video(path)
    except (VideoDecodeError, FileNotFoundError) as err:
        note(f"{type(err).__name__}: {err}")
        event(f"probe raised {type(err).__name__}")
        return
    event("probe returned a frame table")
    _check_info(info)


def _stamp(frame: Any) -> Stamp | None:
    try:
        return read_stamp(frame)
    except ValueError:
        return None


def _decode(path: Path, info: VideoInfo, indices: list[int], threads: int, *, exact: bool) -> int:
    """Read every frame in order, then ``indices`` one by one, then ``indices`` at once.

    Only frames or the documented errors may come out; with ``exact`` every frame returned
    must carry its own index in its stamp. Returns the number of frames returned.
    """
    returned = 0

    def check(index: int, frame: Any) -> None:
        nonlocal returned
        returned += 1
        if exact:
            assert _stamp(frame) == Stamp(CLIP, CAMERA, index), f"frame {index} came back as {_stamp(frame)}"

    decoder = PyAVDecoder(path, info=info, threads=threads)
    try:
        for index in [*range(info.frame_count), *indices]:
            try:
                frame = decoder.get(index)
            except (VideoDecodeError, IndexError) as err:
                note(f"get({index}): {type(err).__name__}: {err}")
                continue
            check(index, frame)
        try:
            frames = decoder.get_many(indices)
        except (VideoDecodeError, IndexError) as err:
            note(f"get_many: {type(err).__name__}: {err}")
        else:
            for index, frame in zip(indices, frames):
                check(index, frame)
    finally:
        decoder.close()
    return returned


@settings(FUZZ, max_examples=300)
@given(case=st.data(), threads=st.sampled_from([0, 1]))
def test_decode_damaged_video(videos: dict[str, Video], workdir: Path, case: st.DataObject, threads: int) -> None:
    video, path = _damaged(case, videos, workdir)
    indices = case.draw(st.lists(st.integers(-2, FRAMES + 1), max_size=6), label="random indices")
    # With the pristine frame table (packet and codec-configuration checksums) nothing wrong may come back.
    returned = _decode(path, video.info, indices, threads, exact=True)
    event("pristine table: " + ("frames returned, stamps checked" if returned else "no frame returned"))
    try:
        own = probe_video(path)
    except VideoDecodeError:
        return
    # The damaged file's own probe checksums the damage itself: only the error types are checked.
    returned = _decode(path, own, indices, threads, exact=False)
    event("own table: " + ("frames returned" if returned else "no frame returned"))


def test_fuzzing_decodes_the_pristine_files_exactly(videos: dict[str, Video], workdir: Path) -> None:
    """The harness itself: undamaged files come back frame-exact through the same checks."""
    for video in videos.values():
        path = workdir / f"pristine-{video.name}.mp4"
        path.write_bytes(video.data)
        assert _decode(path, video.info, [FRAMES - 1, 0, 7], 0, exact=True) == FRAMES + 6


# -- regressions: damage that once escaped as the wrong exception type --------------------------


def _corrupt(video: Video, workdir: Path, edit: Any) -> Path:
    data = bytearray(video.data)
    edit(data)
    path = workdir / f"regression-{video.name}.mp4"
    path.write_bytes(bytes(data))
    return path


def test_non_utf8_metadata_does_not_stop_probing(videos: dict[str, Video], workdir: Path) -> None:
    video = videos["h264-faststart"]

    def edit(data: bytearray) -> None:
        data[data.index(b"VideoHandler") + 3] = 0xFF  # the track's handler name, read as UTF-8

    path = _corrupt(video, workdir, edit)
    assert probe_video(path).frame_count == FRAMES
    assert read_stamp(PyAVDecoder(path, info=video.info).get(5)) == Stamp(CLIP, CAMERA, 5)


def test_unknown_codec_is_a_decode_error(videos: dict[str, Video], workdir: Path) -> None:
    video = videos["h264-faststart"]

    def edit(data: bytearray) -> None:
        at = data.index(b"avc1", video.moov[0])  # the sample description's codec tag
        data[at : at + 4] = b"zzzz"

    path = _corrupt(video, workdir, edit)
    with pytest.raises(VideoDecodeError, match="FFmpeg has no decoder for its video stream"):
        probe_video(path)
    with pytest.raises(VideoDecodeError, match="FFmpeg has no decoder for its video stream"):
        PyAVDecoder(path, info=video.info).get(3)


def test_failed_seek_is_a_decode_error(videos: dict[str, Video], workdir: Path) -> None:
    video = videos["h264-faststart"]
    # Cut where the sample timing table begins: the file opens with a known codec, but holds no
    # sample the demuxer can seek to.
    path = workdir / "cut-in-moov.mp4"
    path.write_bytes(video.data[: video.data.index(b"stts", video.moov[0]) - 4])
    with pytest.raises(VideoDecodeError, match=r"frame 6: seeking to this keyframe failed"):
        PyAVDecoder(path, info=video.info).get(7)


# -- regressions: damage that once escaped as the wrong exception or as wrong pixels -----------


def test_damaged_codec_configuration_is_detected(videos: dict[str, Video], workdir: Path) -> None:
    video = videos["h264-faststart"]

    def edit(data: bytearray) -> None:
        at = data.index(b"avcC", video.moov[0]) + 4  # the AVCDecoderConfigurationRecord
        data[at + 14] ^= 0x01  # one bit of the SPS: every frame still decodes, into wrong pixels

    path = _corrupt(video, workdir, edit)
    decoder = PyAVDecoder(path, info=video.info)
    with pytest.raises(VideoDecodeError):
        for index in range(FRAMES):
            assert read_stamp(decoder.get(index)) == Stamp(CLIP, CAMERA, index)


@pytest.mark.parametrize("which", ["index", "sidecar"])
def test_deeply_nested_json_is_a_value_error(dataset: Dataset, which: str) -> None:
    deep = "[" * 100_000
    path = _write_index(dataset, deep if which == "index" else dataset.index_text, deep if which == "sidecar" else None)
    with pytest.raises(ValueError):
        load_index(path)


@pytest.mark.parametrize(
    "entry", [{"v" * 300: {"scene-0000": 8}}, {"videos": {"s" * 300: 8}}], ids=["video_dir", "clip_id"]
)
def test_overlong_names_are_reported_not_raised_as_oserror(dataset: Dataset, entry: dict[str, Any]) -> None:
    with pytest.raises(IndexValidationError, match="does not exist"):
        load_index(_write_index(dataset, json.dumps(entry)))


def _sidecar_with(dataset: Dataset, entry: Any) -> str:
    files = dict(dataset.sidecar["files"])
    files[dataset.file_keys[0]] = entry
    return json.dumps({**dataset.sidecar, "files": files})


@pytest.mark.parametrize("entry", [[1, 2], "x", 3, {"info": [1]}], ids=["list", "str", "int", "info-list"])
def test_sidecar_entry_of_the_wrong_shape_is_ignored(dataset: Dataset, entry: Any) -> None:
    if isinstance(entry, dict):
        entry = {**entry, "size": dataset.sidecar["files"][dataset.file_keys[0]]["size"]}
    index = load_index(_write_index(dataset, dataset.index_text, _sidecar_with(dataset, entry)))
    assert index.clips[0].cameras[0].info is None


def test_sidecar_with_infinite_numbers_is_ignored(dataset: Dataset) -> None:
    key = dataset.file_keys[0]
    entry = dict(dataset.sidecar["files"][key])  # the right size, so the info is parsed
    entry["info"] = {**entry["info"], "width": float("inf")}
    index = load_index(_write_index(dataset, dataset.index_text, _sidecar_with(dataset, entry)))
    assert index.clips[0].cameras[0].info is None

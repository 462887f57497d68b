"""File identity and integrity: changed, swapped, replaced or corrupted files never deliver a wrong frame.

Also the full ``vstream index --check``, the binary frame tables, and the index-side errors (symbolic
link loops, unreadable folders and sidecars, bad UTF-8, absurd frame counts, non-normalised clip ids).
"""

from __future__ import annotations

import json
import os
import pickle
import re
import shutil
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from lightning_vstream import EngineOptions, ErrorOptions, PlanOptions
from lightning_vstream.cli import main
from lightning_vstream.decode.cpu.probe import probe_video
from lightning_vstream.decode.cpu.pyav import PyAVDecoder
from lightning_vstream.demos.synth import Stamp, read_stamp
from lightning_vstream.errors import (
    FileChangedError,
    IndexValidationError,
    VideoDecodeError,
)
from lightning_vstream.index import metadata_path
from lightning_vstream.index.identity import file_identity
from lightning_vstream.index.local_index import _WARNED_NO_TABLES
from lightning_vstream.index.table_file import FrameTables, tables_path
from lightning_vstream.index.table_write import write_tables
from lightning_vstream.indexing import build_index, load_index
from lightning_vstream.indexing.build import write_index_tables
from lightning_vstream.indexing.verify import verify_index
from tests._tables import build_index_with_json_tables

CHANGED = r"changed since the index was built.*Re-run `vstream index`"


@pytest.fixture
def data(make_dataset: Callable[..., Path], tmp_path: Path) -> Path:
    """A private copy of a two-clip, two-camera stamped dataset with binary frame tables."""
    source = make_dataset(clips=2, cameras=2, frames=[12, 16], size=(64, 48), gop=4)
    root = tmp_path / "data"
    shutil.copytree(source.parent, root, copy_function=shutil.copy2)  # keeps mtimes: the index stays valid
    return root / source.name


def _cam(root: Path, clip: int, camera: str) -> Path:
    return root.parent / "videos" / f"scene-{clip:04d}" / f"{camera}.mp4"


def _flip_byte_keeping_identity_stat(path: Path, offset: int) -> None:
    """Corrupt one byte in place: same size, modification time restored (what a quick check trusts)."""
    st = path.stat()
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x55
    path.write_bytes(bytes(data))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def _mid_packet_offset(path: Path) -> int:
    """A byte inside the compressed data of a middle frame (not the container header)."""
    import av

    with av.open(str(path)) as container:
        packets = [p for p in container.demux(container.streams.video[0]) if p.size]
        packet = packets[len(packets) // 2]
        assert packet.pos is not None
        return int(packet.pos) + packet.size // 2


def _frames(path: Path, info: object, count: int, label: str = "") -> Iterator[Stamp]:
    with PyAVDecoder(path, info=info, label=label) as dec:  # type: ignore[arg-type]
        for i in range(count):
            yield read_stamp(dec.get(i))


# -- file identity ----------------------------------------------------------------------------------------


def test_build_records_size_mtime_and_fingerprint(data: Path) -> None:
    file = _cam(data, 0, "CAM_BACK")
    info = load_index(data)["scene-0000"].cameras[0].info
    assert info is not None and info.identity == file_identity(file)
    assert info.identity.size == file.stat().st_size and info.identity.mtime_ns == file.stat().st_mtime_ns


def test_file_replaced_by_one_of_another_size_is_rejected(data: Path) -> None:
    target = _cam(data, 0, "CAM_BACK")
    shutil.copyfile(_cam(data, 1, "CAM_BACK"), target)  # another clip's file: 16 frames, another size
    with pytest.raises(FileChangedError, match=r"clip 'scene-0000', camera 'CAM_BACK'.*" + CHANGED) as err:
        load_index(data, check="thorough")
    assert "the compressed data of frame 0 differs from the checksum recorded" in str(err.value)
    cam = load_index(data)["scene-0000"].cameras[0]  # the fast check opens no file; the decoder does
    with pytest.raises(FileChangedError, match=r"CAM_BACK\.mp4' \(clip 'scene-0000', camera 'CAM_BACK'\) " + CHANGED):
        next(_frames(cam.path, cam.info, 1, label="clip 'scene-0000', camera 'CAM_BACK'"))


def test_file_replaced_after_load_fails_before_any_frame(data: Path) -> None:
    cam = load_index(data)["scene-0000"].cameras[0]
    shutil.copyfile(_cam(data, 1, "CAM_BACK"), cam.path)
    dec = PyAVDecoder(cam.path, info=cam.info, label="clip 'scene-0000', camera 'CAM_BACK'")
    with pytest.raises(FileChangedError, match=r"CAM_BACK\.mp4' \(clip 'scene-0000', camera 'CAM_BACK'\) " + CHANGED):
        dec.get(0)
    assert dec.frames_decoded == 0


def test_swapped_cameras_are_caught_by_the_fingerprint(data: Path) -> None:
    index = load_index(data)
    back, left = index["scene-0001"].cameras
    stats = {p: p.stat() for p in (back.path, left.path)}
    tmp = back.path.with_suffix(".tmp")
    back.path.rename(tmp)
    left.path.rename(back.path)
    tmp.rename(left.path)
    for cam in (back, left):
        # Even with the recorded modification times put back, the fingerprint differs.
        os.utime(cam.path, ns=(stats[cam.path].st_atime_ns, stats[cam.path].st_mtime_ns))
        with pytest.raises(FileChangedError, match=rf"camera '{cam.name}'.*{CHANGED}"):
            next(_frames(cam.path, cam.info, 1, label=f"clip 'scene-0001', camera {cam.name!r}"))
    with pytest.raises(FileChangedError):
        load_index(data, check="thorough")
    assert main(["index", str(data), "--check", "-q"]) == 1


def test_jpeg_renamed_mp4_fails_before_frame_zero(data: Path, tmp_path: Path) -> None:
    from PIL import Image

    cam = load_index(data)["scene-0000"].cameras[1]
    Image.new("RGB", (64, 48), (200, 10, 10)).save(tmp_path / "x.jpg")
    shutil.copyfile(tmp_path / "x.jpg", cam.path)
    # FFmpeg reads a JPEG as a one-frame MJPEG stream: the full re-verification refuses it.
    with pytest.raises(FileChangedError, match=CHANGED):
        next(_frames(cam.path, cam.info, 1))
    with pytest.raises(FileChangedError, match=r"camera 'CAM_BACK_LEFT'.*" + CHANGED):
        load_index(data, check="thorough")


def test_touched_file_is_reverified_and_delivers_the_right_frames(data: Path) -> None:
    file = _cam(data, 1, "CAM_BACK_LEFT")
    os.utime(file, ns=(0, 10**18))
    with open(file, "ab") as f:  # trailing bytes outside any packet: content unchanged
        f.write(b"\0" * 32)
    cam = load_index(data, check="thorough")["scene-0001"].cameras[1]
    assert cam.info is not None and cam.info.identity == file_identity(file)
    assert [s.frame for s in _frames(cam.path, cam.info, 16)] == list(range(16))
    cam = load_index(data)["scene-0001"].cameras[1]  # re-verified by the decoder on open
    assert [s.frame for s in _frames(cam.path, cam.info, 16)] == list(range(16))


def test_same_size_corruption_passes_the_quick_check_but_not_check(
    data: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    file = _cam(data, 1, "CAM_BACK")
    _flip_byte_keeping_identity_stat(file, _mid_packet_offset(file))
    assert main(["index", str(data), "--quick-check"]) == 0
    capsys.readouterr()
    assert main(["index", str(data), "--check", "-q"]) == 1
    err = capsys.readouterr().err
    assert "1 problem(s) in 4 files" in err
    assert "CAM_BACK.mp4' (clip 'scene-0001', camera 'CAM_BACK'): the compressed data of frame 8 differs" in err


def test_check_lists_every_problem(data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    corrupt = _cam(data, 0, "CAM_BACK")
    _flip_byte_keeping_identity_stat(corrupt, _mid_packet_offset(corrupt))
    shutil.copyfile(_cam(data, 0, "CAM_BACK_LEFT"), _cam(data, 1, "CAM_BACK_LEFT"))
    report = verify_index(data)
    assert report.files == 4 and len(report.problems) >= 2, report.problems
    text = "\n".join(report.problems)
    assert "(clip 'scene-0000', camera 'CAM_BACK'): the compressed data of frame 6 differs" in text
    assert "(clip 'scene-0001', camera 'CAM_BACK_LEFT'): holds 12 frames; the index recorded 16" in text
    assert main(["index", str(data), "--check", "-q"]) == 1
    assert "Restore the files, or re-run `vstream index`" in capsys.readouterr().err


def test_check_passes_on_an_intact_dataset(data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["index", str(data), "--check"]) == 0
    assert "4 files, 56 frames: every packet matches its checksum" in capsys.readouterr().out


# -- paths: symbolic links, relative and absolute -------------------------------------------------------


def test_video_folder_behind_a_symlink_keeps_crc_checks(data: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "disk2" / "videos"
    elsewhere.parent.mkdir()
    shutil.move(str(data.parent / "videos"), elsewhere)
    (data.parent / "videos").symlink_to(elsewhere, target_is_directory=True)
    for path in (data, Path(os.path.relpath(data)), data.parent / ".." / data.parent.name / data.name):
        index = load_index(path)
        assert all(cam.info is not None and cam.info.crc32 is not None for clip in index for cam in clip.cameras)
    cam = load_index(data)["scene-0001"].cameras[0]
    _flip_byte_keeping_identity_stat(cam.path, _mid_packet_offset(cam.path))
    # The fingerprint differs, so the file is re-verified on open: its first 8 frames are intact,
    # so it is accepted, and the damaged packet raises at frame 8 (frames still inside FFmpeg's
    # threaded pipeline when packet 8 is read are never delivered).
    delivered: list[Stamp] = []
    with pytest.raises(VideoDecodeError, match=r"frame 8: the compressed data differs from the checksum"):
        delivered.extend(_frames(cam.path, cam.info, 16))
    assert delivered == [Stamp(1, 0, i) for i in range(len(delivered))] and len(delivered) <= 8


def test_index_built_through_a_symlinked_video_folder(data: Path, tmp_path: Path) -> None:
    root = tmp_path / "ds"
    root.mkdir()
    (root / "videos").symlink_to(data.parent / "videos", target_is_directory=True)
    out = build_index(root, output=root / "index.json", progress=False)
    assert json.loads(out.read_text()) == {"videos": {"scene-0000": 12, "scene-0001": 16}}
    assert min(FrameTables(tables_path(out)).keys()) == "videos/scene-0000/CAM_BACK.mp4"
    assert all(cam.info is not None for clip in load_index(out) for cam in clip.cameras)


def test_plain_index_warns_once_and_tables_turn_checks_on(data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tables_path(data).unlink()
    _WARNED_NO_TABLES.discard(str(data))
    with pytest.warns(
        UserWarning,
        match=r"index '.*index\.json' has no frame tables .* integrity checks are off.*"
        r"`vstream index --tables .*index\.json`",
    ):
        load_index(data)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_index(data)  # told once
    assert main(["index", str(data), "--tables", "-q"]) == 0
    assert "integrity checks are on" in capsys.readouterr().out
    _WARNED_NO_TABLES.discard(str(data))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        index = load_index(data)
    assert all(cam.info is not None and cam.info.identity is not None for clip in index for cam in clip.cameras)


def test_tables_of_a_curated_index_keep_its_clips(data: Path) -> None:
    subset = data.with_name("subset.json")
    subset.write_text(json.dumps({"videos": {"scene-0001": 16}}))
    written = write_index_tables(subset, progress=False)
    assert written == tables_path(subset)
    assert sorted(FrameTables(written).keys()) == [
        "videos/scene-0001/CAM_BACK.mp4",
        "videos/scene-0001/CAM_BACK_LEFT.mp4",
    ]
    assert json.loads(subset.read_text()) == {"videos": {"scene-0001": 16}}


def test_json_sidecar_is_still_read_and_checked(data: Path) -> None:
    build_index_with_json_tables(data.parent, output=data, progress=False, video_dirs=["videos"])
    assert metadata_path(data).is_file() and not tables_path(data).exists()
    shutil.copyfile(_cam(data, 1, "CAM_BACK"), _cam(data, 0, "CAM_BACK"))
    with pytest.raises(FileChangedError, match=r"clip 'scene-0000', camera 'CAM_BACK'"):
        load_index(data, check="thorough")


def test_older_sidecar_with_size_only_is_reverified_on_size_change(data: Path) -> None:
    build_index_with_json_tables(data.parent, output=data, progress=False, video_dirs=["videos"])
    meta = json.loads(metadata_path(data).read_text())
    for entry in meta["files"].values():
        del entry["identity"]
    metadata_path(data).write_text(json.dumps(meta))
    assert load_index(data, check="thorough")["scene-0000"].cameras[0].info is not None  # the size matches
    shutil.copyfile(_cam(data, 1, "CAM_BACK"), _cam(data, 0, "CAM_BACK"))
    with pytest.raises(FileChangedError, match=CHANGED):
        load_index(data, check="thorough")


# -- binary frame tables ----------------------------------------------------------------------------------


def test_binary_tables_match_the_probe_and_deliver_exact_frames(data: Path) -> None:
    index = load_index(data)
    for clip in index:
        for cam in clip.cameras:
            assert cam.tables is not None and cam.info == probe_video(cam.path)
    cam = index["scene-0001"].cameras[1]
    assert list(_frames(cam.path, cam.info, 16)) == [Stamp(1, 1, i) for i in range(16)]


def test_pickled_index_sends_the_table_path_not_the_tables(data: Path) -> None:
    index = load_index(data)
    tables = index[0].cameras[0].tables
    assert tables is not None
    payload = pickle.dumps(tables)
    assert len(payload) < 200 and b"tables.bin" in payload
    again = pickle.loads(pickle.dumps(index))
    assert again == index and again[1].cameras[0].info == index[1].cameras[0].info


def test_lookup_of_unknown_keys(data: Path, tmp_path: Path) -> None:
    tables = FrameTables(tables_path(data))
    assert tables.row("videos/nope.mp4") == -1 and tables.get("videos/scene-0000/CAM_BACK.mp4x" * 9) is None
    assert tables.rows([]).shape == (0,)
    empty = write_tables(tmp_path / "empty.tables.bin", {})
    assert len(FrameTables(empty)) == 0 and FrameTables(empty).row("a") == -1


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda b: b"NOTATABL" + b[8:], "is not a version-2 lightning_vstream frame-table file"),
        (lambda b: b[: len(b) // 2], "is truncated or damaged"),
        (lambda b: b[:16] + b"\xff" * 8 + b[24:], "has a damaged header"),
    ],
)
def test_damaged_binary_tables(data: Path, damage: Callable[[bytes], bytes], message: str) -> None:
    path = tables_path(data)
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(
        IndexValidationError, match=rf"frame-table file '.*index\.tables\.bin' {message}.*re-run `vstream index`"
    ):
        load_index(data)


def test_timestamps_beyond_64_bits_are_refused(data: Path, tmp_path: Path) -> None:
    import dataclasses

    info = probe_video(_cam(data, 0, "CAM_BACK"))
    huge = dataclasses.replace(info, pts=tuple(p + 10**30 for p in info.pts))
    with pytest.raises(ValueError, match=r"field 'pts' holds a value beyond 64 bits"):
        write_tables(tmp_path / "t.tables.bin", {"a.mp4": huge})


# -- index-side errors --------------------------------------------------------------------------------------


def test_clip_folder_that_is_a_symlink_loop(data: Path) -> None:
    folder = data.parent / "videos" / "scene-0001"
    shutil.rmtree(folder)
    folder.symlink_to(folder)
    with pytest.raises(IndexValidationError, match=r"clip 'scene-0001': folder '.*scene-0001' is a symbolic link loop"):
        load_index(data)


def test_build_over_a_symlink_loop_terminates(data: Path) -> None:
    (data.parent / "videos" / "loop").symlink_to(data.parent / "videos", target_is_directory=True)
    out = build_index(data.parent, output=data, progress=False)
    assert json.loads(out.read_text()) == {"videos": {"scene-0000": 12, "scene-0001": 16}}


def test_unreadable_clip_folder(data: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_scandir = os.scandir
    folder = str(data.parent / "videos" / "scene-0001")

    def scandir(path: object = ".") -> object:
        if str(path) == folder:
            raise PermissionError(13, "Permission denied", folder)
        return real_scandir(path)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "scandir", scandir)
    # With frame tables, the quick check takes each clip's camera files from the tables and lists
    # no clip folder (a decoder opening a file there names it); the thorough check lists them all.
    assert len(load_index(data)) == 2
    with pytest.raises(
        IndexValidationError,
        match=r"clip 'scene-0001': folder '.*scene-0001' cannot be read "
        r"\(Permission denied\); check its permissions",
    ):
        load_index(data, check="thorough")
    with pytest.raises(IndexValidationError, match=r"folder '.*scene-0001' cannot be read \(Permission denied\)"):
        build_index(data.parent, output=data, progress=False)


def test_unreadable_sidecar(data: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    build_index_with_json_tables(data.parent, output=data, progress=False, video_dirs=["videos"])
    real = Path.read_bytes

    def read_bytes(self: Path) -> bytes:
        if self.name == "index.meta.json":
            raise PermissionError(13, "Permission denied", str(self))
        return real(self)

    monkeypatch.setattr(Path, "read_bytes", read_bytes)
    with pytest.raises(
        IndexValidationError,
        match=r"metadata file '.*index\.meta\.json' cannot be read "
        r"\(Permission denied\)",
    ):
        load_index(data)


def test_unreadable_binary_tables(data: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    real_open = builtins.open

    def fake_open(file: object, *args: object, **kwargs: object) -> object:
        if str(file).endswith(".tables.bin"):
            raise PermissionError(13, "Permission denied", str(file))
        return real_open(file, *args, **kwargs)  # type: ignore[call-overload]

    monkeypatch.setattr(builtins, "open", fake_open)
    with pytest.raises(IndexValidationError, match=r"frame-table file '.*' cannot be read \(Permission denied\)"):
        load_index(data)


def test_index_with_bad_utf8(data: Path) -> None:
    data.write_bytes(b'{"videos": {"scene-0000": 12, "sc\xe9ne": 3}}')
    with pytest.raises(
        IndexValidationError, match=r"index file '.*index\.json' is not valid UTF-8 \(byte 33: b'\\xe9'\)"
    ):
        load_index(data)


def test_absurd_frame_count(data: Path) -> None:
    data.write_text(json.dumps({"videos": {"scene-0000": 10**30}}))
    with pytest.raises(
        IndexValidationError,
        match=r"clip 'scene-0000' has frame count 10{30}, more than any video "
        r"holds \(at most 2147483647\)",
    ):
        load_index(data)


@pytest.mark.parametrize("clip_id", ["../videos/scene-0001", "scene-0000/", ".", "..", "a\\b", ""])
def test_clip_ids_must_be_plain_folder_names(data: Path, clip_id: str) -> None:
    data.write_text(json.dumps({"videos": {"scene-0000": 12, clip_id: 16}}))
    with pytest.raises(
        IndexValidationError,
        match=rf"clip id {re.escape(repr(clip_id))} in video folder "
        r"'videos' is not a plain folder name",
    ):
        load_index(data)


def test_one_folder_under_two_names(data: Path) -> None:
    data.write_text(json.dumps({"videos": {"scene-0000": 12}, "./videos/": {"scene-0001": 16}}))
    with pytest.raises(IndexValidationError, match=r"video folders 'videos' and './videos/' are the same folder"):
        load_index(data)
    (data.parent / "alias").symlink_to(data.parent / "videos", target_is_directory=True)
    data.write_text(json.dumps({"videos": {"scene-0000": 12}, "alias": {"scene-0001": 16}}))
    with pytest.raises(IndexValidationError, match=r"video folders 'videos' and 'alias' are the same folder"):
        load_index(data)


# -- end to end: the streaming loader -----------------------------------------------------------------------


def _stream(index_file: Path, on_error: str) -> list[dict[str, object]]:
    from lightning_vstream import StreamVideoDataModule

    dm = StreamVideoDataModule(
        index_file=index_file,
        batch_size=2,
        engine=EngineOptions(num_workers=0),
        errors=ErrorOptions(on_error=on_error),
        plan=PlanOptions(shuffle=False),
    )
    dm.setup("fit")
    return list(dm.train_dataloader())


def test_stream_never_delivers_a_replaced_file(data: Path) -> None:
    shutil.copyfile(_cam(data, 1, "CAM_BACK"), _cam(data, 0, "CAM_BACK"))  # clip 1's camera under clip 0's name
    with pytest.raises(FileChangedError, match=r"clip 'scene-0000', camera 'CAM_BACK'.*" + CHANGED):
        _stream(data, "raise")
    delivered = 0
    for batch in _stream(data, "skip"):
        for slot in range(2):
            if not batch["valid"][slot]:  # type: ignore[index]
                continue
            clip_id, frame = batch["clip_id"][slot], int(batch["frame_index"][slot])  # type: ignore[index]
            assert clip_id != "scene-0000"
            for cam in range(2):
                assert read_stamp(batch["frames"][slot, cam]) == Stamp(int(clip_id[-4:]), cam, frame)  # type: ignore[index]
            delivered += 1
    assert delivered > 0  # frames of the intact clip, each checked; none of the replaced one

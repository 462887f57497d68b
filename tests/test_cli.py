"""The ``vstream`` command, run in-process through ``lightning_vstream.cli.main``."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from lightning_vstream.cli import main
from lightning_vstream.decode.cpu import PyAVDecoder
from lightning_vstream.demos.synth import Stamp, read_stamp
from lightning_vstream.index import load_index, metadata_path, tables_path


@pytest.fixture(scope="module")
def synth_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A dataset written by ``vstream synth`` (2 clips x 2 cameras, 6 and 8 frames)."""
    root = tmp_path_factory.mktemp("cli") / "data"
    argv = ["synth", str(root), "--clips", "2", "--cameras", "2", "--frames", "6,8", "--size", "64x48", "--gop", "4"]
    assert main(argv) == 0
    return root


def test_synth_writes_a_dataset(synth_root: Path) -> None:
    index_path = synth_root / "index.json"
    assert json.loads(index_path.read_text()) == {"videos": {"scene-0000": 6, "scene-0001": 8}}
    assert tables_path(index_path).is_file()
    index = load_index(index_path)
    assert index.camera_names == ("CAM_BACK", "CAM_BACK_LEFT")
    cam = index["scene-0001"].cameras[1]
    assert cam.info is not None and (cam.info.width, cam.info.height) == (64, 48)
    assert read_stamp(PyAVDecoder(cam.path).get(7)) == Stamp(1, 1, 7)


def test_synth_prints_a_summary(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "one"
    argv = ["synth", str(root), "--clips", "1", "--cameras", "1", "--frames", "2", "--size", "32x32", "--gop", "2"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert f"wrote 1 clips x 1 cameras to {root}; index: {root / 'index.json'}" in out


def test_index_then_check(synth_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "elsewhere" / "out.json"
    assert main(["index", str(synth_root), "-o", str(out), "-q"]) == 0
    printed = capsys.readouterr().out
    assert f"wrote {out}: 2 clips, cameras ['CAM_BACK', 'CAM_BACK_LEFT'], 14 frames per camera" in printed
    data = json.loads(out.read_text())
    assert list(data.values()) == [{"scene-0000": 6, "scene-0001": 8}]
    assert tables_path(out).is_file() and not metadata_path(out).exists()

    assert main(["index", str(out), "--check"]) == 0
    printed = capsys.readouterr().out
    assert f"{out}: 4 files, 28 frames: every packet matches its checksum." in printed
    assert main(["index", str(out), "--quick-check"]) == 0
    printed = capsys.readouterr().out
    assert f"{out}: 2 clips, 2 cameras, 14 frames per camera: all files match the index" in printed


def test_index_default_output_and_no_metadata(
    tmp_path: Path, synth_root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "copy"
    shutil.copytree(synth_root / "videos", root / "videos")
    assert main(["index", str(root), "--no-metadata", "--quiet"]) == 0
    assert (root / "index.json").is_file()
    assert not metadata_path(root / "index.json").exists() and not tables_path(root / "index.json").exists()
    assert "2 clips" in capsys.readouterr().out


def test_check_reports_problems(synth_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({str(synth_root / "videos"): {"scene-0000": 9, "scene-0001": 8, "scene-0404": 3}}))
    assert main(["index", str(bad), "--quick-check"]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith(f"vstream index: error: {str(bad)!r} has 3 problems:")
    assert "clip 'scene-0000' lists 9 frames, but camera 'CAM_BACK' (CAM_BACK.mp4) holds 6" in captured.err
    assert "clip 'scene-0404': folder" in captured.err


def test_check_of_a_missing_index(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["index", str(tmp_path / "missing.json"), "--check"]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert f"vstream index: error: index file {str(tmp_path / 'missing.json')!r} does not exist." in captured.err


def test_index_of_a_missing_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["index", str(tmp_path / "nowhere"), "-q"]) == 1
    assert "vstream index: error: dataset folder" in capsys.readouterr().err


def test_index_of_a_folder_without_videos(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["index", str(tmp_path), "-q"]) == 1
    assert "no clip folders with video files or image folders found" in capsys.readouterr().err


def test_synth_rejects_a_too_small_size(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["synth", str(tmp_path / "d"), "--size", "16x16", "--clips", "1", "--cameras", "1", "--frames", "2"]
    assert main(argv) == 1
    assert "vstream synth: error: frames of 16x16 are too small for a stamp" in capsys.readouterr().err


@pytest.mark.parametrize("size", ["abc", "64", "64x48x3", "64xx48", "wide"])
def test_bad_size_is_an_argparse_error(tmp_path: Path, size: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["synth", str(tmp_path), "--size", size])
    assert exit_info.value.code == 2
    assert f"argument --size: size {size!r} must look like WIDTHxHEIGHT" in capsys.readouterr().err
    assert not (tmp_path / "index.json").exists()


@pytest.mark.parametrize(
    ("frames", "message"), [("0", "must be positive"), ("5,x", "must be a count or a comma-separated list")]
)
def test_bad_frames_is_an_argparse_error(
    tmp_path: Path, frames: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["synth", str(tmp_path), "--frames", frames])
    assert exit_info.value.code == 2
    assert f"argument --frames: frames {frames!r} {message}" in capsys.readouterr().err


def test_command_is_required(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main([])
    assert exit_info.value.code == 2
    assert "the following arguments are required: COMMAND" in capsys.readouterr().err


def test_help_lists_the_commands(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for command in ("synth", "index", "demo"):
        assert command in out


def test_index_of_an_index_file_points_to_check(synth_root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["index", str(synth_root / "index.json")]) == 1
    assert "is a file; `vstream index` scans a dataset folder" in capsys.readouterr().err


def test_check_of_a_folder_points_to_the_index_file(synth_root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["index", "--check", str(synth_root)]) == 1
    assert "is a folder; --check works on an index file" in capsys.readouterr().err


def test_version_comes_from_the_package_metadata(capsys: pytest.CaptureFixture[str]) -> None:
    from importlib.metadata import version

    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f"vstream (lightning_vstream) {version('lightning_vstream')}"


@pytest.mark.parametrize("command", [[], ["synth"], ["index"], ["demo"]])
def test_help_shows_defaults_and_no_markup(command: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main([*command, "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert "``" not in out
    if command in (["synth"], ["demo"]):
        assert "(default: " in out
        for line in out.splitlines():
            if line.strip().startswith("--") and "--help" not in line and "  " in line.strip():
                assert line.split("  ", 1)[1].strip(), f"option without help text: {line!r}"


def test_permission_error_is_a_message_and_exit_1(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    denied = tmp_path / "locked" / "CAM_FRONT.mp4"

    def refuse(*args: object, **kwargs: object) -> None:
        raise PermissionError(13, "Permission denied", str(denied))

    monkeypatch.setattr("lightning_vstream.index.build_index", refuse)
    assert main(["index", str(tmp_path), "-q"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"vstream index: error: permission denied {str(denied)!r}")
    assert "Traceback" not in err


@pytest.mark.parametrize("option", ["--clips=0", "--jobs=-1", "--gop=x", "--bframes=-2"])
def test_bad_synth_numbers_are_usage_errors(tmp_path: Path, option: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["synth", str(tmp_path / "d"), option])
    assert exit_info.value.code == 2
    assert "error: argument" in capsys.readouterr().err

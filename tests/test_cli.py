"""The ``vstream`` command, run in-process through ``lightning_vstream.cli.main``."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from lightning_vstream.cli import main
from lightning_vstream.decode.cpu.pyav import PyAVDecoder
from lightning_vstream.demos.synth import Stamp, read_stamp
from lightning_vstream.index import metadata_path, tables_path
from lightning_vstream.indexing import load_index


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
    assert main(["index", str(tmp_path / "missing.json"), "--check"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert f"vstream index: error: index file {str(tmp_path / 'missing.json')!r} does not exist." in captured.err
    assert "`vstream index DATASET_FOLDER`" in captured.err and "`vstream synth FOLDER`" in captured.err


def test_index_of_a_missing_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["index", str(tmp_path / "nowhere"), "-q"]) == 2
    assert "vstream index: error: dataset folder" in capsys.readouterr().err


def test_index_of_a_folder_without_videos(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["index", str(tmp_path), "-q"]) == 1
    assert "no clip folders with video files or image folders found" in capsys.readouterr().err


def test_synth_rejects_a_too_small_size(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["synth", str(tmp_path / "d"), "--size", "16x16", "--clips", "1", "--cameras", "1", "--frames", "2"]
    assert main(argv) == 2
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
    assert main(["index", str(synth_root / "index.json")]) == 2
    assert "is a file; `vstream index` scans a dataset folder" in capsys.readouterr().err


def test_check_of_a_folder_points_to_the_index_file(synth_root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["index", "--check", str(synth_root)]) == 2
    err = capsys.readouterr().err
    assert "is a folder; --check works on an index file" in err
    assert f"`vstream index --check {synth_root / 'index.json'}`" in err


def test_version_comes_from_the_package_metadata(capsys: pytest.CaptureFixture[str]) -> None:
    from importlib.metadata import version

    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f"vstream (lightning_vstream) {version('lightning_vstream')}"


@pytest.mark.parametrize("command", [[], ["synth"], ["index"], ["demo"], ["encode"], ["import-nuscenes"]])
def test_help_shows_defaults_and_no_markup(command: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main([*command, "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert "``" not in out
    # Only defaults that say something: none for options that are off unless given.
    assert "(default: None)" not in out and "(default: False)" not in out and "(default: [])" not in out
    assert "(default: (" not in out  # a size reads 160x96, not as a Python tuple
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

    monkeypatch.setattr("lightning_vstream.indexing.build_index", refuse)
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


# -- fast, lazy commands -------------------------------------------------------------------------
_HEAVY = ("torch", "lightning", "av", "numpy")


def test_help_of_every_command_imports_no_heavy_package() -> None:
    """`vstream --help` and each command's --help answer without importing torch, lightning, av or numpy."""
    import subprocess
    import sys

    from lightning_vstream.cli import COMMANDS

    code = (
        "import sys\n"
        "from lightning_vstream.cli import main\n"
        f"for argv in {[['--help']] + [[name, '--help'] for name in COMMANDS]!r}:\n"
        "    try:\n"
        "        main(argv)\n"
        "    except SystemExit as exit:\n"
        "        assert exit.code == 0, (argv, exit.code)\n"
        f"print(sorted(m for m in {_HEAVY!r} if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.strip().splitlines()[-1] == "[]"
    assert "import-nuscenes" in done.stdout and "--replace" in done.stdout


def test_importing_the_package_imports_no_heavy_package() -> None:
    import subprocess
    import sys

    code = (
        "import sys, lightning_vstream\n"
        "assert lightning_vstream.__version__\n"
        f"print(sorted(m for m in {_HEAVY!r} if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.strip() == "[]"


def test_every_public_name_resolves() -> None:
    import lightning_vstream

    for name in lightning_vstream.__all__:
        assert getattr(lightning_vstream, name) is not None, name
    assert set(lightning_vstream.__all__) <= set(dir(lightning_vstream))
    with pytest.raises(AttributeError, match="has no attribute 'Nope'"):
        lightning_vstream.Nope  # noqa: B018


def test_a_registered_command_is_imported_only_when_it_runs(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import sys
    import types

    from lightning_vstream import cli

    module = types.ModuleType("vstream_hello_command")

    def add_arguments(parser: object) -> None:
        parser.add_argument("--name", default="world")  # type: ignore[attr-defined]

    def run(args: object) -> int:
        print(f"hello {args.name}")  # type: ignore[attr-defined]
        return 0

    module.add_arguments, module.run = add_arguments, run  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vstream_hello_command", module)
    commands = {
        **cli.COMMANDS,
        "hello": cli.Command("say hello", "vstream_hello_command"),
        "broken": cli.Command("a command whose module does not import", "no_such_package.command"),
    }
    monkeypatch.setattr(cli, "COMMANDS", commands)
    assert main(["hello", "--name", "vstream"]) == 0
    assert capsys.readouterr().out == "hello vstream\n"
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])  # lists "broken" without importing it
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert "say hello" in out and "a command whose module does not import" in out
    with pytest.raises(ModuleNotFoundError):
        main(["broken"])


def test_a_misspelt_command_suggests_the_closest(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["snyth", "data"])
    assert exit_info.value.code == 2
    assert "invalid choice: 'snyth'" in capsys.readouterr().err.splitlines()[-1]


def test_no_metadata_is_said_in_words_not_as_a_warning(
    synth_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import warnings

    root = tmp_path / "bare"
    shutil.copytree(synth_root / "videos", root / "videos")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert main(["index", str(root), "--no-metadata", "-q"]) == 0
    out = capsys.readouterr().out
    assert "note: no frame tables (--no-metadata), so integrity checks are off for these files; " in out
    assert f"`vstream index --tables {root / 'index.json'}` writes them." in out


# -- exit codes ------------------------------------------------------------------------------------
def test_exit_codes_tell_a_wrong_command_line_from_a_failed_run(
    synth_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # 2: the command line is wrong (a path of the wrong kind, conflicting flags, a value out of range).
    assert main(["index", str(synth_root / "index.json"), "--check", "--tables"]) == 2
    assert "--check and --tables cannot be combined" in capsys.readouterr().err
    assert main(["encode", str(tmp_path / "none.json"), str(tmp_path / "out"), "-q"]) == 2
    assert "source index" in capsys.readouterr().err
    # 1: the command ran and found the data bad.
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({str(synth_root / "videos"): {"scene-0000": 9}}))
    assert main(["index", str(bad), "--quick-check"]) == 1
    assert "lists 9 frames" in capsys.readouterr().err


# -- vstream synth: progress, replacing a dataset, image folders ------------------------------------
def _synth(root: Path, *extra: str) -> list[str]:
    return ["synth", str(root), "--clips", "2", "--cameras", "2", "--frames", "4", "--size", "64x48", *extra]


def test_synth_prints_a_line_per_file_when_not_on_a_terminal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(_synth(tmp_path / "d")) == 0
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 4 and err[0].startswith("[1/4] wrote ") and err[-1].startswith("[4/4] wrote ")
    assert {Path(line.split(" wrote ")[1]).name for line in err} == {"CAM_BACK.mp4", "CAM_BACK_LEFT.mp4"}
    assert main([*_synth(tmp_path / "q"), "--quiet"]) == 0
    assert capsys.readouterr().err == ""


def test_synth_shows_a_bar_on_a_terminal() -> None:
    import io

    from lightning_vstream.commands.synth import progress_reporter

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    out = Terminal()
    with progress_reporter("writing videos", stream=out) as report:
        for done in range(1, 4):
            report(f"f{done}.mp4", done, 3)
    assert "writing videos: 100%" in out.getvalue() and "3/3" in out.getvalue()
    assert "wrote" not in out.getvalue()


def test_synth_refuses_a_folder_holding_another_dataset_unless_told_to_replace_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "data"
    assert main([*_synth(root), "--cameras", "3", "--clips", "3", "-q"]) == 0
    (root / "notes.txt").write_text("mine")
    capsys.readouterr()
    assert main([*_synth(root), "-q"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        f"vstream synth: error: {str(root)!r} holds another dataset: videos/scene-0000/CAM_BACK_RIGHT.mp4, "
        "videos/scene-0001/CAM_BACK_RIGHT.mp4, videos/scene-0002/ would not be overwritten"
    )
    assert "pass --replace" in err
    assert len(load_index(root / "index.json").camera_names) == 3  # untouched

    assert main([*_synth(root), "-q", "--replace"]) == 0
    index = load_index(root / "index.json")  # the stale third camera and clip are gone
    assert index.camera_names == ("CAM_BACK", "CAM_BACK_LEFT") and len(index) == 2
    assert sorted(p.name for p in (root / "videos").iterdir()) == ["scene-0000", "scene-0001"]
    assert (root / "notes.txt").read_text() == "mine"  # only the dataset's own entries are replaced
    assert main([*_synth(root), "-q"]) == 0  # the same dataset again: every file is overwritten, none left over
    assert main([*_synth(root), "-q", "--images"]) == 2  # camera folders would sit beside the camera files


def test_synth_writes_an_image_dataset_that_encode_takes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("PIL")
    from lightning_vstream.decode import make_decoder

    root = tmp_path / "images"
    assert main([*_synth(root), "--images", "--fps", "10", "-q"]) == 0
    folder = root / "videos" / "scene-0001" / "CAM_BACK_LEFT"
    assert sorted(p.name for p in folder.iterdir())[:2] == ["000000.jpg", "000001.jpg"]
    index = load_index(root / "index.json")
    cam = index["scene-0001"].cameras[1]
    assert cam.path == folder and cam.info is not None and cam.info.timestamps == pytest.approx([0, 0.1, 0.2, 0.3])
    assert read_stamp(make_decoder(folder).get(3)) == Stamp(1, 1, 3)
    assert main(["encode", str(root / "index.json"), str(tmp_path / "encoded"), "--codec", "h264", "-q"]) == 0
    encoded = load_index(tmp_path / "encoded" / "index.json")
    assert read_stamp(PyAVDecoder(encoded["scene-0001"].cameras[1].path).get(3)) == Stamp(1, 1, 3)


def test_an_error_is_its_message_and_debug_adds_the_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("VSTREAM_DEBUG", raising=False)
    missing = tmp_path / "index.json"
    assert main(["index", str(missing), "--check"]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"vstream index: error: index file {str(missing)!r} does not exist. Run `vstream index DATASET_FOLDER` to "
        "index your videos, or `vstream synth FOLDER` for a stamped dataset.\n"
    )
    for argv in (["--debug", "index", str(missing), "--check"], ["index", str(missing), "--check", "--debug"]):
        assert main(argv) == 2  # the same exit status
        err = capsys.readouterr().err
        assert "Traceback (most recent call last)" in err and err.endswith(
            f"{str(missing)!r} does not exist. Run "
            "`vstream index DATASET_FOLDER` to index your videos, or `vstream synth FOLDER` for a stamped dataset.\n"
        )
    monkeypatch.setenv("VSTREAM_DEBUG", "1")
    assert main(["index", str(missing), "--check"]) == 2
    assert "Traceback (most recent call last)" in capsys.readouterr().err


def test_an_error_from_a_worker_prints_without_the_workers_traceback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from lightning_vstream.errors import VideoDecodeError

    try:  # what torch's DataLoader raises in the training process for an error in a worker
        raise VideoDecodeError("boom")
    except VideoDecodeError:
        import traceback

        rebuilt = VideoDecodeError(
            f"Caught VideoDecodeError in DataLoader worker process 0.\nOriginal {traceback.format_exc()}"
        )

    def fail(args: object) -> int:
        raise rebuilt

    monkeypatch.delenv("VSTREAM_DEBUG", raising=False)
    monkeypatch.setattr("lightning_vstream.commands.synth.run", fail)
    assert main(["synth", "x"]) == 1
    assert capsys.readouterr().err == "vstream synth: error: boom\n"


def test_synth_refuses_a_too_small_frame_before_creating_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "d"
    assert main(["synth", str(root), "--size", "16x16", "-q"]) == 2
    assert "frames of 16x16 are too small for a stamp; use at least 32x32." in capsys.readouterr().err
    assert not root.exists()  # "before any work": not even d/videos


# -- one rule for a wrong command line: exit status 2, before any work -----------------------------
#: Per command, mistakes on its command line, run in a folder holding a stamped dataset (``data/``) and a
#: nuScenes-layout one (``nus/``): each exits with status 2 as docs/cli.md states, before anything is written.
USAGE_MISTAKES: dict[str, list[list[str]]] = {
    "demo": [
        ["--cache-dir", "data/index.json", "--steps", "1"],
        ["--cache-dir", "data/index.json/cache", "--steps", "1"],
        ["--steps", "0"],
        ["--num-workers", "-1"],
    ],
    "synth": [
        ["new", "--size", "16x16", "-q"],
        ["new", "--fps", "0", "-q"],
        ["new", "--fps", "-3", "-q"],
        ["new", "--preset", "quick", "-q"],
        ["new", "--frames", "0", "-q"],
        ["data/index.json", "-q"],
    ],
    "index": [
        ["data/indx.json", "--check"],
        ["data/indx.json", "--quick-check"],
        ["data/indx.json", "--tables"],
        ["nodata", "-o", "new/index.json"],
        ["data/index.json"],
        ["data", "--check"],
        ["data/index.json", "--check", "--tables"],
        ["data", "-o", "new/index.json", "-j", "0"],
        ["data", "-o", "new/index.json", "--table-format", "json"],
        ["data", "-o", "new/index.json", "--storage-option", "endpoint=http://127.0.0.1:9"],
        ["data", "-o", "new/index.json", "--bogus"],
    ],
    "encode": [
        ["data/indx.json", "new", "-q"],
        ["data/index.json", "data/index.json", "-q"],
        ["data/index.json", "new", "--cameras", "CAM_NOPE", "-q"],
        ["data/index.json", "new", "--preset", "quick", "-q"],
        ["data/index.json", "new", "--bitrate", "lots", "-q"],
        ["data/index.json", "new", "--crf", "99", "-q"],
    ],
    "import-nuscenes": [
        ["nodata", "new", "-q"],
        ["nus", "new", "--dataset-version", "v9.9", "-q"],
        ["nus", "new", "--scenes", "scene-nope", "-q"],
        ["nus", "new", "--cameras", "CAM_NOPE", "-q"],
        ["nus", "new", "--preset", "quick", "-q"],
    ],
    "preview": [
        ["data/indx.json", "-o", "new/p.png"],
        ["data/indx.yaml", "-o", "new/p.png"],
        ["data/index.json", "--clip", "scene-9999", "-o", "new/p.png"],
        ["data/index.json", "--steps", "0", "-o", "new/p.png"],
    ],
    "doctor": [["--size", "big", "--json", "new/d.json"], ["--gpu", "-1", "--json", "new/d.json"]],
}


@pytest.fixture(scope="module")
def mistakes_workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from _nuscenes_fixture import write_nuscenes

    root = tmp_path_factory.mktemp("mistakes")
    assert (
        main(["synth", str(root / "data"), "--clips", "2", "--cameras", "2", "--frames", "4", "--size", "64x48", "-q"])
        == 0
    )
    write_nuscenes(root / "nus", scenes=1, samples=2, sweeps_between=0, drop=())
    return root


def _tree(root: Path) -> dict[str, float]:
    return {str(p.relative_to(root)): p.stat().st_mtime for p in sorted(root.rglob("*"))}


def _exit_status(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as stop:  # argparse's own errors
        return int(stop.code or 0)


def test_every_command_has_its_usage_mistakes_listed() -> None:
    from lightning_vstream.cli import COMMANDS

    assert set(USAGE_MISTAKES) == set(COMMANDS)


@pytest.mark.parametrize(
    ("command", "argv"),
    [
        pytest.param(command, argv, id=f"{command} {' '.join(argv)}")
        for command, cases in USAGE_MISTAKES.items()
        for argv in cases
    ],
)
def test_a_wrong_command_line_exits_2_and_writes_nothing(
    command: str,
    argv: list[str],
    mistakes_workspace: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(mistakes_workspace)
    before = _tree(mistakes_workspace)
    assert _exit_status([command, *argv]) == 2
    err = capsys.readouterr().err
    assert f"vstream {command}: error: " in err and "Traceback" not in err
    assert _tree(mistakes_workspace) == before  # "before any work": no folder, no file, nothing rewritten


# -- a stray camera file in one clip -----------------------------------------------------------------
def test_a_stray_camera_file_in_one_clip_is_named_and_the_common_cameras_are_indexed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "data"
    assert main(["synth", str(root), "--clips", "3", "--cameras", "2", "--frames", "6", "--size", "64x48", "-q"]) == 0
    stray = root / "videos" / "scene-0001" / "CAM_EXTRA.mp4"
    shutil.copy2(root / "videos" / "scene-0001" / "CAM_BACK.mp4", stray)
    # The index built before the file came: the quick check names it and gives the command that re-indexes.
    assert main(["index", str(root / "index.json"), "--quick-check"]) == 1
    err = capsys.readouterr().err
    assert "'CAM_EXTRA.mp4' is not in the index (added since it was built?). Re-index: `vstream index " in err
    assert f"`vstream index {str(root)!r}` indexes the cameras every clip has" in err

    assert main(["index", str(root), "-q"]) == 0
    out = capsys.readouterr().out
    assert "3 clips, cameras ['CAM_BACK', 'CAM_BACK_LEFT']" in out and "left out" not in out
    assert (
        f"are not indexed: the other clips lack their camera, so the index holds the cameras every clip has: {str(stray)!r}."
        in out
    )
    assert f"To index them, give every clip those cameras and run `vstream index {root}` again" in out
    assert not (root / "index.incomplete.json").exists()
    index = load_index(root / "index.json", check="thorough")
    assert [clip.camera_names for clip in index] == [("CAM_BACK", "CAM_BACK_LEFT")] * 3
    assert read_stamp(PyAVDecoder(index["scene-0001"].cameras[1].path).get(5)) == Stamp(1, 1, 5)
    # Both checks accept the file the build named; they name it again.
    assert main(["index", str(root / "index.json"), "--quick-check"]) == 0
    assert "all files match the index" in (out := capsys.readouterr().out) and "CAM_EXTRA.mp4" in out
    assert main(["index", str(root / "index.json"), "--check"]) == 0
    # A file added after this build is still one the index does not describe.
    shutil.copy2(stray, root / "videos" / "scene-0002" / "CAM_EXTRA.mp4")
    assert main(["index", str(root / "index.json"), "--quick-check"]) == 1
    assert "clip 'scene-0002' has cameras ['CAM_BACK', 'CAM_BACK_LEFT', 'CAM_EXTRA']" in capsys.readouterr().err


def test_build_index_warns_about_a_stray_camera_file_with_the_python_fix(tmp_path: Path) -> None:
    from lightning_vstream.demos.synth import write_dataset
    from lightning_vstream.errors import VStreamWarning
    from lightning_vstream.indexing import build_index

    root = tmp_path / "d"
    write_dataset(root, clips=3, cameras=2, frames=4, size=(64, 48))  # two clips of three: the common cameras
    shutil.copy2(root / "videos" / "scene-0000" / "CAM_BACK.mp4", root / "videos" / "scene-0000" / "CAM_EXTRA.mp4")
    with pytest.warns(
        VStreamWarning,
        match=r"CAM_EXTRA\.mp4'\. To index them, give every clip those cameras and call build_index\(\.\.\.\) again",
    ):
        build_index(root, output=root / "index.json", progress=False)
    # The stray file is in the first clip, which sets the cameras when its folder is listed: the tables decide.
    assert load_index(root / "index.json", check="thorough").camera_names == ("CAM_BACK", "CAM_BACK_LEFT")


# -- a video with a display rotation -----------------------------------------------------------------
@pytest.mark.parametrize("degrees", [90, 270])
def test_a_rotated_video_is_refused_when_indexed(
    tmp_path: Path, degrees: int, capsys: pytest.CaptureFixture[str]
) -> None:
    from _remux import rotated_copy

    root = tmp_path / "data"
    assert main(["synth", str(root), "--clips", "2", "--cameras", "2", "--frames", "6", "--size", "64x48", "-q"]) == 0
    before = (root / "index.json").read_bytes()
    camera = root / "videos" / "scene-0001" / "CAM_BACK.mp4"
    rotated = rotated_copy(camera, tmp_path / "rotated.mp4", degrees)
    shutil.copy2(rotated, camera)
    assert main(["index", str(root), "-q"]) == 1
    err = capsys.readouterr().err
    assert (
        f"vstream index: error: clip 'scene-0001', camera 'CAM_BACK': {str(camera)!r}: the video carries a display "
        f"rotation of {degrees} degrees (its display matrix), which lightning_vstream does not apply" in err
    )
    turn = "transpose=cclock" if degrees == 90 else "transpose=clock"
    assert "`ffmpeg -i IN.mp4 -c:v libx264 OUT.mp4`" in err and f"-vf {turn}" in err
    assert (root / "index.json").read_bytes() == before  # nothing written


# -- frame tables of another dataset ------------------------------------------------------------------
def test_quick_check_reports_frame_tables_copied_from_another_dataset(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import warnings

    from lightning_vstream.errors import VStreamWarning

    small = ["--clips", "2", "--cameras", "2", "--frames", "6", "--size", "64x48", "-q"]
    assert main(["synth", str(tmp_path / "a"), *small]) == 0
    assert main(["synth", str(tmp_path / "other"), *small]) == 0
    (tmp_path / "other" / "videos").rename(tmp_path / "other" / "cams")
    assert main(["index", str(tmp_path / "other"), "-q"]) == 0
    index = tmp_path / "a" / "index.json"
    shutil.copy2(tables_path(tmp_path / "other" / "index.json"), tables_path(index))
    capsys.readouterr()
    with pytest.warns(VStreamWarning, match="has no frame table for 4 of its 4 video files"):
        load_index(index)
    # The quick check says what load_index warns about, names the tables file and fails, as --check does.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert main(["index", str(index), "--quick-check"]) == 1
    captured = capsys.readouterr()
    assert "all files match" not in captured.out
    assert (
        f"1. the frame tables next to the index ({str(tables_path(index))!r}) describe none of its video files; "
        "they list other files ('cams/scene-0000/CAM_BACK.mp4'," in captured.err
    )
    assert (
        f"'{index.parent / 'videos' / 'scene-0000' / 'CAM_BACK.mp4'}' (clip 'scene-0000', camera 'CAM_BACK'): "
        in captured.err
    )
    assert main(["index", str(index), "--check"]) == 1
    # Its own tables written, both checks pass.
    assert main(["index", str(index), "--tables", "-q"]) == 0
    assert main(["index", str(index), "--quick-check"]) == 0
    assert "all files match the index" in capsys.readouterr().out

"""What a newcomer meets in the first hour: the CI script, the nvdriver tests' hint, exit codes, defaults."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from conftest import FAKE_NVDRIVER_ENV, FAKE_NVDRIVER_SOURCES, fake_driver_hint

ROOT = Path(__file__).resolve().parents[1]


def test_the_ci_script_names_no_folder_of_one_machine() -> None:
    script = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert "/work/" not in script and "/home/" not in script
    assert "../shared/tools/fake-nvdriver" in script  # beside the repository, as the docs say


def test_the_nvdriver_hint_gives_commands_that_build_the_driver(tmp_path: Path) -> None:
    absent = fake_driver_hint(tmp_path / "nowhere")
    assert "sources are not part of the repository" in absent
    assert "`bash ../shared/tools/fake-nvdriver/build /tmp/fake-nvdriver`" in absent
    assert f"`{FAKE_NVDRIVER_ENV}=/tmp/fake-nvdriver python -m pytest -m nvdriver`" in absent
    if not (FAKE_NVDRIVER_SOURCES / "build").is_file():
        pytest.skip("the fake driver's sources are not beside this checkout")
    present = fake_driver_hint()
    assert "from the repository root" in present
    command = present.split("`")[1]
    assert command.startswith("bash ../shared/tools/fake-nvdriver/build ")
    out = tmp_path / "fake-nvdriver"
    # The hint's command, run where it says (the repository root), builds the three libraries.
    subprocess.run([*command.split()[:2], str(out)], cwd=ROOT, check=True, capture_output=True, timeout=120)
    assert sorted(p.name for p in out.iterdir()) == ["libcuda.so.1", "libnvcuvid.so.1", "libnvidia-encode.so.1"]


def test_an_index_whose_video_folder_moved_names_the_fix(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from lightning_vstream.cli import main
    from lightning_vstream.demos.synth import write_dataset

    index = write_dataset(tmp_path / "d", clips=2, cameras=1, frames=4, size=(64, 48))
    (tmp_path / "d" / "videos").rename(tmp_path / "d" / "vids")
    assert main(["index", str(index), "--check"]) == 1
    err = capsys.readouterr().err
    assert (
        "video folder 'videos' (" in err and "does not exist. Its clips (scene-0000, scene-0001) are in 'vids'" in err
    )
    assert f"rename that folder back to 'videos', or re-index: `vstream index {str(tmp_path / 'd')!r}`" in err
    (tmp_path / "d" / "vids").rename(tmp_path / "d" / "gone")
    (tmp_path / "d" / "gone" / "scene-0001").rename(tmp_path / "d" / "gone" / "other")
    assert main(["index", str(index), "--check"]) == 1
    assert "restore 'videos' there, keep the index in the dataset's root" in capsys.readouterr().err

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

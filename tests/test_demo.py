"""`vstream demo`: builds or reuses its dataset, trains with both callbacks, checks stamps, reports."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from lightning_vstream.cli import main
from lightning_vstream.demos.demo import run_demo


def test_demo_command_generates_then_reuses_its_dataset(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cache = tmp_path / "cache"
    assert main(["demo", "--cache-dir", str(cache), "--steps", "5", "--num-workers", "0"]) == 0
    first = capsys.readouterr().out
    assert "data     generated 8 clips x 6 cameras" in first
    assert re.search(r"result   \d+\.\d camera-frames/s \(\d+\.\d samples/s\) over 5 steps", first)
    assert "decode   amplification 1.00: 120 frames decoded for 120 delivered, 0 seeks" in first
    assert "stamps   120 frames checked, all stamps correct" in first
    assert re.search(
        r"targets  20 slot-frames' annotations \(token, ego pose, boxes\) match their frames; "
        r"box-centre loss \d+\.\d\d -> \d+\.\d\d",
        first,
    )
    assert f"source   {cache.resolve() / 'demo-v2' / 'index.json'} (generated now)" in first
    assert "metrics  train/* figures logged to" in first

    result = run_demo(cache_dir=cache, steps=3, num_workers=0, progress_bar=False)
    second = capsys.readouterr().out
    assert "data     reused 8 clips x 6 cameras" in second and "(reused from cache)" in second
    assert result.reused and result.steps == 3 and result.stamp_errors == []
    assert result.frames_checked == 3 * 4 * 6 and result.annotations_checked == 3 * 4
    assert result.slot_starts == result.slots_reset == 4  # four slots start their first clip, nothing else
    assert result.frames_per_sec > 0 and 0 <= result.data_wait_fraction <= 1
    assert result.metrics_file is not None and "train/frames_per_sec" in result.metrics_file.read_text()


def test_demo_rebuilds_a_broken_cache(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "demo-v2"
    root.mkdir()
    (root / "index.json").write_text("{not json")
    result = run_demo(cache_dir=tmp_path, steps=1, num_workers=0, progress_bar=False)
    out = capsys.readouterr().out
    assert "is unusable (index file" in out and "rebuilding it" in out
    assert not result.reused and result.stamp_errors == []


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--steps", "0"], "vstream demo: error: argument --steps: '0' must be at least 1."),
        (["--num-workers", "-1"], "vstream demo: error: argument --num-workers: '-1' must be 0 or more."),
    ],
)
def test_demo_rejects_bad_arguments(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["demo", "--cache-dir", str(tmp_path), *argv])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_demo_rejects_bad_values_from_python(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"steps=0 is invalid; expected an integer >= 1"):
        run_demo(cache_dir=tmp_path, steps=0, num_workers=0, progress_bar=False)

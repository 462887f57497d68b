"""`vstream demo`: builds or reuses its dataset, trains with both callbacks, validates, checks stamps, reports."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from lightning_vstream.cli import main
from lightning_vstream.demos.demo import _coverage, run_demo


def test_demo_command_generates_then_reuses_its_dataset(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cache = tmp_path / "cache"
    assert main(["demo", "--cache-dir", str(cache), "--steps", "5"]) == 0
    first = capsys.readouterr().out
    # The product's default engine, said by name: decode threads in the training process.
    threads = " ".join(first.split())
    assert re.search(
        r"6 cameras, decoded by \d+ decode threads? in the training process \(the thread engine, engine\.kind='auto': "
        r"decode threads in the training process; --engine workers for worker processes\)",
        threads,
    )
    assert re.search(r"over 5 training steps, end to end \(thread engine\)", threads)
    assert "data     generated 10 clips x 6 cameras" in first
    assert "(6 clips to train on, 4 held out for validation)" in " ".join(first.split())
    assert re.search(r"result   \d+\.\d camera-frames/s \(\d+\.\d samples/s\) over 5 training steps", first)
    # A slot whose piece starts mid-clip (the epoch has 3 cuts) decodes from the keyframe before (GOP 12).
    decode = re.search(
        r"decode   amplification \d\.\d\d: (\d+) frames decoded for 120 delivered in training, (\d+) seeks", first
    )
    assert decode is not None and 120 <= int(decode.group(1)) <= 120 + 3 * 11 * 6 and int(decode.group(2)) <= 3 * 6
    # 5 training steps x 4 slots x 6 cameras, then the validation pass over the 4 held-out clips.
    match = re.search(r"stamps   (\d+) frames checked \(training and validation\), all stamps correct", first)
    assert match is not None and int(match.group(1)) > 120
    assert re.search(
        r"boxes    held-out clips: box centres predicted \d+\.\d m from the true ones per frame \(\d+ frames with "
        r"boxes\);\s+guessing the training frames' mean centre: \d+\.\d m\.",
        first,
    )
    assert "the run stopped at step 5 of the 47-step epoch (--steps 47 runs it whole)" in first
    assert f"source   {cache.resolve() / 'demo-v3' / 'train.json'} (generated now)" in first
    assert "metrics  train/* and val/* figures logged to" in first
    assert "loss" not in first  # no raw loss trend that a reader could take for divergence

    result = run_demo(cache_dir=cache, steps=3, engine="workers", num_workers=1, progress_bar=False)
    second = capsys.readouterr().out
    assert "decoded by 1 decoding worker process (the worker engine, engine.kind='workers')" in " ".join(second.split())
    assert result.engine == "workers" and "end to end (worker engine)" in second
    assert "data     reused 10 clips x 6 cameras" in second and "(reused from cache)" in second
    assert result.reused and result.steps == 3 and result.stamp_errors == []
    assert result.annotations_checked > 3 * 4
    assert result.slot_starts == result.slots_reset == 8  # 4 training slots start a clip, then 4 validation ones
    assert result.frames_per_sec > 0 and 0 <= result.data_wait_fraction <= 1
    assert result.val_box_error is not None and result.baseline_box_error is not None and result.val_frames > 0
    assert result.metrics_file is not None and "val/box_loss" in result.metrics_file.read_text()


def test_the_report_says_why_frames_were_not_read() -> None:
    lengths = {f"scene-{i:04d}": n for i, n in enumerate([24, 40, 32, 28, 24, 40])}
    whole = _coverage(lengths, 47)  # 188 frames on 4 slots: 47 steps, nothing left out
    assert whole[0].startswith("6 training clips in 4 slots: an epoch is 47 steps; the clips, shuffled, are laid end")
    assert len(whole) == 1
    short = _coverage(lengths, 10)
    assert short[1].startswith("the run stopped at step 10 of the 47-step epoch (--steps 47 runs it whole); not read")
    assert "scene-0002 (slot 0, from step 24)" in short[1] and "scene-0004 from frame 10" in short[1]
    odd = _coverage({**lengths, "scene-0005": 41}, 47)  # 189 frames: one waits for a later epoch
    assert odd[1] == "left for a later epoch (1 frame, fewer than the slots): scene-0005 frames 40-40"
    assert _coverage(lengths, 50)[1] == "this run's 50 steps went on into the next epoch, whose clip order is new"


def test_demo_prints_no_warning(tmp_path: Path) -> None:
    """A first run, as a newcomer starts it: nothing on standard error (no warning, no progress bar off a terminal)."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("PYTHONWARNINGS")}
    done = subprocess.run(
        [sys.executable, "-m", "lightning_vstream.cli", "demo", "--cache-dir", str(tmp_path), "--steps", "3"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    assert "all stamps correct" in done.stdout


def test_demo_rebuilds_a_broken_cache(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "demo-v3"
    root.mkdir()
    (root / "val.json").write_text("{not json")
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

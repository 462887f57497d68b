"""benchmarks/stride.py: a smoke run on tiny footage, its frame check, and a peer that is not there."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "stride.py"


def _module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("stride_benchmark", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_frame_check_names_a_frame_other_than_asked(tmp_path: Path) -> None:
    bench = _module()
    rng = np.random.default_rng(0)
    frames = rng.integers(0, 256, size=(3, 48, 64, 3), dtype=np.uint8)  # three distinct frames, HWC
    reference = {"ippp": {"clip-0000|CAM_0": np.stack([bench.block_means(f, "hwc") for f in frames])}}
    # Channels first or last, the block means are the same.
    assert np.array_equal(
        bench.block_means(frames[1].transpose(2, 0, 1), "chw"), reference["ippp"]["clip-0000|CAM_0"][1]
    )
    delivered = {
        "stream 1/ippp|clip-0000|CAM_0|1": bench.block_means(frames[1], "hwc"),
        "random/ippp|clip-0000|CAM_0|2": bench.block_means(frames[0], "hwc"),  # frame 0 delivered for frame 2
    }
    np.savez(tmp_path / "means.npz", **delivered)
    checked, bad = bench.verify(tmp_path / "means.npz", reference)
    assert checked == {"stream 1/ippp": 1, "random/ippp": 1}
    assert list(bad) == ["random/ippp"]
    assert bad["random/ippp"][0].startswith("clip-0000 CAM_0 frame 2 is nearest to frame 0")


@pytest.mark.slow
def test_quick_run_measures_every_case_and_reports_a_missing_peer(tmp_path: Path) -> None:
    out = tmp_path / "stride.json"
    missing = tmp_path / "no-venv" / "bin" / "python"
    command = [
        sys.executable,
        str(SCRIPT),
        "--quick",
        "--size",
        "160x96",
        "--cameras",
        "2",
        "--jobs",
        "1",
        "--skip",
        "decord2,spdl",
        "--torchcodec-python",
        str(missing),
        "--data",
        str(tmp_path / "data"),
        "--json",
        str(out),
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["schema"] == "lightning_vstream.bench.stride/1"
    assert result["failed"] == {}
    # The missing peer is reported with its reason, not a crash; skipped peers are named as such.
    assert "no-venv" in result["not_measured"]["torchcodec"]
    assert result["not_measured"]["decord2"] == "skipped (--skip)"
    assert f"torchcodec: not measured ({result['not_measured']['torchcodec']})" in done.stdout
    # Every case measured for our reader, its frames checked against a full decode of each file.
    assert result["frames_checked"]["vstream"] > 0
    cases = result["cases"]
    assert sorted(cases) == sorted(
        [f"stream {s}/{e}" for s in (1, 2, 6) for e in ("ippp", "stride")]
        + [f"random/{e}" for e in ("ippp", "stride", "x264b")]
    )
    for name, case in cases.items():
        row = case["rows"]["vstream"]
        assert row["frames_per_s"]["median"] > 0, name
        assert row["decoded_per_delivered"] is not None, name
    # Every frame is needed at stride 1; on IPPP every frame before a wanted one is a reference.
    assert cases["stream 1/ippp"]["rows"]["vstream"]["decoded_per_delivered"] == 1.0
    assert cases["stream 1/stride"]["rows"]["vstream"]["decoded_per_delivered"] == 1.0
    assert cases["stream 6/ippp"]["rows"]["vstream"]["decoded_per_delivered"] > 1.0
    assert cases["stream 1/ippp"]["rows"]["vstream"]["delivered"] == 2 * 24
    assert cases["stream 6/stride"]["rows"]["vstream"]["delivered"] == 2 * 4
    goals = {g["goal"].split(" (")[0]: g for g in result["goals"]}
    assert goals["stride 6 on the stride layout / our stride 6 on IPPP"]["ratio"] > 0
    assert goals["random access on x264 B-frame files / torchcodec's best"]["ratio"] is None
    # The encodes' sizes are reported (the stride layout's file-size cost).
    assert all(e["bytes"] > 0 for e in result["data"]["encodes"].values())

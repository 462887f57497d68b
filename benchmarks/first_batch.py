"""Time to the first streaming batch with 2 workers, per worker start method, against a baseline commit.

Each measurement runs in a fresh Python process (nothing imported or cached beforehand) that
builds a ``StreamDataLoader`` over a small stamped dataset with two workers started by ``fork``,
``forkserver`` or ``spawn`` and takes one batch. The figures:

- ``import_s``: ``import lightning_vstream`` plus the DataModule and loader modules in the main
  process (lightning included, on both sides);
- ``first_batch_s``: from ``iter(loader)`` to the first batch: worker start (a spawn or
  forkserver worker imports what unpickling the dataset needs), opening the files, decoding.

The baseline is the same measurement on the code of another commit (default: ``bf20a80``, where
``import lightning_vstream`` imported lightning), exported with ``git archive`` and measured in the
same run. This script imports nothing from the package at module level, so a spawn child that
re-imports it as ``__mp_main__`` pays nothing extra.

Usage::

    python benchmarks/first_batch.py                   # 3 repeats, baseline bf20a80, writes first_batch.json
    python benchmarks/first_batch.py --repeats 5 --baseline-ref HEAD~3 --out runs/first_batch.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from lightning_vstream import EngineOptions, PlanOptions

ROOT = Path(__file__).resolve().parents[1]
METHODS = ("fork", "forkserver", "spawn")


def _child(index: str, method: str) -> None:
    """Measure one start method in this (fresh) process and print one JSON line.

    Code whose ``StreamVideoDataModule`` takes ``multiprocessing_context`` is measured through it
    (as users get it); older code through a ``StreamDataLoader`` built the same way by hand.
    """
    start = time.perf_counter()
    import inspect

    import lightning_vstream  # noqa: F401  (the package import a user script does)
    from lightning_vstream.indexing import load_index
    from lightning_vstream.options import DecodeOptions
    from lightning_vstream.stream.sampler import StreamSampler
    from lightning_vstream.stream.stream_datamodule import StreamVideoDataModule
    from lightning_vstream.stream.worker import StreamDataset
    from lightning_vstream.stream.worker_loader import StreamDataLoader

    imported = time.perf_counter()
    if "multiprocessing_context" in inspect.signature(StreamVideoDataModule).parameters:
        dm = StreamVideoDataModule(
            index_file=index,
            batch_size=2,
            engine=EngineOptions(num_workers=2, multiprocessing_context=method),
            plan=PlanOptions(shuffle=False),
            decode=DecodeOptions(decoder_threads=1),
        )
        dm.setup("fit")
        loader = dm.train_dataloader()
    else:
        loaded = load_index(index)
        sampler = StreamSampler(
            [c.frame_count for c in loaded.clips],
            num_cameras=len(loaded.camera_names),
            batch_size=2,
            shuffle=False,
            num_parts=2,
        )
        loader = StreamDataLoader(
            StreamDataset(index=loaded, decode=DecodeOptions(decoder_threads=1)),
            sampler=sampler,
            num_workers=2,
            multiprocessing_context=method,
        )
    begin = time.perf_counter()
    batch = next(iter(loader))
    first = time.perf_counter()
    assert batch["frames"].shape[0] == 2
    print(json.dumps({"import_s": imported - start, "first_batch_s": first - begin}))


def _measure(code_dir: Path, index: Path, method: str) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(code_dir)}
    out = subprocess.run(
        [sys.executable, __file__, "--child", str(index), method],
        capture_output=True,
        text=True,
        env=env,
        cwd=code_dir,
        timeout=300,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def _export(ref: str, into: Path) -> Path:
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", ref, "lightning_vstream"], capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--child", nargs=2, metavar=("INDEX", "METHOD"), help=argparse.SUPPRESS)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--baseline-ref", default="bf20a80", help="commit to compare with (default: bf20a80)")
    parser.add_argument("--out", type=Path, default=Path("first_batch.json"))
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    args = parser.parse_args()
    if args.child:
        _child(*args.child)
        return
    with tempfile.TemporaryDirectory() as tmp:
        sys.path.insert(0, str(ROOT))
        from lightning_vstream.demos.synth import write_dataset

        index = write_dataset(Path(tmp) / "data", clips=4, cameras=2, frames=12, size=(64, 48), gop=6)
        codes = {"baseline": _export(args.baseline_ref, Path(tempfile.mkdtemp(dir=tmp))), "current": ROOT}
        results: dict[str, dict[str, list[dict[str, float]]]] = {name: {m: [] for m in METHODS} for name in codes}
        for _ in range(args.repeats):  # interleaved, so load on the machine hits both alike
            for method in args.methods:
                for name, code in codes.items():
                    results[name][method].append(_measure(code, index, method))
                    print(f"  {name:<8} {method:<10} {results[name][method][-1]}", flush=True)
    summary: dict[str, dict[str, dict[str, float]]] = {}
    print(f"time to first batch, 2 workers, {args.repeats} repeats (median, min-max), baseline {args.baseline_ref}")
    print(f"{'method':<11} {'baseline s':>18} {'current s':>18} {'speed-up':>9} {'import base/cur s':>18}")
    for method in args.methods:
        row = {}
        for name in codes:
            times = [r["first_batch_s"] for r in results[name][method]]
            imports = [r["import_s"] for r in results[name][method]]
            row[name] = {
                "median_s": statistics.median(times),
                "min_s": min(times),
                "max_s": max(times),
                "import_median_s": statistics.median(imports),
            }
        summary[method] = row
        base, cur = row["baseline"], row["current"]
        print(
            f"{method:<11} {base['median_s']:7.2f} ({base['min_s']:.2f}-{base['max_s']:.2f}) "
            f"{cur['median_s']:7.2f} ({cur['min_s']:.2f}-{cur['max_s']:.2f}) "
            f"{base['median_s'] / cur['median_s']:8.2f}x {base['import_median_s']:8.2f}/{cur['import_median_s']:.2f}"
        )
    report = {
        "baseline_ref": args.baseline_ref,
        "repeats": args.repeats,
        "machine": platform.platform(),
        "cpus": os.cpu_count(),
        "python": sys.version.split()[0],
        "summary": summary,
        "raw": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

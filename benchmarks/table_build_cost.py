"""What building frame tables costs next to decoding: should a plain index build them on first open?

For stamped synthetic datasets of a few sizes, measures (median of ``--repeats``):

- ``probe``: building every file's frame table with packet CRCs and identity
  (:func:`lightning_vstream.indexing.camera_tables.probe_with_identity`, what ``vstream index`` does per file);
- ``decode``: decoding every frame of every file once with :class:`PyAVDecoder` (one epoch of
  sequential reading, RGB output, FFmpeg's automatic threads), the baseline.

The ratio probe/decode is the extra cost a first epoch would pay if tables were built on first
open. The decision it informs is documented in docs/index_format.md.

Usage::

    python benchmarks/table_build_cost.py
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
import warnings
from pathlib import Path

from lightning_vstream.decode.cpu.pyav import PyAVDecoder
from lightning_vstream.demos.synth import write_dataset
from lightning_vstream.indexing import load_index
from lightning_vstream.indexing.camera_tables import probe_with_identity

SIZES = [((160, 96), 8, 40), ((640, 360), 2, 60), ((1600, 900), 1, 30)]  # (size, clips, frames); 6 cameras


def _measure(root: Path, size: tuple[int, int], clips: int, frames: int, repeats: int) -> dict[str, float]:
    index_path = write_dataset(root, clips=clips, cameras=6, frames=frames, size=size, gop=12, with_metadata=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # no tables on purpose: building them is what is measured
        files = [cam.path for clip in load_index(index_path) for cam in clip.cameras]
    probe_s, decode_s = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        infos = [probe_with_identity(f) for f in files]
        probe_s.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        for f, info in zip(files, infos):
            with PyAVDecoder(f, info=info) as dec:
                for _ in range(info.frame_count):
                    dec.read()
        decode_s.append(time.perf_counter() - t0)
    probe, decode = statistics.median(probe_s), statistics.median(decode_s)
    return {
        "width": size[0],
        "height": size[1],
        "files": len(files),
        "frames_per_file": frames,
        "probe_s": probe,
        "decode_s": decode,
        "ratio": probe / decode,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("table_build_cost.json"))
    args = parser.parse_args()
    results = []
    with tempfile.TemporaryDirectory(prefix="table_cost_") as tmp:
        for i, (size, clips, frames) in enumerate(SIZES):
            results.append(_measure(Path(tmp) / str(i), size, clips, frames, args.repeats))
    print(f"building frame tables (probe with CRCs) vs decoding every frame once; median of {args.repeats}")
    print(f"{'size':>10} {'files':>6} {'frames':>7} {'probe s':>8} {'decode s':>9} {'probe/decode':>13}")
    for r in results:
        print(
            f"{r['width']:>5}x{r['height']:<4} {r['files']:>6} {r['frames_per_file']:>7} {r['probe_s']:>8.3f} "
            f"{r['decode_s']:>9.3f} {r['ratio']:>12.1%}"
        )
    args.out.write_text(json.dumps(results, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

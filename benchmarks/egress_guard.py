"""What the egress guard costs: GOP-sized ranged GETs from an S3 endpoint, with and without it, in one run.

A store at a configured endpoint is reached through the egress guard (``lightning_vstream.storage._egress``),
a forward proxy in the reading process that lets requests reach the endpoint's host and no other. This
script serves one object from moto's S3 server on 127.0.0.1 and reads it in ranges of ``--range`` bytes
(a GOP) through obstore, the way the loaders do, with the guard (the default) and without it (the
baseline), alternating the two in every repeat:

- sequential GETs, then ``--threads`` threads at once (the loaders' I/O threads);
- per configuration: GETs/s and MB/s (median and spread over repeats), and this process's CPU seconds
  per GB read (obstore's client plus, with the guard, its relay threads).

The server is Python (moto), so it bounds both throughputs; the CPU figure is the guard's own cost.

Usage::

    python benchmarks/egress_guard.py            # writes benchmarks/egress_guard.json next to the table
    python benchmarks/egress_guard.py --quick
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from lightning_vstream.storage import StorageConfig
from lightning_vstream.storage._obstore_calls import build_store, call
from lightning_vstream.storage.obstore_transport import store_spec
from lightning_vstream.storage.urls import parse
from tests._s3 import CREDENTIALS, S3TestServer

BUCKET = "egress-bench"
KEY = "blob.bin"


def _reads(store: Any, size: int, span: int, count: int, threads: int) -> tuple[float, float]:
    """Wall seconds and process CPU seconds to read ``count`` ranges of ``span`` bytes spread over the object."""
    starts = [(i * 7919 * span) % max(size - span, 1) for i in range(count)]

    def one(start: int) -> int:
        data, _ = call(store, "get", {"key": KEY, "start": start, "end": start + span, "if_match": None})
        return memoryview(data).nbytes

    wall, cpu = time.perf_counter(), time.process_time()
    if threads == 1:
        total = sum(one(s) for s in starts)
    else:
        with ThreadPoolExecutor(threads) as pool:
            total = sum(pool.map(one, starts))
    assert total == count * span
    return time.perf_counter() - wall, time.process_time() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=32 * 2**20, help="object size in bytes")
    parser.add_argument("--range", type=int, default=256 * 1024, help="bytes per GET (a GOP)")
    parser.add_argument("--count", type=int, default=200, help="GETs per measurement")
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path, default=Path(__file__).with_suffix(".json"))
    args = parser.parse_args()
    if args.quick:
        args.count, args.repeats, args.size = 60, 3, 8 * 2**20
    server = S3TestServer(Path(tempfile.mkdtemp(prefix="vstream-egress-"))).start()
    try:
        server.bucket(BUCKET)
        server.put_bytes(BUCKET, KEY, bytes(range(256)) * (args.size // 256))
        options = {"endpoint": server.direct_endpoint, "allow_http": True, **CREDENTIALS}
        spec = store_spec(parse(f"s3://{BUCKET}/{KEY}"), StorageConfig(options))
        assert spec["egress"], "a configured endpoint is guarded"
        stores = {"guard": build_store(spec), "baseline": build_store({**spec, "egress": []})}
        for store in stores.values():  # warm up: connections, credentials
            _reads(store, args.size, args.range, 8, 1)
        results: dict[str, dict[str, Any]] = {}
        for threads in (1, args.threads):
            samples: dict[str, list[tuple[float, float]]] = {name: [] for name in stores}
            for _ in range(args.repeats):
                for name, store in stores.items():
                    samples[name].append(_reads(store, args.size, args.range, args.count, threads))
            for name, runs in samples.items():
                walls = [w for w, _ in runs]
                gets = [args.count / w for w in walls]
                gb = args.count * args.range / 1e9
                results[f"{name}/threads={threads}"] = {
                    "gets_per_s": statistics.median(gets),
                    "gets_per_s_spread": [min(gets), max(gets)],
                    "mb_per_s": statistics.median(gets) * args.range / 1e6,
                    "cpu_s_per_gb": statistics.median(c / gb for _, c in runs),
                }
        ratios = {
            f"threads={t}": {
                "throughput": results[f"guard/threads={t}"]["gets_per_s"]
                / results[f"baseline/threads={t}"]["gets_per_s"],
                "cpu_per_gb": results[f"guard/threads={t}"]["cpu_s_per_gb"]
                / results[f"baseline/threads={t}"]["cpu_s_per_gb"],
            }
            for t in (1, args.threads)
        }
    finally:
        server.stop()
    print(f"{'configuration':28} {'GETs/s':>10} {'spread':>17} {'MB/s':>8} {'CPU s/GB':>9}")
    for name, row in results.items():
        low, high = row["gets_per_s_spread"]
        print(
            f"{name:28} {row['gets_per_s']:10.1f} {f'{low:.1f}-{high:.1f}':>17} {row['mb_per_s']:8.1f} "
            f"{row['cpu_s_per_gb']:9.2f}"
        )
    for name, ratio in ratios.items():
        print(f"guard / baseline, {name}: throughput x{ratio['throughput']:.2f}, CPU per GB x{ratio['cpu_per_gb']:.2f}")
    report = {
        "machine": {"platform": platform.platform(), "python": platform.python_version()},
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "results": results,
        "ratios": ratios,
    }
    args.out.write_text(json.dumps(report, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

"""The stream plan's cost: planning one epoch of 100,000 clips x 6 cameras for 64 global slots; JSON on stdout.

Run: ``python benchmarks/plan_cost.py [--clips 100000 --world 8 --batch 8 --repeat 5]``. Clip lengths are
nuScenes-like (39-41 frames) and long-tailed (5-400). Measured in the same run: the training plan of one
rank (what each rank computes every epoch), the plan of every slot (what a resume on another world size
computes once), the evaluation plan (longest-first dealing, the baseline), the sampler's first
``schedule()`` and the dataset identity a loader state records. Best of ``--repeat``; the plan does not
depend on the camera count (cameras are read per slot), which only the sampler carries.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
from collections.abc import Callable

from lightning_vstream.stream.ledger import dataset_identity
from lightning_vstream.stream.sampler import StreamSampler
from lightning_vstream.stream.schedule import PlanSpec


def _best(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def _measure(
    lengths: list[int], ids: list[str], cameras: list[str], args: argparse.Namespace
) -> dict[str, float | int]:
    """Every timing of one length mix (best of ``args.repeat``), and the training plan's statistics."""
    spec = PlanSpec(None, args.cameras, args.batch, args.world, args.world - 1, seed=3)
    evaluation = PlanSpec(None, args.cameras, args.batch, args.world, args.world - 1, remainder="pad")
    plan = spec.plan(lengths, epoch=1)
    row: dict[str, float | int] = {
        "train_rank_s": _best(lambda: spec.plan(lengths, epoch=1), args.repeat),
        "train_all_slots_s": _best(lambda: spec.global_plan(lengths, epoch=1), args.repeat),
        "eval_baseline_s": _best(lambda: evaluation.plan(lengths, epoch=1), args.repeat),
        "sampler_s": _best(
            lambda: StreamSampler(lengths, num_cameras=args.cameras, batch_size=args.batch, spec=spec).schedule(),
            args.repeat,
        ),
        "identity_s": _best(lambda: dataset_identity(lengths, ids, cameras), args.repeat),
        **{f"plan_{k}": v for k, v in plan.stats.as_dict().items()},
    }
    row["train_over_eval"] = row["train_rank_s"] / row["eval_baseline_s"]
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--clips", type=int, default=100_000)
    parser.add_argument("--cameras", type=int, default=6)
    parser.add_argument("--world", type=int, default=8)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    rng = random.Random(0)
    mixes = {
        "nuscenes-like": [rng.randint(39, 41) for _ in range(args.clips)],
        "long-tailed": [rng.choice([5, 20, 40, 40, 40, 400]) for _ in range(args.clips)],
    }
    ids = [f"scene-{i:06d}" for i in range(args.clips)]
    cameras = [f"CAM_{i}" for i in range(args.cameras)]
    results: dict[str, dict[str, float | int]] = {}
    for name, lengths in mixes.items():
        results[name] = _measure(lengths, ids, cameras, args)
    print(
        f"{'mix':<15} {'train/rank s':>12} {'all slots s':>12} {'eval s':>8} {'train/eval':>10} {'cuts':>6} {'short':>6} {'dropped':>8}"
    )
    for name, row in results.items():
        print(
            f"{name:<15} {row['train_rank_s']:>12.3f} {row['train_all_slots_s']:>12.3f} {row['eval_baseline_s']:>8.3f} "
            f"{row['train_over_eval']:>10.2f} {row['plan_cuts']:>6} {row['plan_short_segments']:>6} "
            f"{row['plan_frames_dropped']:>8}"
        )
    meta = {"clips": args.clips, "cameras": args.cameras, "slots": args.world * args.batch, "load": os.getloadavg()}
    print(json.dumps({"settings": meta, "results": results}, indent=1))


if __name__ == "__main__":
    main()

"""``vstream demo``: build a small stamped dataset and train a tiny temporal model on it."""

from __future__ import annotations

import argparse
from pathlib import Path

from lightning_vstream.commands.args import non_negative, positive


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Build (once, cached) a small stamped 6-camera dataset, train a tiny temporal model on it with "
        "the throughput and temporal-reset callbacks, check every delivered frame's stamp, and report "
        "frames/sec and how well the model tracks the boxes against a baseline."
    )
    parser.add_argument("--cache-dir", type=Path, default=Path(".vstream_cache"), help="where the dataset is cached")
    parser.add_argument("--steps", type=positive, default=40, help="training steps")
    parser.add_argument(
        "--engine",
        choices=("auto", "threads", "workers"),
        default="auto",
        help="how frames are decoded, as StreamVideoDataModule(engine=) takes it; auto (its default): decode "
        "threads in the training process, unless --num-workers asks for worker processes",
    )
    parser.add_argument(
        "--num-workers",
        type=non_negative,
        default=None,
        help="decoding worker processes of --engine workers (default: 2); 1 or more chooses workers under auto",
    )


def run(args: argparse.Namespace) -> int:
    from lightning_vstream.demos.demo import run_demo

    run_demo(cache_dir=args.cache_dir, steps=args.steps, engine=args.engine, num_workers=args.num_workers)
    return 0

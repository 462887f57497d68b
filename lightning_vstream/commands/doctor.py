"""``vstream doctor``: check whether this machine can decode on the GPU, correctly, and how fast."""

from __future__ import annotations

import argparse
from pathlib import Path

from lightning_vstream.commands.args import non_negative, size


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Report the driver, PyNvVideoCodec and NVDEC's engines and limits; decode stamped files on NVDEC "
        "and on the CPU and compare them frame by frame; measure raw NVDEC, the stream engine and the worker "
        "design. Without an NVIDIA GPU it says so and exits 0."
    )
    parser.add_argument("--gpu", type=non_negative, default=0, help="GPU ordinal to check")
    parser.add_argument("--json", type=Path, default=Path("vstream_doctor.json"), help="where the full report goes")
    parser.add_argument("--size", type=size, default=(960, 544), help="size of the generated test files, WIDTHxHEIGHT")


def run(args: argparse.Namespace) -> int:
    from lightning_vstream.doctor import run_doctor

    return run_doctor(gpu=args.gpu, json_path=args.json, size=args.size)

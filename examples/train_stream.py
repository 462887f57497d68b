"""Train a streaming temporal model from a YAML config with LightningCLI.

Every ``StreamVideoDataModule`` argument is a ``data:`` option, every ``TinyStreamPETR``
argument a ``model:`` option, and the two callbacks are configured under ``trainer.callbacks``.
Swap in your own LightningModule by replacing ``TinyStreamPETR`` below; give it a
``reset_temporal_state(mask)`` method (see ``TemporalStateReset``). ``VStreamCLI`` is
``LightningCLI`` with clearer errors: a misspelt option is named with the closest valid one.

Usage::

    vstream synth data --clips 8 --cameras 6 --frames 40      # or `vstream index` your own videos
    python examples/train_stream.py fit --config examples/configs/stream.yaml
    python examples/train_stream.py fit --config examples/configs/stream.yaml --data.batch_size 2
    python examples/train_stream.py fit --print_config         # every option with its default
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from lightning_vstream import StreamVideoDataModule, VStreamCLI
from lightning_vstream.demos import TinyStreamPETR


def main(args: Sequence[str] | None = None, *, run: bool = True) -> VStreamCLI:
    """Build the CLI from ``args`` (the command line when None); ``run=False`` only parses and instantiates."""
    return VStreamCLI(
        TinyStreamPETR,
        StreamVideoDataModule,
        args=list(args) if args is not None else None,
        run=run,
        save_config_kwargs={"overwrite": True},
    )


if __name__ == "__main__":
    main()
    if torch.distributed.is_initialized():  # under DDP: stop gloo's or NCCL's threads before exiting
        torch.distributed.destroy_process_group()

"""The Trainer the Lightning tests fit with: on the CPU, one device, nothing printed or written unless asked."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning.pytorch as pl


def quiet_trainer(tmp_path: Path | None = None, **kwargs: Any) -> pl.Trainer:
    """A ``Trainer`` with no logger, progress bar, model summary or checkpoints; ``kwargs`` override any of it."""
    options: dict[str, Any] = dict(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
    )
    if tmp_path is not None:
        options["default_root_dir"] = tmp_path
    return pl.Trainer(**{**options, **kwargs})

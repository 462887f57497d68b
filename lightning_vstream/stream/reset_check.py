"""The warning when a temporal model is fitted on streaming batches with nothing that resets its memory.

A slot of a streaming batch moves from one clip to the next, flagging ``batch["is_first"]``; a
model that keeps state from step to step must forget it there, which
:class:`~lightning_vstream.callbacks.TemporalStateReset` does (or the model itself, when it says so
with ``handles_is_first = True``).
"""

from __future__ import annotations

import warnings
from typing import Any

from lightning_vstream.errors import VStreamWarning, user_stacklevel

__all__ = ["warn_without_temporal_reset"]


def warn_without_temporal_reset(trainer: Any) -> bool:
    """Warn on rank 0 when ``trainer`` fits a model with nothing that resets its memory at ``is_first``.

    Returns whether it warned (the DataModule warns once).

    Example::

        >>> warn_without_temporal_reset(None)
        False
    """
    if trainer is None or trainer.global_rank != 0:
        return False
    from lightning_vstream.callbacks import TemporalStateReset

    model = trainer.lightning_module
    if any(isinstance(c, TemporalStateReset) for c in getattr(trainer, "callbacks", [])) or (
        getattr(model, "handles_is_first", False) is True
    ):
        return False
    name = type(model).__name__
    if callable(getattr(model, "reset_temporal_state", None)):
        what = f"{name} defines reset_temporal_state(mask), but no TemporalStateReset callback calls it"
        fix = "add TemporalStateReset() to the Trainer's callbacks"
    else:
        what = "the Trainer has no TemporalStateReset callback"
        fix = (
            f"give {name} a method reset_temporal_state(mask) that forgets the memory of the slots where "
            "mask is True, and add TemporalStateReset() to the Trainer's callbacks"
        )
    warnings.warn(
        f"StreamVideoDataModule: {what}, so nothing clears the model's memory where a batch slot starts a new "
        f"clip (batch['is_first']), and memory carries over from one clip into the next. To fix it, {fix}. If "
        f"{name} reads batch['is_first'] itself, or keeps no state from one step to the next, set the class "
        "attribute `handles_is_first = True` on it to say so (see docs/temporal_models.md).",
        VStreamWarning,
        stacklevel=user_stacklevel(),  # the user's trainer.fit(...), not a line of Lightning's
    )
    return True

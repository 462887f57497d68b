"""TemporalStateReset: clear a temporal model's memory where a slot starts a new clip.

The protocol. A model that carries state from one step to the next (a StreamPETR-style query
memory, a recurrent hidden state) keeps it per *slot*: row ``s`` of the batch at step ``t + 1``
continues row ``s`` at step ``t``. When a slot moves on to another clip or segment, the batch
flags it in ``is_first`` and the model must forget that slot's memory, and only that slot's.
The model opts in by defining::

    def reset_temporal_state(self, mask: torch.Tensor | None) -> None:
        '''Forget the memory of the slots where ``mask`` (BoolTensor [slots]) is True;
        forget everything when ``mask`` is None.'''

``mask`` is on the batch's device. ``None`` is passed at epoch and stage boundaries (train,
validation, test and predict loops), where the next batch may have another batch size and no
slot continues: the model should drop its state entirely and re-create it at the next batch.

Fitting on streaming batches with neither this callback nor a model that says it handles
``is_first`` itself (``handles_is_first = True``) warns once (:func:`warn_without_temporal_reset`,
called by :class:`~lightning_vstream.StreamVideoDataModule`): memory would carry over from one clip
into the next.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import lightning.pytorch as pl
import torch

from lightning_vstream.errors import ConfigurationError, ConfigurationTypeError, VStreamWarning, user_stacklevel

__all__ = ["ResetFn", "TemporalStateReset", "warn_without_temporal_reset"]

#: Signature of a user-given reset function: ``fn(model, mask)``; ``mask`` is None to reset all.
ResetFn = Callable[[pl.LightningModule, torch.Tensor | None], None]


class TemporalStateReset(pl.Callback):
    """Before every batch, resets the model's temporal state for the slots flagged ``is_first``.

    Calls ``model.<method>(mask)`` (by default ``model.reset_temporal_state(mask)``) with the
    batch's ``is_first`` BoolTensor before each training, validation, test and predict batch,
    and with ``mask=None`` ("reset every slot") at the start of training (also when resuming
    mid-epoch), at the start of every epoch of those loops and when validation ends inside a
    training epoch. See the module docstring for the protocol.

    Args:
        method: Name of the model's reset method; a dotted path reaches a submodule
            (``"head.memory.reset"``).
        fn: A function ``fn(model, mask)`` to call instead of a method of the model.
        stages: Loops in which to reset: any of ``"train"``, ``"val"``, ``"test"``, ``"predict"``.

    Raises:
        ValueError: ``stages`` names an unknown loop or ``method`` is not a (dotted) name; at a
            batch: the batch holds no ``is_first`` BoolTensor ``[slots]``.
        TypeError: ``fn`` is not callable; or, when the Trainer sets up, the model has no
            callable ``method``.

    Example::

        >>> from lightning_vstream.callbacks import TemporalStateReset
        >>> class Memory(pl.LightningModule):
        ...     def reset_temporal_state(self, mask):
        ...         ...  # forget the slots where mask is True (everything when mask is None)
        >>> trainer = pl.Trainer(callbacks=[TemporalStateReset()])  # doctest: +SKIP
    """

    def __init__(
        self,
        *,
        method: str = "reset_temporal_state",
        fn: ResetFn | None = None,
        stages: tuple[str, ...] = ("train", "val", "test", "predict"),
    ) -> None:
        super().__init__()
        if fn is not None and not callable(fn):
            raise ConfigurationTypeError(
                f"TemporalStateReset: fn={fn!r} is not callable; pass a function fn(model, mask)."
            )
        if not isinstance(method, str) or not method or any(not part.isidentifier() for part in method.split(".")):
            raise ConfigurationError(
                f"TemporalStateReset: method={method!r} is not a method name; pass the name of the model's reset "
                "method, for example 'reset_temporal_state' or 'memory.reset'."
            )
        unknown = sorted(set(stages) - {"train", "val", "test", "predict"})
        if unknown:
            raise ConfigurationError(
                f"TemporalStateReset: stages={tuple(stages)!r} holds unknown loop(s) {unknown}; "
                "use any of 'train', 'val', 'test', 'predict'."
            )
        self.method = method
        self.fn = fn
        self.stages = frozenset(stages)

    # -- resolving the reset function ------------------------------------------------------
    def _target(self, pl_module: pl.LightningModule) -> Callable[[torch.Tensor | None], None]:
        if self.fn is not None:
            fn = self.fn
            return lambda mask: fn(pl_module, mask)
        owner: Any = pl_module
        for part in self.method.split("."):
            owner = getattr(owner, part, None)
            if owner is None:
                break
        if owner is None or not callable(owner):
            found = "is not callable" if owner is not None else "is missing"
            raise ConfigurationTypeError(
                f"TemporalStateReset: {type(pl_module).__name__}.{self.method} {found}. Add a method "
                f"`def {self.method.rsplit('.', 1)[-1]}(self, mask: torch.Tensor | None) -> None` that forgets "
                "the temporal state of the slots where mask is True (all slots when mask is None), pass "
                "TemporalStateReset(method=...) with the name of your model's reset method, or "
                "TemporalStateReset(fn=...) with a function fn(model, mask)."
            )
        return owner

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._target(pl_module)  # fail before the first batch, not in the middle of an epoch

    def _reset(self, pl_module: pl.LightningModule, mask: torch.Tensor | None) -> None:
        self._target(pl_module)(mask)

    def _reset_batch(self, stage: str, pl_module: pl.LightningModule, batch: Any) -> None:
        if stage not in self.stages:
            return
        mask = batch.get("is_first") if isinstance(batch, dict) else None
        if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool or mask.dim() != 1:
            got = f"a dict with keys {sorted(batch)}" if isinstance(batch, dict) else f"a {type(batch).__name__}"
            if isinstance(mask, torch.Tensor):
                got += f" whose 'is_first' is {mask.dtype} of shape {tuple(mask.shape)}"
            raise ConfigurationError(
                f"TemporalStateReset needs {stage} batches holding 'is_first', a BoolTensor [slots] "
                f"(StreamVideoDataModule batches do), but got {got}. Remove the callback for other data, or "
                f"pass stages=... without {stage!r}."
            )
        self._reset(pl_module, mask)

    def _reset_all(self, stage: str, pl_module: pl.LightningModule) -> None:
        if stage in self.stages:
            self._reset(pl_module, None)

    # -- batch hooks -----------------------------------------------------------------------
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._reset_batch("train", pl_module, batch)

    def on_validation_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        self._reset_batch("val", pl_module, batch)

    def on_test_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        self._reset_batch("test", pl_module, batch)

    def on_predict_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        self._reset_batch("predict", pl_module, batch)

    # -- epoch and stage boundaries --------------------------------------------------------
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # A run resumed mid-epoch skips on_train_epoch_start; its slots continue clips whose
        # memory the checkpoint does not hold.
        self._reset_all("train", pl_module)

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._reset_all("train", pl_module)

    def on_validation_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._reset_all("val", pl_module)

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # Validation inside fit overwrote the memory the training slots were carrying.
        if trainer.state.fn == "fit":
            self._reset_all("train", pl_module)

    def on_test_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._reset_all("test", pl_module)

    def on_predict_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._reset_all("predict", pl_module)


def warn_without_temporal_reset(trainer: Any) -> bool:
    """Warn on rank 0 when ``trainer`` fits a model with nothing that resets its memory at ``is_first``.

    Returns whether it warned (the DataModule warns once).

    Example::

        >>> warn_without_temporal_reset(None)
        False
    """
    if trainer is None or trainer.global_rank != 0:
        return False
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

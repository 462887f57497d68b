"""Lightning callbacks for streaming training: throughput metrics, temporal-state resets and batch previews.

- :mod:`~lightning_vstream.callbacks.throughput`: :class:`StreamThroughputMonitor`, how fast frames reach the
  model and how long the loop waits for them.
- :mod:`~lightning_vstream.callbacks.temporal_reset`: :class:`TemporalStateReset`, clearing a temporal model's
  memory where a slot starts a new clip, and the warning when a temporal model runs without it.
- :mod:`~lightning_vstream.callbacks.preview`: :class:`BatchPreview`, a picture of the first training batches of
  every epoch, in the Trainer's loggers.
"""

from lightning_vstream.callbacks.preview import BatchPreview
from lightning_vstream.callbacks.temporal_reset import ResetFn, TemporalStateReset
from lightning_vstream.callbacks.throughput import StreamThroughputMonitor

__all__ = ["BatchPreview", "ResetFn", "StreamThroughputMonitor", "TemporalStateReset"]

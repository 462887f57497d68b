"""Lightning callbacks for streaming training: throughput metrics, temporal-state resets and batch previews."""

from lightning_vstream.callbacks.preview import BatchPreview
from lightning_vstream.callbacks.temporal_reset import ResetFn, TemporalStateReset
from lightning_vstream.callbacks.throughput import StreamThroughputMonitor

__all__ = ["BatchPreview", "ResetFn", "StreamThroughputMonitor", "TemporalStateReset"]

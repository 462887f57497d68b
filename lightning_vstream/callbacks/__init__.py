"""Lightning callbacks for streaming training: throughput metrics and temporal-state resets."""

from lightning_vstream.callbacks.temporal_reset import ResetFn, TemporalStateReset
from lightning_vstream.callbacks.throughput import StreamThroughputMonitor

__all__ = ["ResetFn", "StreamThroughputMonitor", "TemporalStateReset"]

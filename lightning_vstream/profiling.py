"""NVTX ranges named after the pipeline's stages, so an Nsight Systems profile reads like the pipeline.

Every range lives in the NVTX domain :data:`NVTX_DOMAIN` (``"lightning_vstream"``) and uses one of
the standard names below, so ``nsys stats --report nvtx_sum`` groups the time of each stage:

=============================  ===================================================================
:data:`RANGE_DEMUX`            reading compressed packets from the container (``vstream/demux``)
:data:`RANGE_DECODE`           turning packets into frames, CPU or NVDEC (``vstream/decode``)
:data:`RANGE_COLOR_CONVERT`    YUV -> RGB conversion (``vstream/color_convert``)
:data:`RANGE_HANDOFF`          importing a GPU frame into torch and copying it out of the
                               decoder's surface pool (``vstream/handoff``)
:data:`RANGE_TRANSFORM`        :class:`~lightning_vstream.transforms.FrameTransform` (``vstream/transform``)
:data:`RANGE_COLLATE`          stacking a batch (``vstream/collate``)
:data:`RANGE_ENGINE_STEP`      one decode thread's share of one step in the stream engine
                               (``vstream/engine_step``); nests demux, decode, colour, transform
:data:`RANGE_WAIT`             the training process waiting for the engine's decode threads to
                               have queued a batch (``vstream/wait``): time the loader stalls training
=============================  ===================================================================

The ``nvtx`` package is imported on first use; when it is missing or broken, ranges are no-ops.
Without a profiler attached, ``nvtx`` itself makes a range cost well under a microsecond.

Example::

    >>> with nvtx_range(RANGE_DECODE):
    ...     pass
    >>> @nvtx_range(RANGE_TRANSFORM)
    ... def step(): return 1
    >>> step()
    1
"""

from __future__ import annotations

import functools
import threading
from contextlib import ContextDecorator
from typing import Any

from lightning_vstream.errors import ConfigurationTypeError

__all__ = [
    "NVTX_DOMAIN",
    "RANGE_COLLATE",
    "RANGE_COLOR_CONVERT",
    "RANGE_DECODE",
    "RANGE_DEMUX",
    "RANGE_ENGINE_STEP",
    "RANGE_HANDOFF",
    "RANGE_NAMES",
    "RANGE_TRANSFORM",
    "RANGE_WAIT",
    "nvtx_available",
    "nvtx_range",
]

#: NVTX domain of every range this package emits.
NVTX_DOMAIN = "lightning_vstream"
RANGE_DEMUX = "vstream/demux"
RANGE_DECODE = "vstream/decode"
RANGE_COLOR_CONVERT = "vstream/color_convert"
RANGE_HANDOFF = "vstream/handoff"
RANGE_TRANSFORM = "vstream/transform"
RANGE_COLLATE = "vstream/collate"
RANGE_ENGINE_STEP = "vstream/engine_step"
RANGE_WAIT = "vstream/wait"
#: The standard range names, in pipeline order.
RANGE_NAMES = (
    RANGE_DEMUX,
    RANGE_DECODE,
    RANGE_COLOR_CONVERT,
    RANGE_HANDOFF,
    RANGE_TRANSFORM,
    RANGE_COLLATE,
)

# Fixed colours per stage make the timeline readable at a glance.
_COLORS = {
    RANGE_DEMUX: "yellow",
    RANGE_DECODE: "green",
    RANGE_COLOR_CONVERT: "cyan",
    RANGE_HANDOFF: "blue",
    RANGE_TRANSFORM: "purple",
    RANGE_COLLATE: "orange",
    RANGE_ENGINE_STEP: "grey",
    RANGE_WAIT: "red",
}


@functools.cache
def _nvtx_domain() -> Any:
    """The ``nvtx`` domain object, or None when the ``nvtx`` package cannot be imported."""
    try:
        import nvtx

        return nvtx.get_domain(NVTX_DOMAIN)
    except Exception:
        return None


_attributes_lock = threading.Lock()
_attributes: dict[str, Any] = {}


def _event_attributes(domain: Any, name: str) -> Any:
    # Registering the message once per name keeps push_range at its cheapest.
    attrs = _attributes.get(name)
    if attrs is None:
        with _attributes_lock:
            attrs = _attributes.get(name)
            if attrs is None:
                attrs = domain.get_event_attributes(message=name, color=_COLORS.get(name, "white"))
                _attributes[name] = attrs
    return attrs


def nvtx_available() -> bool:
    """True when the ``nvtx`` package is importable (a profiler may still be absent)."""
    return _nvtx_domain() is not None


class nvtx_range(ContextDecorator):
    """Mark a stage of the pipeline as an NVTX push/pop range in the ``lightning_vstream`` domain.

    Usable as a context manager or a decorator; ranges nest. Use the ``RANGE_*`` constants of this
    module as names so profiles stay comparable; any string is accepted.

    Args:
        name: Range name, such as :data:`RANGE_DECODE`.

    Raises:
        TypeError: ``name`` is not a non-empty string.

    Example::

        >>> with nvtx_range(RANGE_COLLATE):
        ...     batch = [1, 2]
    """

    def __init__(self, name: str) -> None:
        if not isinstance(name, str) or not name:
            raise ConfigurationTypeError(f"nvtx_range name must be a non-empty string, got {name!r}.")
        self.name = name

    def __enter__(self) -> nvtx_range:
        domain = _nvtx_domain()
        if domain is not None:
            domain.push_range(_event_attributes(domain, self.name))
        return self

    def __exit__(self, *exc: object) -> None:
        domain = _nvtx_domain()
        if domain is not None:
            domain.pop_range()

    def __repr__(self) -> str:
        return f"nvtx_range({self.name!r})"

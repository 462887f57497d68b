"""FFmpeg's decoders across ``fork()``: what a forked child inherits is kept, never freed.

FFmpeg's decoding threads do not survive ``fork()``. A forked child that frees an inherited decoder
(even garbage the parent had not collected yet) joins threads that no longer exist and hangs. So
after a fork the child takes every live decoder's FFmpeg objects into a list that is never freed
(each decoder's ``_disown``, which calls :func:`keep_forever`); the decoders themselves reopen their
files lazily when used. Both PyAV decoders (:class:`~lightning_vstream.decode.cpu.pyav.PyAVDecoder`,
:class:`~lightning_vstream.decode.ranged.gop_reads.GopDecoder`) register here when they open (:func:`opened`).
"""

from __future__ import annotations

import gc
import os
import weakref
from typing import Any, Protocol

__all__ = ["keep_forever", "opened"]


class _Disownable(Protocol):
    def _disown(self) -> None: ...


_LIVE_DECODERS: weakref.WeakSet[_Disownable] = weakref.WeakSet()
_INHERITED_FFMPEG_OBJECTS: list[Any] = []
_decoding_started = False  # set once this process opens a decoder (FFmpeg threads may exist)
_froze_for_fork = False


def opened(decoder: _Disownable) -> None:
    """Note that ``decoder`` holds FFmpeg state now: a forked child calls its ``_disown()``."""
    global _decoding_started
    _LIVE_DECODERS.add(decoder)
    _decoding_started = True


def keep_forever(*objects: Any) -> None:
    """Keep FFmpeg objects a forked child inherited for the life of the process (freeing them could hang)."""
    _INHERITED_FFMPEG_OBJECTS.extend(objects)


def _freeze_objects_before_fork() -> None:
    # FFmpeg objects that are garbage but not yet collected (in reference cycles: a finished
    # Trainer, an exception's traceback) must never be finalized in a child, whose garbage
    # collector can run before any after-fork handler does. gc.freeze() moves every existing
    # object to a generation the collector ignores, so the child never collects what it
    # inherited (CPython's documented pattern for fork); the parent unfreezes right after.
    # A process whose own code already uses gc.freeze() is left alone.
    global _froze_for_fork
    _froze_for_fork = _decoding_started and gc.get_freeze_count() == 0
    if _froze_for_fork:
        gc.freeze()


def _unfreeze_after_fork_in_parent() -> None:
    if _froze_for_fork:
        gc.unfreeze()


def _disown_decoders_after_fork() -> None:
    for decoder in list(_LIVE_DECODERS):
        decoder._disown()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(
        before=_freeze_objects_before_fork,
        after_in_parent=_unfreeze_after_fork_in_parent,
        after_in_child=_disown_decoders_after_fork,
    )

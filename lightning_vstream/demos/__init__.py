"""Synthetic stamped data, the end-to-end demo, and a tiny temporal model to train on it.

- :func:`write_dataset`: a stamped multi-camera dataset (every frame says which clip, camera and
  frame it is; :func:`read_stamp` reads it back), as ``vstream synth`` writes it;
- :func:`run_demo`: ``vstream demo``;
- :class:`TinyStreamPETR`: a stand-in for a real temporal model, with ``reset_temporal_state``.

Modules: :mod:`~lightning_vstream.demos.synth` (stamped videos), :mod:`~lightning_vstream.demos.synth_images`
(stamped image-folder cameras), :mod:`~lightning_vstream.demos.synth_annotations` (stamped annotations),
:mod:`~lightning_vstream.demos.demo` (the demo run and its report), :mod:`~lightning_vstream.demos.models`
(the tiny temporal model).

Names load on first access (the model imports lightning; the data writers do not).

Example::

    >>> from lightning_vstream.demos import write_dataset, TinyStreamPETR
    >>> index_file = write_dataset("/tmp/stamped", clips=4, cameras=2, frames=12)  # doctest: +SKIP
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lightning_vstream._exports import lazy_exports

if TYPE_CHECKING:
    from lightning_vstream.demos.demo import DemoResult, run_demo
    from lightning_vstream.demos.models import TinyStreamPETR
    from lightning_vstream.demos.synth import Stamp, clip_name, clip_number, read_stamp, write_dataset
    from lightning_vstream.demos.synth_annotations import write_synthetic_annotations

_EXPORTS = {
    "DemoResult": "lightning_vstream.demos.demo",
    "Stamp": "lightning_vstream.demos.synth",
    "TinyStreamPETR": "lightning_vstream.demos.models",
    "clip_name": "lightning_vstream.demos.synth",
    "clip_number": "lightning_vstream.demos.synth",
    "read_stamp": "lightning_vstream.demos.synth",
    "run_demo": "lightning_vstream.demos.demo",
    "write_dataset": "lightning_vstream.demos.synth",
    "write_synthetic_annotations": "lightning_vstream.demos.synth_annotations",
}


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)


__all__ = [
    "DemoResult",
    "Stamp",
    "TinyStreamPETR",
    "clip_name",
    "clip_number",
    "read_stamp",
    "run_demo",
    "write_dataset",
    "write_synthetic_annotations",
]

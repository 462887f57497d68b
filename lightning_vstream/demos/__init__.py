"""Synthetic stamped data, the end-to-end demo, and a tiny temporal model to train on it.

- :mod:`~lightning_vstream.demos.synth`: stamped multi-camera datasets (every frame says which clip, camera and frame it is).
- :mod:`~lightning_vstream.demos.demo`: ``vstream demo``.
- :mod:`~lightning_vstream.demos.models`: :class:`TinyStreamPETR`, a stand-in for a real temporal model.
"""

"""The random-access way to read: each sample is an explicit set of frames of one clip.

- :mod:`~lightning_vstream.clips.selection`: which frames a sample holds (indices, times, windows, multi-rate).
- :mod:`~lightning_vstream.clips.dataset`: :class:`VideoClipDataset`, its decoder cache and collate function.
- :mod:`~lightning_vstream.clips.datamodule`: :class:`ClipVideoDataModule`.
"""

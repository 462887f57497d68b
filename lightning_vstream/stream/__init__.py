"""The streaming way to read: each batch slot follows one clip frame by frame.

- :mod:`~lightning_vstream.stream.schedule`: which clip and frame every slot reads at every step, per rank.
- :mod:`~lightning_vstream.stream.sampler`: the rank-aware sampler: each step's reads, split into parts.
- :mod:`~lightning_vstream.stream.worker_loader`: the stream-affine DataLoader and its resumable state.
- :mod:`~lightning_vstream.stream.worker`: what a DataLoader worker does: decode its camera streams into the batch.
- :mod:`~lightning_vstream.stream.engine`: the in-process engine: decode threads writing into batches on one device.
- :mod:`~lightning_vstream.stream.stream_datamodule`: :class:`StreamVideoDataModule`.
"""

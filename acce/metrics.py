"""Metrics: the single TensorBoard writer (x-axis = learner_version; env steps as progress/*).

Every key written here is documented in docs/metrics.md (a test checks the prefixes).
"""
from __future__ import annotations

from pathlib import Path
from typing import Mapping

import numpy as np

PREFIXES = ("episode/", "loss/", "is/", "staleness/", "throughput/", "queue/", "weights/", "eval/", "progress/",
            "delay/", "wm/", "learner/", "bc/", "curriculum/", "inference/")
"""metric groups (docs/design.md §9 plus learner/, bc/, curriculum/, inference/ internals)"""


class Metrics:
    def __init__(self, log_dir: str | Path, enabled: bool = True):
        self.log_dir = Path(log_dir)
        self.writer = None
        if enabled:
            from torch.utils.tensorboard import SummaryWriter
            self.writer = SummaryWriter(str(self.log_dir))
        self.last: dict[str, float] = {}

    def scalars(self, values: Mapping[str, float], step: int) -> None:
        for key, value in values.items():
            if not key.startswith(PREFIXES):
                raise ValueError(f"metric {key!r} has no documented group; use one of {PREFIXES}")
            if value is None or not np.isfinite(value):
                continue
            self.last[key] = float(value)
            if self.writer is not None:
                self.writer.add_scalar(key, float(value), step)

    def histogram(self, key: str, values: np.ndarray, step: int) -> None:
        if self.writer is not None and len(values):
            self.writer.add_histogram(key, np.asarray(values), step)

    def video(self, key: str, frames: np.ndarray, step: int, fps: int = 10) -> None:
        """frames: (T, H, W, 3) uint8, written as an animated GIF image summary (what TensorBoard plays).

        Not SummaryWriter.add_video: it needs moviepy<2 (it imports moviepy.editor, removed in moviepy 2.0); the
        GIF is the same summary it would write, encoded with Pillow (already installed)."""
        if self.writer is None or not len(frames):
            return
        import io

        from PIL import Image
        from tensorboard.compat.proto.summary_pb2 import Summary
        frames = np.asarray(frames, dtype=np.uint8)
        buf = io.BytesIO()
        images = [Image.fromarray(f) for f in frames]
        images[0].save(buf, format="GIF", save_all=True, append_images=images[1:], duration=int(1000 / fps), loop=0)
        t, h, w, c = frames.shape
        summary = Summary(value=[Summary.Value(tag=key, image=Summary.Image(
            height=h, width=w, colorspace=c, encoded_image_string=buf.getvalue()))])
        self.writer._get_file_writer().add_summary(summary, step)

    def image(self, key: str, image: np.ndarray, step: int) -> None:
        if self.writer is not None:
            self.writer.add_image(key, np.asarray(image), step, dataformats="HWC")

    def flush(self) -> None:
        if self.writer is not None:
            self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None

"""Online thresholds for the world model's done heads (terminated, success), fitted on real data it has not seen.

A head fine-tuned on one improving policy's episodes keeps ranking steps well but its logits drift: in `bench wm`
the success head's recall at logit > 0 fell from 0.65 to 0.14 while its AUROC held (docs/decisions.md). ImaginedEnv
acts on `logit > threshold`, so the threshold is what needs to follow. `Calibrator` keeps the one-step logits of the
last `frames` real transitions, each computed before its episode joins the training buffer (test-then-train, so the
window never holds data the model was fitted on at the time), and sets each head's threshold to the logit that
maximizes F1 there.
"""
from __future__ import annotations

from collections import deque
from typing import Sequence

import numpy as np
import torch

from worldmodel.config import CALIBRATE_RULES
from worldmodel.data import EpisodeArrays, split_cameras

MIN_POSITIVES = 5
"""a head keeps its threshold until the window holds this many positive transitions"""


def counts_at_thresholds(logits: np.ndarray, label: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(values, tp, fp): the distinct logits best first, and the true and false positives of `logit >= value` at
    each: the points of a precision-recall curve (shared by F1 calibration and average precision)."""
    order = np.argsort(-logits, kind="stable")
    sorted_logits = logits[order]
    last = np.r_[np.flatnonzero(np.diff(sorted_logits)), len(logits) - 1]  # last index of each distinct value
    return sorted_logits[last], np.cumsum(label[order])[last], np.cumsum(~label[order])[last]


def best_f1_threshold(logits: np.ndarray, label: np.ndarray) -> tuple[float, float]:
    """(threshold, F1) with `logit > threshold` the best F1 over every cut between distinct logits (the midpoint
    between the last logit called positive and the next one below it). Needs at least one positive."""
    logits, label = np.asarray(logits, np.float64), np.asarray(label, bool)
    if not label.any():
        raise ValueError("best_f1_threshold needs at least one positive label")
    values, tp, fp = counts_at_thresholds(logits, label)
    f1 = 2 * tp / (2 * tp + fp + (label.sum() - tp))
    k = int(np.argmax(f1))  # ties: the highest threshold (fewest positives called)
    below = values[k + 1] if k + 1 < len(values) else values[k] - 1.0
    return float((values[k] + below) / 2), float(f1[k])


def count_matching_threshold(logits: np.ndarray, label: np.ndarray) -> float:
    """The cut with as many logits above it as there are positives (the midpoint between the k-th and (k+1)-th
    largest logit, k = positives): the head then calls successes as often as they happen. A quantile of the window
    rather than an arg-max over a flat F1 curve. Logits tied at the cut are all called negative."""
    logits, label = np.asarray(logits, np.float64), np.asarray(label, bool)
    k = int(label.sum())
    if k == 0:
        raise ValueError("count_matching_threshold needs at least one positive label")
    s = np.sort(logits)[::-1]
    return float((s[k - 1] + s[k]) / 2) if k < len(s) else float(s[-1] - 1.0)


@torch.no_grad()
def one_step_logits(model, ep: EpisodeArrays) -> np.ndarray:
    """(T, 2) done-head logits of each transition's predicted next latent: encode frame t, step with action t,
    as ImaginedEnv does. Labels are the episode's (terminated, success) per transition."""
    t = ep.num_steps
    obs = {**split_cameras(ep.images[:t], model.cameras), "state": ep.state[:t], "instruction": [ep.instruction] * t}
    was_training = model.training
    model.eval()
    try:
        z = model.encode(obs)
        pred = model.next(z, torch.tensor(ep.action, dtype=torch.float32, device=z.device))  # copies: may be read-only
        return model.done_logits(pred.z).float().cpu().numpy()
    finally:
        model.train(was_training)


class Calibrator:
    """A window of (logits, labels) over the last `frames` real transitions and the thresholds fitted on it."""

    def __init__(self, frames: int, rule: str = "f1"):
        if frames <= 0:
            raise ValueError(f"calibration window must be > 0 frames, got {frames}")
        if rule not in CALIBRATE_RULES:
            raise ValueError(f"calibration rule must be one of {CALIBRATE_RULES}, got {rule!r}")
        self.frames, self.rule = int(frames), rule
        self._window: deque[tuple[np.ndarray, np.ndarray]] = deque()
        self._count = 0
        self.f1 = [float("nan"), float("nan")]

    def observe(self, model, episodes: Sequence[EpisodeArrays]) -> None:
        """Score `episodes` with the current model (before it trains on them) and refit its thresholds."""
        for ep in episodes:
            if ep.num_steps:
                labels = np.stack([ep.terminated, ep.success], -1).astype(bool)
                self._window.append((one_step_logits(model, ep), labels))
                self._count += ep.num_steps
        while self._window and self._count - len(self._window[0][0]) >= self.frames:
            self._count -= len(self._window.popleft()[0])
        self.fit(model)

    def fit(self, model) -> None:
        if not self._window:
            return
        logits = np.concatenate([w[0] for w in self._window])
        labels = np.concatenate([w[1] for w in self._window])
        for head in (0, 1):
            if labels[:, head].sum() >= MIN_POSITIVES:
                x, y = logits[:, head], labels[:, head]
                if self.rule == "count":
                    threshold = count_matching_threshold(x, y)
                    tp, called = int((y & (x > threshold)).sum()), int((x > threshold).sum())
                    self.f1[head] = 2 * tp / (called + int(y.sum()))
                else:
                    threshold, self.f1[head] = best_f1_threshold(x, y)
                model.done_threshold[head] = threshold

    @property
    def window_frames(self) -> int:
        return self._count

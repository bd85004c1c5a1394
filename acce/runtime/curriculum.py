"""Task sampling for rollouts: uniform, or failure-weighted (P(task) ∝ recent failures + 1, as AcceRL does)."""
from __future__ import annotations

import collections

import numpy as np


class TaskSampler:
    def __init__(self, tasks, mode: str = "uniform", window: int = 50, min_share: float = 0.0):
        self.tasks = tuple(tasks)
        self.mode = mode
        if min_share * len(self.tasks) > 1.0 + 1e-9:
            raise ValueError(f"min_share {min_share} over {len(self.tasks)} tasks exceeds 1")
        self.min_share = float(min_share)
        self.history = {t: collections.deque(maxlen=window) for t in self.tasks}

    def __call__(self, rng: np.random.Generator) -> str:
        return self.tasks[int(rng.choice(len(self.tasks), p=self.probabilities()))]

    def probabilities(self) -> np.ndarray:
        if self.mode == "uniform":
            return np.full(len(self.tasks), 1.0 / len(self.tasks))
        weights = np.array([sum(1 for s in self.history[t] if not s) + 1.0 for t in self.tasks])
        # a floor per task, the rest by failures: p = m + (1 - K m) w / sum(w)
        k = len(self.tasks)
        return self.min_share + (1.0 - k * self.min_share) * weights / weights.sum()

    def update(self, task: str, success: bool) -> None:
        if task in self.history:
            self.history[task].append(bool(success))

    def state_dict(self) -> dict:
        return {"mode": self.mode, "history": {t: list(h) for t, h in self.history.items()}}

    def load_state_dict(self, state: dict) -> None:
        for t, h in state.get("history", {}).items():
            if t in self.history:
                self.history[t].extend(h)

"""Normalization statistics that travel with every checkpoint (docs/design.md §3: loading without them is an error)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

STD_FLOOR = 1e-3
"""smallest state std: a constant dimension (a gripper that never moved in the data) must not blow up to inf"""

DEFAULT_ACTION_REPR = {"type": "normalized", "range": [-1.0, 1.0]}
"""what the action vector means when the caller does not say; the env maps [-1, 1] to physical commands"""


@dataclass(frozen=True)
class NormStats:
    """Per-dimension state normalization plus a description of the action space."""

    state_mean: np.ndarray
    """(S,) float32"""
    state_std: np.ndarray
    """(S,) float32, > 0"""
    action_repr: dict[str, Any] = field(default_factory=lambda: dict(DEFAULT_ACTION_REPR))
    """what an action means, e.g. {"type": "delta_xyz_gripper", "dim": 4, "range": [-1, 1]}"""

    def __post_init__(self) -> None:
        try:
            mean = np.asarray(self.state_mean, dtype=np.float32).reshape(-1)
            std = np.asarray(self.state_std, dtype=np.float32).reshape(-1)
        except (TypeError, ValueError):
            raise ValueError("normalization statistics are malformed: state_mean/state_std must be numeric (S,) "
                             "arrays; recompute them with NormStats.from_states(states)") from None
        if mean.shape != std.shape:
            raise ValueError(f"normalization statistics are malformed: state_mean {mean.shape} vs state_std "
                             f"{std.shape}")
        if not (np.all(np.isfinite(mean)) and np.all(np.isfinite(std)) and np.all(std > 0)):
            raise ValueError("normalization statistics are malformed: state_mean/state_std must be finite and "
                             "state_std > 0; recompute them with NormStats.from_states(states)")
        if not isinstance(self.action_repr, dict):
            raise ValueError(f"normalization statistics are malformed: action_repr must be a dict, got "
                             f"{type(self.action_repr).__name__}")
        object.__setattr__(self, "state_mean", mean)
        object.__setattr__(self, "state_std", std)

    @property
    def state_dim(self) -> int:
        return int(self.state_mean.shape[0])

    @classmethod
    def from_states(cls, states: np.ndarray, action_repr: dict[str, Any] | None = None) -> "NormStats":
        """Statistics of a (N, S) array of proprioceptive states (e.g. every frame of the demonstration store)."""
        states = np.asarray(states, dtype=np.float64)
        if states.ndim != 2 or states.shape[0] == 0:
            raise ValueError(f"NormStats.from_states expects a non-empty (N, S) array, got shape {states.shape}")
        if not np.all(np.isfinite(states)):
            raise ValueError("NormStats.from_states: states contain NaN/inf; clean the data first")
        return cls(states.mean(0).astype(np.float32), np.maximum(states.std(0), STD_FLOOR).astype(np.float32),
                   dict(action_repr) if action_repr is not None else dict(DEFAULT_ACTION_REPR))

    def to_dict(self) -> dict[str, Any]:
        """Plain lists and dicts: fits JSON, YAML, msgpack and torch.save alike."""
        return {"state_mean": self.state_mean.tolist(), "state_std": self.state_std.tolist(),
                "action_repr": dict(self.action_repr)}

    @classmethod
    def from_dict(cls, d: Any) -> "NormStats":
        if not isinstance(d, dict) or not {"state_mean", "state_std"} <= set(d):
            raise ValueError("checkpoint has no normalization statistics (need 'state_mean' and 'state_std'); "
                             "compute them with NormStats.from_states(states) and save the policy with "
                             "VLAPolicy.policy_state()")
        return cls(np.asarray(d["state_mean"], np.float32), np.asarray(d["state_std"], np.float32),
                   dict(d.get("action_repr") or DEFAULT_ACTION_REPR))

"""Schema of an acce episode store: what every episode shares, and the per-frame / per-episode array specs.

Split out of `acce.store.episodes` (which re-exports everything here); see that module's docstring for the layout.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from acce.types import AUX_KEY, IMAGE_PREFIX, STATE_KEY, UNIT_FIELDS, EnvSpec, Episode

TRANSITION_FIELDS: dict[str, tuple[type, Any]] = {
    "reward": (np.float32, 0.0),
    "terminated": (np.bool_, False),
    "truncated": (np.bool_, False),
    "success": (np.bool_, False),
    "behavior_version": (np.int64, -1),
    "delay_steps": (np.int32, 0),
    "policy_sampled": (np.bool_, False),
}
"""(T,) episode fields stored per frame row: dtype and the value padding the final observation's row"""
EPISODE_NUMBERS: dict[str, type] = {
    "frame_start": np.int64, "num_steps": np.int64, "task_id": np.int64, "seed": np.int64,
    "wm_version": np.int64, "success": np.bool_,
}
EPISODE_STRINGS = ("instruction", "task", "source", "episode_id")
_CAMERA_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


@dataclass(frozen=True)
class StoreSchema:
    """What every episode in a store shares; saved in the root attrs and checked on every append."""

    image_shapes: dict[str, tuple[int, int]]
    """camera name -> (H, W); obs["image/<camera>"] is uint8 (T+1, H, W, 3)"""
    state_dim: int
    """S: obs["state"] is float32 (T+1, S)"""
    action_dim: int
    """A: action is float32 (T, A) in [-1, 1]"""
    control_hz: float
    """control rate the episodes were recorded at"""
    extra: dict[str, Any] = field(default_factory=dict)
    """free-form JSON metadata (robot type, task registry version, ...); not interpreted by the store"""
    aux_dim: int = 0
    """P: obs["aux"] is float32 (T+1, P) privileged training labels (simulated demos only); 0 = none"""
    action_repr: str = ""
    """what the actions mean (EnvSpec.action_repr); "" = not recorded (stores written before the env spec, imports)"""
    max_step_m: float = 0.0
    """end-effector displacement of a unit action per step, metres (EnvSpec.max_step_m); 0 = none or not recorded"""
    state_names: tuple[str, ...] = ()
    """EnvSpec.state_names: the dataset's name of each state dim; () = unnamed"""
    action_names: tuple[str, ...] = ()
    """EnvSpec.action_names: the dataset's name of each action dim; () = unnamed"""
    action_low: tuple[float, ...] = ()
    """EnvSpec.action_low: the data's units at a = -1 (stored actions are in [-1, 1]); () = no units"""
    action_high: tuple[float, ...] = ()
    """EnvSpec.action_high: the data's units at a = +1"""

    @classmethod
    def fields_for(cls, spec: EnvSpec, *, aux_dim: int = 0, extra: dict[str, Any] | None = None) -> dict[str, Any]:
        """The keyword arguments of `EpisodeStore.create` / `open_or_create` for episodes of an env spec."""
        return {"image_shapes": {c: (spec.image_size, spec.image_size) for c in spec.cameras},
                "state_dim": spec.state_dim, "action_dim": spec.action_dim, "control_hz": spec.control_hz,
                "action_repr": spec.action_repr, "max_step_m": spec.max_step_m, "aux_dim": aux_dim,
                **{n: getattr(spec, n) for n in UNIT_FIELDS if getattr(spec, n)},
                **({"extra": extra} if extra is not None else {})}

    @classmethod
    def from_spec(cls, spec: EnvSpec, *, aux_dim: int = 0, extra: dict[str, Any] | None = None) -> StoreSchema:
        return cls(**{"extra": {}, **cls.fields_for(spec, aux_dim=aux_dim, extra=extra)})

    @property
    def env_spec(self) -> EnvSpec:
        """The env spec the episodes were recorded under. Stores without a recorded action representation read as
        "normalized" (unknown); cameras of different or non-square sizes have no EnvSpec (ValueError)."""
        sizes = {h for h, w in self.image_shapes.values() if h == w}
        if len(sizes) != 1 or any(h != w for h, w in self.image_shapes.values()):
            raise ValueError(f"image_shapes {self.image_shapes} are not one square size: no env spec (and no policy) "
                             "describes them; import the dataset with dataset.image_size=N to resize to N x N")
        return EnvSpec(self.state_dim, self.action_dim, self.action_repr or "normalized", self.control_hz,
                       tuple(self.image_shapes), sizes.pop(), self.max_step_m,
                       **{n: getattr(self, n) for n in UNIT_FIELDS})

    def __post_init__(self) -> None:
        shapes = {str(k): (int(v[0]), int(v[1])) for k, v in sorted(dict(self.image_shapes).items())}
        object.__setattr__(self, "image_shapes", shapes)
        object.__setattr__(self, "extra", dict(self.extra or {}))
        for name, kind in (("state_names", str), ("action_names", str), ("action_low", float), ("action_high", float)):
            object.__setattr__(self, name, tuple(kind(v) for v in getattr(self, name)))
        for cam, (h, w) in shapes.items():
            if not _CAMERA_NAME.match(cam) or h < 1 or w < 1:
                raise ValueError(f"image_shapes[{cam!r}] = {(h, w)}: camera names use [A-Za-z0-9_.-] "
                                 "and (H, W) must be positive")
        if self.aux_dim < 0:
            raise ValueError(f"aux_dim={self.aux_dim} must be >= 0")
        if self.state_dim < 1 or self.action_dim < 1:
            raise ValueError(f"state_dim={self.state_dim} and action_dim={self.action_dim} must both be >= 1")
        if not self.control_hz > 0:
            raise ValueError(f"control_hz={self.control_hz} must be > 0")
        if not isinstance(self.action_repr, str) or self.max_step_m < 0:
            raise ValueError(f"action_repr={self.action_repr!r} must be a str and max_step_m={self.max_step_m} >= 0")
        for name, width in (("state_names", self.state_dim), ("action_names", self.action_dim),
                            ("action_low", self.action_dim), ("action_high", self.action_dim)):
            if getattr(self, name) and len(getattr(self, name)) != width:
                raise ValueError(f"{name} has {len(getattr(self, name))} entries for {width} dims")
        if bool(self.action_low) != bool(self.action_high):
            raise ValueError("give action_low and action_high together (the actions' units), or neither")
        try:
            json.dumps(self.extra)
        except TypeError as err:
            raise ValueError(f"extra must be JSON-serializable (plain dicts, lists, numbers, str): {err}") from None

    def to_json(self) -> dict[str, Any]:
        return {"image_shapes": {k: list(v) for k, v in self.image_shapes.items()}, "state_dim": self.state_dim,
                "action_dim": self.action_dim, "control_hz": self.control_hz, "extra": self.extra,
                "aux_dim": self.aux_dim,
                # only when recorded, so stores without them keep the layout older readers know
                **({"action_repr": self.action_repr} if self.action_repr else {}),
                **({"max_step_m": self.max_step_m} if self.max_step_m else {}),
                **{n: list(getattr(self, n)) for n in UNIT_FIELDS if getattr(self, n)}}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> StoreSchema:
        return cls(image_shapes=d["image_shapes"], state_dim=int(d["state_dim"]), action_dim=int(d["action_dim"]),
                   control_hz=float(d["control_hz"]), extra=d.get("extra") or {}, aux_dim=int(d.get("aux_dim", 0)),
                   action_repr=str(d.get("action_repr", "")), max_step_m=float(d.get("max_step_m", 0.0)),
                   **{n: tuple(d[n]) for n in UNIT_FIELDS if n in d})

    def frame_arrays(self) -> dict[str, tuple[tuple[int, ...], Any]]:
        """frames/ array name -> (shape after the frame axis, dtype); names equal Episode obs keys where shared."""
        arrays: dict[str, tuple[tuple[int, ...], Any]] = {
            f"{IMAGE_PREFIX}{cam}": ((h, w, 3), np.uint8) for cam, (h, w) in self.image_shapes.items()}
        arrays[STATE_KEY] = ((self.state_dim,), np.float32)
        if self.aux_dim:
            arrays[AUX_KEY] = ((self.aux_dim,), np.float32)
        arrays["timestamp_s"] = ((), np.float64)
        arrays["action"] = ((self.action_dim,), np.float32)
        arrays.update({name: ((), dtype) for name, (dtype, _) in TRANSITION_FIELDS.items()})
        return arrays

    def mismatch(self, other: StoreSchema, compare_extra: bool = True) -> str | None:
        """Name the first field where `other` differs from this schema, or None."""
        for name in ("image_shapes", "state_dim", "aux_dim", "action_dim", "control_hz", *UNIT_FIELDS) + (
                ("extra",) if compare_extra else ()):
            if getattr(self, name) != getattr(other, name):
                return f"{name}: store has {getattr(self, name)!r}, requested {getattr(other, name)!r}"
        for name in ("action_repr", "max_step_m"):  # compared where both sides recorded them (older stores did not)
            mine, theirs = getattr(self, name), getattr(other, name)
            if mine and theirs and mine != theirs:
                return f"{name}: store has {mine!r}, requested {theirs!r}"
        return None

    def frame_rows(self, episode: Episode) -> dict[str, np.ndarray]:
        """The episode as frames/ rows (T + 1 each, padded); raises ValueError naming what does not fit."""
        episode.validate()
        schema, t = self, episode.num_steps
        cams = {k for k in episode.obs if k.startswith(IMAGE_PREFIX)}
        expected = {f"{IMAGE_PREFIX}{c}" for c in schema.image_shapes}
        others = {STATE_KEY} | ({AUX_KEY} if schema.aux_dim else set())
        if cams != expected or set(episode.obs) - cams != others:
            hint = (" (aux labels need a store created with aux_dim > 0, and a store with aux_dim needs them)"
                    if AUX_KEY in set(episode.obs) ^ others else "")
            raise ValueError(f"episode obs keys {sorted(episode.obs)} do not match the store's "
                             f"{sorted(expected | others)}{hint}")
        for cam, (h, w) in schema.image_shapes.items():
            if episode.obs[f"{IMAGE_PREFIX}{cam}"].shape[1:3] != (h, w):
                raise ValueError(f"obs['{IMAGE_PREFIX}{cam}'] is {episode.obs[f'{IMAGE_PREFIX}{cam}'].shape[1:3]} "
                                 f"(H, W) but the store holds {(h, w)}; resize or use a store with that shape")
        state = episode.obs[STATE_KEY]
        if state.ndim != 2 or state.shape[1] != schema.state_dim:
            raise ValueError(f"obs['state'] has shape {state.shape}, the store needs (T+1, {schema.state_dim})")
        if schema.aux_dim and episode.obs[AUX_KEY].shape[1:] != (schema.aux_dim,):
            raise ValueError(f"obs['aux'] has shape {episode.obs[AUX_KEY].shape}, the store needs "
                             f"(T+1, {schema.aux_dim})")
        if episode.action.shape != (t, schema.action_dim):
            raise ValueError(f"action has shape {episode.action.shape}, the store needs ({t}, {schema.action_dim})")
        for name in EPISODE_STRINGS:
            if not isinstance(getattr(episode, name), str):
                raise ValueError(f"episode.{name} must be a str, got {type(getattr(episode, name)).__name__}")
        rows = {k: np.asarray(v) for k, v in episode.obs.items()}
        rows[STATE_KEY] = state.astype(np.float32)
        if schema.aux_dim:
            rows[AUX_KEY] = episode.obs[AUX_KEY].astype(np.float32)
        rows["timestamp_s"] = episode.timestamp_s.astype(np.float64)
        rows["action"] = np.concatenate([episode.action, np.zeros((1, schema.action_dim))]).astype(np.float32)
        for name, (dtype, pad) in TRANSITION_FIELDS.items():
            rows[name] = np.append(getattr(episode, name), pad).astype(dtype)
        return rows

"""Contracts shared by sim, world model, runtime and robot bridge (docs/design.md §3, §5, §6).

Plain data and small Protocols (implementations wrap, not subclass); only numpy, so `import acce` stays light."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Protocol, Sequence, runtime_checkable

import numpy as np

# --- observation keys (same in sim, world model and robot) ------------------------------------------------
IMAGE_PREFIX = "image/"
"""prefix of camera keys: obs["image/<camera>"] is uint8 (H, W, 3)"""
STATE_KEY = "state"
"""proprioception only, float32 (S,): end-effector position, gripper opening; never object poses"""
INSTRUCTION_KEY = "instruction"
"""natural-language instruction (str)"""
TASK_ID_KEY = "task_id"
"""integer id of the task in the registry, int64; episode stores keep it beside the instruction string"""
AUX_KEY = "aux"
"""optional privileged training labels, float32 (P,): where the instruction's object and goal are (sim only, and
only when an env is built with aux_labels=True). Supervision for the BC perception auxiliary loss; policies never
read it as an input, and robots and world models never produce it (docs/design.md §3 departure, docs/decisions.md)"""

SOURCES = ("sim", "imagined", "real", "demo")
"""where a decision came from (docs/design.md §6)"""

Obs = dict[str, Any]
"""one env: {"image/front": (H, W, 3) uint8, "state": (S,) float32, "instruction": str}"""
BatchObs = dict[str, Any]
"""N envs: {"image/front": (N, H, W, 3) uint8, "state": (N, S) float32, "instruction": list[str], "task_id": (N,)}"""


def batch_row(batch: Mapping[str, Any], i: int) -> Obs:
    """Row i of a batched observation (arrays and the instruction list alike)."""
    return {k: v[i] for k, v in batch.items()}


def image_keys(obs: Mapping[str, Any]) -> list[str]:
    """Camera keys of an observation, sorted so every component sees them in the same order."""
    return sorted(k for k in obs if k.startswith(IMAGE_PREFIX))


UNIT_FIELDS = ("state_names", "action_names", "action_low", "action_high")
"""EnvSpec fields a dataset or robot gives and a sim leaves empty: dim names and the actions' physical units"""


@dataclass(frozen=True)
class EnvSpec:
    """What a policy trained in one env needs from any other place it runs (docs/design.md §11).

    The env factory produces it (`SimVectorEnv.spec`, `acce.wiring.env_spec`); it travels with the policy
    (`VLAPolicy.env_spec`, checkpoints), the episode store (`StoreSchema.from_spec`), the server's metadata and
    the robot runtime, so nothing downstream hard-codes a width or a rate.
    """

    state_dim: int
    """S: obs["state"] is float32 (S,) proprioception"""
    action_dim: int
    """A: an action is float32 (A,) in [-1, 1]"""
    action_repr: str
    """what an action means once the env maps it to physical commands: "delta_xyz_gripper" (both sims: fingertip or
    hand displacement in units of max_step_m, then a gripper command), "joint_pos_abs" (a joint-position arm),
    "normalized" (unknown: stores and policies that predate the spec). A robot mapping must implement the same one"""
    control_hz: float
    """control steps per second: one action per step, so a policy is only valid at the rate it was trained at"""
    cameras: tuple[str, ...]
    """camera names, sorted: obs["image/<camera>"] for each"""
    image_size: int
    """side of every (square) camera image, pixels"""
    max_step_m: float = 0.0
    """end-effector displacement one unit action commands per control step, metres (delta representations; 0 where
    it has no meaning, e.g. joint positions)"""
    state_names: tuple[str, ...] = ()
    """name of each state dim (a dataset's or robot's feature keys, e.g. "elbow_flex.pos"); () = unnamed (sims)"""
    action_names: tuple[str, ...] = ()
    """name of each action dim, the robot action keys it commands; () = unnamed (sims)"""
    action_low: tuple[float, ...] = ()
    """value of each action dim at a = -1 in the data's own units (degrees, radians, ...): the policy acts in
    [-1, 1] and a robot sends low + (a + 1) / 2 * (high - low); () = the env maps [-1, 1] itself (sims)"""
    action_high: tuple[float, ...] = ()
    """value of each action dim at a = +1 in the data's units; given together with action_low"""

    def __post_init__(self) -> None:
        object.__setattr__(self, "cameras", tuple(sorted(str(c) for c in self.cameras)))
        for name in ("state_names", "action_names"):
            object.__setattr__(self, name, tuple(str(n) for n in getattr(self, name)))
        for name in ("action_low", "action_high"):
            object.__setattr__(self, name, tuple(float(v) for v in getattr(self, name)))
        problems = []
        if int(self.state_dim) < 1 or int(self.action_dim) < 1:
            problems.append(f"state_dim={self.state_dim} and action_dim={self.action_dim} must be >= 1")
        if not isinstance(self.action_repr, str) or not self.action_repr:
            problems.append(f"action_repr must be a non-empty string, got {self.action_repr!r}")
        if not float(self.control_hz) > 0:
            problems.append(f"control_hz={self.control_hz} must be > 0")
        if not self.cameras or len(set(self.cameras)) != len(self.cameras):
            problems.append(f"cameras must be distinct names, at least one, got {list(self.cameras)}")
        if int(self.image_size) < 1:
            problems.append(f"image_size={self.image_size} must be >= 1 pixel")
        if float(self.max_step_m) < 0:
            problems.append(f"max_step_m={self.max_step_m} must be >= 0")
        for name, width in (("state_names", self.state_dim), ("action_names", self.action_dim),
                            ("action_low", self.action_dim), ("action_high", self.action_dim)):
            if getattr(self, name) and len(getattr(self, name)) != int(width):
                problems.append(f"{name} has {len(getattr(self, name))} entries for {width} dims")
        if len(self.action_low) != len(self.action_high) or not all(
                np.isfinite(lo) and np.isfinite(hi) and lo < hi for lo, hi in zip(self.action_low, self.action_high)):
            problems.append(f"action_low {list(self.action_low)} and action_high {list(self.action_high)} must both "
                            "be given (or neither), finite, with low < high in every dim")
        if problems:
            raise ValueError("env spec is invalid: " + "; ".join(problems))
        for name, kind in (("state_dim", int), ("action_dim", int), ("control_hz", float), ("image_size", int),
                           ("max_step_m", float)):
            object.__setattr__(self, name, kind(getattr(self, name)))

    def to_dict(self) -> dict[str, Any]:
        """Plain types (fits JSON, msgpack, torch.save): cameras as a list."""
        out = {"state_dim": self.state_dim, "action_dim": self.action_dim, "action_repr": self.action_repr,
               "control_hz": self.control_hz, "cameras": list(self.cameras), "image_size": self.image_size,
               "max_step_m": self.max_step_m}
        # names and units only when known, so a sim spec's dict is what readers before them know
        return {**out, **{n: list(getattr(self, n)) for n in UNIT_FIELDS if getattr(self, n)}}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "EnvSpec":
        """Inverse of to_dict; a missing or unknown key is a ValueError naming it."""
        if not isinstance(d, Mapping):
            raise ValueError(f"env spec must be a dict (EnvSpec.to_dict()), got {type(d).__name__}")
        names = [f for f in cls.__dataclass_fields__]
        missing = [n for n in names if n not in d and n not in ("max_step_m", *UNIT_FIELDS)]
        unknown = sorted(set(d) - set(names))
        if missing or unknown:
            raise ValueError(f"env spec dict has missing keys {missing} / unknown keys {unknown}; expected {names}")
        return cls(**{**d, **{n: tuple(d[n]) for n in ("cameras", *UNIT_FIELDS) if n in d}})

    def action_repr_dict(self) -> dict[str, Any]:
        """The action description a policy's normalization statistics carry (`NormStats.action_repr`)."""
        out: dict[str, Any] = {"type": self.action_repr, "dim": self.action_dim, "range": [-1, 1],
                               "control_hz": self.control_hz}
        if self.action_low:
            out.update(low=list(self.action_low), high=list(self.action_high))
        if self.action_names:
            out["names"] = list(self.action_names)
        return {**out, "max_step_m": self.max_step_m} if self.max_step_m else out

    def to_units(self, action: np.ndarray) -> np.ndarray:
        """(..., A) actions in [-1, 1] -> the data's units (low + (a + 1) / 2 * (high - low)); as is without units."""
        if not self.action_low:
            return np.asarray(action, np.float64)
        lo, hi = np.asarray(self.action_low), np.asarray(self.action_high)
        return lo + (np.asarray(action, np.float64) + 1.0) / 2.0 * (hi - lo)

    def from_units(self, value: np.ndarray) -> np.ndarray:
        """Inverse of to_units: (..., A) values in the data's units -> [-1, 1] inside [action_low, action_high]."""
        if not self.action_low:
            return np.asarray(value, np.float64)
        lo, hi = np.asarray(self.action_low), np.asarray(self.action_high)
        return 2.0 * (np.asarray(value, np.float64) - lo) / (hi - lo) - 1.0

    def differences(self, other: "EnvSpec") -> dict[str, tuple[Any, Any]]:
        """field -> (this spec's value, other's) where they differ."""
        return {n: (getattr(self, n), getattr(other, n)) for n in self.__dataclass_fields__
                if getattr(self, n) != getattr(other, n)}

    def check_compatible(self, other: "EnvSpec", this: str = "this", that: str = "other") -> None:
        """Raise one ValueError naming every field where `other` differs (a policy runs only where its spec holds).
        `this` / `that` name the two sides in the message, e.g. "the policy" and "the robot"."""
        diff = self.differences(other)
        if diff:
            raise ValueError("env specs differ: " + "; ".join(f"{n}: {this} {a!r}, {that} {b!r}"
                                                               for n, (a, b) in diff.items()))


@dataclass
class VecStep:
    """Result of one batched env step (N envs).

    Autoreset happens in the same call: where `done` is set, `obs` already holds the first observation of the
    next episode and `final_obs` the last observation of the finished one (for bootstrapping truncations).
    """

    obs: BatchObs | None
    """observation after the step (None when the caller asked for no observation: physics-only steps)"""
    reward: np.ndarray
    """(N,) float32 weighted sum of `reward_terms`"""
    terminated: np.ndarray
    """(N,) bool: the MDP ended (success or failure state)"""
    truncated: np.ndarray
    """(N,) bool: time limit (or imagination gate) cut the episode"""
    success: np.ndarray
    """(N,) bool: the task's success predicate at this step (not a reward threshold)"""
    reward_terms: dict[str, np.ndarray] = field(default_factory=dict)
    """raw reward terms, each (N,) float32, logged unweighted"""
    final_obs: dict[int, Obs] = field(default_factory=dict)
    """env index -> last observation of an episode that ended in this step (only rendered envs)"""
    episode_success: np.ndarray | None = None
    """(N,) bool for envs that ended this step: did the episode reach success at any step"""
    info: dict[str, np.ndarray] = field(default_factory=dict)
    """per-env extras, each (N,): "episode_return", "episode_length" (valid where done), "task_id", "seed"
    (of the episode that was running during this step)"""

    @property
    def done(self) -> np.ndarray:
        return self.terminated | self.truncated


@runtime_checkable
class VectorEnv(Protocol):
    """Batched env contract shared by the sim vector env and the world model's ImaginedEnv."""

    num_envs: int
    action_dim: int
    state_dim: int
    control_hz: float
    camera_names: tuple[str, ...]
    image_size: int

    def reset(self, seeds: Sequence[int] | None = None) -> BatchObs: ...

    def step(self, actions: np.ndarray, render: bool = True, active: np.ndarray | None = None) -> VecStep:
        """actions: (N, A) float32 in [-1, 1]. render=False skips observation rendering (inside a chunk);
        envs that finish are reset in the same call and their final observation is in `final_obs`.
        active: optional (N,) bool; inactive envs do not move (a paused env waiting for fresher weights)."""
        ...

    def observe(self, indices: Sequence[int] | None = None) -> BatchObs:
        """Render the current observation of some envs (all when None), rows in the order of `indices`."""
        ...

    def close(self) -> None: ...


@runtime_checkable
class LatencyModel(Protocol):
    """Inference latency in control steps, drawn per request (docs/design.md §5)."""

    def sample_steps(self) -> int:
        """d_k = ceil(latency_s * control_hz) for one request."""
        ...


@runtime_checkable
class Policy(Protocol):
    """One method: a batch of observations -> action chunks. Wrappers (executors, recorders) are Policies too."""

    def infer(self, obs: BatchObs) -> dict[str, np.ndarray]:
        """Returns at least {"actions": (N, H, A) float32 in [-1, 1]}."""
        ...


@dataclass
class Episode:
    """One recorded episode (episode store, LeRobotDataset export, world-model training).

    Frame convention: T transitions and T + 1 observation frames. Transition t starts at observation t, executes
    `action[t]`, and produces `reward[t]`, `success[t]`, `terminated[t]`, `truncated[t]`; observation T is the final
    one (needed to bootstrap and to train the world model's terminal transition).
    """

    obs: dict[str, np.ndarray]
    """image keys (T+1, H, W, 3) uint8 and "state" (T+1, S) float32"""
    action: np.ndarray
    """(T, A) float32 in [-1, 1]: the actions that really executed (after latency and safety)"""
    reward: np.ndarray
    """(T,) float32"""
    terminated: np.ndarray
    """(T,) bool"""
    truncated: np.ndarray
    """(T,) bool"""
    success: np.ndarray
    """(T,) bool, the success predicate after each transition"""
    behavior_version: np.ndarray
    """(T,) int64 weights version that chose each executed action; -1 for experts and humans"""
    delay_steps: np.ndarray
    """(T,) int32 inference delay d of the decision whose chunk supplied each executed action"""
    policy_sampled: np.ndarray
    """(T,) bool: the executed action is the one the policy sampled (False after a clamp or intervention)"""
    timestamp_s: np.ndarray
    """(T+1,) float64 wall-clock time of each observation frame"""
    instruction: str
    task: str
    task_id: int
    source: str
    """one of SOURCES"""
    seed: int
    episode_id: str
    wm_version: int = -1
    """world-model version for imagined episodes, -1 otherwise"""

    @property
    def num_steps(self) -> int:
        return int(self.action.shape[0])

    @property
    def is_success(self) -> bool:
        return bool(self.success.any())

    def validate(self) -> None:
        """Raise ValueError naming the first inconsistent field (shapes, dtypes, source)."""
        t = self.num_steps
        if self.source not in SOURCES:
            raise ValueError(f"episode source {self.source!r} is not one of {SOURCES}")
        if STATE_KEY not in self.obs:
            raise ValueError("episode obs has no 'state' key")
        for key, arr in self.obs.items():
            if arr.shape[0] != t + 1:
                raise ValueError(f"obs[{key!r}] has {arr.shape[0]} frames, expected T+1 = {t + 1}")
            if key.startswith(IMAGE_PREFIX) and (arr.dtype != np.uint8 or arr.ndim != 4 or arr.shape[-1] != 3):
                raise ValueError(f"obs[{key!r}] must be uint8 (T+1, H, W, 3), got {arr.dtype} {arr.shape}")
        for name in ("reward", "terminated", "truncated", "success", "behavior_version", "delay_steps",
                     "policy_sampled"):
            arr = getattr(self, name)
            if arr.shape != (t,):
                raise ValueError(f"episode field {name} has shape {arr.shape}, expected ({t},)")
        if self.timestamp_s.shape != (t + 1,):
            raise ValueError(f"timestamp_s has shape {self.timestamp_s.shape}, expected ({t + 1},)")
        if not np.all(np.isfinite(self.action)) or np.abs(self.action).max(initial=0.0) > 1.0 + 1e-6:
            raise ValueError("episode actions must be finite and inside [-1, 1]")


@dataclass
class Segment:
    """T consecutive decisions of one env (docs/design.md §6): what crosses from actors to the learner.

    Decision k saw `obs[k]` (plus the committed prefix and its delay d_k), sampled `chunk[k]`, and owns the rewards
    of the control steps its actions really ran (`exec_len[k]` steps, chunk positions `exec_mask[k]`). The state
    after decision k is obs[k+1] unless `next_index[k] >= 0`, which points into `bootstrap` (the segment's last
    next-state, or the final observation of a truncated episode). A segment is complete or it is not sent.
    """

    obs: dict[str, np.ndarray]
    """image keys (T, H, W, 3) uint8, "state" (T, S) float32, at decision points"""
    instruction: list[str]
    """(T) instruction of each decision's episode"""
    task_id: np.ndarray
    """(T,) int64"""
    prefix: np.ndarray
    """(T, D, A) float32 committed prefix (actions already committed from the previous chunk), zero-padded"""
    delay_steps: np.ndarray
    """(T,) int32 inference delay d_k in control steps"""
    chunk: np.ndarray
    """(T, H, A) float32 the sampled chunk (before clipping to the action bounds)"""
    exec_mask: np.ndarray
    """(T, H) bool chunk positions that executed AND were sampled by the policy (policy-gradient positions)"""
    exec_len: np.ndarray
    """(T,) int32 control steps owned by the decision (its executed span)"""
    behavior_logp: np.ndarray
    """(T,) float32 behavior log-prob of the positions in exec_mask"""
    behavior_logp_pos: np.ndarray
    """(T, H) float32 behavior log-prob per chunk position (sums over action dims), for re-masking"""
    behavior_value: np.ndarray
    """(T,) float32 behavior critic's value at the decision"""
    reward: np.ndarray
    """(T,) float32 discounted reward of the executed span: sum_j gamma^j r_{t_k + d_k + j}"""
    discount: np.ndarray
    """(T,) float32 gamma^exec_len, 0 where the episode terminated inside the span"""
    terminated: np.ndarray
    """(T,) bool"""
    truncated: np.ndarray
    """(T,) bool"""
    success: np.ndarray
    """(T,) bool the task's success predicate fired inside the span"""
    next_index: np.ndarray
    """(T,) int64: -1 -> next state is decision k+1; i >= 0 -> bootstrap row i"""
    bootstrap: dict[str, Any]
    """next states not in obs: keys of obs plus "instruction" (list), "task_id", "prefix", "delay_steps" (rows)"""
    behavior_version: np.ndarray
    """(T,) int64 weights version that sampled each chunk"""
    source: str
    """one of SOURCES"""
    wm_version: np.ndarray
    """(T,) int64 world-model version for imagined decisions, -1 otherwise"""
    episode_id: np.ndarray
    """(T,) int64 worker-unique episode counter"""
    env_step: np.ndarray
    """(T,) int64 control step within the episode at the decision"""
    timestamp_s: np.ndarray
    """(T,) float64 wall-clock time of each decision"""
    worker_id: int = 0
    env_index: int = 0
    created_s: float = 0.0
    """wall-clock time the segment was completed (queue wait is measured from here)"""
    frozen_features: dict[str, np.ndarray] | None = None
    """(T, F) float32 per acce.policy.frozen.FROZEN_KEYS key: trunk outputs the server shipped (None: not shipped)"""
    frozen_stamp: str = ""
    """frozen_stamp of the weights that computed frozen_features; a learner whose own differs recomputes them"""

    def __len__(self) -> int:
        return int(self.chunk.shape[0])

    @property
    def episode_end(self) -> np.ndarray:
        return self.terminated | self.truncated

    @property
    def nbytes(self) -> int:
        return int(sum(a.nbytes for a in [*self.obs.values(), self.prefix, self.chunk, self.exec_mask,
                                          self.behavior_logp_pos, *(self.frozen_features or {}).values()]))

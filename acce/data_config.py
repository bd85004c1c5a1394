"""`dataset.*`: how a LeRobotDataset v3 becomes acce episodes (`acce collect --import-lerobot DIR`, docs/robot.md).

The defaults are LeRobot's own conventions (`lerobot-record` writes them): every `observation.images.<name>` is the
camera `<name>`, `observation.state` is the state, `action` the action and the frame's `task` the instruction. Other
layouts name their keys here; a feature that is neither mapped nor ignored is an error, so nothing the robot
recorded is dropped without the user saying so.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from acce.configlib import ConfigError

ACTION_NORMS = ("auto", "minmax", "none")
SUCCESS_LABELS = ("auto", "last_step", "none")
"""dataset.success values that are not a column name"""


@dataclass(frozen=True)
class DatasetConfig:
    path: str = ""
    """local root of a finalized LeRobotDataset v3 (acce never downloads one); `--import-lerobot DIR` sets it"""
    cameras: dict[str, str] = field(default_factory=dict)
    """acce camera name -> dataset image or video feature, e.g. {top: observation.images.cam_high};
    {} = every observation.images.<name> feature as camera <name>"""
    state_key: str = "observation.state"
    """the dataset's float feature that becomes obs["state"] (proprioception)"""
    action_key: str = "action"
    """the dataset's float feature that becomes the action"""
    instruction_key: str = "task"
    """where the instruction comes from: "task" (LeRobot's task strings) or a string feature of the dataset"""
    ignore: tuple[str, ...] = ()
    """dataset features deliberately left out (anything neither mapped nor ignored is refused)"""
    image_size: int = 0
    """resize every camera to (image_size, image_size), the policy's image size (a robot's cameras are resized the
    same way at deployment); 0 = keep the dataset's size, which must then be square and equal for all cameras"""
    action_repr: str = ""
    """EnvSpec.action_repr of the imported actions; "" = from the dataset: what acce recorded when acce exported it,
    "joint_pos_abs" when every action name ends in ".pos" (lerobot's joint-position arms), else "normalized\""""
    action_norm: str = "auto"
    """how the dataset's actions become the policy's [-1, 1]: "minmax" maps each dim's range in the data (or
    action_low / action_high) onto [-1, 1] and records that range in the env spec, so serving and robots send the
    data's own units; "none" imports actions that are already in [-1, 1]; "auto" = "none" for datasets acce
    exported, "minmax" for every other"""
    action_low: tuple[float, ...] = ()
    """minmax: the value of each action dim at a = -1 in the data's units (e.g. a joint's lower limit in degrees);
    () = the data's per-dim minimum"""
    action_high: tuple[float, ...] = ()
    """minmax: the value at a = +1; () = the data's per-dim maximum"""
    heldout_fraction: float = 0.1
    """`acce train --data`: share of the episodes (the last ones recorded; at least one of two or more) kept out of
    cloning for the open-loop evaluation"""
    success: str = "auto"
    """`acce train --data`: where the episodes' success (the world model's success and reward labels) comes from:
    "auto" = the data's own outcomes when it has them (LeRobot's next.success / next.reward features, an acce
    store's recorded labels), else "last_step"; "last_step" = every episode succeeded at its last step (teleoperated
    demos); "none" = no success (rewards only from next.reward); or the name of a dataset feature: an episode
    succeeded at its last step when that feature is true (non-zero) at its last frame (a per-episode label).
    Success ends an episode (terminated, as in the simulator); without next.reward, a success step is reward 1"""
    wm_steps: int = 0
    """`acce train --data`: world-model optimizer steps on the training episodes after cloning (the `wm.*` model,
    built for the dataset's env spec: its widths, cameras, rate and image size); 0 = no world model. RL in
    imagination (train.max_versions > 0) and the imagined-success report need it"""
    max_rate_percentile: float = 99.9
    """data-derived rate limits (acce/action_rates.py; `acce robot`'s default safety.max_rate): per action dim, this
    percentile, in (0, 100], of the recorded per-step change |a_t - a_(t-1)| within episodes"""
    max_rate_margin: float = 1.5
    """the data-derived limit is that percentile times this factor (> 0): 1.5 lets the policy move half again as fast
    as the operator did at the percentile"""

    def __post_init__(self) -> None:
        object.__setattr__(self, "cameras", {str(k): str(v) for k, v in dict(self.cameras or {}).items()})
        if self.action_norm not in ACTION_NORMS:
            raise ConfigError(f"dataset.action_norm={self.action_norm!r} is not one of {ACTION_NORMS}")
        if self.image_size < 0 or self.image_size > 512:
            raise ConfigError(f"dataset.image_size={self.image_size} must be in [1, 512], or 0 to keep the size")
        if len(self.action_low) != len(self.action_high) or any(
                lo >= hi for lo, hi in zip(self.action_low, self.action_high)):
            raise ConfigError("dataset.action_low and dataset.action_high need one value per action dim each, with "
                              "low < high")
        if not 0.0 <= self.heldout_fraction < 1.0:
            raise ConfigError(f"dataset.heldout_fraction={self.heldout_fraction} must be in [0, 1)")
        if not self.success.strip():
            raise ConfigError(f"dataset.success is empty; use one of {SUCCESS_LABELS} or a dataset feature name")
        if self.wm_steps < 0:
            raise ConfigError(f"dataset.wm_steps={self.wm_steps} must be >= 0 (0 = no world model)")
        if not 0.0 < self.max_rate_percentile <= 100.0 or not self.max_rate_margin > 0.0:
            raise ConfigError(f"dataset.max_rate_percentile={self.max_rate_percentile} must be in (0, 100] and "
                              f"dataset.max_rate_margin={self.max_rate_margin} > 0 (e.g. 99.9 and 1.5)")
        if self.action_low and self.action_norm == "none":
            raise ConfigError("dataset.action_low/action_high give the range that maps onto [-1, 1]: set "
                              "dataset.action_norm=minmax (or drop the bounds)")

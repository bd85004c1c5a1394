"""Meta-World v3 tasks behind the same single-env contract as our tabletop tasks (docs/design.md §3).

    env = make_metaworld_env("reach-v3")          # or "metaworld/reach-v3"
    obs, info = env.reset(seed=0)                 # the seed picks the task variation (object / goal positions)
    obs, reward, terminated, truncated, info = env.step(env.expert_action())
    env.close()

Observation: {"image/front": (H, W, 3) uint8, "state": (4,) float32, "instruction": str}, plus "image/wrist" (an
eye-in-hand view) and so on for each camera in `cameras=("front", "wrist")` (env.cameras; MW_CAMERAS). The state is
proprioception only: hand xyz and gripper opening, the first 4 entries of Meta-World's 39-d observation. Object and
goal positions are NOT in it; the policy has to see them (the goal is drawn as a green 4 cm sphere, GOAL_MARKER_*).
Actions: (4,) float32 in [-1, 1] = hand xyz delta + gripper effort, which is Meta-World's own action space.
With `aux_labels=True` every observation also carries obs["aux"], (4,) float32 privileged labels read from the 39-d
vector: the first object's xy ([4:6]) then the goal's xy ([36:38]), in Meta-World's world frame (m). These are for
BC supervision (bc.aux_loss_coef) and the privileged critic only, never a policy input; evaluation envs omit them.
"First object" is whatever Meta-World lists first: the puck in push/pick-place, the door handle in door-open. Reach
tasks label the goal's x, y, z, z instead (their puck plays no part; GOAL_ONLY_TASKS).

How Meta-World is driven (metaworld 3.0.0):
  - the env class comes from `metaworld.env_dict.ALL_V3_ENVIRONMENTS[name]`, built with our image size;
  - task variations: instead of MT1's fixed list of 50 pickled tasks we switch on Meta-World's own seeded sampling
    (`seeded_rand_vec`), which draws object/goal positions from the env's `np_random`. We hand it our gymnasium
    generator, so `reset(seed=s)` picks one variation deterministically and later unseeded resets continue that
    stream (the gymnasium seeding contract `check_env` tests);
  - the goal is kept in the privileged 39-d observation (`_partially_observable = False`, as in MT1) because the
    scripted experts in `metaworld.policies.ENV_POLICY_MAP` read it; the policy never sees that vector;
  - rendering uses `mujoco.Renderer` on Meta-World's model directly (not gymnasium's MujocoRenderer) so that
    physics-only steps (`step_no_render`) and rendering (`observe`) are separate calls for the vector env.
"""
from __future__ import annotations

import dataclasses
import difflib
import os
import string
import warnings
from typing import Any

# Why here: mujoco picks its GL backend at import time and workers have no display; EGL (Mesa llvmpipe on CPU
# machines) works headless. setdefault keeps any backend the user chose.
os.environ.setdefault("MUJOCO_GL", "egl")

import gymnasium as gym  # noqa: E402
import mujoco  # noqa: E402
import numpy as np  # noqa: E402
from gymnasium import spaces  # noqa: E402

from acce.task_names import task_id  # noqa: E402
from acce.types import AUX_KEY, EnvSpec  # noqa: E402
from sim.metaworld_instructions import INSTRUCTIONS as _INSTRUCTIONS  # noqa: E402
from sim.task import AUX_DIM  # noqa: E402

TASK_PREFIX = "metaworld/"
"""registry prefix of Meta-World task names: "metaworld/reach-v3" """
MW_CAMERAS = {"front": "corner", "wrist": "gripperPOV", "top": "topview"}
"""acce camera name (obs key `image/<name>`, env.cameras) -> the Meta-World camera behind it. front: "corner", the
closest fixed view with the table, arm, object and goal in frame (at 64x64 "corner2"/"corner3" leave the puck 1-2
pixels wide), rolled upright. wrist: "gripperPOV", Meta-World's eye-in-hand camera (it rides with the hand and looks
down past the fingers; "behindGripper" hangs 0.5 m above the hand). top: "topview", straight down on the table: the
goal's x and y, which the front view mixes with its height."""
GOAL_MARKER_RADIUS_M = 0.04
"""radius the goal site is drawn at (Meta-World: 0.02): drawing only, sites never collide and success is unchanged"""
GOAL_MARKER_RGB = (0.1, 1.0, 0.1)
"""colour the goal site is drawn in (Meta-World: dark red, the arm's colour). At 64x64 Meta-World's goal was 1-3
pixels, red on red, and a cloned reach policy's aux head did not locate it at all (docs/decisions.md)"""
INSTRUCTION_CHARSET = string.ascii_letters + string.digits + " " + string.punctuation
"""characters an instruction may contain (gymnasium Text space)"""
STATE_DIM = 4
"""hand xyz + gripper opening"""
AUX_OBJECT_XY = slice(4, 6)
"""the first object's xy in Meta-World's 39-d observation (its position is [4:7])"""
AUX_GOAL_XY = slice(36, 38)
"""the goal's xy in the 39-d observation (its position is [36:39], present because _partially_observable=False)"""
AUX_ORIGIN_XY = np.array([0.0, 0.6])
"""subtracted from both labels: Meta-World's table centre, so the labels are small numbers around 0 as the
tabletop's table-frame ones are (the privileged critic scales them by a constant and expects no offset)"""
GOAL_ONLY_TASKS = ("reach-v3", "reach-wall-v3")
"""tasks whose object plays no part (reach's puck is placed at random and never touched): their aux labels are the
goal's x, y, z, z instead. Their goal height varies over 0.05-0.3 m, more than its x or y (0.2 / 0.1 m), and success
is a 3-d distance, so a policy told only the goal's xy guesses the height (about 25 % success from 20-50 demos)"""
MW_MAX_REWARD = 10.0
"""Meta-World's shaped reward per step is in 0..10; acce returns it minus this. Success ends an acce episode, so with
the raw reward hovering just outside the success radius (~9 a step for the rest of the episode) was worth more to RL than
succeeding (docs/decisions.md); shifted, every step before success costs and succeeding is the best outcome."""
ACTION_REPR = "delta_xyz_gripper"
"""Meta-World's own action, which means what the tabletop's does: hand (mocap) displacement in units of its
action_scale (our max_step_m), then a gripper effort (+1 closes)"""


@dataclasses.dataclass(frozen=True)
class MetaWorldTaskConfig:
    """env.task_params of a Meta-World task, e.g. {metaworld/reach-v3: {max_steps: 150}}."""

    max_steps: int = 0
    """time limit in control steps (0: Meta-World's own, 500 at 80 Hz; the scripted reach expert needs ~50)"""


def _bare_name(name: str) -> str:
    return name[len(TASK_PREFIX):] if name.startswith(TASK_PREFIX) else name


def _v3_envs() -> dict:
    # Imported lazily: metaworld imports every task module, too heavy for code that only lists names.
    from metaworld.env_dict import ALL_V3_ENVIRONMENTS

    return ALL_V3_ENVIRONMENTS


def metaworld_task_names() -> list[str]:
    """All Meta-World v3 tasks as registry names ("metaworld/reach-v3", ...), sorted."""
    return sorted(TASK_PREFIX + name for name in _v3_envs())


def metaworld_instruction(name: str) -> str:
    """Instruction for a task: a template for known families, else the name in words.

    "reach-v3" -> "reach the goal position"; "button-press-topdown-v3" -> "button press topdown".
    """
    family = _bare_name(name).rsplit("-v", 1)[0]
    return _INSTRUCTIONS.get(family, family.replace("-", " "))


def _rotate_camera_upright(model: mujoco.MjModel, data: mujoco.MjData, cam_id: int) -> None:
    """Roll the camera 180 degrees about its optical axis if its image "up" points down in the world.

    Why: Meta-World's corner cameras are defined with an up axis pointing at the floor, so their images come out
    upside down. Rolling the camera (rather than flipping the array) keeps the image a true, non-mirrored view; a
    vertical flip alone would mirror left and right.
    """
    mujoco.mj_kinematics(model, data)
    mujoco.mj_camlight(model, data)  # camera frames are computed here, not in mj_kinematics
    up_world = data.cam_xmat[cam_id].reshape(3, 3)[:, 1]  # camera y axis = image up
    if up_world[2] < 0:
        rolled = np.zeros(4)
        mujoco.mju_mulQuat(rolled, model.cam_quat[cam_id].copy(), np.array([0.0, 0.0, 0.0, 1.0]))
        model.cam_quat[cam_id] = rolled
        mujoco.mj_camlight(model, data)


class MetaWorldEnv(gym.Env):
    """One Meta-World v3 task with pixels + proprioception + instruction (see module docstring).

    `step` == `step_no_render` followed by `observe`; the vector env calls the two halves separately so that the
    steps inside an action chunk skip rendering. aux_labels: also put the privileged object/goal xy in obs["aux"]
    (BC supervision and the privileged critic only, never a policy input; see the module docstring).
    """

    metadata = {"render_modes": ["rgb_array"]}

    def __init__(self, name: str, image_size: int = 64, max_episode_steps: int | None = None,
                 cameras: tuple[str, ...] = ("front",), antialias: bool = True, render_mode: str | None = None,
                 aux_labels: bool = False):
        bare = _bare_name(name)
        envs = _v3_envs()
        if bare not in envs:
            close = difflib.get_close_matches(bare, list(envs), n=5, cutoff=0.5)
            hint = f"did you mean {', '.join(close)}?" if close else "see metaworld_task_names()"
            raise ValueError(f"unknown Meta-World task {name!r}: {hint}")
        if image_size < 1:
            raise ValueError(f"image_size must be >= 1 pixel, got {image_size}")
        cameras = tuple(cameras)
        unknown = [c for c in cameras if c not in MW_CAMERAS]
        if unknown or not cameras:
            raise ValueError(f"Meta-World cameras must be one or more of {sorted(MW_CAMERAS)}, got {list(cameras)}")
        if render_mode not in (None, "rgb_array"):
            raise ValueError(f"render_mode must be None or 'rgb_array', got {render_mode!r}")

        self.env_name = bare
        self.task_name = TASK_PREFIX + bare
        self.task_id = task_id(self.task_name)  # 100 + sorted position: never a tabletop id (acce.task_names)
        self.instruction = metaworld_instruction(bare)
        self.image_size = int(image_size)
        self.render_mode = render_mode
        self.aux_labels = bool(aux_labels)

        # width/height size the offscreen framebuffer that our renderer draws into.
        self._env = envs[bare](width=self.image_size, height=self.image_size)
        # Switch from "frozen task from set_task" to Meta-World's seeded sampling (see module docstring).
        self._env._set_task_called = True
        self._env._freeze_rand_vec = False
        self._env.seeded_rand_vec = True
        self._env._partially_observable = False
        self._env.__dict__.pop("sawyer_observation_space", None)  # cached_property: recompute with the goal

        self.max_episode_steps = int(max_episode_steps or self._env.max_path_length)
        if self.max_episode_steps < 1:
            raise ValueError(f"max_episode_steps must be >= 1, got {max_episode_steps}")
        # Meta-World raises if stepped past its own horizon; make its horizon ours so only we truncate.
        self._env.max_path_length = self.max_episode_steps

        model = self._env.model
        self.control_hz = 1.0 / (self._env.frame_skip * model.opt.timestep)
        self.metadata = {**self.metadata, "render_fps": self.control_hz}
        self.state_dim = STATE_DIM
        self.action_dim = int(self._env.action_space.shape[0])
        self.max_step_m = float(self._env.action_scale)
        """hand motion one action of magnitude 1 commands (m per control step), as TabletopEnv.max_step_m"""

        self.cameras = cameras
        self._cam_ids = {c: mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_CAMERA, MW_CAMERAS[c]) for c in cameras}
        self._cam_id = self._cam_ids[cameras[0]]  # the one render() shows
        # Only corner comes out upside down; gripperPOV looks down with image up = world +y (away from the robot).
        if "front" in cameras:
            _rotate_camera_upright(model, self._env.data, self._cam_ids["front"])
        # Speed, measured at 64x64 on llvmpipe (2 cores, push-v3): shadows on 19 fps; off 67; reflections also off
        # 82 (no visible change at this size); MSAA also off 223 (jaggier edges, small objects flicker more).
        goal = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_SITE, "goal")
        if goal >= 0:  # alpha kept: a task that hides its goal keeps it hidden
            model.site_size[goal][0] = GOAL_MARKER_RADIUS_M
            model.site_rgba[goal][:3] = GOAL_MARKER_RGB
        model.light_castshadow[:] = 0
        model.mat_reflectance[:] = 0
        if not antialias:
            model.vis.quality.offsamples = 0  # read when the renderer's GL context is created
        self.antialias = antialias
        self._renderer: mujoco.Renderer | None = None  # created on first render: no GL context until needed

        obs_spaces: dict[str, spaces.Space] = {
            f"image/{c}": spaces.Box(0, 255, (self.image_size, self.image_size, 3), np.uint8) for c in cameras}
        obs_spaces["state"] = spaces.Box(-np.inf, np.inf, (STATE_DIM,), np.float32)
        obs_spaces["instruction"] = spaces.Text(max_length=256, charset=INSTRUCTION_CHARSET)
        if self.aux_labels:
            obs_spaces[AUX_KEY] = spaces.Box(-10.0, 10.0, (AUX_DIM,), np.float32)  # m: the table is ~1 m across
        self.observation_space = spaces.Dict(obs_spaces)
        self.action_space = spaces.Box(-1.0, 1.0, (self.action_dim,), np.float32)

        self._expert = None
        self._mw_obs: np.ndarray | None = None  # (39,) float64 privileged Meta-World observation
        self._steps = 0
        self._needs_reset = True

    # --- gymnasium API ------------------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[dict, dict]:
        """Start an episode; `seed` selects the object/goal variation (same seed, same first observation)."""
        super().reset(seed=seed)
        # One generator for everything random: Meta-World samples the variation from ours.
        self._env.np_random = self.np_random
        self._mw_obs, _ = self._env.reset()
        # Meta-World moves the goal site in the model but leaves the derived world positions stale until its next
        # step: without this the reset frame shows the previous episode's goal (docs/decisions.md)
        mujoco.mj_forward(self._env.model, self._env.data)
        self._steps = 0
        self._needs_reset = False
        return self.observe(), {"task": self.task_name, "task_id": self.task_id, "success": False}

    def step(self, action: np.ndarray) -> tuple[dict, float, bool, bool, dict]:
        reward, terminated, truncated, info = self.step_no_render(action)
        return self.observe(), reward, terminated, truncated, info

    @property
    def env_spec(self) -> EnvSpec:
        """What a policy trained here needs elsewhere: `image/<c>` for c in cameras (not gymnasium's `spec`)."""
        return EnvSpec(self.state_dim, self.action_dim, ACTION_REPR, self.control_hz, self.cameras, self.image_size,
                       self.max_step_m)

    def render(self) -> np.ndarray | None:
        """The first camera's image (render_mode "rgb_array"); None without a render mode, as gymnasium expects."""
        if self.render_mode == "rgb_array":
            return self._render_image(self.cameras[0])
        return None

    def close(self) -> None:
        """Free the GL context and Meta-World's env; safe to call twice."""
        if self._renderer is not None:
            self._renderer.close()
            self._renderer = None
        if self._env is not None:
            self._env.close()
            self._env = None

    # --- split step for lazy rendering --------------------------------------------------------------------
    def step_no_render(self, action: np.ndarray) -> tuple[float, bool, bool, dict]:
        """Advance physics one control step; returns (reward, terminated, truncated, info), no observation.

        info["success"] is Meta-World's success predicate; info["reward_terms"] its raw reward terms, and
        info["mw_reward"] Meta-World's shaped reward (0..10, the terms combined non-linearly). The reward returned is
        that minus MW_MAX_REWARD. terminated is True on success; truncated when `max_episode_steps` is reached
        without success.
        """
        if self._needs_reset:
            raise RuntimeError(f"{self.task_name}: call reset() before step() (and after an episode ends)")
        action = np.asarray(action, dtype=np.float64).reshape(-1)
        if action.shape != (self.action_dim,) or not np.all(np.isfinite(action)):
            raise ValueError(f"{self.task_name}: action must be {self.action_dim} finite numbers in [-1, 1], "
                             f"got {action}")
        self._mw_obs, reward, _, _, mw_info = self._env.step(np.clip(action, -1.0, 1.0))
        self._steps += 1
        success = bool(mw_info["success"])
        terminated = success
        # Why exclusive: a success on the last step is a terminal state, not a cut-off to bootstrap through.
        truncated = not terminated and self._steps >= self.max_episode_steps
        self._needs_reset = terminated or truncated
        reward_terms = {k: float(v) for k, v in mw_info.items() if k not in ("success", "unscaled_reward")}
        return float(reward) - MW_MAX_REWARD, terminated, truncated, {
            "success": success, "reward_terms": reward_terms, "mw_reward": float(reward),
            "task": self.task_name, "task_id": self.task_id}

    def observe(self) -> dict[str, Any]:
        """Render the cameras and read proprioception (and the aux labels, if asked for) for the current state."""
        if self._mw_obs is None:
            raise RuntimeError(f"{self.task_name}: call reset() before observe()")
        obs: dict[str, Any] = {f"image/{c}": self._render_image(c) for c in self.cameras}
        obs["state"] = self._mw_obs[:STATE_DIM].astype(np.float32)
        obs["instruction"] = self.instruction
        if self.aux_labels:
            obs[AUX_KEY] = self.aux_targets()
        return obs

    # --- privileged helpers -------------------------------------------------------------------------------
    def expert_action(self, noise_std: float = 0.0, rng: np.random.Generator | None = None) -> np.ndarray:
        """Meta-World's scripted policy for this task on the privileged observation, plus optional Gaussian noise
        (TabletopEnv's signature, so demos and DAgger labels come from the same call): (4,) float32 in [-1, 1]."""
        if self._mw_obs is None:
            raise RuntimeError(f"{self.task_name}: call reset() before expert_action()")
        if self._expert is None:
            from metaworld.policies import ENV_POLICY_MAP

            self._expert = ENV_POLICY_MAP[self.env_name]()
        with warnings.catch_warnings():
            # Why: the scripted policies use large gains and warn on every call that the env will clip them.
            warnings.filterwarnings("ignore", message="Constant\\(s\\) may be too high")
            action = self._expert.get_action(self._mw_obs)
        if noise_std > 0.0:
            action = action + (rng or self.np_random).normal(0.0, noise_std, size=np.shape(action))
        return np.clip(action, -1.0, 1.0).astype(np.float32)

    @property
    def privileged_obs(self) -> np.ndarray:
        """Meta-World's full (39,) observation (object and goal poses); for experts and debugging only."""
        return self._mw_obs.copy()

    def aux_targets(self) -> np.ndarray:
        """(AUX_DIM,) float32 privileged labels: the first object's xy, then the goal's xy (m, world frame minus
        AUX_ORIGIN_XY); for GOAL_ONLY_TASKS the goal's xy (the same frame), then its height z twice (m)."""
        if self._mw_obs is None:
            raise RuntimeError(f"{self.task_name}: call reset() before aux_targets()")
        goal = self._mw_obs[AUX_GOAL_XY] - AUX_ORIGIN_XY
        if self.env_name in GOAL_ONLY_TASKS:
            z = self._mw_obs[AUX_GOAL_XY.stop]
            return np.concatenate([goal, [z, z]]).astype(np.float32)
        return np.concatenate([self._mw_obs[AUX_OBJECT_XY] - AUX_ORIGIN_XY, goal]).astype(np.float32)

    def _render_image(self, camera: str) -> np.ndarray:
        if self._renderer is None:  # one renderer for every camera: update_scene picks the view
            self._renderer = mujoco.Renderer(self._env.model, self.image_size, self.image_size)
        self._renderer.update_scene(self._env.data, camera=self._cam_ids[camera])
        return self._renderer.render()  # (H, W, 3) uint8, a fresh array per call


def make_metaworld_env(name: str, image_size: int = 64, max_episode_steps: int | None = None,
                       antialias: bool = True, aux_labels: bool = False,
                       cameras: tuple[str, ...] = ("front",)) -> MetaWorldEnv:
    """Build a Meta-World task by name ("reach-v3" or "metaworld/reach-v3"); unknown names list close matches.

    antialias=False renders ~2.7x faster on CPU at 64x64 at the cost of aliased edges. aux_labels: obs["aux"] for
    training envs (privileged; see MetaWorldEnv). cameras: names in MW_CAMERAS, one `image/<name>` each.
    """
    return MetaWorldEnv(name, image_size=image_size, max_episode_steps=max_episode_steps, antialias=antialias,
                        aux_labels=aux_labels, cameras=cameras)

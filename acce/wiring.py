"""The CLI layer's factories: the only place in `acce` that reaches into sim/, worldmodel/ and robot_bridge/,
always lazily, so that `import acce` stays light and the roles stay placement- and simulator-agnostic."""
from __future__ import annotations

from typing import Any

from acce.types import EnvSpec

SEED_SPLIT_STARTS = {"val": 1_000_000, "test": 1_050_000}
"""first seed of the validation and test ranges (sim.task.SEED_SPLITS; a test keeps them equal without importing sim
here). Validation decides (periodic evaluations, early stopping, presets); test only reports"""


def make_sim_env(tasks, num_envs: int, *, seeds: str = "train", instruction_split: str = "train", seed: int = 0,
                 image_size: int = 64, cameras=("front",), task_params: dict | None = None,
                 task_sampler=None, episode_seeds=None, aux_labels: bool = False, privileged_state: bool = False,
                 replay_failed: float = 0.0, replay_capacity: int = 64) -> Any:
    """The tabletop (or Meta-World) vector env; privileged_state: the sanity ladder's state-only view
    (sim.privileged_env); replay_failed / replay_capacity: SimVectorEnv's failed-layout replay (training only)."""
    from sim.task import SEED_SPLITS
    from sim.vector_env import SimVectorEnv, task_config_from_params

    if seeds not in SEED_SPLITS:
        raise ValueError(f"seeds must be one of {list(SEED_SPLITS)}, got {seeds!r}")

    configs = {t: task_config_from_params(t, p) for t, p in (task_params or {}).items()}
    env = SimVectorEnv(tuple(tasks), num_envs, image_size=image_size, cameras=tuple(cameras),
                       instruction_split=instruction_split, seed_range=SEED_SPLITS[seeds],
                       seed=seed, task_configs=configs, task_sampler=task_sampler, episode_seeds=episode_seeds,
                       aux_labels=aux_labels or privileged_state, replay_failed=replay_failed,
                       replay_capacity=replay_capacity)
    if privileged_state:
        from sim.privileged_env import PrivilegedStateEnv
        return PrivilegedStateEnv(env)
    return env


def sim_aux_dim() -> int:
    """Width of the sim's privileged aux labels (obs["aux"] with aux_labels=True)."""
    from sim.task import AUX_DIM
    return AUX_DIM


def env_spec(cfg) -> EnvSpec:
    """The env spec of cfg.env (widths, action representation and scale, control rate, cameras, image size), read
    from one opened env: the tasks define it, and the vector env checks that the tasks of one run agree."""
    env = make_sim_env(cfg.env.tasks, 1, image_size=cfg.env.image_size, cameras=cfg.env.cameras,
                       task_params=cfg.env.task_params, privileged_state=cfg.env.privileged_state)
    try:
        return env.env_spec
    finally:
        env.close()


def fit_aux(cfg, *, verbose: bool = True):
    """cfg with the perception aux path off when env.tasks have no aux labels, saying so in one line.

    bc.aux_loss_coef and policy.aux_input need the sim's privileged positions (obs["aux"]); presets turn them on, so
    a run on tasks the sim cannot label switches them off here instead of failing. Every tabletop and Meta-World task
    has labels today (acce.task_names.has_aux_labels); the switch stays for tasks added without them. Tabletop and
    Meta-World tasks in one run are a ConfigError (no shared state size or control rate)."""
    import dataclasses

    from acce.configlib import ConfigError
    from acce.task_names import has_aux_labels, is_metaworld
    tasks = cfg.env.tasks
    metaworld = [t for t in tasks if is_metaworld(t)]
    if metaworld and len(metaworld) < len(tasks):
        tabletop = [t for t in tasks if not is_metaworld(t)]
        raise ConfigError(f"env.tasks mixes tabletop tasks {tabletop} with Meta-World tasks {metaworld}: they differ "
                          "in state size and control rate, so one policy cannot act in both; train them in separate "
                          "runs")
    without = [t for t in tasks if not has_aux_labels(t)]
    if not without or not (cfg.bc.aux_loss_coef > 0 or cfg.policy.aux_input):
        return cfg
    if verbose:
        changed = [f"bc.aux_loss_coef {cfg.bc.aux_loss_coef:g} -> 0"] * (cfg.bc.aux_loss_coef > 0) + \
            ["policy.aux_input true -> false"] * cfg.policy.aux_input
        print(f"acce: no aux labels in {', '.join(without)}: {', '.join(changed)}", flush=True)
    return dataclasses.replace(cfg, bc=dataclasses.replace(cfg.bc, aux_loss_coef=0.0),
                               policy=dataclasses.replace(cfg.policy, aux_input=False))


def task_table() -> list[dict]:
    """Every registered task with its instructions (train, validation and test paraphrases), gym id, time limit and
    control rate."""
    from sim.tasks import GYM_IDS, TASKS, task_id

    rows = []
    for name, cls in sorted(TASKS.items()):
        cfg = cls.config_cls()
        rows.append({"task": name, "task_id": task_id(name), "gym_id": GYM_IDS[name], "max_steps": cfg.max_steps,
                     "control_hz": cfg.control_hz, "train_instructions": list(cls.train_templates),
                     "val_instructions": list(cls.val_templates),
                     "heldout_instructions": list(cls.heldout_templates), "doc": (cls.__module__ and
                     __import__(cls.__module__, fromlist=["_"]).__doc__ or "").strip().splitlines()[0]})
    return rows


def make_latency_model(cfg, seed: int):
    """The configured inference-latency model (None when there is no latency)."""
    d = cfg.delay
    if d.model == "fixed" and d.fixed_steps == 0:
        return None
    control_hz = env_spec(cfg).control_hz  # seconds -> control steps at the tasks' own rate
    if d.model == "measured":
        from acce.runtime.worker import MeasuredLatency
        return MeasuredLatency(control_hz=control_hz)
    from sim.latency import make_latency_model as make
    return make(d.model, control_hz=control_hz, seed=seed, fixed_steps=d.fixed_steps, low_s=d.low_s, high_s=d.high_s,
                path=d.path or None)


class _RolloutEnvFactory:
    """Picklable (Ray ships it to worker processes): worker id -> that worker's training vector env."""

    def __init__(self, cfg, sampler=None):
        self.cfg, self.sampler = cfg, sampler

    def __call__(self, worker_id: int):
        from acce.runtime.curriculum import TaskSampler
        cfg = self.cfg
        sampler = self.sampler or (TaskSampler(cfg.env.tasks, cfg.rollout.task_sampling, cfg.rollout.failure_window,
                                               cfg.rollout.min_task_share)
                                   if cfg.rollout.task_sampling == "failure" else None)
        if sampler is None and len(cfg.env.tasks) > 1:
            sampler = TaskSampler(cfg.env.tasks, "uniform")
        env = make_sim_env(cfg.env.tasks, cfg.env.num_envs, seeds="train", seed=cfg.run.seed * 1000 + worker_id,
                           image_size=cfg.env.image_size, cameras=cfg.env.cameras, task_params=cfg.env.task_params,
                           task_sampler=sampler, aux_labels=cfg.policy.critic == "privileged",
                           privileged_state=cfg.env.privileged_state, replay_failed=cfg.rollout.replay_failed,
                           replay_capacity=cfg.rollout.replay_capacity)
        if cfg.env.step_latency_ms > 0:
            from sim.slow_env import SlowStepEnv
            env = SlowStepEnv(env, cfg.env.step_latency_ms, cfg.env.step_latency_sigma, seed=worker_id,
                              independent=cfg.env.step_independent)
        return env


def rollout_env_factory(cfg, sampler=None):
    return _RolloutEnvFactory(cfg, sampler)


def make_runtime(cfg, learner, *, sampler=None, on_episode=None, wm_resume: str | None = None):
    """The runtime of `runtime.kind` over this run's factories. sampler: the driver's curriculum (the local runtime's
    envs sample from it; Ray workers keep their own); wm_resume: a world-model checkpoint to continue."""
    make_env = rollout_env_factory(cfg, sampler if cfg.runtime.kind == "local" else None)
    kw = {"make_latency": latency_factory(cfg), "on_episode": on_episode}
    if cfg.imagination.enabled:
        kw["make_imagined_env"] = imagined_env_factory(cfg)
        kw["make_wm_trainer"] = wm_trainer_factory(cfg, wm_resume)
    if cfg.runtime.kind == "local":
        from acce.runtime.local import LocalRuntime
        return LocalRuntime(cfg, learner, make_env, **kw)
    from acce.runtime.ray_runtime import RayRuntime
    return RayRuntime(cfg, learner, make_env, **kw)


class _LatencyFactory:
    def __init__(self, cfg):
        self.cfg = cfg

    def __call__(self, worker_id: int):
        return make_latency_model(self.cfg, self.cfg.run.seed * 1000 + 500 + worker_id)


def latency_factory(cfg):
    return _LatencyFactory(cfg)


class _EvalEnvFactory:
    def __init__(self, cfg, aux_labels: bool = False):
        self.cfg, self.aux_labels = cfg, aux_labels

    def __call__(self, tasks, num_envs, **kw):
        cfg = self.cfg
        return make_sim_env(tasks, num_envs, image_size=cfg.env.image_size, cameras=cfg.env.cameras,
                            task_params={t: p for t, p in cfg.env.task_params.items() if t in tasks},
                            privileged_state=cfg.env.privileged_state, aux_labels=self.aux_labels, **kw)


def eval_env_factory(cfg, aux_labels: bool = False):
    return _EvalEnvFactory(cfg, aux_labels)


def make_evaluator(cfg, server, tasks, episodes: int, *, latency=None, num_envs: int | None = None, probe=None):
    """The run's Evaluator: its evaluation envs (validation or test seeds per run() call), chunking and latency (default: cfg's model, seeded apart from
    training) and the learner's delay handling; one place for `acce eval`, training, and the benchmarks. probe: the
    Evaluator's per-decision hook (`acce eval --aux-probe`); its envs then also carry the privileged labels, which the
    policy never reads."""
    from acce.runtime.evaluator import Evaluator
    return Evaluator(eval_env_factory(cfg, aux_labels=probe is not None), server, probe=probe, tasks=list(tasks),
                     episodes=episodes, num_envs=num_envs or cfg.eval.num_envs, chunk_len=cfg.policy.chunk_len,
                     exec_horizon=cfg.rollout.execution_horizon, max_delay=cfg.policy.max_delay_steps,
                     latency=latency if latency is not None else make_latency_model(cfg, cfg.run.seed + 999),
                     delay_aware=cfg.learner.delay_correction, groups=cfg.eval.groups,
                     align_decisions=cfg.rollout.align_decisions)


def make_eval_role(cfg, place):
    """The run's periodic evaluation as a role (acce/runtime/eval_role.py): each request gets a deterministic
    server on its policy snapshot (on `place`'s device) stamped with its version, and make_evaluator with the split's
    episode count (eval.test_episodes_per_task on test seeds, eval.episodes_per_task on validation seeds)."""
    from acce.policy.vla import VLAPolicy
    from acce.runtime.eval_role import EvaluatorRole
    from acce.serving.inference import InferenceServer

    def build(policy_state: dict[str, Any], version: int, split: str):
        server = InferenceServer(place(VLAPolicy.from_state(policy_state)), deterministic=True,
                                 backend=cfg.runtime.inference_backend)
        server._version = version
        episodes = cfg.eval.test_episodes_per_task if split == "test" else cfg.eval.episodes_per_task
        return make_evaluator(cfg, server, cfg.env.tasks, episodes)
    return EvaluatorRole(build, instructions=tuple(cfg.eval.instructions))


# --- world model (the imagination pipeline) ------------------------------------------------------------------------
def check_world_model(model, cfg, *, state_dim: int | None = None, action_dim: int | None = None) -> None:
    """A world model (e.g. `imagination.wm_init_from`) must read and write the policy's observations."""
    from acce.configlib import ConfigError
    where = cfg.imagination.wm_init_from or "the world model"
    if model.cfg.image_size != cfg.env.image_size:
        raise ConfigError(f"{where} reads {model.cfg.image_size}px images but env.image_size={cfg.env.image_size}; "
                          "pretrain on data recorded at env.image_size or change env.image_size")
    if tuple(model.cameras) != tuple(cfg.env.cameras):
        raise ConfigError(f"{where} was trained on cameras {list(model.cameras)} but env.cameras="
                          f"{list(cfg.env.cameras)}; they must match")
    for name, want, have in (("state", state_dim, model.state_dim), ("action", action_dim, model.action_dim)):
        if want is not None and want != have:
            raise ConfigError(f"{where} has {name} size {have} but the env's is {want}; pretrain on this env's data")
    check_world_model_aux(model.aux_dim, cfg, where)


def check_world_model_aux(aux_dim: int, cfg, where: str = "the world model") -> None:
    """policy.critic=privileged values every state from obs["aux"]: imagined states get it only from the world
    model's aux head, and without one the critic would see no labels (before this check: a KeyError in the
    learner's collate, or placeholder zeros when a batch's first segment was imagined)."""
    from acce.configlib import ConfigError
    if cfg.policy.critic != "privileged" or aux_dim == sim_aux_dim():
        return
    have = f"an aux head of width {aux_dim}" if aux_dim else "no aux head"
    raise ConfigError(f"policy.critic=privileged reads obs['aux'] ({sim_aux_dim()} privileged labels), but {where} has "
                      f"{have}, so imagined states would have none: pretrain on episodes recorded with aux labels (a "
                      "store with frames/aux: `acce collect --aux-labels`, or BC demos with bc.aux_loss_coef > 0), or "
                      "leave imagination.wm_init_from empty to train one online, or use policy.critic=trunk")


class _WMTrainerFactory:
    """Picklable: first real episode -> WorldModelTrainer (fresh from cfg.wm, or continuing a checkpoint)."""

    def __init__(self, cfg, init_from: str, control_hz: float):
        self.cfg, self.init_from, self.control_hz = cfg, init_from, control_hz

    def __call__(self, first):
        import torch

        from worldmodel.trainer import WorldModelTrainer
        cfg = self.cfg
        device = "cuda" if cfg.imagination.trainer_gpus > 0 and torch.cuda.is_available() else "cpu"
        state_dim, action_dim = int(first.obs["state"].shape[1]), int(first.action.shape[1])
        if self.init_from:
            trainer = WorldModelTrainer.from_checkpoint(self.init_from, device=device)
            check_world_model(trainer.model, cfg, state_dim=state_dim, action_dim=action_dim)
        else:  # the sim envs record obs["aux"] exactly when the critic is privileged (_RolloutEnvFactory's aux_labels)
            trainer = WorldModelTrainer.create(
                cfg.wm, state_dim=state_dim, action_dim=action_dim, cameras=cfg.env.cameras,
                control_hz=self.control_hz, device=device,
                aux_dim=sim_aux_dim() if cfg.policy.critic == "privileged" else 0)
        im = cfg.imagination
        if im.wm_replay_from and im.wm_replay_fraction > 0:
            from acce.configlib import ConfigError
            from worldmodel.data import load_episodes
            episodes, desc = load_episodes(im.wm_replay_from)
            if tuple(desc["cameras"]) != tuple(trainer.model.cameras):
                raise ConfigError(f"imagination.wm_replay_from={im.wm_replay_from} has cameras {desc['cameras']} but "
                                  f"the world model reads {list(trainer.model.cameras)}; replay data recorded with "
                                  "the run's env.cameras")
            trainer.set_replay(episodes, im.wm_replay_fraction)
        if im.wm_calibrate_frames:
            trainer.set_calibration(im.wm_calibrate_frames, im.wm_calibrate_rule)
        return trainer


def wm_trainer_factory(cfg, init_from: str | None = None):
    """The online trainer's factory; a pretrained start (`init_from`, default imagination.wm_init_from) is loaded
    and checked here, in the driver, so a bad path or a mismatched model fails before any actor starts."""
    path = cfg.imagination.wm_init_from if init_from is None else init_from
    if path:
        from worldmodel.model import WorldModel
        check_world_model(WorldModel.load(path), cfg)  # (a fresh model gets an aux head when the critic needs one)
    return _WMTrainerFactory(cfg, path, env_spec(cfg).control_hz)


class _ImaginedEnvFactory:
    """Picklable: (worker id, publication) -> ImaginedEnv over the published world model, gated by this run's
    wm.horizon and wm.max_disagreement."""

    def __init__(self, cfg):
        self.cfg = cfg

    def __call__(self, worker_id: int, publication: dict):
        from worldmodel.imagined_env import ImaginedEnv
        from worldmodel.model import WorldModel
        cfg = self.cfg
        model = WorldModel.from_state(publication["desc"], publication["version"], publication["state"])
        check_world_model_aux(model.aux_dim, cfg)  # also checked at startup; here no publication slips past it
        # obs["aux"] exactly when the sim envs record it (_RolloutEnvFactory): one batch's segments share keys
        return ImaginedEnv(model, cfg.imagination.num_envs, horizon=cfg.wm.horizon,
                           max_disagreement=cfg.wm.max_disagreement, seed=cfg.run.seed * 1000 + worker_id,
                           aux_labels=cfg.policy.critic == "privileged")


def imagined_env_factory(cfg):
    return _ImaginedEnvFactory(cfg)

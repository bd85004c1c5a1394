"""The world-model half of `acce train --data` (docs/design.md §7, §11): a world model pretrained on the dataset's
training episodes, RL in imagination from their recorded states, and the imagined success it can report.

- World model: `wm.*` built for the dataset's env spec (state and action widths, cameras, control rate, image size)
  and trained `dataset.wm_steps` steps by `acce wm-pretrain`'s trainer (worldmodel.pretrain.train_model) on the
  training episodes, labelled by acce.dataset_labels, validated on the held-out ones; saved as RUN/wm/worldmodel.pt.
- RL (`train.max_versions` > 0): the local runtime's roles with an imagination producer only. An ImaginationWorker
  (a RolloutWorker over an ImaginedEnv, stamping source=imagined and wm_version) branches from frames of the training
  episodes, its inference server runs the learner's newest weights, the run's gate (runtime.mode: a StalenessGate
  when async) paces it and the learner consumer (learner.*: PPO/GIPO, delay-aware credit) updates on every
  learner.batch_segments segments until train.max_versions or train.max_wall_s. Rewards, termination and success
  are the world model's heads; the world model stays fixed (no new real data arrives to co-train it on).
- Imagined success: the acce Evaluator (deterministic actions, exactly the first n start seeds) with an ImaginedEnv in
  place of the simulator, n = eval.test_episodes_per_task branches from states of the held-out episodes (training
  ones when none are held out), for version 0 and the final policy on the same starts. It is the world model's
  judgement of `wm.horizon` steps, not a measured success rate, and is labelled so everywhere.

acce imports worldmodel only lazily, from this `acce train --data` driver and acce/wiring.py (docs/design.md §2).
"""
from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any, Sequence

from acce.configlib import ConfigError
from acce.types import EnvSpec, Episode

IMAGINED_LABEL = ("imagined success: the world model's success head on imagined branches from recorded states "
                  "(no simulator: a model's judgement, not a measured success rate)")

TASK = "dataset"
"""the <task> of a dataset run's episode/*/imagined/<task> metrics and of its imagined evaluation"""


def check_image_size(size: int) -> None:
    """The world model reads square images whose side is a power of two >= 16."""
    if size < 16 or size & (size - 1):
        raise ConfigError(f"the world model (dataset.wm_steps > 0) reads the policy's {size}px images but needs a "
                          "power of two >= 16: set dataset.image_size=64 (or 32)")


def world_model_arrays(episodes: Sequence[Episode], spec: EnvSpec) -> list:
    """The episodes as the world model reads them (worldmodel.data.EpisodeArrays, cameras in the spec's order)."""
    from worldmodel.data import from_episode
    return [from_episode(ep, spec.cameras) for ep in episodes]


def pretrain_world_model(cfg, spec: EnvSpec, train_arrays: list, val_arrays: list, run_dir: Path,
                         progress: bool = True):
    """A `wm.*` world model for `spec` trained dataset.wm_steps steps; returns (model, summary)."""
    import torch

    from worldmodel.model import WorldModel
    from worldmodel.pretrain import train_model

    check_image_size(spec.image_size)
    wcfg = dataclasses.replace(cfg.wm, image_size=spec.image_size)
    with torch.random.fork_rng():  # seeded init without moving the caller's global RNG
        torch.manual_seed(wcfg.seed)
        model = WorldModel(wcfg, state_dim=spec.state_dim, action_dim=spec.action_dim, cameras=tuple(spec.cameras),
                           control_hz=spec.control_hz)
    model.data_info = {"path": cfg.dataset.path, "kind": "acce train --data", "train_episodes": len(train_arrays),
                       "val_episode_ids": [e.episode_id for e in val_arrays], "steps": cfg.dataset.wm_steps,
                       "success_labels": cfg.dataset.success}
    summary = train_model(model, train_arrays, val_arrays, run_dir / "wm", cfg.dataset.wm_steps,
                          progress=progress, torch_threads=None)  # the driver's threads (runtime.driver_threads)
    return model.eval(), summary


def _publication(model, episodes: Sequence[Episode]) -> dict[str, Any]:
    """What an ImaginationWorker takes (acce.runtime.imagination.WMTrainerRole.publication's shape)."""
    state = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
    return {"version": int(model.version), "desc": model.describe(), "state": state, "episodes": list(episodes)}


def _server(policy_state: dict[str, Any], like, **kw):
    """An inference server over a copy of the policy, on the learner policy's device and precision."""
    from acce.device import place
    from acce.policy.vla import VLAPolicy
    from acce.serving.inference import InferenceServer
    return InferenceServer(place(VLAPolicy.from_state(policy_state), like.device, like.amp), **kw)


def rl_in_imagination(cfg, learner, model, start_episodes: Sequence[Episode], metrics,
                      progress: bool = True) -> dict[str, Any]:
    """Learner updates on imagined segments only, until train.max_versions (or train.max_wall_s); returns counters.

    The local runtime's roles (acce/runtime/roles.py) in its order, with an imagination producer in place of the
    simulator's: the producer ticks into the bounded queue, then the learner consumer ticks while a batch is ready
    (it publishes to the server and reports to the gate)."""
    from tqdm import tqdm

    from acce.runtime.imagination import IMAGINATION_WORKER_ID0, ImaginationWorker
    from acce.runtime.queue import RolloutQueue
    from acce.runtime.roles import LearnerConsumer, RolloutProducer, make_gate, rollout_kwargs
    from acce.wiring import imagined_env_factory

    lc, t = cfg.learner, cfg.train
    learner.set_log_std(lc.rl_log_std, lc.rl_log_std_per_dim)
    learner.reset_optimizer()  # RL starts with fresh moments at learner.lr, not cloning's (as after a warm start)
    version0, updates0 = learner.version, learner.updates
    server = _server(learner.policy.policy_state(), learner.policy, max_batch=cfg.runtime.max_batch,
                     timeout_ms=cfg.runtime.timeout_ms, seed=cfg.run.seed + 7,
                     ship_features=lc.train_scope == "residual", backend=cfg.runtime.inference_backend)
    gate = make_gate(cfg, cfg.imagination.num_envs, learner.version)
    worker = ImaginationWorker(imagined_env_factory(cfg), server, worker_id=IMAGINATION_WORKER_ID0, gate=gate,
                               **rollout_kwargs(cfg))
    worker.offer(_publication(model, start_episodes))
    queue = RolloutQueue(cfg.runtime.queue_capacity)

    def take() -> list | None:
        return queue.get_batch(lc.batch_segments) if len(queue) >= lc.batch_segments else None

    def put(segment) -> None:  # one process: a full queue cannot wait for the learner, so the learner runs first
        while not queue.try_put(segment):
            if not consumer.tick():
                raise RuntimeError("the imagined queue is full but holds no learner batch (runtime.queue_capacity < "
                                   "learner.batch_segments?)")

    consumer = LearnerConsumer(learner, take, server.load_weights, gate)
    producer = RolloutProducer(worker, put)
    consumer.publish()
    t0 = time.time()
    bar = tqdm(total=t.max_versions, desc="RL in imagination", unit="ver", disable=not progress, dynamic_ncols=True)

    def done() -> bool:
        return learner.version - version0 >= t.max_versions or (t.max_wall_s > 0 and time.time() - t0 >= t.max_wall_s)

    episodes: list[dict[str, Any]] = []
    last: dict[str, float] = {}
    """the latest update's metrics (the learner's running totals of what it consumed, by source)"""
    idle = 0
    try:
        while not done():
            produced = producer.tick()
            while not done() and consumer.tick():
                pass
            for upd in consumer.drain()[0]:
                metrics.scalars(upd, int(upd.get("learner/version", learner.version)))
                last.update(upd)
            episodes += producer.drain()[0]
            bar.update(learner.version - version0 - bar.n)
            idle = 0 if produced else idle + 1
            if idle > 1000:
                raise RuntimeError("RL in imagination stalled: the imagination worker produced no segment in 1000 "
                                   "turns (every branch waits on the gate); raise learner.max_staleness")
        counters = producer.stats().counters
    finally:
        bar.close()
        producer.close()
    imagined = [e for e in episodes if e["source"] == "imagined"]
    if imagined:
        recent = imagined[-200:]
        metrics.scalars({f"episode/success/imagined/{TASK}": sum(e["success"] for e in recent) / len(recent),
                         f"episode/return/imagined/{TASK}": sum(e["return"] for e in recent) / len(recent)},
                        learner.version)
    return {"versions": learner.version - version0, "updates": learner.updates - updates0, "source": "imagined",
            "imagined_steps": counters.env_steps, "imagined_episodes": len(imagined),
            "imagined_training_success": (sum(e["success"] for e in imagined) / len(imagined)) if imagined else None,
            "consumed_imagined_steps": last.get("learner/consumed_imagined_steps"),
            "consumed_sim_steps": last.get("learner/consumed_env_steps"),
            "wm_version": counters.wm_version, "wall_s": time.time() - t0}


class _ImaginedEvalEnvs:
    """The Evaluator's env factory: an ImaginedEnv over a fixed world model whose branches start from recorded
    states picked by the Evaluator's seeds (each seed names one start, so two policies see the same starts)."""

    def __init__(self, cfg, model, episodes: Sequence[Episode]):
        self.cfg, self.model, self.episodes = cfg, model, list(episodes)

    def __call__(self, tasks, num_envs: int, *, seeds: str, instruction_split: str, episode_seeds=None):
        from worldmodel.imagined_env import ImaginedEnv
        return ImaginedEnv(self.model, num_envs, horizon=self.cfg.wm.horizon,
                           max_disagreement=self.cfg.wm.max_disagreement, start_episodes=self.episodes,
                           episode_seeds=episode_seeds)


def imagined_success(cfg, policy_state: dict[str, Any], version: int, model, episodes: Sequence[Episode],
                     like) -> dict[str, Any]:
    """Deterministic actions of `policy_state` in eval.test_episodes_per_task imagined branches (the Evaluator's
    protocol): success rate with its Wilson interval, mean length and return (world-model reward)."""
    from acce.runtime.evaluator import Evaluator

    server = _server(policy_state, like, deterministic=True)
    server._version = version
    n = cfg.eval.test_episodes_per_task
    ev = Evaluator(_ImaginedEvalEnvs(cfg, model, episodes), server, tasks=[TASK], episodes=n,
                   num_envs=min(n, cfg.imagination.num_envs), chunk_len=cfg.policy.chunk_len,
                   exec_horizon=cfg.rollout.execution_horizon, max_delay=cfg.policy.max_delay_steps,
                   delay_aware=cfg.learner.delay_correction)
    r = ev.run("test")["per_task"][f"{TASK}/test"]
    return {"version": int(version), "n": r["n"], "success_rate": r["success_rate"], "ci95": r["ci95"],
            "mean_length": r["mean_length"], "mean_return": r["mean_return"]}

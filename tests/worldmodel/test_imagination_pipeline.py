"""The imagination pipeline's roles (acce/runtime/imagination.py) with a tiny world model, in one process."""
import threading

import numpy as np
import pytest
import torch
from test_imagined_env import _calm, _versioned_state
from wm_helpers import CountingPolicy, TINY, fake_episode, tiny_cfg, tiny_model

from acce.config import load
from acce.runtime.imagination import ImaginationWorker, ImaginationWorkerStats, WMTrainerRole, imagination_metrics
from acce.runtime.roles import RolloutProducer
from acce.store.recorder import RecordingEnv
from worldmodel.imagined_env import ImaginedEnv
from worldmodel.trainer import WorldModelTrainer

CHUNK = 4
TINY_WM = [f"wm.{k}={v}" for k, v in TINY.items()]
PIPELINE = ["policy.language=hash", "policy.resnet_hidden_sizes=[8,16,32]", "policy.image_grid=2",
            "policy.trunk_width=32", "policy.trunk_layers=1", "policy.trunk_heads=2", "policy.max_delay_steps=4",
            "env.image_size=32", "env.tasks=[reach]", "env.num_envs=2", "rollout.num_workers=1",
            "rollout.segment_len=4", "rollout.execution_horizon=4", "learner.batch_segments=2", "learner.epochs=1",
            "learner.minibatches=1", "runtime.kind=local", "runtime.queue_capacity=8", "imagination.num_workers=1",
            "imagination.num_envs=2", "imagination.imagined_fraction=0.5", "imagination.wm_min_episodes=2",
            "imagination.wm_steps_per_publish=10", "imagination.queue_capacity=8", *TINY_WM]
"""configs/debug_wm.yaml in the local runtime, without the BC warm start"""


def _rollout(**kw):
    return dict(segment_len=3, chunk_len=CHUNK, exec_horizon=2, max_delay=0, gamma=0.99, delay_aware=True, **kw)


def _publication(model, version: int, episodes, state=None):
    return {"version": version, "desc": model.describe(), "state": state or model.state_dict(), "episodes": episodes}


def _env_factory(num_envs: int = 2, horizon: int = 6):
    def make(worker_id, pub):
        from worldmodel.model import WorldModel
        model = WorldModel.from_state(pub["desc"], pub["version"], pub["state"])
        return ImaginedEnv(model, num_envs, horizon=horizon, seed=worker_id)
    return make


# --- recording real episodes ----------------------------------------------------------------------------------
def test_recording_env_hands_complete_episodes_of_its_slots_to_the_sink():
    from sim.vector_env import SimVectorEnv
    got = []
    env = RecordingEnv(SimVectorEnv(["reach"], 2, image_size=32, seed=3), got.extend, slots=[1])
    env.reset()
    rng = np.random.default_rng(0)
    moved, actions = 0, []
    while not got:
        active = np.array([True, rng.random() < 0.7])  # slot 1 sometimes paused: those calls are not transitions
        a = rng.uniform(-1.5, 1.5, (2, 4)).astype(np.float32)
        step = env.step(a, render=False, active=active)
        if active[1]:
            moved += 1
            actions.append(np.clip(a[1], -1, 1))
        assert step.obs is None  # the caller still gets a physics-only step
    (ep,) = got
    ep.validate()
    assert ep.source == "sim" and ep.task == "reach" and ep.num_steps == moved == 40  # reach's time limit
    assert ep.truncated[-1] and ep.obs["image/front"].shape == (41, 32, 32, 3)
    np.testing.assert_array_equal(ep.action, np.stack(actions))
    assert env.episodes_recorded == 1 and env.num_envs == 2  # the rest of the contract is the wrapped env's


# --- the world-model trainer role -------------------------------------------------------------------------------
def _role(**icfg):
    cfg = load(None, ["imagination.num_workers=1", "imagination.imagined_fraction=0.5", "env.image_size=32",
                      *TINY_WM, *[f"imagination.{k}={v}" for k, v in icfg.items()]])
    made = []

    def make_trainer(first):
        made.append(first.episode_id)
        return WorldModelTrainer.create(tiny_cfg(), state_dim=7, action_dim=4, control_hz=10.0)
    return WMTrainerRole(make_trainer, cfg.imagination), made


def test_trainer_role_paces_by_real_transitions_and_publishes_every_n_steps():
    role, made = _role(wm_min_episodes=2, wm_train_ratio=0.5, wm_steps_per_publish=4, start_episodes_per_publish=2)
    assert role.add_episodes([fake_episode(6, 0, source="imagined")]) == 0 and not made  # imagination never trains
    assert role.train() == 0 and role.publication() is None
    role.add_episodes([fake_episode(6, 1)])
    assert len(made) == 1 and role.allowance() == 0  # 1 episode < wm_min_episodes
    role.add_episodes([fake_episode(6, 2)])
    # 12 real transitions x ratio 0.5 = 6 steps allowed, at most wm_steps_per_publish=4 per call
    assert role.train() == 4 and role.train() == 2 and role.train() == 0
    pub = role.publication()
    assert pub["version"] == 6 and set(pub) == {"version", "desc", "state", "episodes"}
    assert [ep.seed for ep in pub["episodes"]] == [1, 2]
    assert role.publication() is None  # nothing new until 4 more steps
    role.add_episodes([fake_episode(8, 3)])  # 20 transitions -> 10 steps allowed in total
    assert role.train() == 4 and role.publication()["version"] == 10
    assert [ep.seed for ep in role.fresh] == [2, 3]  # newest start states only
    m = role.metrics()
    assert m["wm/version"] == 10 and m["wm/real_transitions"] == 20 and m["wm/publishes"] == 2
    assert m["wm/loss/total"] > 0


def test_a_pretrained_model_publishes_before_training(tmp_path):
    from acce import wiring
    model = tiny_model()
    model.version = 500
    model.save(tmp_path / "wm.pt")
    cfg = load(None, ["imagination.num_workers=1", "imagination.imagined_fraction=0.5", "env.image_size=32",
                      f"imagination.wm_init_from={tmp_path / 'wm.pt'}", "imagination.wm_min_episodes=99"])
    role = WMTrainerRole(wiring.wm_trainer_factory(cfg), cfg.imagination)
    role.add_episodes([fake_episode(5, 0)])
    assert role.train() == 0 and role.publication()["version"] == 500


@pytest.mark.parametrize("overrides, error, match", [
    (["imagination.wm_init_from=/nonexistent/wm"], FileNotFoundError, "wm-pretrain"),
    (["env.image_size=64"], ValueError, "env.image_size=64"),
])
def test_a_bad_pretrained_start_fails_in_the_driver_with_the_fix(tmp_path, overrides, error, match):
    from acce import wiring
    tiny_model().save(tmp_path / "wm.pt")
    cfg = load(None, ["imagination.num_workers=1", "imagination.imagined_fraction=0.5", "env.image_size=32",
                      f"imagination.wm_init_from={tmp_path / 'wm.pt'}", *overrides])
    with pytest.raises(error, match=match):
        wiring.wm_trainer_factory(cfg)


# --- imagination workers ----------------------------------------------------------------------------------------
def test_imagination_worker_idles_until_a_world_model_is_published():
    policy = CountingPolicy(CHUNK)
    worker = ImaginationWorker(_env_factory(), policy, worker_id=1000, **_rollout())
    assert worker.collect(min_segments=1, max_steps=50) == [] and worker.idle and policy.rows == 0
    assert worker.stats() == ImaginationWorkerStats(env_steps=0, wm_version=-1, env_stats={})
    model = tiny_model()
    model.version = 7
    worker.offer(_publication(model, 7, [fake_episode(6, k) for k in range(2)]))
    segments = worker.collect(min_segments=2, max_steps=200)
    assert len(segments) >= 2 and policy.rows > 0 and not worker.idle
    assert all(s.source == "imagined" and (s.wm_version == 7).all() and s.worker_id == 1000 for s in segments)
    worker.offer(_publication(model, 5, []))  # an older version is never applied
    segments += worker.collect(min_segments=1, max_steps=50)
    st = worker.stats()
    assert worker.wm_version == 7 and st.wm_version == 7 and st.env_stats["swaps"] == 0
    assert st.segments == len(segments) and st.env_steps == worker.worker.stats["env_steps"] > 0
    assert st.env_steps == st.env_stats["steps"] and st.worker["decisions"] == st.decisions == policy.rows
    assert st["wm_version"] == 7 and st.get("env_stats")["swaps"] == 0 and "worker" in st  # old key access
    producer = RolloutProducer(worker, lambda seg: None).stats()  # the drained ProducerStats carries it whole
    assert producer.counters == st and producer.env_steps == st.env_steps and producer.segments == st.segments


def test_imagination_metrics_sum_worker_stats():
    a = ImaginationWorkerStats(env_steps=12, wm_version=3, env_stats={"steps": 12, "episodes": 4, "gate_truncations": 1,
                                                                     "horizon_truncations": 2, "terminations": 1,
                                                                     "swaps": 2})
    b = ImaginationWorkerStats(env_steps=8, wm_version=5, env_stats={"steps": 8, "episodes": 0, "swaps": 1})
    idle = ImaginationWorkerStats()  # no world model yet: not counted, its wm_version -1 is no oldest
    m = imagination_metrics([a, b, idle], trainer_version=6)
    assert m == pytest.approx({"wm/imagined/steps": 20.0, "wm/imagined/branches": 4.0, "wm/imagined/mean_length": 5.0,
                               "wm/imagined/gate_frac": 0.25, "wm/imagined/horizon_frac": 0.5,
                               "wm/imagined/terminated_frac": 0.25, "wm/imagined/swaps": 3.0,
                               "wm/imagined/wm_version": 3.0, "wm/publish_lag": 3.0})
    assert imagination_metrics([idle], trainer_version=6) == {}


def test_publications_add_only_new_start_states():
    worker = ImaginationWorker(_env_factory(), CountingPolicy(CHUNK), worker_id=1000, **_rollout())
    model, eps = tiny_model(), [fake_episode(6, k) for k in range(3)]
    worker.offer(_publication(model, 1, eps[:2]))
    worker.collect(min_segments=1, max_steps=20)
    worker.offer(_publication(model, 2, eps[1:]))  # overlapping window of newest episodes
    worker.collect(min_segments=1, max_steps=20)
    assert len(worker.env.starts) == 3 and worker.wm_version == 2


def test_hot_swap_under_a_concurrent_publisher_never_mixes_versions():
    """A publisher thread offers versions 1, 2, 3, ... while the worker collects. Version v's reward head outputs
    exactly v, so every row of every imagined step shows which weights computed it."""
    model = _calm(tiny_model())
    episodes = [fake_episode(6, k) for k in range(3)]
    states = {v: _versioned_state(model, v) for v in range(1, 41)}
    worker = ImaginationWorker(_env_factory(num_envs=3, horizon=50), CountingPolicy(CHUNK), worker_id=1000, **_rollout())
    worker.offer(_publication(model, 1, episodes, states[1]))
    worker.collect(min_segments=1, max_steps=5)
    steps, env = [], worker.env
    inner_step = env.step

    def recording_step(*args, **kw):
        out = inner_step(*args, **kw)
        steps.append((out.reward.copy(), out.info["wm_version"].copy()))
        return out
    env.step = recording_step
    stop = threading.Event()

    def publisher():
        for v in range(2, 41):
            if stop.is_set():
                return
            worker.offer(_publication(model, v, episodes, states[v]))
            stop.wait(0.01)
    thread = threading.Thread(target=publisher)
    thread.start()
    segments = []
    try:
        while thread.is_alive() and len(steps) < 3000:
            segments += worker.collect(min_segments=1, max_steps=10)
    finally:
        stop.set()
        thread.join()
    versions = sorted({int(v[0]) for _, v in steps})
    assert len(versions) >= 3, f"the swaps should interleave with the steps, saw versions {versions}"
    for reward, version in steps:  # each step was computed by exactly the version it is stamped with
        np.testing.assert_allclose(reward, version.astype(np.float32), atol=1e-4)
    for s in segments:  # decisions are stamped at their decision point; versions only move forward
        assert (np.diff(s.wm_version) >= 0).all() and s.wm_version.min() >= 1


# --- the pipeline in the local runtime --------------------------------------------------------------------------
def _local_runtime(extra=()):
    from acce.runtime.learner import Learner
    from acce.runtime.local import LocalRuntime
    from acce.train import build_policy
    from acce.wiring import imagined_env_factory, latency_factory, rollout_env_factory, wm_trainer_factory
    cfg = load(None, PIPELINE + list(extra))
    policy = build_policy(cfg, np.random.default_rng(0).normal(size=(64, 7)).astype(np.float32))
    learner = Learner(policy, cfg.learner, seed=0)
    rt = LocalRuntime(cfg, learner, rollout_env_factory(cfg), make_latency=latency_factory(cfg),
                      make_imagined_env=imagined_env_factory(cfg), make_wm_trainer=wm_trainer_factory(cfg))
    rt.start()
    return cfg, learner, rt


def _run_until_imagined_consumed(rt, extra_updates: int = 2, max_polls: int = 400):
    updates, episodes = [], []
    for _ in range(max_polls):
        out = rt.poll()
        updates += out["updates"]
        episodes += out["episodes"]
        consumed = [u for u in updates if u.get("queue/imagined_frac", 0) > 0]
        if consumed and len(updates) >= updates.index(consumed[0]) + 1 + extra_updates:
            return updates, episodes
    raise AssertionError("no imagined segment reached the learner")


def test_local_runtime_mixes_imagined_segments_into_learner_batches():
    cfg, learner, rt = _local_runtime()
    try:
        updates, episodes = _run_until_imagined_consumed(rt)
        stats = rt.stats()
    finally:
        rt.shutdown()
    assert {u["queue/imagined_frac"] for u in updates} <= {0.0, 0.5}  # 1 of 2 segments, or 0 before the first WM
    assert updates[-1]["queue/consumed/imagined"] + updates[-1]["queue/consumed/sim"] == 2 * len(updates)
    mixed = [u for u in updates if u["queue/imagined_frac"] > 0]
    assert all("staleness/mean/imagined" in u and "wm/consumed_version_mean" in u for u in mixed)
    assert {ep["source"] for ep in episodes} == {"sim", "imagined"}
    wm = stats.wm
    assert wm["wm/version"] >= 10 and wm["wm/published_version"] >= 10 and wm["wm/real_episodes"] >= 2
    assert 0 <= wm["wm/imagined/gate_frac"] <= 1 and wm["wm/imagined/steps"] == stats.imagined_steps > 0
    # env_steps stays the simulator's: imagined steps are counted apart
    assert stats.env_steps == sum(w.stats["env_steps"] for w in rt.workers)


def test_local_runtime_with_imagination_is_deterministic():
    runs = []
    for _ in range(2):
        _, learner, rt = _local_runtime()
        try:
            updates, _ = _run_until_imagined_consumed(rt, extra_updates=1)
        finally:
            rt.shutdown()
        runs.append((len(updates), [p.detach().clone() for p in learner.policy.parameters()],
                     rt.imagination.role.version))
    assert runs[0][0] == runs[1][0] and runs[0][2] == runs[1][2]
    assert all(torch.equal(a, b) for a, b in zip(runs[0][1], runs[1][1]))


def test_imagined_data_never_reaches_evaluation_nor_the_curriculum(tmp_path, monkeypatch):
    """Train with imagination (local runtime) and watch every env the evaluator builds, every episode the
    curriculum sees, and every episode the world model trains on."""
    from acce import wiring
    from acce.runtime.curriculum import TaskSampler
    from acce.train import Trainer
    from acce.wiring import SEED_SPLIT_STARTS
    eval_envs, curriculum, captured = [], [], {}
    make_eval = wiring.eval_env_factory

    def spy_eval_factory(cfg, *args, **kw):
        inner = make_eval(cfg, *args, **kw)

        def make(*args, **kw):
            env = inner(*args, **kw)
            eval_envs.append(env)
            return env
        return make
    monkeypatch.setattr(wiring, "eval_env_factory", spy_eval_factory)
    update = TaskSampler.update
    monkeypatch.setattr(TaskSampler, "update", lambda self, task, success: (curriculum.append(task),
                                                                            update(self, task, success)))
    make_runtime = Trainer.make_runtime
    monkeypatch.setattr(Trainer, "make_runtime", lambda self, learner: captured.setdefault(
        "rt", make_runtime(self, learner)))
    cfg = load(None, PIPELINE + [f"run.out_dir={tmp_path}", "run.name=iso", "train.max_wall_s=0",
                                 "train.max_versions=24", "eval.every_versions=0", "eval.test_episodes_per_task=2",
                                 "eval.test_at_start=false", "eval.train_instructions=true",
                                 "eval.num_envs=2", "eval.video=false", "train.log_every_s=0"])
    trainer = Trainer(cfg, progress=False)
    summary = trainer.run()
    im = summary["imagination"]
    assert im["queue/consumed/imagined"] > 0 and trainer.counters["imagined_episodes"] > 0, "imagination was off"
    assert eval_envs and not any(isinstance(e, ImaginedEnv) for e in eval_envs)
    assert {k: v["n"] for k, v in summary["eval"].items()} == {"reach/test": 2, "reach/test/train_instr": 2}
    assert len(curriculum) == trainer.counters["episodes"]  # one curriculum update per real episode, none imagined
    assert "episode/return/imagined/reach" in trainer.metrics.last and "episode/return/sim/reach" in \
        trainer.metrics.last
    wm = captured["rt"].imagination.role.trainer
    assert wm.skipped_imagined == 0  # no imagined episode was ever offered to the world model
    assert all(ep.seed < SEED_SPLIT_STARTS["val"] for ep in wm.buffer.episodes)  # ... nor an evaluation episode
    assert (tmp_path / "iso" / "checkpoints" / "worldmodel.pt").is_file()

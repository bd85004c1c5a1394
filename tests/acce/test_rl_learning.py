"""Small learning tests: RL from a poor start must raise success on a task whose optimum is known (the first rungs
of the sanity ladder), and must not when the policy gradient is off."""
import numpy as np
import pytest
import torch

from acce.config import load
from acce.policy.norm import NormStats
from acce.policy.vla import VLAPolicy
from acce.runtime.learner import make_learner
from sim.bandit import ContextualBanditEnv

TINY = ["policy.language=hash", "policy.resnet_hidden_sizes=[8,16]", "policy.resnet_depths=[1,1]",
        "policy.image_grid=2", "policy.trunk_width=32", "policy.trunk_layers=1", "policy.trunk_heads=2",
        "policy.max_delay_steps=0", "policy.chunk_len=4", "policy.init_log_std=-0.7", "env.image_size=32",
        "env.tasks=[reach]", "rollout.num_workers=1", "rollout.segment_len=1", "rollout.execution_horizon=4",
        "learner.batch_segments=32", "runtime.kind=local", "runtime.queue_capacity=64"]


def bandit_policy(cfg, seed=0):
    torch.manual_seed(seed)
    states = np.zeros((64, 7), np.float32)
    states[:, :3] = np.random.default_rng(0).uniform(-0.8, 0.8, (64, 3))
    return VLAPolicy(cfg.policy, 7, 4, NormStats.from_states(states))


def deterministic_success(policy, n=256, seed=123):
    env = ContextualBanditEnv(n, image_size=32, seed=seed)
    obs = env.reset()
    with torch.no_grad():
        mean, _, _ = policy(policy.with_lang(obs))
    dist = np.linalg.norm(np.clip(mean[:, -1, :3].numpy(), -1, 1) - env.targets, axis=1)
    return float((dist < env.success_radius).mean())


def run_bandit(overrides, updates, seed=0):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # float sums differ with the thread count and RL amplifies them: fix it
    try:
        return _run_bandit(overrides, updates, seed)
    finally:
        torch.set_num_threads(threads)


def _run_bandit(overrides, updates, seed):
    from acce.runtime.local import LocalRuntime
    cfg = load(None, TINY + list(overrides))
    policy = bandit_policy(cfg, seed)
    before = deterministic_success(policy)
    learner = make_learner(policy, cfg.learner, seed=seed)
    rt = LocalRuntime(cfg, learner, lambda w: ContextualBanditEnv(16, image_size=32, seed=seed * 10 + w + 1))
    rt.start()
    stats = []
    try:
        while len(stats) < updates:
            stats += rt.poll()["updates"]
    finally:
        rt.shutdown()
    return before, deterministic_success(policy), stats


@pytest.mark.parametrize("variant", [["learner.algorithm=ppo"], ["learner.algorithm=gipo"],
                                     ["learner.train_scope=residual", "policy.residual_hidden=64"]],
                         ids=["ppo", "gipo", "residual"])
def test_contextual_bandit_is_learned_from_scratch(variant):
    """60 updates (7,680 env steps, one torch thread): measured 0.8 % -> 20.7 % (PPO), 19.9 % (GIPO), 14.8 % (the
    residual alone on a random trunk); the margin leaves room for other CPUs' float differences."""
    before, after, stats = run_bandit([*variant, "learner.lr=1e-3", "learner.epochs=4", "learner.minibatches=4"],
                                      updates=60)
    assert before < 0.05
    assert after >= before + 0.1, (before, after)
    assert max(s["is/approx_kl"] for s in stats) > 1e-3  # the policy moved


def test_contextual_bandit_is_not_learned_without_the_policy_gradient():
    before, after, _ = run_bandit(["learner.lr=1e-3", "learner.epochs=4", "learner.minibatches=4",
                                   "learner.value_warmup_updates=1000"], updates=60)
    assert after == before, (before, after)  # only the critic trained: the actor is exactly where it started


TD3 = ["learner.algorithm=td3", "learner.train_scope=residual", "policy.residual_hidden=64", "learner.lr=1e-3",
       "learner.max_staleness=-1"]


@pytest.mark.parametrize("actor", ["on", "off"])
def test_contextual_bandit_is_learned_off_policy(actor):
    """learner.algorithm=td3 (replayed features, 2 gradient steps per decision): measured 0.8 % -> 98.0 % in 60
    updates (7,680 env steps), where PPO's best sizing reached 41.8 %; with the actor off (critic-only updates) the
    policy must stay exactly where it started."""
    extra = [] if actor == "on" else ["learner.value_warmup_updates=1000"]
    before, after, stats = run_bandit([*TD3, *extra], updates=40)
    assert before < 0.05
    if actor == "on":
        assert after >= before + 0.5, (before, after)
        assert stats[-1]["loss/value"] < stats[0]["loss/value"]  # the Q heads fit
    else:
        assert after == before, (before, after)

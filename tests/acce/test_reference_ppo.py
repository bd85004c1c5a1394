"""The ladder's independent PPO yardstick (`acce bench ppo-reference`): it runs on the state-only task and reports
its curve in env steps."""
from acce.bench.reference_ppo import _RunningNorm, run_reference_ppo

import numpy as np


def test_running_norm_matches_the_pooled_moments():
    rng = np.random.default_rng(0)
    a, b = rng.normal(2.0, 3.0, (50, 2)), rng.normal(-1.0, 0.5, (70, 2))
    norm = _RunningNorm(2)
    norm.update(a)
    norm.update(b)
    pooled = np.concatenate([a, b])
    assert np.allclose(norm.mean, pooled.mean(0), atol=1e-4) and np.allclose(norm.var, pooled.var(0), atol=1e-3)


def test_reference_ppo_runs_and_reports_its_curve():
    out = run_reference_ppo("reach", budget_steps=2048, num_envs=4, rollout_steps=64, epochs=2, minibatches=2)
    steps = [c["env_steps"] for c in out["curve"]]
    assert steps == sorted(steps) and steps[-1] >= 2048 and len(steps) == 8
    assert 0.0 <= out["final_train_success"] <= 1.0 and out["wall_s"] > 0
    assert all(np.isfinite(c["approx_kl"]) and c["approx_kl"] >= -1e-6 for c in out["curve"])

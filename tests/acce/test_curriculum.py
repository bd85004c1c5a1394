"""Failure-weighted task sampling and its per-task floor (rollout.min_task_share): hand-computed probabilities."""
import numpy as np
import pytest

from acce.config import ConfigError, load
from acce.runtime.curriculum import TaskSampler


def _fill(sampler: TaskSampler, task: str, failures: int, successes: int) -> None:
    for ok in [False] * failures + [True] * successes:
        sampler.update(task, ok)


def test_failure_weights_without_floor():
    s = TaskSampler(["reach", "push"], "failure", window=50)
    _fill(s, "reach", 1, 49)   # weight 1 + 1 = 2
    _fill(s, "push", 15, 35)   # weight 15 + 1 = 16
    np.testing.assert_allclose(s.probabilities(), [2 / 18, 16 / 18])


def test_floor_lifts_the_solved_task():
    s = TaskSampler(["reach", "push"], "failure", window=50, min_share=0.25)
    _fill(s, "reach", 1, 49)
    _fill(s, "push", 15, 35)
    # p = 0.25 + 0.5 * w / 18: reach 0.25 + 1/18, push 0.25 + 8/18
    np.testing.assert_allclose(s.probabilities(), [0.25 + 1 / 18, 0.25 + 8 / 18])
    assert s.probabilities().sum() == pytest.approx(1.0)


def test_full_floor_is_uniform_and_uniform_mode_ignores_it():
    s = TaskSampler(["a", "b", "c"], "failure", min_share=1 / 3)
    _fill(s, "a", 10, 0)
    np.testing.assert_allclose(s.probabilities(), [1 / 3] * 3)
    u = TaskSampler(["a", "b"], "uniform", min_share=0.1)
    np.testing.assert_allclose(u.probabilities(), [0.5, 0.5])


def test_sampling_follows_the_probabilities():
    s = TaskSampler(["reach", "push"], "failure", min_share=0.3)
    _fill(s, "push", 49, 0)  # weights 1 and 50: reach 0.3 + 0.4 / 51
    rng = np.random.default_rng(0)
    draws = [s(rng) for _ in range(20000)]
    assert draws.count("reach") / len(draws) == pytest.approx(0.3 + 0.4 / 51, abs=0.01)


def test_floor_over_one_is_refused():
    with pytest.raises(ValueError, match="exceeds 1"):
        TaskSampler(["a", "b", "c"], "failure", min_share=0.4)
    with pytest.raises(ConfigError, match="use at most 0.5"):
        load(None, ["env.tasks=[reach,push]", "rollout.task_sampling=failure", "rollout.min_task_share=0.6"])
    with pytest.raises(ConfigError, match=r"min_task_share must be in \[0, 1\]"):
        load(None, ["rollout.min_task_share=-0.1"])

"""rollout.align_decisions: a blocking worker holds envs that fall due off-phase (after a reset, mid-way through the
others' chunks) so that every inference batch carries all its envs, at a cost of at most execution_horizon - 1 idle
control steps per episode."""
import numpy as np
import pytest

from acce.config import load
from acce.runtime.worker import RolloutWorker
from sim.bandit import ContextualBanditEnv
from test_worker import CountingPolicy


class StaggeredBandit(ContextualBanditEnv):
    """Bandit slots whose episodes last `lengths[i]` control steps, so that after their first episode they fall due
    at different control steps."""

    def __init__(self, lengths):
        self.lengths = list(lengths)
        super().__init__(len(self.lengths), steps=max(self.lengths))

    def _reset_slot(self, i):
        super()._reset_slot(i)
        self.t[i] = self.steps - self.lengths[i]  # the episode ends when t reaches steps: lengths[i] steps from now


class BatchRecorder(CountingPolicy):
    def __init__(self):
        super().__init__()
        self.sizes = []

    def infer(self, batch):
        self.sizes.append(len(batch["state"]))
        return super().infer(batch)


def run(align, steps=60):
    policy = BatchRecorder()
    worker = RolloutWorker(StaggeredBandit([5, 6, 7, 9]), policy, segment_len=2, chunk_len=4, exec_horizon=4,
                           align_decisions=align)
    try:
        worker.collect(min_segments=10_000, max_steps=steps)
        return policy.sizes, worker.stats, len(worker.drain_episodes())
    finally:
        worker.close()


def test_staggered_episodes_split_the_batches_without_alignment():
    sizes, stats, _ = run(False)
    assert sizes[0] == 4 and min(sizes) == 1 and np.mean(sizes) < 2.5  # the phases drift apart after the first resets
    assert stats.paused_steps == 0 and stats.held_steps == 0  # every env steps at every control step


def test_aligned_decisions_go_out_in_full_batches_and_idle_at_most_horizon_minus_one_per_episode():
    sizes, stats, episodes = run(True)
    assert set(sizes) == {4}  # all four envs in every batch
    assert stats.decisions == 4 * len(sizes)
    # every control step either steps an env or idles it; a held env waits at most 3 steps (horizon 4) per episode
    assert stats.env_steps + stats.paused_steps == 4 * 60
    assert 0 < stats.paused_steps <= 3 * episodes and stats.held_steps > 0


def test_the_first_eight_control_steps_by_hand():
    """Slots of 5, 6, 7 and 9 steps, horizon 4: all four decide at t = 0 and 4. Unaligned, the 5-, 6- and 7-step
    slots restart and decide alone at control steps 5, 6 and 7 (the 9-step slot's t = 8 decision falls after the
    8th step): batches 4, 4, 1, 1, 1 and 32 env steps. Aligned, they idle 3, 2 and 1 steps waiting for it: batches
    4, 4 and 32 - 6 = 26 env steps."""
    sizes, stats, _ = run(False, steps=8)
    assert sizes == [4, 4, 1, 1, 1] and (stats.env_steps, stats.paused_steps) == (32, 0)
    sizes, stats, _ = run(True, steps=8)
    assert sizes == [4, 4] and (stats.env_steps, stats.paused_steps) == (26, 6)


def test_pipelined_workers_ignore_alignment():
    worker = RolloutWorker(StaggeredBandit([5, 6]), CountingPolicy(), segment_len=2, chunk_len=4, exec_horizon=4,
                           pipelined=True, align_decisions=True)
    try:
        assert not worker.align
    finally:
        worker.close()


@pytest.mark.parametrize("value,expected", [(None, True), ("false", False)])
def test_config_field_defaults_on_and_reaches_the_workers(value, expected):
    from acce.runtime.roles import rollout_kwargs
    cfg = load(None, [] if value is None else [f"rollout.align_decisions={value}"])
    assert cfg.rollout.align_decisions is expected and rollout_kwargs(cfg)["align_decisions"] is expected

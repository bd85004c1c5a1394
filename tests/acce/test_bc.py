"""Behavior-cloning data: chunk targets and masks on hand-made episodes, DAgger relabeling with the sim expert."""
import numpy as np
import pytest
import torch

from acce.bc import DemoDataset
from acce.config import load
from acce.types import Episode


def episode(t_len, action_value=0.5, instruction="go", task_id=2):
    return Episode(obs={"image/front": np.zeros((t_len + 1, 8, 8, 3), np.uint8),
                        "state": np.arange(t_len + 1, dtype=np.float32)[:, None].repeat(2, 1)},
                   action=np.full((t_len, 2), action_value, np.float32), reward=np.zeros(t_len, np.float32),
                   terminated=np.zeros(t_len, bool), truncated=np.zeros(t_len, bool), success=np.zeros(t_len, bool),
                   behavior_version=np.full(t_len, -1), delay_steps=np.zeros(t_len, np.int32),
                   policy_sampled=np.zeros(t_len, bool), timestamp_s=np.zeros(t_len + 1), instruction=instruction,
                   task="reach", task_id=task_id, source="demo", seed=0, episode_id=f"e{t_len}")


def test_chunk_targets_are_the_next_h_actions_masked_past_the_end():
    ep = episode(3)
    ep.action[:, 0] = [1.0, 2.0, 3.0]
    data = DemoDataset([ep], chunk_len=2, max_delay=1, action_dim=2)
    assert len(data) == 3  # the final observation is not a decision
    inputs, target, mask = data.batch(np.arange(3))
    assert target[:, :, 0].tolist() == [[1, 2], [2, 3], [3, 0]]
    assert mask.tolist() == [[True, True], [True, True], [True, False]]
    assert inputs["state"][:, 0].tolist() == [0, 1, 2] and inputs["prefix"].shape == (3, 1, 2)


def test_cloning_at_a_delay_feeds_the_committed_prefix_and_drops_unexecuted_positions():
    ep = episode(4)
    ep.action[:, 0] = [0.1, 0.2, 0.3, 2.0]  # 2.0 runs clipped to 1.0, as the timeline commits it
    data = DemoDataset([ep], chunk_len=4, max_delay=3, action_dim=2)
    inputs, target, mask = data.batch(np.arange(4), delays=np.array([0, 2, 3, 1]))
    assert inputs["delay_steps"].tolist() == [0, 2, 3, 1]
    # decision t at delay d: the demo's actions t … t+d-1 run while the call is in flight; zero past the end
    np.testing.assert_allclose(inputs["prefix"][:, :, 0], [[0, 0, 0], [0.2, 0.3, 0], [0.3, 1.0, 0], [1.0, 0, 0]])
    np.testing.assert_allclose(target[:, :, 0], [[0.1, 0.2, 0.3, 2.0], [0.2, 0.3, 2.0, 0], [0.3, 2.0, 0, 0],
                                                 [2.0, 0, 0, 0]])  # unchanged by d
    # positions < d never execute, positions past the episode's end do not exist
    assert mask.tolist() == [[True, True, True, True], [False, False, True, False],
                             [False, False, False, False], [False, False, False, False]]
    with pytest.raises(ValueError, match="delays must be"):
        data.batch(np.arange(2), delays=np.array([0, 4]))


def test_random_delay_draws_every_latency_up_to_the_bound_and_zero_by_default():
    data = DemoDataset([episode(30)], chunk_len=6, max_delay=4, action_dim=2)
    assert not data.batch(np.arange(30))[0]["delay_steps"].any()
    drawn = DemoDataset([episode(30)], chunk_len=6, max_delay=4, action_dim=2, random_delay_steps=3, seed=1)
    d = np.concatenate([drawn.batch(np.arange(30))[0]["delay_steps"] for _ in range(20)])
    assert set(d.tolist()) == {0, 1, 2, 3}
    with pytest.raises(ValueError, match="random_delay_steps"):
        DemoDataset([episode(3)], chunk_len=6, max_delay=2, action_dim=2, random_delay_steps=3)
    with pytest.raises(Exception, match="max_delay_steps"):
        load(None, ["bc.random_delay_steps=3", "policy.max_delay_steps=2"])


def test_a_naive_policy_cloned_at_one_latency_sees_no_latency_inputs_but_skips_the_positions_that_never_run():
    # bc.min_delay_steps = bc.random_delay_steps = 2, bc.delay_inputs=false: the latency-matched naive baseline
    aware = DemoDataset([episode(30)], chunk_len=6, max_delay=4, action_dim=2, random_delay_steps=2, seed=1,
                        min_delay_steps=2)
    naive = DemoDataset([episode(30)], chunk_len=6, max_delay=4, action_dim=2, random_delay_steps=2, seed=1,
                        min_delay_steps=2, delay_inputs=False)
    (ia, ta, ma), (i_n, tn, mn) = aware.batch(np.arange(25)), naive.batch(np.arange(25))  # (chunks inside the episode)
    assert (ia["delay_steps"] == 2).all() and ia["prefix"][:, :2].any()  # one latency; the aware one sees it
    assert not i_n["delay_steps"].any() and not i_n["prefix"].any()  # the naive one is told nothing ...
    np.testing.assert_array_equal(tn, ta)
    np.testing.assert_array_equal(mn, ma)  # ... but learns the same executed positions
    assert not mn[:, :2].any() and mn[:, 2:].all()  # positions 0, 1 run during the latency: out of the loss
    with pytest.raises(ValueError, match="min_delay_steps"):
        DemoDataset([episode(3)], chunk_len=6, max_delay=4, action_dim=2, random_delay_steps=2, min_delay_steps=3)
    with pytest.raises(Exception, match="bc.min_delay_steps"):
        load(None, ["bc.random_delay_steps=2", "bc.min_delay_steps=3"])


def test_labels_replace_executed_actions_and_extend_appends():
    data = DemoDataset([episode(2)], chunk_len=2, max_delay=0, action_dim=2)
    labels = [np.array([[-1.0, -1.0], [-0.5, -0.5], [0.0, 0.0]], np.float32)]
    data.extend([episode(3, instruction="other", task_id=1)], labels)
    assert len(data) == 5 and data.instructions[2:] == ["other"] * 3 and data.task_ids[2:] == [1, 1, 1]
    _, target, mask = data.batch(np.arange(5))
    assert target[0, 0, 0] == 0.5  # first episode: its executed actions
    assert target[2:, 0, 0].tolist() == [-1.0, -0.5, 0.0]  # second: the labels
    assert data.states.shape == (5, 2)
    with pytest.raises(ValueError, match="label arrays"):
        data.extend([episode(2)], [])
    with pytest.raises(ValueError, match="targets"):
        data.extend([episode(2)], [np.zeros((3, 2), np.float32)])
    with pytest.raises(ValueError, match="no demonstration steps"):
        DemoDataset([], chunk_len=2, max_delay=0, action_dim=2)


def test_dagger_rollouts_label_the_policys_states_with_the_expert():
    from acce.dagger import dagger_rollouts
    from acce.train import build_policy
    from acce.wiring import make_sim_env

    cfg = load(None, ["policy.language=hash", "policy.resnet_hidden_sizes=[8,16,32]", "policy.image_grid=2",
                      "policy.trunk_width=32", "policy.trunk_layers=1", "policy.trunk_heads=2", "env.image_size=32",
                      "policy.chunk_len=4", "policy.max_delay_steps=0"])
    policy = build_policy(cfg, np.zeros((4, 7), np.float32))
    policy.train()

    def make_env(tasks, n, **kw):
        return make_sim_env(tasks, n, image_size=32, **kw)
    episodes, labels, success = dagger_rollouts(policy, make_env, ["reach"], 3, chunk_len=4, exec_horizon=2,
                                                num_envs=3, seed=0, progress=False)
    assert len(episodes) == len(labels) == 3 and set(success) == {"reach"}
    for ep, lab in zip(episodes, labels):
        assert lab.shape == ep.action.shape
        # an untrained policy (mean ~0) barely moves, while the expert always heads for the cube at full speed
        assert np.abs(ep.action[:, :3]).max() < 0.2 and np.abs(lab[:, :3]).max(1).min() > 0.2
    assert policy.training  # the policy's mode is restored
    data = DemoDataset(episodes, 4, 0, 4, labels)
    assert len(data) == sum(ep.num_steps for ep in episodes)
    torch.testing.assert_close(torch.as_tensor(data.targets[0, 0]), torch.as_tensor(labels[0][0]))


class PositionPolicy(torch.nn.Module):
    """Chunk position j is the action (j + 1) / 10 in every dim (0 = held: nothing committed); records the inputs."""
    seen: list = []

    def __init__(self, chunk_len, action_dim=4):
        super().__init__()
        self.H, self.A = chunk_len, action_dim

    def with_lang(self, batch):
        return batch

    def forward(self, batch):
        PositionPolicy.seen.append((batch["delay_steps"].copy(), batch["prefix"].copy()))
        b = len(batch["delay_steps"])
        return (torch.arange(1, self.H + 1, dtype=torch.float32)[None, :, None].expand(b, self.H, self.A) / 10,)


def test_dagger_runs_a_naive_policy_late_without_telling_it():
    from acce.dagger import dagger_rollouts
    from acce.wiring import make_sim_env

    PositionPolicy.seen = []
    episodes, labels, _ = dagger_rollouts(
        PositionPolicy(6), lambda tasks, n, **kw: make_sim_env(tasks, n, image_size=32, **kw), ["reach"], 2,
        chunk_len=6, exec_horizon=2, num_envs=2, seed=3, progress=False, max_delay=3, random_delay_steps=3,
        min_delay_steps=3, delay_inputs=False)
    assert all(not d.any() and not p.any() for d, p in PositionPolicy.seen)  # inputs: d = 0, no prefix
    for ep in episodes:
        pos = np.round(ep.action[:, 0] * 10).astype(int) - 1  # executed chunk position, -1 = held
        # every chunk takes over 3 steps after its request, from position 3 (the execution trick), and runs until
        # the next one takes over s = 2 steps later: only positions 3 and 4 ever execute (after the held start)
        assert set(pos[3:].tolist()) <= {3, 4} and (pos[:3] == -1).all()


def test_dagger_at_random_latency_runs_the_rollout_workers_schedule():
    from acce.dagger import dagger_rollouts
    from acce.wiring import make_sim_env

    PositionPolicy.seen = []
    episodes, labels, _ = dagger_rollouts(
        PositionPolicy(6), lambda tasks, n, **kw: make_sim_env(tasks, n, image_size=32, **kw), ["reach"], 4,
        chunk_len=6, exec_horizon=2, num_envs=2, seed=3, progress=False, max_delay=3, random_delay_steps=3)
    delays = np.concatenate([d for d, _ in PositionPolicy.seen])
    assert set(delays.tolist()) == {0, 1, 2, 3}  # every latency drawn
    for d, prefix in PositionPolicy.seen:  # the prefix holds the committed actions: d rows, zeros after them
        assert not prefix[np.arange(3)[None] >= d[:, None]].any()
    for ep, lab in zip(episodes, labels):
        assert lab.shape == ep.action.shape
        pos = np.round(ep.action[:, 0] * 10).astype(int) - 1  # executed chunk position, -1 = held
        # a chunk takes over d steps after its request at position d and runs until the next one does: with s = 2
        # and d <= 3 every executed position lies in 0 … s - 1 + 3
        assert pos.max() <= 4 and (pos >= 2).any()
    with pytest.raises(ValueError, match="random_delay_steps"):
        dagger_rollouts(PositionPolicy(6), None, ["reach"], 1, chunk_len=6, exec_horizon=2, max_delay=1,
                        random_delay_steps=2)



def test_dagger_groups_split_each_task_over_threads_and_repeat_with_the_seed():
    import threading

    from acce.dagger import dagger_rollouts
    from acce.wiring import make_sim_env

    made = []

    def make_env(tasks, n, **kw):
        made.append((threading.current_thread().name, kw["seed"], n))
        return make_sim_env(tasks, n, image_size=32, **kw)

    def run(groups):
        made.clear()
        PositionPolicy.seen = []
        eps, labels, success = dagger_rollouts(
            PositionPolicy(6), make_env, ["reach", "push"], 10, chunk_len=6, exec_horizon=2, num_envs=2, seed=5,
            progress=False, max_delay=3, random_delay_steps=3, groups=groups)
        return eps, labels, success, list(made)

    eps, labels, success, envs = run(2)
    assert [ep.task for ep in eps] == ["reach"] * 5 + ["push"] * 5 and set(success) == {"reach", "push"}
    # two groups per task (3 + 2 episodes), each env made on a thread of its own, with its own layouts' seed
    assert len(envs) == 4 and all(len({name for name, _, _ in pair}) == 2 for pair in (envs[:2], envs[2:]))
    assert threading.main_thread().name not in {name for name, _, _ in envs}
    assert len({seed for _, seed, _ in envs}) == 4
    again = run(2)
    assert [ep.seed for ep in again[0]] == [ep.seed for ep in eps]  # same seed, same data, in group order
    for a, b in zip(again[1], labels):
        np.testing.assert_array_equal(a, b)
    one = run(1)[3]
    assert len(one) == 2 and {name for name, _, _ in one} == {threading.main_thread().name}
    with pytest.raises(ValueError, match="groups must be >= 1"):
        dagger_rollouts(PositionPolicy(6), None, ["reach"], 1, chunk_len=6, exec_horizon=2, groups=0)

def with_aux(ep, values):
    ep.obs["aux"] = np.asarray(values, np.float32)
    return ep


def test_aux_labels_are_standardized_by_the_first_episodes_and_must_be_all_or_none():
    a = with_aux(episode(2), [[0.0, 1.0], [2.0, 1.0], [4.0, 1.0]])  # frames: the last one is not a decision
    data = DemoDataset([a], chunk_len=2, max_delay=0, action_dim=2)
    assert data.aux_dim == 2
    # stats over the decision frames (0, 2): mean (1, 1), std (1, 0 -> floored at 1e-3)
    np.testing.assert_allclose(data.aux_mean, [1.0, 1.0])
    np.testing.assert_allclose(data.aux_std, [1.0, 1e-3])
    inputs, _, _ = data.batch(np.arange(2))
    np.testing.assert_allclose(inputs["aux"], [[-1.0, 0.0], [1.0, 0.0]])
    data.extend([with_aux(episode(1), [[5.0, 1.0], [0.0, 0.0]])])
    np.testing.assert_allclose(data.aux_mean, [1.0, 1.0])  # fixed after construction
    np.testing.assert_allclose(data.batch(np.array([2]))[0]["aux"], [[4.0, 0.0]])
    with pytest.raises(ValueError, match="all with aux labels or none"):
        data.extend([episode(2)])
    assert DemoDataset([episode(2)], chunk_len=2, max_delay=0, action_dim=2).aux_dim == 0


def test_bc_aux_loss_trains_the_aux_head_and_needs_targets():
    from acce.policy import NormStats, PolicyConfig, VLAPolicy
    from acce.runtime.learner import Learner

    cfg = load(None, ["policy.language=hash", "policy.trunk_width=32", "policy.trunk_layers=1",
                      "policy.trunk_heads=2", "policy.chunk_len=2", "policy.max_delay_steps=1", "learner.lr=3e-3",
                      "rollout.execution_horizon=1", "rollout.segment_len=2"])
    torch.manual_seed(0)
    norm = NormStats(np.zeros(2, np.float32), np.ones(2, np.float32), {"dim": 2, "range": [-1, 1]})
    policy = VLAPolicy(cfg.policy, 2, 2, norm, aux_dim=2)
    rng = np.random.default_rng(0)
    eps = [with_aux(episode(3), rng.normal(size=(4, 2))) for _ in range(2)]
    for ep in eps:
        ep.obs["image/front"] = rng.integers(0, 255, ep.obs["image/front"].shape, dtype=np.uint8)
    data = DemoDataset(eps, chunk_len=2, max_delay=1, action_dim=2)
    learner = Learner(policy, cfg.learner, seed=0)
    inputs, target, mask = data.batch(np.arange(len(data)))
    head = policy.aux_head.weight.detach().clone()
    _, frozen_aux = learner.bc_step(inputs, target, mask)
    assert np.isnan(frozen_aux) and torch.equal(head, policy.aux_head.weight)  # coef 0: aux head untouched
    first = learner.bc_step(inputs, target, mask, aux_coef=1.0)[1]
    for _ in range(60):
        last = learner.bc_step(inputs, target, mask, aux_coef=1.0)[1]
    assert last < 0.2 * first  # 6 frames with distinct random images: the head can fit them
    with pytest.raises(ValueError, match="no 'aux' targets"):
        learner.bc_step({k: v for k, v in inputs.items() if k != "aux"}, target, mask, aux_coef=1.0)


class _CountingLearner:
    """Records the learning rate of every bc_step; the optimizer is a stand-in with one param group."""

    def __init__(self, lr=1.0):
        self.optimizer = type("Opt", (), {"param_groups": [{"lr": lr}]})()
        self.lrs = []

    def bc_step(self, inputs, target, mask, augment_px, aux_coef):
        self.lrs.append(self.optimizer.param_groups[0]["lr"])
        return 0.0, float("nan")


def test_bc_time_budget_ends_the_phase_and_the_cosine_schedule_together():
    from acce.bc import bc_train

    data = DemoDataset([episode(4)], chunk_len=2, max_delay=0, action_dim=2)
    # a fake clock that advances 1 s per reading: reading 0 starts the phase, reading k precedes step k-1
    ticks = iter(range(100))
    learner = _CountingLearner()
    losses = bc_train(learner, data, steps=100, batch_size=2, progress=False, lr_schedule="cosine", max_wall_s=4.0,
                      clock=lambda: float(next(ticks)))
    # steps 0..2 start at 1, 2, 3 s (progress 1/4, 2/4, 3/4 of the time budget; the step fraction is smaller);
    # at 4 s the budget is spent and the phase ends
    assert len(losses) == 3
    assert learner.lrs == pytest.approx([0.5 * (1 + np.cos(np.pi * f)) for f in (0.25, 0.5, 0.75)])
    # without a time budget the step budget binds and the schedule is the usual one over steps
    learner = _CountingLearner()
    assert len(bc_train(learner, data, steps=4, batch_size=2, progress=False, lr_schedule="cosine")) == 4
    assert learner.lrs == pytest.approx([0.5 * (1 + np.cos(np.pi * k / 4)) for k in range(4)])


def test_bc_schedule_span_runs_one_part_of_a_single_cosine():
    from acce.bc import bc_train

    data = DemoDataset([episode(4)], chunk_len=2, max_delay=0, action_dim=2)
    learner = _CountingLearner()
    # the second of two phases (bc.phase_schedule=continuous): progress k/4 of the phase is 0.5 + k/8 of the cosine
    assert len(bc_train(learner, data, steps=4, batch_size=2, progress=False, lr_schedule="cosine",
                        schedule_span=(0.5, 1.0))) == 4
    assert learner.lrs == pytest.approx([0.5 * (1 + np.cos(np.pi * (0.5 + k / 8))) for k in range(4)])
    # a third call on the same optimizer (whose rate has decayed) still scales the cosine from the original rate
    learner.lrs.clear()
    bc_train(learner, data, steps=2, batch_size=2, progress=False, lr_schedule="cosine", schedule_span=(0.0, 0.5))
    assert learner.lrs == pytest.approx([1.0, 0.5 * (1 + np.cos(np.pi * 0.25))])
    with pytest.raises(ValueError, match="schedule_span"):
        bc_train(learner, data, steps=4, batch_size=2, progress=False, schedule_span=(0.6, 0.5))


def test_bc_time_budget_is_checked_in_the_config():
    from acce.configlib import ConfigError

    with pytest.raises(ConfigError, match="bc.max_wall_s"):
        load(None, ["bc.max_wall_s=-1"])

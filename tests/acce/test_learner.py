"""Learner wiring on hand-built segments: bootstrap rows, staleness admission, GAE targets, versions."""
import numpy as np
import pytest
import torch

from acce.config import load
from acce.policy.norm import NormStats
from acce.policy.vla import VLAPolicy
from acce.runtime.learner import Learner, collate
from acce.serving.timeline import EnvTimeline, build_segment
from test_timeline import decide  # noqa: E402  (tests/acce is on sys.path under pytest's rootdir import mode)

G = 0.9


def make_learner(overrides=()):
    cfg = load(None, ["policy.language=hash", "policy.resnet_hidden_sizes=[8,16,32]", "policy.image_grid=2",
                      "policy.trunk_width=32", "policy.trunk_layers=1", "policy.trunk_heads=2",
                      "policy.max_delay_steps=2", "policy.chunk_len=6", f"learner.gamma={G}", "learner.lam=1.0",
                      "learner.epochs=1", "learner.minibatches=1", *overrides])
    torch.manual_seed(0)
    policy = VLAPolicy(cfg.policy, 1, 2, NormStats.from_states(np.zeros((4, 1), np.float32)))
    return cfg, Learner(policy, cfg.learner)


def segment(rewards, version=0, truncate_last=False):
    """One env, decisions every 2 steps with d = 0; step rewards given; optional truncation at the end."""
    tl = EnvTimeline(6, 2, 2, 2, G, aware=True)
    for k in range(len(rewards) // 2):
        dec = decide(tl, k, 0)
        dec.version = version
        for r in rewards[2 * k:2 * k + 2]:
            tl.action()
            tl.record(r, success=False)
    obs = {"state": np.array([99.0], np.float32), "instruction": "x", "task_id": 0}
    if truncate_last:
        tl.end_episode(terminated=False, truncated=True, final_inp=tl.make_input(obs, 0))
    else:
        decide(tl, 9, 0)
    seg = build_segment(tl.closed, 6, G)
    seg.obs["image/front"] = np.random.default_rng(len(rewards)).integers(0, 255, (len(seg), 32, 32, 3), np.uint8)
    seg.bootstrap["image/front"] = np.zeros((len(seg.bootstrap["state"]), 32, 32, 3), np.uint8)
    return seg


def constant_value(learner, c):
    with torch.no_grad():
        learner.policy.value_head[-1].weight.zero_()
        learner.policy.value_head[-1].bias.fill_(c)


def test_targets_use_bootstrap_rows_and_semi_markov_discounts():
    _, learner = make_learner()
    constant_value(learner, 2.0)
    seg = segment([1.0, 1.0, 0.0, 1.0])  # decision rewards: 1 + 0.9 = 1.9 and 0 + 0.9 = 0.9
    data = collate([seg])
    np.testing.assert_allclose(data["reward"], [[1.9, 0.9]], rtol=1e-6)
    tg = learner._targets(data)
    # lam = 1: A_1 = 0.9 + 0.81 * 2 - 2 = 0.52 ; A_0 = 1.9 + 0.81 * 2 - 2 + 0.81 * 0.52 = 1.9412
    np.testing.assert_allclose(tg["adv"].numpy(), [1.9412, 0.52], rtol=1e-5)
    np.testing.assert_allclose(tg["returns"].numpy(), [3.9412, 2.52], rtol=1e-5)


def test_truncated_episode_bootstraps_from_its_final_observation():
    _, learner = make_learner()
    constant_value(learner, 1.0)
    seg = segment([0.0, 0.0, 1.0, 0.0], truncate_last=True)
    assert seg.truncated[-1] and seg.next_index[-1] == 0 and seg.bootstrap["state"][0, 0] == 99.0
    tg = learner._targets(collate([seg]))
    # A_1 = 1 + 0.81 * 1 - 1 = 0.81 (bootstraps through the truncation)
    assert tg["adv"][1].item() == pytest.approx(0.81, rel=1e-5)


def test_stale_segments_are_excluded_and_counted_versions_advance():
    cfg, learner = make_learner(["learner.max_staleness=1"])
    learner.version = 5
    fresh, stale = segment([1, 0, 1, 0], version=4), segment([1, 0, 1, 0], version=3)
    metrics = learner.update([fresh, stale])
    assert learner.excluded_segments == 1 and metrics["staleness/max"] == 2.0
    # what the benches count: only the admitted segment, 2 decisions x 2 control steps (the stale one never counts)
    assert metrics["learner/consumed_segments"] == 1 and metrics["learner/consumed_env_steps"] == 4
    assert learner.version == 6  # one optimizer step (epochs * minibatches = 1)
    before = {k: v.clone() for k, v in learner.policy.state_dict().items()}
    learner.update([segment([1, 1, 1, 1], version=6)])
    assert any(not torch.equal(before[k], v) for k, v in learner.policy.state_dict().items())


def test_value_warmup_leaves_the_actor_alone():
    _, learner = make_learner(["learner.value_warmup_updates=1"])
    mean_head = learner.policy.mean_head.weight.clone()
    value_head = learner.policy.value_head[-1].weight.clone()
    trunk = [p.clone() for p in learner.policy.trunk.parameters()]
    learner.update([segment([1, 0, 1, 0])])
    assert torch.equal(mean_head, learner.policy.mean_head.weight)
    assert not torch.equal(value_head, learner.policy.value_head[-1].weight)
    # the critic reads the trunk through a stop-gradient: critic-only updates leave the shared features alone too
    assert all(torch.equal(a, b) for a, b in zip(trunk, learner.policy.trunk.parameters()))


def test_critic_gradient_is_clipped_apart_from_the_actor():
    """With a stop-gradient critic, a huge value loss must not shrink the actor's step: clipping is per group."""
    _, learner = make_learner(["learner.max_grad_norm=1.0"])
    learner.policy.zero_grad()
    for p in learner.policy.parameters():
        p.grad = torch.full_like(p, 1e-4)
    for p in learner.policy.value_head.parameters():
        p.grad = torch.full_like(p, 100.0)
    actor_before = learner.policy.mean_head.weight.grad.clone()
    learner._clip_gradients()
    assert torch.equal(learner.policy.mean_head.weight.grad, actor_before)  # actor norm < 1: untouched
    critic_norm = torch.sqrt(sum((p.grad ** 2).sum() for p in learner.policy.value_head.parameters()))
    assert abs(float(critic_norm) - 1.0) < 1e-4


def test_first_step_ratio_is_exactly_one():
    """Before any optimizer step the new policy is the proximal policy: ratio 1, nothing clipped. (It was not when the
    RL update augmented images that the proximal log-probs never saw.)"""
    _, learner = make_learner()
    metrics = learner.update([segment([1, 0, 1, 0]), segment([0, 1, 0, 1])])
    assert metrics["is/ratio_max"] == pytest.approx(1.0, abs=1e-5) and metrics["is/clip_frac"] == 0.0


def test_stop_gradient_critic_gets_its_own_learning_rate():
    _, learner = make_learner(["learner.lr=1e-5", "learner.critic_lr=1e-3"])
    lrs = sorted(g["lr"] for g in learner.optimizer.param_groups)
    assert lrs == [1e-5, 1e-3]
    critic = {id(p) for p in learner.policy.value_head.parameters()}
    group = next(g for g in learner.optimizer.param_groups if g["lr"] == 1e-3)
    assert {id(p) for p in group["params"]} == critic
    learner.reset_optimizer(5e-4)  # the BC warm start's rate applies to the actor only
    assert sorted(g["lr"] for g in learner.optimizer.param_groups) == [5e-4, 1e-3]
    _, shared = make_learner(["policy.value_stop_gradient=false", "learner.critic_lr=1e-3"])
    assert len(shared.optimizer.param_groups) == 1  # one trunk, one rate


def test_value_targets_are_standardized_by_running_statistics():
    _, learner = make_learner()
    a, b = torch.tensor([1.0, 2.0, 3.0]), torch.tensor([10.0, -4.0])
    learner._update_value_stats(a)
    learner._update_value_stats(b)
    both = np.array([1.0, 2.0, 3.0, 10.0, -4.0])
    mu, sigma = learner.value_stats()
    assert abs(mu - both.mean()) < 1e-9 and abs(sigma - both.std()) < 1e-9  # Welford == numpy, population std
    # the critic's output is in standardized units: a head that outputs 1 means a value of mu + sigma
    constant_value(learner, 1.0)
    tg = learner._targets(collate([segment([1.0, 1.0, 0.0, 1.0])]))
    assert torch.allclose(tg["old_values"], torch.full_like(tg["old_values"], mu + sigma), atol=1e-5)
    mu2, sigma2 = learner.value_stats()  # this batch's targets joined the statistics
    assert torch.allclose(tg["returns_std"], (tg["returns"] - mu2) / sigma2)
    restored = make_learner()[1]
    restored.load_state_dict(learner.state_dict())
    assert restored.value_stats() == learner.value_stats()
    _, off = make_learner(["learner.normalize_values=false"])
    off._update_value_stats(a)
    assert off.value_stats() == (0.0, 1.0)


def _output_kl(learner, start_state, segments):
    """KL(π ‖ π_start) of the chunk distributions on the segments' observations."""
    from acce.algo import gaussian_kl
    start = VLAPolicy.from_state({**learner.policy.policy_state(), "state_dict": start_state})
    batch = learner.policy.with_lang(collate(segments)["inputs"])
    with torch.no_grad():
        (m, s, _), (m0, s0, _) = learner.policy.eval()(batch), start.eval()(batch)
    return gaussian_kl(m, s, m0, s0).item()


def test_reference_kl_anchors_rl_to_the_starting_policy_and_survives_checkpoints():
    """learner.ref_kl_coef: the reference is frozen at the first update (KL 0 there), the actor ends nearer its start
    than without the anchor, and a resumed learner keeps the original reference, not its own current weights."""
    runs = {}
    probe = [segment([1, 0, 1, 0]), segment([0, 1, 1, 1])]
    for coef in (0.0, 10.0):
        _, learner = make_learner([f"learner.ref_kl_coef={coef}", "learner.lr=1e-3"])
        start = {k: v.clone() for k, v in learner.policy.state_dict().items()}
        first = learner.update([segment([1, 0, 1, 0]), segment([0, 1, 0, 1])])
        for k in range(6):
            metrics = learner.update([segment([1, 0, 1, k % 2]), segment([0, 1, k % 2, 1])])
        runs[coef] = (learner, start, first, metrics)
    learner, start, first, metrics = runs[10.0]
    assert runs[0.0][0].ref_policy is None and "loss/ref_kl" not in runs[0.0][3]
    assert first["loss/ref_kl"] == pytest.approx(0.0, abs=1e-6) and metrics["loss/ref_kl"] > 0
    anchored, free = _output_kl(learner, start, probe), _output_kl(runs[0.0][0], runs[0.0][1], probe)
    assert anchored < 0.5 * free
    ref = learner.ref_policy.state_dict()
    assert all(torch.equal(ref[k], v) for k, v in start.items())
    _, resumed = make_learner(["learner.ref_kl_coef=10.0"])
    resumed.load_state_dict(learner.state_dict())
    resumed.update([segment([1, 1, 0, 0])])
    assert all(torch.equal(resumed.ref_policy.state_dict()[k], v) for k, v in start.items())


def test_adaptive_learning_rate_follows_the_kl_target():
    """target_kl 0.01: KL 0.03 > 2x target -> lr / 1.5; KL 0.004 < target / 2 -> lr * 1.5; KL 0 (first minibatch)
    and KL inside [0.005, 0.02] leave it; bounds hold; the rate survives a checkpoint."""
    _, learner = make_learner(["learner.target_kl=0.01", "learner.lr=3e-4", "learner.lr_max=4e-4"])
    learner._adapt_lr(0.03)
    assert learner.actor_lr == pytest.approx(2e-4) and learner.optimizer.param_groups[0]["lr"] == pytest.approx(2e-4)
    assert learner.optimizer.param_groups[1]["lr"] == learner.cfg.critic_lr  # the critic keeps its own rate
    for kl in (0.0, 0.005, 0.02):
        learner._adapt_lr(kl)
        assert learner.actor_lr == pytest.approx(2e-4)
    learner._adapt_lr(0.004)
    assert learner.actor_lr == pytest.approx(3e-4)
    learner._adapt_lr(0.004)
    assert learner.actor_lr == pytest.approx(4e-4)  # 4.5e-4 capped at lr_max
    state = learner.state_dict()
    _, fresh = make_learner(["learner.target_kl=0.01", "learner.lr=3e-4", "learner.lr_max=4e-4"])
    fresh.load_state_dict(state)
    assert fresh.actor_lr == pytest.approx(4e-4) and fresh.optimizer.param_groups[0]["lr"] == pytest.approx(4e-4)


def test_explained_variance_by_hand():
    from acce.algo.losses import explained_variance as _explained_variance
    returns = torch.tensor([1.0, 2.0, 3.0, 4.0])  # unbiased variance 5/3
    assert _explained_variance(returns, returns) == pytest.approx(1.0)
    assert _explained_variance(torch.full((4,), 2.5), returns) == pytest.approx(0.0)
    # errors (0.5, -0.5, 0.5, -0.5): variance 1/3 -> 1 - (1/3) / (5/3) = 0.8
    assert _explained_variance(returns + torch.tensor([0.5, -0.5, 0.5, -0.5]), returns) == pytest.approx(0.8)


def test_residual_scope_trains_only_the_rl_heads_from_cached_features_and_resumes():
    """learner.train_scope=residual: cloning never trains the residual (it stays zero: version 0 = the warm start);
    RL changes only residual.*, log_std and the critic, from trunk features computed once per update; the publish
    holds just those; a resumed learner rebuilds the same optimizer."""
    from acce.serving.inference import InferenceServer
    over = ["policy.residual_hidden=16", "learner.train_scope=residual", "learner.epochs=2", "learner.minibatches=2"]
    _, learner = make_learner(over)
    assert not any(id(p) in {id(q) for q in learner.policy.residual.parameters()}
                   for g in learner.optimizer.param_groups for p in g["params"])  # BC's optimizer has no residual
    before = {k: v.clone() for k, v in learner.policy.state_dict().items()}
    learner.update([segment([1, 0, 1, 0]), segment([0, 1, 0, 1])])
    changed = {k for k, v in learner.policy.state_dict().items() if not torch.equal(before[k], v)}
    assert changed and all(k.startswith(("residual.", "log_std", "value_head.")) for k in changed), changed
    assert any(k.startswith("residual.") for k in changed)
    published = learner.trainable_state()
    assert set(published) == {k for k in before if k.startswith(("residual.", "log_std", "value_head."))}
    server = InferenceServer(VLAPolicy.from_state({**learner.policy.policy_state(), "state_dict": before}))
    server.load_weights(learner.version, published)  # a subset publish is applied at the next batch
    server._apply_staged()
    assert torch.equal(server.policy.residual[-1].weight, learner.policy.residual[-1].weight)
    _, resumed = make_learner(over)
    resumed.load_state_dict(learner.state_dict())
    assert resumed.rl_started and not resumed.policy.trunk.embeddings.position_embeddings.weight.requires_grad
    resumed.update([segment([1, 0, 1, 0])])  # the restored optimizer matches the frozen parameter set


def test_rl_log_std_sets_the_exploration_noise_rl_starts_with(tmp_path):
    """learner.rl_log_std: a fresh RL run (from scratch or from train.init_from) starts with that noise; the saved
    warm start keeps its own; an out-of-range value is one clear config error."""
    from acce.checkpoint import save_checkpoint
    from acce.configlib import ConfigError, to_dict
    from acce.train import Trainer
    base = ["bc.steps=0", "bc.episodes=0", f"run.out_dir={tmp_path}", "learner.rl_log_std=-2.5"]
    cfg = load("configs/debug.yaml", base + ["run.name=scratch"])
    scratch = Trainer(cfg, progress=False).build_learner()
    assert torch.all(scratch.policy.log_std == -2.5)
    warm = tmp_path / "warm.pt"
    with torch.no_grad():
        scratch.policy.log_std.fill_(-1.0)
    save_checkpoint(warm, {"config": to_dict(cfg), "learner": scratch.state_dict(), "counters": {}})
    rl = Trainer(load("configs/debug.yaml", base + ["run.name=rl", f"train.init_from={warm}"]),
                 progress=False).build_learner()
    assert torch.all(rl.policy.log_std == -2.5)
    keep = Trainer(load("configs/debug.yaml", base[:-1] + ["run.name=keep", f"train.init_from={warm}"]),
                   progress=False).build_learner()
    assert torch.all(keep.policy.log_std == -1.0)
    with pytest.raises(ConfigError, match="rl_log_std"):
        load("configs/debug.yaml", ["learner.rl_log_std=3.0"])


def test_rl_log_std_per_dim_sizes_each_action_dimensions_noise(tmp_path):
    """learner.rl_log_std_per_dim: one log_std per action dimension at every chunk position, winning over
    rl_log_std; the wrong count or a value outside the clamp is one clear error."""
    from acce.configlib import ConfigError
    from acce.train import Trainer
    per_dim = "learner.rl_log_std_per_dim=[-2.3,-2.3,-2.0,-0.7]"
    cfg = load("configs/debug.yaml", ["bc.steps=0", "bc.episodes=0", f"run.out_dir={tmp_path}",
                                      "learner.rl_log_std=-2.5", per_dim])
    learner = Trainer(cfg, progress=False).build_learner()
    expected = torch.tensor([-2.3, -2.3, -2.0, -0.7]).expand(cfg.policy.chunk_len, 4)
    assert torch.allclose(learner.policy.log_std, expected)
    with pytest.raises(ValueError, match="4 dimensions"):
        learner.set_log_std(None, (-1.0, -1.0))
    with pytest.raises(ConfigError, match="rl_log_std_per_dim"):
        load("configs/debug.yaml", ["learner.rl_log_std_per_dim=[-2.3,-2.3,-2.3,3.0]"])


@pytest.mark.parametrize("kl_stop, steps", [(0.0, 12), (1e-12, 1), (1e9, 12)])
def test_kl_stop_ends_the_update_once_the_policy_has_moved(kl_stop, steps):
    """4 epochs x 3 minibatches = 12 optimizer steps. The first minibatch's KL is exactly 0 (the policy is the
    proximal one), so it always steps; with a tiny kl_stop the second minibatch's KL (> 0 after one Adam step at
    lr 1e-2) ends the update; off (0) or huge, all 12 run. Versions count the steps taken."""
    _, learner = make_learner(["learner.epochs=4", "learner.minibatches=3", "learner.lr=1e-2",
                               f"learner.kl_stop={kl_stop}"])
    segs = [segment([1.0, 0.0, 2.0, 0.0, -1.0, 3.0]) for _ in range(2)]
    m = learner.update(segs)
    assert learner.version == steps and m["learner/opt_steps"] == steps


def test_critic_tail_fits_the_critic_after_kl_stop_and_leaves_the_actor_as_without_it():
    """kl_stop ends the actor's steps after the first of 4 x 3 minibatches; with learner.critic_tail the other 11
    minibatches step the (stop-gradient) critic alone: the actor's weights are bit-identical to the run without the
    tail, the version counts only the actor's step, and the critic has moved further."""
    args = ["learner.epochs=4", "learner.minibatches=3", "learner.lr=1e-2", "learner.kl_stop=1e-12"]
    runs = {}
    for tail in (False, True):
        _, learner = make_learner([*args, f"learner.critic_tail={str(tail).lower()}"])
        before = {k: v.clone() for k, v in learner.policy.state_dict().items()}
        m = learner.update([segment([1.0, 0.0, 2.0, 0.0, -1.0, 3.0]) for _ in range(2)])
        runs[tail] = (before, learner.policy.state_dict(), m, learner.version)
    (b0, a0, m0, v0), (b1, a1, m1, v1) = runs[False], runs[True]
    assert v0 == v1 == 1 and m0["learner/opt_steps"] == m1["learner/opt_steps"] == 1
    assert m0["learner/critic_tail_steps"] == 0 and m1["learner/critic_tail_steps"] == 11
    critic = [k for k in a1 if k.startswith("value_head.")]
    assert critic and all(torch.equal(a0[k], a1[k]) for k in a1 if k not in critic)
    moved = [float((a[k] - b[k]).norm()) for (b, a) in ((b0, a0), (b1, a1)) for k in critic[:1]]
    assert moved[1] > moved[0] > 0


def test_critic_tail_needs_kl_stop_and_a_critic_apart_from_the_actor():
    from acce.configlib import ConfigError
    with pytest.raises(ConfigError, match="learner.critic_tail"):
        load(None, ["learner.critic_tail=true"])
    with pytest.raises(ValueError, match="shares the encoder"):
        make_learner(["learner.kl_stop=0.01", "learner.critic_tail=true", "policy.value_stop_gradient=false"])


def test_kl_stop_must_not_be_negative():
    from acce.configlib import ConfigError
    with pytest.raises(ConfigError, match="learner.kl_stop"):
        load(None, ["learner.kl_stop=-0.1"])

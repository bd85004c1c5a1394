"""Frozen features shipped with segments (learner.train_scope=residual): the learner reuses what the inference server
computed, updates exactly as if it had recomputed them, and never uses features of other frozen weights."""
import dataclasses

import numpy as np
import torch

from acce.config import load
from acce.policy.frozen import frozen_stamp
from acce.policy.vla import VLAPolicy
from acce.runtime.learner import Learner
from acce.serving.inference import InferenceServer
from test_runtime import TINY, make_runtime, run_updates, tiny_policy  # noqa: E402 (tests/acce is on sys.path)

RESIDUAL = ["policy.residual_hidden=16", "learner.train_scope=residual", "learner.epochs=2", "learner.minibatches=2",
            "learner.value_warmup_updates=0"]


def collected(n_segments=2):
    """Real segments from the local runtime's worker (its server ships features), and the config."""
    cfg, learner, rt = make_runtime(RESIDUAL)
    try:
        segments = []
        while len(segments) < n_segments:
            segments += rt.workers[0].collect(min_segments=1)
    finally:
        rt.shutdown()
    return cfg, learner, segments[:n_segments]


def fresh_learner(cfg):
    return Learner(tiny_policy(cfg), cfg.learner, seed=0)  # same seed as make_runtime's: identical weights


def without_features(segments, stamp=""):
    return [dataclasses.replace(s, frozen_features=None if not stamp else s.frozen_features, frozen_stamp=stamp)
            for s in segments]


def count_rows(policy, name):
    """Rows that went through policy.<name> (a spy on the instance)."""
    rows, inner = [], getattr(policy, name)

    def spy(batch, *args, **kwargs):
        rows.append(len(batch["instruction"]))
        return inner(batch, *args, **kwargs)
    setattr(policy, name, spy)
    return rows


def test_segments_carry_the_servers_frozen_features_under_the_learners_stamp():
    cfg, learner, segments = collected()
    seg = segments[0]
    assert seg.frozen_stamp == frozen_stamp(fresh_learner(cfg).policy)
    width = cfg.policy.trunk_width
    assert {k: v.shape for k, v in seg.frozen_features.items()} == {"h_action": (len(seg), width),
                                                                     "h_value": (len(seg), width)}
    assert all(v.dtype == np.float32 for v in seg.frozen_features.values())
    # what the server shipped is what the learner would compute: the trunk's output at the action query
    ref = fresh_learner(cfg).policy.eval()
    obs = {**seg.obs, "instruction": seg.instruction, "task_id": seg.task_id, "prefix": seg.prefix,
           "delay_steps": seg.delay_steps.astype(np.int64)}
    with torch.no_grad():
        feats = ref.features(ref.with_lang(obs))
    torch.testing.assert_close(torch.as_tensor(seg.frozen_features["h_action"]), feats["h_action"])


def test_update_from_shipped_features_equals_the_update_that_recomputes_them():
    cfg, _, segments = collected()
    shipped, recomputed = fresh_learner(cfg), fresh_learner(cfg)
    vision_rows = []
    shipped.policy.vision.register_forward_hook(lambda m, inp, out: vision_rows.append(inp[0].shape[0]))
    m_shipped = shipped.update(segments)
    m_recomputed = recomputed.update(without_features(segments))
    assert m_shipped["learner/shipped_features_frac"] == 1.0 and m_recomputed["learner/shipped_features_frac"] == 0.0
    assert m_shipped["learner/opt_steps"] == m_recomputed["learner/opt_steps"] == 4
    moved, start = 0, tiny_policy(cfg).state_dict()
    for (name, a), (_, b) in zip(shipped.policy.named_parameters(), recomputed.policy.named_parameters()):
        # float tolerance, not bit-exact: the server ran the trunk on batches of 2 rows, the recompute on 8 (other
        # summation order in the matmuls, ~1e-7)
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6, msg=name)
        moved += int(not torch.equal(a, start[name]))
    assert moved >= 3  # residual, log_std and critic all learned: equal because both moved alike
    # the cost: vision (and the trunk) ran only for the bootstrap rows, never for the 2 x 4 decisions
    assert sum(vision_rows) == sum(len(s.bootstrap["instruction"]) for s in segments)


def test_features_from_other_frozen_weights_are_recomputed():
    cfg, _, segments = collected()
    learner = fresh_learner(cfg)
    rows = count_rows(learner.policy, "features")
    other = without_features(segments[1:], stamp="another-trunk")  # e.g. shipped before a different warm start
    metrics = learner.update(segments[:1] + other)
    boot = sum(len(s.bootstrap["instruction"]) for s in segments)
    assert rows == [len(other[0]), boot]  # only the mismatched segment's rows, then the bootstrap rows
    assert metrics["learner/shipped_features_frac"] == 0.5
    scope_all = Learner(tiny_policy(cfg), load(None, TINY + ["policy.residual_hidden=16"]).learner, seed=0)
    # train_scope=all: the trunk trains, so shipped features would be stale after its first step: never used
    assert scope_all.update(segments)["learner/shipped_features_frac"] == 0.0


def test_server_restamps_only_when_a_swap_changes_frozen_weights():
    cfg = load(None, TINY + RESIDUAL)
    server = InferenceServer(tiny_policy(cfg), ship_features=True)
    batch = {"image/front": np.zeros((1, 32, 32, 3), np.uint8), "state": np.zeros((1, 7), np.float32),
             "instruction": ["reach"], "task_id": np.zeros(1, np.int64),
             "prefix": np.zeros((1, 4, 4), np.float32), "delay_steps": np.zeros(1, np.int64)}
    first = server.infer(batch)["frozen_stamp"]
    state = server.policy.trainable_state_dict()
    server.load_weights(1, {k: v + 1 if k == "log_std" else v for k, v in state.items()})
    assert server.infer(batch)["frozen_stamp"] == first  # the residual scope's publish: same trunk
    server.load_weights(2, {k: v + 1 if k == "mean_head.bias" else v for k, v in state.items()})
    second = server.infer(batch)["frozen_stamp"]
    assert second != first and second == frozen_stamp(server.policy)


def test_residual_local_run_trains_from_shipped_features_and_async_equals_sync():
    _, learner_s, rt_s = make_runtime(RESIDUAL + ["runtime.mode=sync"])
    _, learner_a, rt_a = make_runtime(RESIDUAL + ["runtime.mode=async", "learner.max_staleness=0"])
    start = {k: v.clone() for k, v in learner_s.policy.state_dict().items()}
    try:
        up_s, up_a = run_updates(rt_s, 2), run_updates(rt_a, 2)
        assert all(u["learner/shipped_features_frac"] == 1.0 for u in up_s + up_a)
        for (name, p_s), (_, p_a) in zip(learner_s.policy.named_parameters(), learner_a.policy.named_parameters()):
            assert torch.equal(p_s, p_a), name
        moved = {k for k, v in learner_s.policy.state_dict().items() if not torch.equal(v, start[k])}
        assert "log_std" in moved and any(k.startswith("residual.") for k in moved)
    finally:
        rt_s.shutdown()
        rt_a.shutdown()


def test_merge_with_shipped_rows_equals_features_for_an_aux_reading_residual():
    """bench_rl's policy shape: the residual reads the keypoint aux estimate, the critic is privileged. Shipped rows
    (including aux) plus recomputed missing rows give exactly features() of the same batch."""
    from acce.policy.frozen import features_with_shipped, shipped
    from acce.policy.vla import VLAPolicy
    from test_policy import CFG, NORM, S, A, make_batch  # noqa: E402
    cfg = dataclasses.replace(CFG, keypoints=3, aux_from="keypoints", aux_input=True, residual_hidden=8)
    torch.manual_seed(0)
    policy = VLAPolicy(cfg, S, A, NORM, aux_dim=4).eval()
    batch = make_batch(policy, b=4)
    with torch.no_grad():
        full = policy.features(batch)
        arrays = {k.split("/", 1)[1]: v for k, v in shipped(full).items()}
        assert set(arrays) == {"h_action", "h_value", "aux"}
        arrays = {k: np.where(np.arange(4)[:, None] == 2, 0.0, v).astype(np.float32) for k, v in arrays.items()}
        merged = features_with_shipped(policy, batch, arrays, np.array([True, True, False, True]))  # 2: recomputed
    shipped_rows = [0, 1, 3]  # bit-exact; row 2 ran the trunk alone (batch of 1: other float summation order)
    for k, v in full.items():
        assert (v is None and merged[k] is None) or torch.equal(v[shipped_rows], merged[k][shipped_rows]), k
        if v is not None:
            torch.testing.assert_close(v[2], merged[k][2], rtol=0, atol=1e-5)
            assert k not in arrays or not torch.equal(merged[k][2], torch.zeros_like(v[2]))  # not the zero filler
    (m_full, s_full, v_full), (m_merged, s_merged, v_merged) = policy.heads(full), policy.heads(merged)
    assert torch.equal(m_full[shipped_rows], m_merged[shipped_rows]) and torch.equal(s_full, s_merged)
    torch.testing.assert_close(v_full, v_merged, rtol=0, atol=1e-5)


def test_a_privileged_critic_bootstraps_without_vision():
    """Bootstrap rows need only values; the privileged critic's read no trunk output, so vision runs for the
    decisions alone (features recomputed here: none shipped)."""
    cfg, _, segments = collected()
    torch.manual_seed(0)
    policy = VLAPolicy(dataclasses.replace(cfg.policy, critic="privileged"), 7, 4, tiny_policy(cfg).norm,
                       privileged_dim=4)
    vision_rows = []
    policy.vision.register_forward_hook(lambda m, inp, out: vision_rows.append(inp[0].shape[0]))
    Learner(policy, cfg.learner, seed=0).update(without_features(segments))
    assert sum(vision_rows) == sum(len(s) for s in segments)  # not one bootstrap row

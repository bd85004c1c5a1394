"""Frozen features shipped with segments (learner.train_scope=residual): the learner reuses what the inference server
computed, updates exactly as if it had recomputed them, and never uses features of other frozen weights."""
import dataclasses

import numpy as np
import torch

from acce.config import load
from acce.policy.frozen import frozen_stamp
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

"""learner.anchor_tasks / anchor_coef: the residual's correction is held at the warm start on the named tasks only."""
import numpy as np
import pytest
import torch

from acce.config import ConfigError, load
from acce.runtime.learner import collate
from acce.task_names import task_id
from test_learner import make_learner, segment  # noqa: E402  (tests/acce is on sys.path under pytest's rootdir mode)

RESIDUAL = ["policy.residual_hidden=16", "learner.train_scope=residual", "learner.lr=3e-3"]


def tagged(rewards, task):
    seg = segment(rewards)
    seg.task_id[:] = task_id(task)
    seg.instruction = [f"{task} the thing"] * len(seg)  # the tasks must look different for the residual to tell them
    seg.obs["state"] = np.full_like(seg.obs["state"], 2.0 * task_id(task) - 5.0)  # (it reads the state directly)
    seg.obs["image/front"] = np.random.default_rng(task_id(task)).integers(0, 255, seg.obs["image/front"].shape,
                                                                           np.uint8)
    seg.bootstrap["task_id"] = np.full_like(np.asarray(seg.bootstrap["task_id"]), task_id(task))
    return seg


def batch_of(tasks):
    return [tagged([1, 0, 1, 0], tasks[0]), tagged([0, 1, 0, 1], tasks[1])]


def residual_kl_by_hand(learner, segments, task):
    """0.5 (r / σ)² summed over action dims, averaged over the task's decisions and chunk positions, where r is the
    residual's output (the policy's mean minus the cloned head's)."""
    data = collate(segments)
    pol = learner.policy.eval()
    with torch.no_grad():
        feats = pol.features(pol.with_lang(data["inputs"]))
        mean, log_std, _ = pol.heads(feats)
        base = pol.mean_head(feats["h_action"]).view(mean.shape)
    rows = torch.as_tensor(data["inputs"]["task_id"] == task_id(task))
    r = (mean - base)[rows].double()
    return float((0.5 * (r / log_std.double().exp()) ** 2).sum(-1).mean())


def test_anchor_kl_is_the_residual_in_noise_units_on_the_named_tasks_only():
    _, learner = make_learner([*RESIDUAL, "learner.anchor_tasks=[reach]", "learner.anchor_coef=1.0"])
    first = learner.update(batch_of(["reach", "push"]))
    assert first["loss/anchor_kl"] == pytest.approx(0.0, abs=1e-9)  # version 0: the residual is zero
    assert first["learner/anchored_frac"] == pytest.approx(0.5)
    probe = batch_of(["reach", "push"])
    expected = residual_kl_by_hand(learner, probe, "reach")
    assert expected > 0
    # one epoch, one minibatch: the stat is taken before the step, from the same parameters as by hand
    assert learner.update(probe)["loss/anchor_kl"] == pytest.approx(expected, rel=1e-4)
    only_push = learner.update(batch_of(["push", "push"]))
    assert only_push["loss/anchor_kl"] == 0.0 and only_push["learner/anchored_frac"] == 0.0


def test_anchor_holds_the_anchored_task_at_the_warm_start():
    """Same data and seed with and without the anchor: the residual on reach's decisions stays far smaller with it.
    (This toy's residual tells the tasks apart by one state value, so the pull also shrinks push's; the first test
    checks that only reach's decisions enter the term.)"""
    moved = {}
    for over in ([], ["learner.anchor_tasks=[reach]", "learner.anchor_coef=1.0"]):
        _, learner = make_learner([*RESIDUAL, *over])
        for k in range(8):
            learner.update([tagged([1, 0, 1, k % 2], "reach"), tagged([0, 1, k % 2, 1], "push")])
        probe = batch_of(["reach", "push"])
        moved[bool(over)] = (residual_kl_by_hand(learner, probe, "reach"), residual_kl_by_hand(learner, probe, "push"))
    assert moved[False][0] > 1.0 and moved[True][0] < 0.01 * moved[False][0]
    assert "loss/anchor_kl" not in make_learner(RESIDUAL)[1].update(batch_of(["reach", "push"]))


@pytest.mark.parametrize("over, match", [
    (["learner.anchor_tasks=[reach]"], "go together"),
    (["learner.anchor_coef=1.0"], "go together"),
    (["learner.anchor_tasks=[reach]", "learner.anchor_coef=1.0"], "train_scope=residual"),
    (["policy.residual_hidden=16", "learner.train_scope=residual", "learner.algorithm=td3",
      "learner.anchor_tasks=[reach]", "learner.anchor_coef=1.0"], "td3 keeps its residual"),
    (["policy.residual_hidden=16", "learner.train_scope=residual", "learner.anchor_tasks=[reachh]",
      "learner.anchor_coef=1.0"], "unknown task"),
])
def test_anchor_config_errors(over, match):
    with pytest.raises(ConfigError, match=match):
        load(None, over)

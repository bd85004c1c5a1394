"""Aux probe (acce/runtime/aux_probe.py): the read-out math by hand, the phase windows, and the hook in the Evaluator."""
import numpy as np
import pytest
import torch

from acce.runtime.aux_probe import AuxProbe, format_probe, linear_readout
from acce.runtime.evaluator import Evaluator

from test_evaluator import FakeServer, FakeVecEnv, H  # noqa: E402 (tests/acce is on sys.path)


def test_linear_readout_by_hand():
    # an affine copy of the truth is read out exactly: R² 1, no error left
    assert linear_readout([0.0, 1.0, 2.0, 3.0], [1.0, 3.0, 5.0, 7.0]) == pytest.approx((1.0, 0.0))
    # a constant prediction explains nothing: the error left is the truth's own spread, sqrt(1.25)
    assert linear_readout([0.0, 1.0, 2.0, 3.0], [5.0, 5.0, 5.0, 5.0]) == pytest.approx((0.0, np.sqrt(1.25)))
    # truth 0,0,1,1 against 0,1,0,1: the best line is flat at 0.5, so R² 0 and every row is 0.5 off
    assert linear_readout([0.0, 0.0, 1.0, 1.0], [0.0, 1.0, 0.0, 1.0]) == pytest.approx((0.0, 0.5))
    # truth 0,1,2,3 against 0,0,3,3: line 0.5 + 2/3 x gives residuals -0.5, 0.5, -0.5, 0.5 -> R² = 1 - 0.25 / 1.25
    assert linear_readout([0.0, 1.0, 2.0, 3.0], [0.0, 0.0, 3.0, 3.0]) == pytest.approx((0.8, 0.5))
    r2, _ = linear_readout([2.0, 2.0, 2.0], [0.0, 1.0, 2.0])
    assert np.isnan(r2)  # nothing to explain
    with pytest.raises(ValueError, match="equal 1-d"):
        linear_readout([0.0, 1.0], [0.0])


class FakeAuxPolicy:
    """An aux head that reads the object's x exactly (times 10) and knows nothing else (zeros)."""
    aux_dim = 4

    def with_lang(self, batch):
        return batch

    def forward(self, batch, return_aux=False):
        x = torch.as_tensor(np.asarray(batch["state"])[:, 0], dtype=torch.float32)
        aux = torch.zeros(len(x), 4)
        aux[:, 0] = 10.0 * x
        return None, None, None, aux


def test_probe_splits_by_phase_and_reads_each_label_alone():
    probe = AuxProbe(FakeAuxPolicy())
    rng = np.random.default_rng(0)
    for t in (0, 0, 0, 5, 5, 30, 30, 30, 60, 60, 60, 120, 120, 120):
        labels = rng.normal(size=(2, 4))
        state = np.c_[labels[:, 0], np.zeros((2, 2))]
        probe("push", [t, t], {"aux": labels}, {"state": state})
    report = probe.report()["push"]
    assert report["object x"]["all"]["r2"] == pytest.approx(1.0) and report["object x"]["all"]["n"] == 28
    assert report["object x"]["all"]["rmse_cm"] == pytest.approx(0.0, abs=1e-4)  # float32 head
    assert report["goal y"]["all"]["r2"] == pytest.approx(0.0, abs=1e-9)  # a zero output explains nothing
    assert {k: v["n"] for k, v in report["object x"].items()} == {
        "t = 0": 6, "t 1-24": 4, "t 25-49": 6, "t 50-99": 6, "t >= 100": 6, "all": 28}
    text = format_probe(probe.report())
    assert "aux probe push" in text and "object x" in text and "t >= 100" in text


def test_probe_refuses_a_policy_without_aux_head_and_envs_without_labels():
    class NoAux:
        aux_dim = 0
    with pytest.raises(ValueError, match="no aux head"):
        AuxProbe(NoAux())
    with pytest.raises(ValueError, match="aux_labels=True"):
        AuxProbe(FakeAuxPolicy())("push", [0], {"state": np.zeros((1, 3))}, {"state": np.zeros((1, 3))})


def test_evaluator_calls_the_probe_at_every_decision_with_the_control_step():
    class LabelledEnv(FakeVecEnv):
        def observe(self, idx):
            obs = super().observe(idx)
            obs["aux"] = np.tile(self.t[list(idx)][:, None].astype(np.float32), (1, 4))  # label = step
            return obs

    calls = []
    server = FakeServer()
    ev = Evaluator(lambda tasks, n, **kw: LabelledEnv(n, kw["episode_seeds"]), server, tasks=["reach"], episodes=6,
                   num_envs=2, chunk_len=H, exec_horizon=2,
                   probe=lambda task, steps, batch, req: calls.append((task, list(steps), batch["aux"][:, 0].tolist())))
    ev.run("val")
    assert len(calls) == server.calls > 0
    # the steps handed to the probe are the deciding envs' control steps since their reset
    assert all(task == "reach" and steps == labels for task, steps, labels in calls)
    assert any(0 in steps for _, steps, _ in calls) and any(s >= 2 for _, steps, _ in calls for s in steps)

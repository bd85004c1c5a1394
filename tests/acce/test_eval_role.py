"""EvaluatorRole (acce/runtime/eval_role.py) with counting fakes: one evaluation per tick, drained in order, and the
driver's evaluate() going through it."""
import dataclasses

import pytest

from acce.runtime.eval_role import EvalResult, EvaluatorRole
from acce.runtime.roles import Role


class CountingFactory:
    """make_evaluator fake: records what each built evaluator was asked to run; results name their request."""

    def __init__(self):
        self.built, self.runs = [], []

    def __call__(self, policy_state, version, split):
        self.built.append((policy_state["tag"], version, split))
        factory = self

        class FakeEvaluator:
            def run(self, seed_split, instructions=("heldout",), video=False):
                factory.runs.append((version, seed_split, tuple(instructions), video))
                return {"per_task": {f"reach/{seed_split}": {"task": "reach", "split": "heldout",
                                                             "success_rate": version / 10, "mean_return": -1.0}},
                        "videos": {}, "seed_split": seed_split, "tag": policy_state["tag"]}
        return FakeEvaluator()


def test_submitted_evaluations_run_one_per_tick_and_drain_in_order():
    make = CountingFactory()
    role = EvaluatorRole(make, instructions=("heldout", "train"))
    assert not role.tick() and make.runs == [] and role.drain() == ()  # nothing pending: idle
    role.submit({"tag": "a"}, 4, "val", video=True)
    role.submit({"tag": "b"}, 8, "test")
    assert make.runs == []  # submitting runs nothing
    assert role.tick() and make.runs == [(4, "val", ("heldout", "train"), True)]
    assert role.tick() and len(make.runs) == 2 and make.runs[1] == (8, "test", ("heldout", "train"), False)
    assert not role.tick() and len(make.runs) == 2  # both done: idle again
    assert make.built == [("a", 4, "val"), ("b", 8, "test")]
    done = role.drain()
    assert [(r.version, r.split, r.results["tag"]) for r in done] == [(4, "val", "a"), (8, "test", "b")]
    assert all(isinstance(r, EvalResult) for r in done) and role.drain() == ()  # drained once
    with pytest.raises(dataclasses.FrozenInstanceError):
        done[0].version = 5
    assert role.state() == {}


def test_a_split_that_is_not_a_seed_split_is_refused_at_submit():
    make = CountingFactory()
    role = EvaluatorRole(make)
    with pytest.raises(ValueError, match="split must be one of"):
        role.submit({"tag": "a"}, 0, "train")
    assert not role.tick() and make.built == []


def test_the_evaluator_role_meets_the_protocol():
    assert isinstance(EvaluatorRole(CountingFactory()), Role)


def test_the_trainer_evaluates_through_its_role(tmp_path):
    from acce.config import load
    from acce.train import Trainer

    cfg = load("configs/debug.yaml", [f"run.out_dir={tmp_path}", "eval.every_versions=2", "train.select_on_val=true"])
    trainer = Trainer(cfg, progress=False)
    assert isinstance(trainer.evaluator, EvaluatorRole)
    make = CountingFactory()
    trainer.evaluator = EvaluatorRole(make, instructions=tuple(cfg.eval.instructions))
    try:
        results = trainer.evaluate({"tag": "v6"}, 6, video=True, split="val")
        trainer.evaluate({"tag": "v7"}, 7, video=False, split="test")
    finally:
        trainer.metrics.close()
    assert make.built == [("v6", 6, "val"), ("v7", 7, "test")]
    assert [r[3] for r in make.runs] == [cfg.eval.video, False]  # video only where eval.video allows it
    assert results["tag"] == "v6" and "videos" not in results  # the role's results, videos gone to TensorBoard
    assert [(h["version"], h["split"], h[f"eval/success/reach/{h['split']}"]) for h in trainer.history] == \
        [(6, "val", 0.6), (7, "test", 0.7)]
    assert trainer.selected["version"] == 6 and trainer.selected["val_success"] == 0.6  # select_on_val saw it
    assert trainer.evaluator.drain() == ()  # evaluate() drained what it ran

"""EvaluatorRole (acce/runtime/eval_role.py) with counting fakes: one evaluation per tick, drained in order, and the
driver's evaluate() going through it, in place or on a thread beside the loop (eval.background)."""
import dataclasses

import pytest

from acce.runtime.eval_role import EvalResult, EvalThread, EvaluatorRole
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


class GatedFactory(CountingFactory):
    """CountingFactory whose evaluations wait for `release` (a test controls when a background evaluation ends);
    a policy_state tagged 'boom' raises inside the evaluation."""

    def __init__(self):
        super().__init__()
        import threading
        self.release, self.started = threading.Event(), threading.Event()

    def __call__(self, policy_state, version, split):
        inner = super().__call__(policy_state, version, split)
        factory = self

        class Gated:
            def run(self, seed_split, instructions=("heldout",), video=False):
                factory.started.set()
                assert factory.release.wait(10.0), "the test never released the evaluation"
                if policy_state["tag"] == "boom":
                    raise ValueError("evaluation blew up")
                return inner.run(seed_split, instructions, video)
        return Gated()


def test_a_background_thread_runs_evaluations_while_the_driver_goes_on():
    make = GatedFactory()
    role = EvaluatorRole(make)
    ticker = EvalThread(role, idle_sleep_s=0.01)
    try:
        role.submit({"tag": "a"}, 4, "val", context={"env_steps": 123})
        assert make.started.wait(5.0)  # the thread took it ...
        assert role.busy and role.drain() == ()  # ... and the driver is not waiting for it
        make.release.set()
        ticker.wait_idle(timeout_s=5.0)
        assert not role.busy
        (done,) = role.drain()
        assert (done.version, done.split, done.results["tag"]) == (4, "val", "a")
        assert done.context == {"env_steps": 123} and done.policy_state == {"tag": "a"}  # handed back unchanged
        role.submit({"tag": "b"}, 8, "val")
        ticker.wait_idle(timeout_s=5.0)
        assert [r.version for r in role.drain()] == [8]
    finally:
        ticker.close(timeout_s=5.0)
    assert not ticker._thread.is_alive()


def test_a_failed_background_evaluation_is_raised_in_the_driver():
    make = GatedFactory()
    make.release.set()
    role = EvaluatorRole(make)
    ticker = EvalThread(role, idle_sleep_s=0.01)
    try:
        role.submit({"tag": "boom"}, 4, "val")
        with pytest.raises(RuntimeError, match="background evaluation failed.*blew up"):
            ticker.wait_idle(timeout_s=5.0)
        with pytest.raises(RuntimeError, match="blew up"):
            ticker.check()  # and every later check, until the driver stops
        assert not role.busy  # the failed one is not left counted as running
    finally:
        ticker.close(timeout_s=5.0)


@pytest.mark.slow
def test_background_evaluation_keeps_the_history_in_order_and_the_final_in_place(tmp_path, monkeypatch):
    """A real run (debug preset, local runtime) with eval.background: periodic validation rows arrive from the
    thread with the env steps of their submission, in order; version 0 and the final test run in place."""
    import json
    import acce.runtime.eval_role as eval_role
    from acce.cli import main

    import threading
    ticked = []  # versions the thread evaluated (none if the run evaluated everything in place)

    class CountingThread(eval_role.EvalThread):
        def __init__(self, role, **kw):
            tick = role.tick
            role.tick = lambda: bool(role.pending) and (threading.current_thread() is not self._thread or not
                                                         ticked.append(role.pending[0].version)) and tick()
            super().__init__(role, **kw)
    monkeypatch.setattr(eval_role, "EvalThread", CountingThread)
    assert main(["train", "--config", "configs/debug.yaml", f"run.out_dir={tmp_path}", "run.name=bg",
                 "runtime.kind=local", "eval.every_versions=2", "eval.background=true", "train.select_on_val=true",
                 "--quiet"]) == 0
    s = json.loads((tmp_path / "bg" / "summary.json").read_text())
    val = [h for h in s["history"] if h["split"] == "val"]
    test = [h for h in s["history"] if h["split"] == "test"]
    assert val[0]["version"] == 0 and len(val) >= 3 and val[-1]["version"] == s["learner_version"]
    assert [h["version"] for h in val] == sorted({h["version"] for h in val})  # one per version, in order
    steps = [h["env_steps"] for h in val]
    assert steps == sorted(steps) and steps[-1] <= s["env_steps"]
    assert [h["version"] for h in test] == [0, s["test"]["final_version"]]
    assert ticked and ticked == [h["version"] for h in val[1:len(ticked) + 1]]  # the periodic ones: the thread's

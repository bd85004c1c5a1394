"""train.job_max_wall_s: the whole job's wall-clock budget ends RL early enough for the final evaluations."""
import json
import time

from acce.cli import main
from acce.config import load


def _trainer(tmp_path, *overrides):
    from acce.train import Trainer
    return Trainer(load("configs/debug.yaml", [f"run.out_dir={tmp_path}", *overrides]), progress=False)


def test_the_job_budget_leaves_the_final_evaluations_the_time_version_0s_took(tmp_path):
    trainer = _trainer(tmp_path, "train.job_max_wall_s=100", "train.max_versions=0")
    trainer.counters["start_evals_s"] = 6.0
    trainer.job_t0 = time.time() - 90.0  # 90 s in + 6 s of final evaluations = 96 < 100: go on
    assert trainer._budget_done(elapsed=50.0, version=10) == ""
    trainer.job_t0 = time.time() - 95.0  # 95 + 6 = 101 >= 100: stop now
    assert trainer._budget_done(elapsed=50.0, version=10) == "job_max_wall_s"
    trainer.metrics.close()


def test_the_budget_that_ran_out_is_named_and_the_first_one_sticks(tmp_path):
    trainer = _trainer(tmp_path, "train.max_wall_s=60", "train.max_versions=8", "train.job_max_wall_s=0")
    assert trainer._budget_done(elapsed=59.0, version=7) == ""
    assert trainer._budget_done(elapsed=59.0, version=8) == "max_versions"
    assert trainer._budget_done(elapsed=60.0, version=8) == "max_wall_s"  # both spent: the wall-clock is named
    assert not trainer._stop("") and trainer.stop_reason == ""
    assert trainer._stop("max_versions") and trainer._stop("max_wall_s")
    assert trainer.stop_reason == "max_versions"
    trainer.metrics.close()


def test_a_spent_job_budget_still_evaluates_the_final_and_says_why_rl_ended(tmp_path):
    run = tmp_path / "run"
    # 1 s is spent before RL starts: RL must end at its first check, not at max_versions, and still report
    assert main(["train", "--config", "configs/debug.yaml", f"run.out_dir={tmp_path}", "run.name=run",
                 "runtime.kind=local", "train.max_versions=10000", "train.job_max_wall_s=1", "--quiet"]) == 0
    s = json.loads((run / "summary.json").read_text())
    assert s["stop_reason"] == "job_max_wall_s"
    assert s["learner_version"] < 10000
    assert set(s["phase_wall_s"]) == {"warm_start", "start_evals", "rl", "final_evals"}
    assert s["test"]["v0_version"] == 0 and "final" in s["test"]  # version 0 and the final, both on test seeds


def test_without_a_job_budget_the_train_budget_ends_rl(tmp_path):
    run = tmp_path / "run"
    assert main(["train", "--config", "configs/debug.yaml", f"run.out_dir={tmp_path}", "run.name=run",
                 "runtime.kind=local", "--quiet"]) == 0
    s = json.loads((run / "summary.json").read_text())
    assert s["stop_reason"] == "max_versions" and s["learner_version"] >= 6


def test_a_negative_budget_is_one_clear_error():
    import pytest
    from acce.configlib import ConfigError
    with pytest.raises(ConfigError, match=r"train.job_max_wall_s must be >= 0"):
        load("configs/debug.yaml", ["train.job_max_wall_s=-5"])

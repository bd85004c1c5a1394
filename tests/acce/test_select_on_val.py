"""train.select_on_val: early stopping on validation seeds (the reported final is the best validation version)."""
import json

import pytest
import torch

from acce.checkpoint import load_checkpoint
from acce.cli import main
from acce.config import load
from acce.configlib import ConfigError


def test_the_best_validation_version_is_kept_later_on_ties_and_copied(tmp_path):
    from acce.train import Trainer

    cfg = load("configs/debug.yaml", [f"run.out_dir={tmp_path}", "eval.every_versions=2", "train.select_on_val=true"])
    trainer = Trainer(cfg, progress=False)
    states = {v: {"weights": torch.full((2,), float(v))} for v in (0, 10, 20, 30)}
    for version, val in ((0, 0.5), (10, 0.7), (20, 0.7), (30, 0.6)):
        trainer._consider(states[version], version, val)
    assert trainer.selected["version"] == 20 and trainer.selected["val_success"] == 0.7  # tie: the later one
    states[20]["weights"].add_(1.0)  # the live weights move on; the kept copy must not
    assert torch.equal(trainer.selected["policy"]["weights"], torch.full((2,), 20.0))
    trainer.metrics.close()


def test_select_on_val_needs_periodic_validation():
    with pytest.raises(ConfigError, match="eval.every_versions"):
        load("configs/debug.yaml", ["train.select_on_val=true", "eval.every_versions=0"])


@pytest.mark.slow
def test_the_reported_final_is_the_selected_version(tmp_path, monkeypatch):
    from acce.train import Trainer

    # the debug policy scores the same on every validation evaluation, which would select the last version anyway:
    # make version 0 the best so that reporting the last version instead is caught
    consider = Trainer._consider
    monkeypatch.setattr(Trainer, "_consider", lambda self, state, version, val: consider(
        self, state, version, 1.0 if version == 0 else 0.0))
    run = tmp_path / "run"
    assert main(["train", "--config", "configs/debug.yaml", f"run.out_dir={tmp_path}", "run.name=run",
                 "runtime.kind=local", "eval.every_versions=2", "train.select_on_val=true", "--quiet"]) == 0
    s = json.loads((run / "summary.json").read_text())
    val = [h["version"] for h in s["history"] if h["split"] == "val"]
    assert val[0] == 0 and len(val) >= 3 and val[-1] == s["learner_version"] > 0  # v0, periodic, the curve's end
    chosen = s["test"]["selected_on_val"]
    assert chosen == {"version": 0, "val_success": 1.0, "last_version": s["learner_version"]}
    tests = [h for h in s["history"] if h["split"] == "test"]
    assert [h["version"] for h in tests] == [0, chosen["version"]] and s["test"]["final_version"] == chosen["version"]
    # selected.pt holds that version's policy and evaluates from the command line; latest.pt stays the last version
    sel = load_checkpoint(run / "checkpoints" / "selected.pt")
    assert sel["learner"]["version"] == chosen["version"]
    assert load_checkpoint(run)["learner"]["version"] == s["learner_version"]
    out = tmp_path / "eval.json"
    assert main(["eval", "--checkpoint", str(run / "checkpoints" / "selected.pt"), "--episodes", "2",
                 "--out", str(out)]) == 0
    assert json.loads(out.read_text())["checkpoint_version"] == chosen["version"]

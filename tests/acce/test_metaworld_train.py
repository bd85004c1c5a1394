"""Meta-World tasks through the training path: presets keep the aux path and the privileged critic (Meta-World records
aux labels), the policy and demo store take the env's sizes, and a tiny run warm-starts from Meta-World's scripted
policy, cloning its aux head, and evaluates."""
import json

import pytest

from acce.config import load
from acce.configlib import ConfigError
from acce.wiring import env_spec, fit_aux

MW = "metaworld/reach-v3"


def test_presets_keep_the_aux_path_for_metaworld(capsys):
    from acce.task_names import has_aux_labels
    assert has_aux_labels(MW) and has_aux_labels("reach") and not has_aux_labels("metaworld/reech-v3")
    for preset in ("configs/default.yaml", "configs/debug.yaml", None):
        cfg = load(preset, [f"env.tasks=[{MW}]"])
        assert fit_aux(cfg) is cfg  # the aux loss and aux input stay as the preset set them
    cfg = load("configs/default.yaml", [f"env.tasks=[{MW}]"])
    assert cfg.bc.aux_loss_coef > 0 and cfg.policy.aux_input
    assert capsys.readouterr().out == ""  # no "no aux labels" line
    # the privileged critic reads the same labels: a Meta-World config with it loads
    assert load(None, [f"env.tasks=[{MW}]", "policy.critic=privileged"]).policy.critic == "privileged"


def test_tasks_without_labels_still_turn_aux_off_with_one_line(capsys, monkeypatch):
    """The switch stays for a task the sim cannot label (none today: pretend reach-v3 is one)."""
    import acce.config
    import acce.task_names
    for module in (acce.task_names, acce.config):  # acce.config holds its own reference
        monkeypatch.setattr(module, "has_aux_labels", lambda name: name != MW)
    cfg = load("configs/default.yaml", [f"env.tasks=[{MW}]", "policy.critic=trunk"])  # the preset's critic needs labels
    fitted = fit_aux(cfg)
    assert fitted.bc.aux_loss_coef == 0 and not fitted.policy.aux_input
    assert fitted.policy.keypoints == cfg.policy.keypoints and fitted.env == cfg.env  # nothing else changes
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1 and MW in lines[0] and "bc.aux_loss_coef" in lines[0] and "aux_input" in lines[0]
    # half-way (only the loss off) is fine too: the rest is switched off the same way
    assert not fit_aux(load("configs/default.yaml", [f"env.tasks=[{MW}]", "bc.aux_loss_coef=0",
                                                     "policy.critic=trunk"])).policy.aux_input
    assert capsys.readouterr().out.endswith(f"{MW}: policy.aux_input true -> false\n")
    with pytest.raises(ConfigError, match="privileged labels"):
        load(None, [f"env.tasks=[{MW}]", "policy.critic=privileged"])


def test_mixing_tabletop_and_metaworld_is_one_config_error():
    with pytest.raises(ConfigError, match=r"mixes tabletop tasks \['reach'\] with Meta-World.*separate runs"):
        fit_aux(load("configs/default.yaml", [f"env.tasks=[reach,{MW}]"]))
    with pytest.raises(ConfigError, match="separate runs"):  # aux off: still no shared state size / control rate
        fit_aux(load(None, [f"env.tasks=[reach,{MW}]", "bc.aux_loss_coef=0", "policy.aux_input=false"]))
    with pytest.raises(ConfigError, match="unknown task"):
        load(None, ["env.tasks=[metaworld/reech-v3]"])


def test_policy_takes_the_env_sizes():
    import numpy as np

    from acce.train import build_policy
    cfg = fit_aux(load("configs/debug.yaml", [f"env.tasks=[{MW}]"]), verbose=False)
    spec = env_spec(cfg)
    assert (spec.state_dim, spec.action_dim, spec.control_hz, spec.max_step_m) == (4, 4, 80.0, 0.01)
    policy = build_policy(cfg, np.zeros((3, 4), np.float32), spec=spec)
    assert (policy.state_dim, policy.action_dim, policy.aux_dim) == (4, 4, 4)  # the aux head learns object/goal xy
    assert policy.norm.action_repr["control_hz"] == 80.0 and policy.norm.action_repr["max_step_m"] == 0.01


@pytest.mark.slow
def test_tiny_metaworld_train_warm_starts_and_evaluates(tmp_path, capsys):
    """debug preset, local runtime: scripted demos with aux labels + one DAgger round -> RL -> test evaluations, then
    acce eval (whose envs record no labels)."""
    from acce.cli import main
    from acce.store.episodes import EpisodeStore
    run = tmp_path / "mw"
    assert main(["train", "--config", "configs/debug.yaml", f"env.tasks=[{MW}]", f"run.out_dir={tmp_path}",
                 "run.name=mw", "runtime.kind=local", "runtime.driver_threads=1", "bc.episodes=2", "bc.steps=2",
                 "bc.dagger_episodes=1", "train.max_versions=2", "eval.episodes_per_task=2", "eval.video=false",
                 f"env.task_params={{{MW}: {{max_steps: 60}}}}", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "no aux labels" not in out
    summary = json.loads((run / "summary.json").read_text())
    assert summary["learner_version"] >= 2 and summary["env_steps"] > 0
    assert set(summary["bc"]["dagger_round1_success"]) == {MW}  # DAgger labels came from the scripted policy
    assert summary["history"][-1]["version"] == summary["learner_version"]  # the final evaluation
    assert summary["eval"] and all(cell["task"] == MW and cell["n"] > 0 for cell in summary["eval"].values())
    demos = EpisodeStore.open(run / "demos.zarr")
    assert (demos.schema.state_dim, demos.schema.action_dim, demos.schema.aux_dim) == (4, 4, 4)
    assert demos[0].task_id == 140 and demos[0].is_success  # the expert solves reach in ~50 of the 60 steps
    assert demos[0].obs["aux"].shape == (demos[0].num_steps + 1, 4)  # one label row per frame, final one included
    assert main(["eval", "--checkpoint", str(run), "--task", MW, "--episodes", "2", "--out",
                 str(tmp_path / "eval.json")]) == 0
    cells = json.loads((tmp_path / "eval.json").read_text())["per_task"].values()
    assert cells and all(cell["task"] == MW and cell["n"] == 2 for cell in cells)

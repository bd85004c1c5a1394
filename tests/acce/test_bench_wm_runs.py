"""Orchestration of `acce bench wm` with a counting fake Trainer (no training): the arms and their overrides, steps
to a success level with censoring, success at real-env-step budgets, and world-model quality in the result."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

import acce.bench.wm as wm_bench
from test_bench_runs import FakeTrainer, fake_trainer  # noqa: F401  (the shared counting fake and its fixture)

def _history(*points):
    return [{"env_steps": s, "wall_s": s / 100, "eval/success/reach/val": r, "eval/success/push/val": p}
            for s, r, p in points]


def test_steps_to_target_and_censoring():
    hist = _history((0, 0.5, 0.0), (1000, 0.8, 0.1), (2000, 0.9, 0.3))
    assert wm_bench.steps_to_target(hist, "reach", 0.8) == (1000, 10.0)
    assert wm_bench.steps_to_target(hist, "push", 0.8) == (None, None)
    runs = {"model_free": [{"steps_to_target": {"reach": 3000}, "wall_to_target_s": {"reach": 30.0},
                            "final_success": {"reach": 0.8}},
                           {"steps_to_target": {"reach": None}, "wall_to_target_s": {"reach": None},
                            "final_success": {"reach": 0.5}}],
            "online": [{"steps_to_target": {"reach": 1000}, "wall_to_target_s": {"reach": 12.0},
                        "final_success": {"reach": 0.9}},
                       {"steps_to_target": {"reach": 1500}, "wall_to_target_s": {"reach": 14.0},
                        "final_success": {"reach": 0.85}}]}
    table = wm_bench.summarize(runs, ["reach"], budget_steps=5000)
    assert table["model_free/reach"]["steps_mean"] == 4000  # (3000 + budget 5000) / 2, censored
    assert table["model_free/reach"]["reached"] == "1/2" and table["model_free/reach"]["censored"]
    assert table["online/reach"]["ratio_model_free_over_this"] == pytest.approx(4000 / 1250)
    assert table["online/reach"]["ratio_is_bound"]  # a censored arm makes the ratio a lower bound
    assert table["online/reach"]["wall_to_target_s_mean"] == pytest.approx(13.0)


TWO_TASKS = ["env.tasks=[reach,push]"]
"""the preset benchmarks push alone; two tasks exercise the per-task tables"""


def load_cfg():
    from acce.config import load
    return load("configs/bench_wm.yaml", TWO_TASKS + ["imagination.num_workers=0", "imagination.imagined_fraction=0"])


def _fake_wm_eval(recall_of):
    """A wm_eval result whose success recall is recall_of(checkpoint path); every other figure fixed."""
    def evaluate(checkpoint, data, out_json):
        res = {"wm_version": 7, "horizons": {str(h): {"n": 10, "image_psnr_db": 30.0 - h, "state_rmse": 0.01 * h,
                                                      "reward_mae": 0.1 * h} for h in (1, 4, 16)},
               "success_head": {"precision": 0.5, "recall": recall_of(str(checkpoint)), "positives": 4, "n": 40}}
        out_json.write_text(json.dumps(res))
        return res
    return evaluate


def _fake_store(argv):
    """What `acce collect --out PATH` leaves for the config check of imagination.wm_replay_from: a store's zarr.json."""
    out = Path(argv[argv.index("--out") + 1])
    out.mkdir(parents=True)
    (out / "zarr.json").write_text("{}")


@pytest.fixture
def fake_quality(monkeypatch):
    """No held-out recording (it would run the simulator); wm_eval results from _fake_wm_eval: recall 0.25 for the
    pretrained model before RL, 0.5 for an online run's and 0.75 for a pretrained run's model at its end."""
    recorded = []
    monkeypatch.setattr(wm_bench, "record_heldout", lambda config, tasks, n, out, aux_labels=False:
                        recorded.append((tasks, n, aux_labels)) or out)
    monkeypatch.setattr(wm_bench, "evaluate_model", _fake_wm_eval(
        lambda ckpt: 0.25 if "wm_pretrained" in ckpt else 0.75 if "pretrained_s" in ckpt else 0.5))
    return recorded


def test_wm_bench_arms_and_pretraining(fake_trainer, monkeypatch, tmp_path, fake_quality):
    calls, argvs = [], []

    def fake_main(argv):
        calls.append(argv[0])
        argvs.append(argv)
        if argv[0] == "collect":
            _fake_store(argv)
        if argv[0] == "wm-pretrain":
            out = tmp_path / "wm_pretrained"
            out.mkdir()
            (out / "worldmodel.pt").write_bytes(b"x")
        return 0
    monkeypatch.setattr("acce.cli.main", fake_main)

    def outcome(cfg):
        fast = 1000 if cfg.imagination.wm_init_from else 2000 if cfg.imagination.enabled else 4000
        hist = _history((0, 0.5, 0.5), (fast, 0.85, 0.9))
        return {"env_steps": fast, "wall_s": 1.0, "imagination": None, "history": hist,
                "eval": {"reach/test": {"success_rate": 0.85}, "push/test": {"success_rate": 0.9}}}
    fake_trainer.outcome = staticmethod(outcome)
    (tmp_path / "model_free_s1").mkdir()  # finished by an interrupted bench: reused, not run again
    (tmp_path / "model_free_s1" / "summary.json").write_text(json.dumps(
        {**outcome(load_cfg()), "history": _history((0, 0.5, 0.5), (4000, 0.85, 0.9))}))
    out = wm_bench.run_wm_bench("configs/bench_wm.yaml", TWO_TASKS, seeds=(0, 1), warm_start="ws.pt",
                                workdir=str(tmp_path))
    assert calls == ["collect", "wm-pretrain"]
    # the preset's critic is privileged: the offline data carries aux labels, so the pretrained model gets an aux head
    assert "--aux-labels" in argvs[0] and fake_quality[0][2]
    assert len(fake_trainer.made) == 3 * 2 - 1  # no warm start trained (one was given), one run reused
    # the arms take turns going first: seed 0 model-free first, seed 1 online first (model_free_s1 was reused)
    assert [c.run.name for c in fake_trainer.made] == ["model_free_s0", "online_s0", "pretrained_s0", "online_s1",
                                                       "pretrained_s1"]
    assert [r["order"] for r in out["runs"]["model_free"]] == [0, 2]
    by_arm = {}
    for c in fake_trainer.made:
        by_arm.setdefault(c.run.name.rsplit("_s", 1)[0], []).append(c)
    assert not by_arm["model_free"][0].imagination.enabled
    assert by_arm["online"][0].imagination.enabled and not by_arm["online"][0].imagination.wm_init_from
    assert by_arm["pretrained"][0].imagination.wm_init_from.endswith("wm_pretrained")
    # the pretrained arm's fine-tuning replays its pretraining data; the online arm has none to replay
    assert by_arm["pretrained"][0].imagination.wm_replay_from == str(tmp_path / "offline.zarr")
    assert not by_arm["online"][0].imagination.wm_replay_from and out["pretrained_replay_fraction"] == 0.5
    assert all(c.train.init_from == "ws.pt" and c.train.stop_at_success == 0.8 for c in fake_trainer.made)
    t = out["table"]
    assert t["online/push"]["ratio_model_free_over_this"] == pytest.approx(2.0)
    assert t["pretrained/reach"]["ratio_model_free_over_this"] == pytest.approx(4.0)
    assert not t["pretrained/reach"]["ratio_is_bound"]
    # headline on the suite's mean success: model-free ends at (0.85 + 0.9) / 2 = 0.875 and gets there at 4,000
    # steps; online at 2,000, pretrained at 1,000
    h = out["headline"]
    assert h["ratio_online"] == pytest.approx(2.0) and h["ratio_pretrained"] == pytest.approx(4.0)
    assert h["reasons"] == {}


def test_success_at_budgets_reads_the_evaluation_at_or_after_each_budget():
    # a test-split row (no validation keys) is not a periodic evaluation and is skipped
    curve = _history((0, 0.5, 0.1), (4800, 0.6, 0.2), (10000, 0.7, 0.3), (19000, 0.9, 0.5)) + [{"env_steps": 19500}]
    rows = wm_bench.success_at_budgets(curve, ["reach", "push"], (5000, 10000, 20000))
    # 5,000 -> the evaluation at 10,000 (the first at or after it): (0.7 + 0.3) / 2; 10,000 -> the same one;
    # 20,000 -> past the run's last evaluation (19,000): that one stands in, flagged
    assert [(r["budget"], r["env_steps"], r["ended_before"]) for r in rows] == [
        (5000, 10000, False), (10000, 10000, False), (20000, 19000, True)]
    assert [r["success"] for r in rows] == pytest.approx([0.5, 0.5, 0.7])
    assert rows[2]["per_task"] == {"reach": 0.9, "push": 0.5}


def test_budget_table_and_steps_to_model_free_final():
    runs = {"model_free": [{"curve": _history((0, 0.5, 0.5), (5000, 0.6, 0.6), (10000, 0.8, 0.8)),
                            "final_success": {"reach": 0.8, "push": 0.8}, "env_steps": 10000},
                           {"curve": _history((0, 0.5, 0.5), (6000, 0.7, 0.5), (12000, 0.8, 0.8)),
                            "final_success": {"reach": 0.8, "push": 0.8}, "env_steps": 12000}],
            "online": [{"curve": _history((0, 0.5, 0.5), (5000, 0.8, 0.8)),
                        "final_success": {"reach": 0.8, "push": 0.8}, "env_steps": 5000},
                       {"curve": _history((0, 0.5, 0.5), (4000, 0.7, 0.7), (8000, 0.9, 0.9)),
                        "final_success": {"reach": 0.9, "push": 0.9}, "env_steps": 8000}]}
    table = wm_bench.budget_table(runs, ["reach", "push"], (5000, 10000))
    mf5, mf10 = table["model_free"]
    # 5,000: seed 0 at 5,000 (0.6), seed 1 at 6,000 ((0.7 + 0.5) / 2 = 0.6); 10,000: seed 0 at 10,000 (0.8), seed 1
    # at 12,000 (0.8)
    assert mf5["success_per_seed"] == pytest.approx([0.6, 0.6]) and mf5["read_at_env_steps"] == [5000, 6000]
    assert mf5["per_task"] == pytest.approx({"reach": 0.65, "push": 0.55})
    assert mf10["success_mean"] == pytest.approx(0.8) and mf10["seeds_ended_before"] == 0
    on5, on10 = table["online"]
    # online at 5,000: seed 0 reads 5,000 (0.8), seed 1 8,000 (0.9); both runs ended before 10,000 (they stopped at
    # the target), so their last evaluations stand in there
    assert on5["success_per_seed"] == pytest.approx([0.8, 0.9]) and on5["read_at_env_steps"] == [5000, 8000]
    assert on10["seeds_ended_before"] == 2 and on10["success_mean"] == pytest.approx(0.85)
    # model-free ends at 0.8 and gets there at 10,000 and 12,000 steps (mean 11,000); online at 5,000 and 8,000
    level = wm_bench.steps_to_model_free_final(runs, ["reach", "push"])
    assert level["level"] == pytest.approx(0.8)
    assert level["model_free"] == {"steps_mean": 11000.0, "steps_per_seed": [10000, 12000]}
    assert level["online"] == {"steps_mean": 6500.0, "steps_per_seed": [5000, 8000]}


def test_wm_bench_reports_model_quality_and_budgets(fake_trainer, monkeypatch, tmp_path, fake_quality):
    def fake_main(argv):
        if argv[0] == "collect":
            _fake_store(argv)
        if argv[0] == "wm-pretrain":
            (tmp_path / "wm_pretrained").mkdir()
            (tmp_path / "wm_pretrained" / "worldmodel.pt").write_bytes(b"x")
        return 0
    monkeypatch.setattr("acce.cli.main", fake_main)

    def outcome(cfg):
        if cfg.imagination.enabled:  # the trainer saves the run's world model at its end
            (cfg.run.run_dir / "checkpoints").mkdir(parents=True)
            (cfg.run.run_dir / "checkpoints" / "worldmodel.pt").write_bytes(b"x")
        fast = 1000 if cfg.imagination.wm_init_from else 2000 if cfg.imagination.enabled else 4000
        return {"env_steps": fast, "wall_s": 1.0, "imagination": None,
                "history": _history((0, 0.5, 0.5), (fast, 0.85, 0.9)),
                "eval": {"reach/test": {"success_rate": 0.85}, "push/test": {"success_rate": 0.9}}}
    fake_trainer.outcome = staticmethod(outcome)
    out = wm_bench.run_wm_bench("configs/bench_wm.yaml", TWO_TASKS, seeds=(0, 1), warm_start="ws.pt",
                                workdir=str(tmp_path), budgets=(1000, 4000))
    # recorded once, on the bench's tasks, with aux labels (the preset's critic is privileged)
    assert fake_quality == [(["reach", "push"], wm_bench.HELDOUT_EPISODES, True)]
    q = out["model_quality"]
    assert "test seeds" in q["held_out"] and "model_free" not in q
    assert q["pretrained"]["before_rl"]["success_recall"] == 0.25
    assert q["online"]["end_of_run"]["success_recall"] == 0.5 and q["online"]["end_of_run"]["models"] == 2
    assert q["pretrained"]["end_of_run"]["success_recall"] == 0.75
    assert q["online"]["end_of_run"]["h16"] == {"psnr_db": 14.0, "state_rmse": 0.16, "reward_mae": pytest.approx(1.6),
                                                "aux_rmse": None, "n": 10}
    assert all((tmp_path / f"online_s{s}" / "wm_eval.json").is_file() for s in (0, 1))  # kept for a rerun
    assert [r["model_quality"]["success_recall"] for r in out["runs"]["online"]] == [0.5, 0.5]
    # budgets: at 1,000 model-free reads its 4,000-step evaluation (0.875), pretrained its 1,000-step one
    assert [b["success_mean"] for b in out["budgets"]["model_free"]] == pytest.approx([0.875, 0.875])
    assert out["budgets"]["pretrained"][1]["seeds_ended_before"] == 2
    # steps to model-free's final success (0.875) agree with the headline's
    lv, h = out["steps_to_model_free_final"], out["headline"]
    assert lv["level"] == pytest.approx(h["level"]) and lv["online"]["steps_mean"] == h["steps_online"] == 2000
    assert h["steps_model_free"] / lv["pretrained"]["steps_mean"] == pytest.approx(h["ratio_pretrained"])
    # `acce bench headline --in` rebuilds the budgets table at the budgets the file was written with
    from acce.bench.headline import recompute
    written = {**out, "budgets": {arm: rows[:1] for arm, rows in out["budgets"].items()}}  # a stale table
    (tmp_path / "wm.json").write_text(json.dumps({"bench": "wm", "result": {k: v for k, v in written.items()
                                                                            if k != "headline"}}))
    assert recompute(str(tmp_path / "wm.json"))["ratio_pretrained"] == pytest.approx(h["ratio_pretrained"])
    rewritten = json.loads((tmp_path / "wm.json").read_text())["result"]["budgets"]
    assert [b["budget"] for b in rewritten["online"]] == [1000]
    with pytest.raises(ValueError, match="budgets"):
        wm_bench.run_wm_bench("configs/bench_wm.yaml", [], budgets=(5000, 80000), budget_steps=40000,
                              workdir=str(tmp_path))


def test_a_pretrained_model_without_its_data_is_refused_before_any_run(fake_trainer, tmp_path, fake_quality):
    """With replay on (the preset), a workdir holding the pretrained model but not the data it replays fails with the
    fix, before any run; imagination.wm_replay_fraction=0 runs the pretrained arm without replay."""
    (tmp_path / "wm_pretrained").mkdir()
    (tmp_path / "wm_pretrained" / "worldmodel.pt").write_bytes(b"x")
    with pytest.raises(FileNotFoundError, match="offline.zarr.*wm_replay_fraction=0"):
        wm_bench.run_wm_bench("configs/bench_wm.yaml", TWO_TASKS, seeds=(0,), warm_start="ws.pt",
                              workdir=str(tmp_path), arms=("pretrained",))
    assert fake_trainer.made == []
    out = wm_bench.run_wm_bench("configs/bench_wm.yaml", TWO_TASKS + ["imagination.wm_replay_fraction=0"],
                                seeds=(0,), warm_start="ws.pt", workdir=str(tmp_path), arms=("pretrained",))
    assert not fake_trainer.made[0].imagination.wm_replay_from and out["pretrained_replay_fraction"] == 0.0

"""Orchestration of `acce bench delay` and `acce bench wm` with a counting fake Trainer (no training): which runs
are made with which overrides, how results are pooled, and the hand-computed table."""
from __future__ import annotations

import json

import pytest

import acce.bench.delay as delay_bench
import acce.bench.wm as wm_bench
import acce.train


class FakeTrainer:
    """Records every config it is given; `outcome(cfg)` says what the run reports."""
    made: list = []
    outcome = staticmethod(lambda cfg: {})

    def __init__(self, cfg, progress=True):
        self.cfg = cfg
        FakeTrainer.made.append(cfg)

    def run(self):
        return FakeTrainer.outcome(self.cfg)


@pytest.fixture
def fake_trainer(monkeypatch):
    FakeTrainer.made = []
    monkeypatch.setattr(acce.train, "Trainer", FakeTrainer)
    return FakeTrainer


def _delay_outcome(cfg):
    """held-out successes out of 10: 8 at d=0; aware loses 1 per 2 steps of delay, naive loses 2 per 2 steps"""
    task, d = cfg.env.tasks[0], cfg.delay.fixed_steps
    k = 8 - (d // 2) * (1 if cfg.learner.delay_correction else 2) + cfg.run.seed % 2
    return {"env_steps": cfg.train.max_env_steps, "wall_s": 1.0,
            "eval": {f"{task}/test": {"successes": k, "n": 10, "success_rate": k / 10}}}


def test_delay_bench_runs_each_cell_once_and_pools(fake_trainer, monkeypatch, tmp_path):
    fake_trainer.outcome = staticmethod(_delay_outcome)
    evaluated = []
    monkeypatch.setattr(delay_bench, "_evaluate", lambda cfg, ckpt, n: evaluated.append(cfg.delay.fixed_steps) or
                        {"success_rate": 0.5, "ci95": [0.2, 0.8], "n": n})
    out = delay_bench.run_delay_bench(None, ["policy.chunk_len=10", "policy.max_delay_steps=6"], tasks=("reach",),
                                      delays=(0, 2, 4), seeds=(0, 1), budget_steps=500, eval_episodes=10,
                                      workdir=str(tmp_path))
    rl = [c for c in fake_trainer.made if c.train.init_from]
    assert len(fake_trainer.made) - len(rl) == 1  # one warm start for the task
    assert len(rl) == 2 * (1 + 2 * 2)  # per seed: d=0 once (shared by both learners), aware + naive at d=2, 4
    assert all(c.train.max_env_steps == 500 and c.train.max_wall_s == 0 and c.bc.steps == 0 for c in rl)
    # which learner runs first alternates with the seed: seed 0 aware first, seed 1 naive first
    assert [(c.run.seed, c.delay.fixed_steps, c.learner.delay_correction) for c in rl if c.delay.fixed_steps == 2] \
        == [(0, 2, True), (0, 2, False), (1, 2, False), (1, 2, True)]
    assert [r["order"] for r in out["runs"]["reach/d2/naive"]] == [1, 0]
    assert evaluated == [0, 2, 2, 4, 4]  # the warm start at every latency (d > 0: with aware and naive inputs)
    assert set(out["warm_start"]) == {f"reach/d{d}/{m}" for d in (0, 2, 4) for m in ("aware", "naive")}
    cells = out["cells"]
    # seed 0 -> k, seed 1 -> k + 1: aware d=4: 6/10 and 7/10 -> mean 0.65; naive d=4: 4, 5 -> 0.45; d=0: 0.85
    assert cells["reach/d0/aware"]["success_mean"] == pytest.approx(0.85)
    assert cells["reach/d0/naive"]["success_mean"] == pytest.approx(0.85)
    assert cells["reach/d4/aware"]["success_mean"] == pytest.approx(0.65)
    assert cells["reach/d4/naive"]["success_mean"] == pytest.approx(0.45)
    assert cells["reach/d4/aware"]["ratio_to_d0"] == pytest.approx(0.65 / 0.85)
    assert cells["reach/d4/aware"]["aware_minus_naive_points"] == pytest.approx(20.0)
    assert cells["reach/d4/aware"]["n_episodes"] == 20
    # the interval is over the two seeds' rates 0.6, 0.7: sd 0.0707, half 12.706 * 0.0707 / sqrt(2) = 0.635
    assert cells["reach/d4/aware"]["ci95_seeds"] == pytest.approx([0.65 - 0.6353, 1.0], abs=1e-3)
    assert "ci95_pooled" not in cells["reach/d4/aware"]
    # the headline: aware keeps 0.65 / 0.85 at d=4, 20 points over naive; the grid has no d=8
    h = out["headline"]
    assert h["keep_d4"] == pytest.approx(0.65 / 0.85) and h["gap_d4_pts"] == pytest.approx(20.0)
    assert h["keep_d8"] is None and "d=8" in h["reasons"]["keep_d8"]
    # the fake runs write no events: their counts are the trainer's, and say so
    assert {r["counted"] for r in out["runs"]["reach/d4/aware"]} == {"produced"}


def test_delay_bench_random_delay_warm_start_gives_the_aware_arm_its_own(fake_trainer, monkeypatch, tmp_path):
    fake_trainer.outcome = staticmethod(_delay_outcome)
    evaluated = []
    monkeypatch.setattr(delay_bench, "_evaluate", lambda cfg, ckpt, n: evaluated.append(
        (cfg.delay.fixed_steps, cfg.learner.delay_correction, ckpt.parent.parent.name)) or
        {"success_rate": 0.5, "ci95": [0.2, 0.8], "n": n})
    out = delay_bench.run_delay_bench(None, ["policy.chunk_len=12", "policy.max_delay_steps=8"], tasks=("reach",),
                                      delays=(0, 8), seeds=(0,), budget_steps=500, eval_episodes=10,
                                      workdir=str(tmp_path), random_delay_warm_start=True)
    warm = [c for c in fake_trainer.made if not c.train.init_from]
    assert [(c.run.name, c.bc.random_delay_steps) for c in warm] == [("reach_bc", 0), ("reach_bc_rd", 8)]
    rl = [c for c in fake_trainer.made if c.train.init_from]
    # d = 0 runs both learners now: each from its own warm start
    assert sorted((c.delay.fixed_steps, c.learner.delay_correction, c.train.init_from.split("/")[-3]) for c in rl) \
        == [(0, False, "reach_bc"), (0, True, "reach_bc_rd"), (8, False, "reach_bc"), (8, True, "reach_bc_rd")]
    assert evaluated == [(0, True, "reach_bc_rd"), (0, False, "reach_bc"), (8, True, "reach_bc_rd"),
                         (8, False, "reach_bc")]
    assert len(out["runs"]["reach/d0/aware"]) == len(out["runs"]["reach/d0/naive"]) == 1
    assert "random d in 0..8" in out["warm_starts"]["aware"]


def test_delay_bench_random_delay_max_keeps_the_full_grids_warm_start_recipe(fake_trainer, monkeypatch, tmp_path):
    fake_trainer.outcome = staticmethod(_delay_outcome)
    monkeypatch.setattr(delay_bench, "_evaluate",
                        lambda cfg, ckpt, n: {"success_rate": 0.5, "ci95": [0.2, 0.8], "n": n})
    base = ["policy.chunk_len=12", "policy.max_delay_steps=8"]
    out = delay_bench.run_delay_bench(None, base, tasks=("reach",), delays=(0, 2), seeds=(0,), budget_steps=500,
                                      eval_episodes=10, workdir=str(tmp_path), random_delay_warm_start=True,
                                      random_delay_max=8)
    warm = [c for c in fake_trainer.made if not c.train.init_from]
    assert [(c.run.name, c.bc.random_delay_steps) for c in warm] == [("reach_bc", 0), ("reach_bc_rd", 8)]
    assert "random d in 0..8" in out["warm_starts"]["aware"] and out["delays"] == [0, 2]
    with pytest.raises(ValueError, match="below the largest benched latency"):
        delay_bench.run_delay_bench(None, base, tasks=("reach",), delays=(0, 4), seeds=(0,), budget_steps=500,
                                    workdir=str(tmp_path / "b"), random_delay_warm_start=True, random_delay_max=2)


def test_delay_bench_naive_at_latency_adds_a_naive_arm_cloned_at_each_latency(fake_trainer, monkeypatch, tmp_path):
    fake_trainer.outcome = staticmethod(_delay_outcome)
    evaluated = []
    monkeypatch.setattr(delay_bench, "_evaluate", lambda cfg, ckpt, n: evaluated.append(
        (cfg.delay.fixed_steps, cfg.learner.delay_correction, ckpt.parent.parent.name)) or
        {"success_rate": 0.5, "ci95": [0.2, 0.8], "n": n})
    out = delay_bench.run_delay_bench(None, ["policy.chunk_len=12", "policy.max_delay_steps=8"], tasks=("reach",),
                                      delays=(0, 4), seeds=(0, 1, 2), budget_steps=500, eval_episodes=10,
                                      workdir=str(tmp_path / "w"), random_delay_warm_start=True, naive_at_latency=True,
                                      plot=str(tmp_path / "delay.png"))
    warm = [c for c in fake_trainer.made if not c.train.init_from]
    assert [(c.run.name, c.bc.random_delay_steps, c.bc.min_delay_steps, c.bc.delay_inputs) for c in warm] == [
        ("reach_bc", 0, 0, True), ("reach_bc_rd", 4, 0, True), ("reach_bc_naive_d4", 4, 4, False)]
    assert warm[2].learner.delay_correction is False  # cloned as the naive learner's policy, told nothing of d
    rl = [c for c in fake_trainer.made if c.train.init_from]
    d4 = sorted((c.learner.delay_correction, c.train.init_from.split("/")[-3]) for c in rl
                if c.delay.fixed_steps == 4 and c.run.seed == 0)
    assert d4 == [(False, "reach_bc"), (False, "reach_bc_naive_d4"), (True, "reach_bc_rd")]
    # three arms at d = 4: each goes first once in three seeds
    firsts = {r["seed"]: m for m in ("aware", "naive", "naive_matched") for r in out["runs"][f"reach/d4/{m}"]
              if r["order"] == 0}
    assert sorted(firsts.values()) == ["aware", "naive", "naive_matched"]
    # at d = 0 nothing is late: the naive run stands for the matched arm (no extra warm start or run)
    assert out["runs"]["reach/d0/naive_matched"] == out["runs"]["reach/d0/naive"]
    assert (4, False, "reach_bc_naive_d4") in evaluated and "reach/d4/naive_matched" in out["warm_start"]
    row = out["cells"]["reach/d4/aware"]
    assert row["aware_minus_naive_matched_points"] == pytest.approx(
        100 * (row["success_mean"] - out["cells"]["reach/d4/naive_matched"]["success_mean"]))
    assert "one latency" in out["warm_starts"]["naive_matched"] and (tmp_path / "delay.png").stat().st_size > 0


def test_delay_bench_reuses_finished_cells(fake_trainer, monkeypatch, tmp_path):
    from acce.configlib import save_config

    def saving(cfg):  # the run's folder as the real Trainer leaves it
        (cfg.run.run_dir / "checkpoints").mkdir(parents=True, exist_ok=True)
        save_config(cfg, cfg.run.run_dir / "config.yaml")
        if not cfg.train.init_from:
            (cfg.run.run_dir / "checkpoints" / "bc.pt").write_bytes(b"x")
            return {}
        out = {"env_steps": 7, "wall_s": 1.0, "eval": {"reach/test": {"successes": 1, "n": 10, "success_rate": 0.1}}}
        (cfg.run.run_dir / "summary.json").write_text(json.dumps(out))
        return out
    fake_trainer.outcome = staticmethod(saving)
    monkeypatch.setattr(delay_bench, "_evaluate", lambda cfg, ckpt, n: {"success_rate": 0.0, "ci95": [0, 1], "n": n})
    delay_bench.run_delay_bench(None, [], tasks=("reach",), delays=(0,), seeds=(0,), workdir=str(tmp_path))
    assert len(fake_trainer.made) == 2  # the warm start and the only cell
    fake_trainer.made.clear()
    out = delay_bench.run_delay_bench(None, [], tasks=("reach",), delays=(0,), seeds=(0,), workdir=str(tmp_path))
    assert fake_trainer.made == []  # warm start and the only cell were already there
    assert out["cells"]["reach/d0/aware"]["success_mean"] == pytest.approx(0.1)
    with pytest.raises(ValueError, match="reach_s0_d0_aware finished with another config"):
        delay_bench.run_delay_bench(None, [], tasks=("reach",), delays=(0,), seeds=(0,), budget_steps=123,
                                    workdir=str(tmp_path))
    # a run made before a config field existed (its config.yaml lacks it) is the same run while the field keeps its
    # default, and another one once it does not
    import yaml
    saved = tmp_path / "reach_s0_d0_aware" / "config.yaml"
    older = yaml.safe_load(saved.read_text())
    del older["bc"]["delay_inputs"]
    saved.write_text(yaml.safe_dump(older))
    delay_bench.run_delay_bench(None, [], tasks=("reach",), delays=(0,), seeds=(0,), workdir=str(tmp_path))
    assert fake_trainer.made == []
    with pytest.raises(ValueError, match="bc.delay_inputs"):
        delay_bench.run_delay_bench(None, ["bc.delay_inputs=false"], tasks=("reach",), delays=(0,), seeds=(0,),
                                    workdir=str(tmp_path))


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


def test_throughput_sweep_keeps_the_mean_latency_and_runs_both_modes(fake_trainer, tmp_path):
    import math

    import acce.bench.throughput as tp
    # each run reports env steps/s = 100 (sync) or 100 * (1 + sigma) (async): the ratio per case is 1 + sigma
    fake_trainer.outcome = staticmethod(lambda cfg: {
        "env_steps_per_s": 100.0 * (1 + (cfg.env.step_latency_sigma if cfg.runtime.mode == "async" else 0.0)),
        "env_steps": 1, "learner_version": 1, "wall_s": 1.0, "actor_idle_frac": 0.0, "learner_idle_frac": 0.0,
        "staleness_mean": 0.0, "staleness_max": 0, "inference_rows_per_batch": 3.0})
    cases = tp.resolve_cases("default,sweep")
    assert list(cases) == ["default", "tail_sigma_0.5", "tail_sigma_1", "tail_sigma_1.5", "tail_sigma_2"]
    out = tp.run_throughput("configs/debug.yaml", [], 2.0, cases)
    runs = [(c.env.step_latency_ms, c.env.step_latency_sigma, c.runtime.mode) for c in fake_trainer.made]
    # which mode runs first alternates from case to case, and each case records it
    assert [m for _, _, m in runs] == ["sync", "async", "async", "sync"] * 2 + ["sync", "async"]
    assert out["cases"]["tail_sigma_0.5"]["order"] == ["async", "sync"]
    for median_ms, sigma, _ in runs[2:]:  # lognormal mean = median * exp(sigma^2 / 2) = the long_tail case's mean
        assert median_ms * math.exp(sigma ** 2 / 2) == pytest.approx(10.0 * math.exp(0.5), rel=1e-4)
    assert runs[4][:2] == (pytest.approx(10.0), 1.0)  # sigma 1 is the long_tail case itself
    assert out["cases"]["tail_sigma_1.5"]["async_over_sync"] == pytest.approx(2.5)
    assert out["cases"]["default"]["ratio_of"] == "env_steps_per_s"  # no consumed counts in these fake runs
    sync = out["cases"]["default"]["sync"]  # the server's batching passes through; a missing counter is None
    assert sync["inference_rows_per_batch"] == 3.0 and sync["inference_forward_ms_per_row"] is None
    tp.plot_sweep(out, str(tmp_path / "sweep.png"))
    assert (tmp_path / "sweep.png").stat().st_size > 1000
    with pytest.raises(ValueError, match="unknown throughput case 'fast'"):
        tp.resolve_cases("default,fast")


def test_throughput_ratio_uses_consumed_steps_after_startup(fake_trainer):
    """Both modes report 1,000 env steps/s produced; their events say what the learner consumed after start-up:
    async 3,000 steps between updates 5 s and 15 s in (300/s), sync 1,500 between 2 s and 12 s (150/s)."""
    import acce.bench.throughput as tp
    from test_bench_fair import write_events
    events = {"async": [(5, 10, 1000), (15, 40, 4000)], "sync": [(2, 10, 500), (12, 40, 2000)]}

    def outcome(cfg):
        write_events(cfg.run.run_dir, 1e9, events[cfg.runtime.mode])
        return {"env_steps_per_s": 1000.0, "env_steps": 20000, "learner_version": 40, "wall_s": 20.0}
    fake_trainer.outcome = staticmethod(outcome)
    row = tp.run_throughput("configs/debug.yaml", [], 20.0, {"default": []})["cases"]["default"]
    assert row["async"]["consumed_env_steps_per_s"] == pytest.approx(300.0, rel=1e-3)
    assert row["sync"]["startup_s"] == pytest.approx(2.0, abs=1e-2)
    assert row["ratio_of"] == "consumed_env_steps_per_s" and row["async_over_sync"] == pytest.approx(2.0, rel=1e-3)


@pytest.mark.parametrize("preset", sorted(str(p) for p in __import__("pathlib").Path("configs").glob("*.yaml")
                                           if "wm" not in p.name))  # imagination presets cannot run sync
def test_bench_throughput_runs_with_every_preset(fake_trainer, preset):  # noqa: F811
    """Its runs evaluate nothing (eval.every_versions=0), so they must also turn off a preset's train.select_on_val,
    which needs periodic validation evaluations (the main job's preset has it on)."""
    from acce.bench.throughput import run_throughput
    fake_trainer.outcome = staticmethod(lambda cfg: {"env_steps_per_s": 1.0, "learner_version": 1})
    run_throughput(preset, [], duration_s=1.0, cases={"default": []})
    assert len(fake_trainer.made) == 2
    assert all(c.eval.every_versions == 0 and not c.train.select_on_val for c in fake_trainer.made)


def test_delay_bench_warm_start_per_seed_clones_each_seeds_own_and_pools_them(fake_trainer, monkeypatch, tmp_path):
    fake_trainer.outcome = staticmethod(_delay_outcome)
    rates = {"reach_bc": 0.9, "reach_bc_w1": 0.5, "reach_bc_rd": 1.0, "reach_bc_rd_w1": 0.8}
    monkeypatch.setattr(delay_bench, "_evaluate", lambda cfg, ckpt, n: {
        "success_rate": rates[ckpt.parent.parent.name], "ci95": [0.0, 1.0], "n": n})
    out = delay_bench.run_delay_bench(None, ["policy.chunk_len=12", "policy.max_delay_steps=8"], tasks=("reach",),
                                      delays=(0, 4), seeds=(0, 1), budget_steps=500, eval_episodes=10,
                                      workdir=str(tmp_path), random_delay_warm_start=True, random_delay_max=8,
                                      warm_start_per_seed=True)
    warm = [(c.run.name, c.run.seed) for c in fake_trainer.made if not c.train.init_from]
    # the preset's seed (0) keeps the shared warm starts' names and recipe; seed 1 clones its own with run.seed 1
    assert warm == [("reach_bc", 0), ("reach_bc_rd", 0), ("reach_bc_w1", 1), ("reach_bc_rd_w1", 1)]
    rl = {(c.run.name, c.run.seed, c.train.init_from.split("/")[-3]) for c in fake_trainer.made if c.train.init_from}
    assert ("reach_s0_d4_naive", 0, "reach_bc") in rl and ("reach_s1_d4_naive_w1", 1, "reach_bc_w1") in rl
    assert ("reach_s1_d4_aware_w1", 1, "reach_bc_rd_w1") in rl and len(rl) == 2 * 4
    # the warm-start row pools the two seeds' warm starts: mean 0.7 of 0.9 and 0.5, t interval over the two
    row = out["warm_start"]["reach/d4/naive"]
    assert row["per_seed"] == [0.9, 0.5] and row["success_rate"] == pytest.approx(0.7) and row["n"] == 20
    assert row["ci95"] == pytest.approx([0.0, 1.0])  # 0.7 +- 12.706 * 0.283 / sqrt(2), clipped
    assert out["warm_start"]["reach/d0/aware"]["success_rate"] == pytest.approx(0.9)
    assert out["warm_starts"]["per_seed"] is True

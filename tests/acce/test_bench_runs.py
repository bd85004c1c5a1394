"""Orchestration of `acce bench delay` and `acce bench throughput` with a counting fake Trainer (no training): which runs
are made with which overrides, how results are pooled, and the hand-computed table."""
from __future__ import annotations

import json

import pytest

import acce.bench.delay as delay_bench
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

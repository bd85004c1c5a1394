"""`acce bench rl` orchestration with a counting fake Trainer: one warm start per task, async and sync runs from
it with the same budget, alternating order, reuse of finished runs, and the hand-computed summary."""
from __future__ import annotations

import json

import pytest

import acce.bench.rl as rl_bench
from test_bench_runs import fake_trainer  # noqa: F401  (the fixture)


def _outcome(cfg):
    """async: v0 0.2 -> final 0.6 + 0.1 * seed; sync: final 0.5. Validation curve: async hits 0.9 * 0.7 = 0.63 at
    2,000 steps (seed 1 only; seed 0 never does), sync never; wall = steps / 100 (async) or / 50 (sync)."""
    task, seed, mode = cfg.env.tasks[0], cfg.run.seed, cfg.runtime.mode
    if cfg.train.max_versions == 1:
        return {}
    final = 0.6 + 0.1 * seed if mode == "async" else 0.5
    rate = 100 if mode == "async" else 50
    hist = [{"split": "test", "version": 0, "env_steps": 0, "wall_s": 0.0, f"eval/success/{task}/test": 0.2}]
    for steps, val in ((0, 0.2), (1000, 0.5), (2000, final + 0.03 if mode == "async" else 0.4)):
        hist.append({"split": "val", "version": steps // 10, "env_steps": steps, "wall_s": steps / rate,
                     f"eval/success/{task}/val": val})
    test = {"v0": {task: 0.2}, "final": {task: final}}
    if seed == 1:  # a run with train.select_on_val: its final is version 200 of 400
        test["selected_on_val"] = {"version": 200, "val_success": 0.73, "last_version": 400}
    return {"env_steps": 4000, "wall_s": 4000 / rate, "history": hist, "test": test,
            "eval": {f"{task}/test": {"n": 100}}}


def test_rl_bench_runs_and_summarizes(fake_trainer, tmp_path):  # noqa: F811
    fake_trainer.outcome = staticmethod(_outcome)
    # the preset selects on validation (train.select_on_val); the warm start, which evaluates nothing, must not
    out = rl_bench.run_rl_bench(None, ["eval.every_versions=50", "train.select_on_val=true"], tasks=["reach"],
                                seeds=(0, 1), budget_steps=4000, workdir=str(tmp_path))
    warm = [c for c in fake_trainer.made if not c.train.init_from]
    rl = [c for c in fake_trainer.made if c.train.init_from]
    assert len(warm) == 1 and warm[0].env.tasks == ("reach",) and not warm[0].train.select_on_val
    assert all(c.train.select_on_val for c in fake_trainer.made if c.train.init_from)
    assert [(c.run.seed, c.runtime.mode) for c in rl] == [(0, "async"), (0, "sync"), (1, "sync"), (1, "async")]
    assert all(c.train.max_env_steps == 4000 and c.train.max_wall_s == 0 and c.bc.steps == 0 for c in rl)
    row = out["tasks"]["reach"]
    assert row["v0"] == pytest.approx(0.2) and row["final"] == pytest.approx(0.65)
    assert row["final_sync"] == pytest.approx(0.5) and row["rl_added_points"] == pytest.approx(45.0)
    assert row["target_90pct"] == pytest.approx(0.585)
    # async: seed 0 reaches 0.63 >= 0.585 at 2,000 steps (20 s); seed 1 reaches 0.73 at 2,000 (20 s) -> 2,000, 20 s
    assert row["steps_to_90pct"]["async"] == pytest.approx(2000) and row["wall_to_90pct_s"]["async"] == 20.0
    # sync never reaches it: censored at the budget (4,000 steps, its run's 80 s)
    assert row["steps_to_90pct"]["sync"] == 4000 and row["wall_to_90pct_s"]["sync"] == 80.0
    assert row["censored_runs"] == {"async": 0, "sync": 2} and row["async_over_sync_wall"] == pytest.approx(4.0)
    assert [s["seed"] for s in row["per_seed"]] == [0, 1] and row["per_seed"][1]["final_sync"] == 0.5
    # which version each seed's final is: the last (no selection) or the one chosen on validation seeds
    assert [(s["selected_version"], s["last_version"]) for s in row["per_seed"]] == [(None, None), (200, 400)]
    assert set(row) >= {"v0", "final", "final_sync", "per_seed", "steps_to_90pct", "wall_to_90pct_s"}


def _saving(cfg):
    """_outcome, and the run's folder as the real Trainer leaves it: config.yaml, then summary.json (an RL run) or
    the warm start's checkpoint."""
    from acce.configlib import save_config
    out, run_dir = _outcome(cfg), cfg.run.run_dir
    (run_dir / "checkpoints").mkdir(parents=True, exist_ok=True)
    save_config(cfg, run_dir / "config.yaml")
    if cfg.train.init_from:
        (run_dir / "summary.json").write_text(json.dumps(out))
    else:
        (run_dir / "checkpoints" / "bc.pt").write_bytes(b"x")
    return out


def test_rl_bench_reuses_finished_runs(fake_trainer, tmp_path):  # noqa: F811
    fake_trainer.outcome = staticmethod(_saving)
    args = dict(tasks=["reach"], seeds=(0,), budget_steps=4000, workdir=str(tmp_path))
    first = rl_bench.run_rl_bench(None, ["eval.every_versions=50"], **args)
    assert [(c.run.seed, c.runtime.mode) for c in fake_trainer.made if c.train.init_from] == [(0, "async"), (0, "sync")]
    (tmp_path / "reach_sync_s0" / "summary.json").unlink()  # interrupted during its sync run
    fake_trainer.made.clear()
    again = rl_bench.run_rl_bench(None, ["eval.every_versions=50"], **args)
    assert [(c.run.seed, c.runtime.mode) for c in fake_trainer.made] == [(0, "sync")]  # no warm start, no async
    assert again["tasks"]["reach"]["final"] == first["tasks"]["reach"]["final"]


def test_rl_bench_refuses_a_finished_run_with_another_config(fake_trainer, tmp_path):  # noqa: F811
    """Reusing a run made with another budget (or override) would mix settings in one table without a word."""
    fake_trainer.outcome = staticmethod(_saving)
    rl_bench.run_rl_bench(None, ["eval.every_versions=50"], tasks=["reach"], seeds=(0,), budget_steps=4000,
                          workdir=str(tmp_path))
    with pytest.raises(ValueError, match=r"reach_async_s0 finished with another config.*train\.max_env_steps: "
                                         r"4000 -> 8000.*another --workdir"):
        rl_bench.run_rl_bench(None, ["eval.every_versions=50"], tasks=["reach"], seeds=(0,), budget_steps=8000,
                              workdir=str(tmp_path))


def test_rl_bench_needs_validation_curves(tmp_path):
    with pytest.raises(ValueError, match="eval.every_versions"):
        rl_bench.run_rl_bench(None, ["eval.every_versions=0"], tasks=["reach"], workdir=str(tmp_path))


def test_rl_bench_sizes_one_tasks_warm_start_apart(fake_trainer, tmp_path):  # noqa: F811
    fake_trainer.outcome = staticmethod(_outcome)
    out = rl_bench.run_rl_bench(None, ["eval.every_versions=50", "bc.episodes=100"], tasks=["reach", "push"],
                                seeds=(0,), budget_steps=4000, workdir=str(tmp_path),
                                task_overrides=["push:bc.episodes=400,bc.steps=1200"])
    warm = {c.env.tasks[0]: c for c in fake_trainer.made if not c.train.init_from}
    assert (warm["reach"].bc.episodes, warm["push"].bc.episodes, warm["push"].bc.steps) == (100, 400, 1200)
    assert all(c.bc.steps == 0 for c in fake_trainer.made if c.train.init_from)  # RL runs never clone
    assert out["warm_start"]["push"]["overrides"] == ["bc.episodes=400", "bc.steps=1200"]
    assert out["warm_start"]["reach"]["overrides"] == []
    assert out["warm_start"]["push"]["checkpoint"] == "push_bc/checkpoints/bc.pt"  # no machine path in the JSON


def test_rl_bench_keeps_the_privileged_critic_for_meta_world(fake_trainer, tmp_path):  # noqa: F811
    """A preset with the privileged critic (configs/bench_rl.yaml) benches a Meta-World task with it too: its envs
    record privileged labels (obs["aux"]), so neither the up-front check nor the task's runs swap the critic."""
    fake_trainer.outcome = staticmethod(_outcome)
    rl_bench.run_rl_bench(None, ["eval.every_versions=50", "policy.critic=privileged"],
                          tasks=["reach", "metaworld/reach-v3"], seeds=(0,), budget_steps=4000, workdir=str(tmp_path),
                          task_overrides=["metaworld/reach-v3:bc.episodes=20"])
    critic = {(c.env.tasks[0], bool(c.train.init_from)): c.policy.critic for c in fake_trainer.made}
    assert critic == {("reach", False): "privileged", ("reach", True): "privileged",
                      ("metaworld/reach-v3", False): "privileged", ("metaworld/reach-v3", True): "privileged"}


@pytest.mark.parametrize("spec, match", [("push", "write TASK:KEY=VALUE"), ("push:bc.episodes", "write TASK"),
                                         ("track:bc.steps=5", "not among the benchmarked tasks")])
def test_rl_bench_refuses_bad_task_overrides_before_any_run(fake_trainer, tmp_path, spec, match):  # noqa: F811
    with pytest.raises(ValueError, match=match):
        rl_bench.run_rl_bench(None, ["eval.every_versions=50"], tasks=["reach", "push"], seeds=(0,),
                              workdir=str(tmp_path / "w"), task_overrides=[spec])
    assert fake_trainer.made == [] and not (tmp_path / "w").exists()


def test_task_overrides_keep_commas_inside_brackets():
    assert rl_bench.parse_task_overrides(["reach:env.tasks=[reach,push],bc.steps=3"], ["reach"]) == {
        "reach": ["env.tasks=[reach,push]", "bc.steps=3"]}


def test_rl_bench_counts_consumed_steps_and_times_from_the_first_update(fake_trainer, tmp_path):  # noqa: F811
    """The runs write TensorBoard events as the trainer does; the bench reads consumed steps and start-up from them.
    Async: 3,000 steps produced, half consumed, first update 4 s in. Sync: first update 2 s in, 90 % consumed."""
    from test_bench_fair import write_events
    events = {"async": [(4, 50, 200), (10, 100, 500), (20, 200, 1000), (30, 300, 1500)],
              "sync": [(2, 50, 450), (12, 100, 900), (24, 200, 1800), (30, 300, 2700)]}

    def outcome(cfg):
        if cfg.train.max_versions == 1:
            return {}
        mode = cfg.runtime.mode
        write_events(cfg.run.run_dir, 1e9, events[mode])
        at200 = events[mode][2][0]  # both reach 0.75 >= 0.9 * 0.8 at version 200 (2,000 steps produced)
        hist = [{"split": "val", "version": v, "env_steps": p, "wall_s": w, "eval/success/reach/val": r}
                for v, p, w, r in ((0, 0, 0.0, 0.5), (100, 1000, 11.0, 0.6), (200, 2000, float(at200), 0.75))]
        return {"env_steps": 3000, "wall_s": 30.0, "history": hist, "eval": {"reach/test": {"n": 100}},
                "test": {"v0": {"reach": 0.5}, "final": {"reach": 0.8}}}
    fake_trainer.outcome = staticmethod(outcome)
    out = rl_bench.run_rl_bench(None, ["eval.every_versions=50"], tasks=["reach"], seeds=(0,), budget_steps=3000,
                                workdir=str(tmp_path))
    row = out["tasks"]["reach"]
    # consumed at version 200: async 1,000 (not the 2,000 produced), sync 1,800
    assert row["steps_to_90pct"] == {"async": 1000, "sync": 1800}
    # wall-clock from the first update: async 20 - 4 = 16 s, sync 24 - 2 = 22 s
    assert row["wall_to_90pct_s"]["async"] == pytest.approx(16.0, abs=1e-2)
    assert row["wall_to_90pct_s"]["sync"] == pytest.approx(22.0, abs=1e-2)
    run = out["runs"]["reach"]["async"][0]
    assert (run["counted"], run["env_steps"], run["env_steps_produced"], run["order"]) == ("consumed", 1500, 3000, 0)
    assert run["startup_s"] == pytest.approx(4.0, abs=1e-2) and run["wall_s"] == pytest.approx(26.0, abs=1e-2)
    assert out["runs"]["reach"]["sync"][0]["order"] == 1
    assert out["headline"]["async_sync_wall_ratio_default"] == pytest.approx(22.0 / 16.0, rel=1e-3)


def test_rl_bench_long_tail_runs_each_seed_and_mode_again_with_lognormal_latency(fake_trainer, tmp_path):  # noqa: F811
    """Both modes reach 0.9 * 0.7 = 0.63 at 2,000 env steps. Wall-clock per env step: default async 1/100 s, sync
    1/50 s -> 20 s vs 40 s (ratio 2); long tail async 1/80 s, sync 1/20 s -> 25 s vs 100 s (ratio 4)."""
    def outcome(cfg):
        if cfg.train.max_versions == 1:
            return {}
        tail = cfg.env.step_latency_ms > 0
        rate = {(False, "async"): 100, (False, "sync"): 50, (True, "async"): 80, (True, "sync"): 20}[
            (tail, cfg.runtime.mode)]
        hist = [{"split": "val", "version": v, "env_steps": st, "wall_s": st / rate, "eval/success/reach/val": r}
                for v, st, r in ((0, 0, 0.2), (100, 1000, 0.5), (200, 2000, 0.7))]
        return {"env_steps": 3000, "wall_s": 3000 / rate, "history": hist, "eval": {"reach/test": {"n": 100}},
                "test": {"v0": {"reach": 0.2}, "final": {"reach": 0.7}}}
    fake_trainer.outcome = staticmethod(outcome)
    out = rl_bench.run_rl_bench(None, ["eval.every_versions=50"], tasks=["reach"], seeds=(0, 1), budget_steps=3000,
                                workdir=str(tmp_path), long_tail=True)
    rl = [c for c in fake_trainer.made if c.train.init_from]
    assert len([c for c in fake_trainer.made if not c.train.init_from]) == 1  # one warm start serves both cases
    tail = [c for c in rl if c.env.step_latency_ms > 0]
    assert [c.run.name for c in tail] == ["reach_long_tail_async_s0", "reach_long_tail_sync_s0",
                                          "reach_long_tail_sync_s1", "reach_long_tail_async_s1"]
    assert all(c.env.step_latency_ms == 10 and c.env.step_latency_sigma == 1.0 for c in tail) and len(rl) == 8
    assert out["long_tail_tasks"]["reach"]["wall_to_90pct_s"] == {"async": 25.0, "sync": 100.0}
    h = out["headline"]
    assert h["async_sync_wall_ratio_default"] == pytest.approx(2.0)
    assert h["async_sync_wall_ratio_long_tail"] == pytest.approx(4.0) and h["reasons"] == {}

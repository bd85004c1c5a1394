"""Bench fairness (acce/bench/fair.py) and the headline objects (acce/bench/headline.py): seed-level intervals, mode
order, consumed-vs-produced env steps and start-up out of the timed window (read back from TensorBoard events the
way a real run writes them), and every headline figure from hand-made results with hand-computed numbers."""
from __future__ import annotations

import json

import pytest

from acce.bench import fair, headline
from acce.stats import seed_interval


def write_events(run_dir, t0, consumed, progress=((0.5, 0.5),)):
    """A run's TensorBoard events as the trainer writes them: learner/consumed_env_steps at each update's version
    (step), progress/wall_s points; wall times are t0 + the offsets given."""
    from torch.utils.tensorboard import SummaryWriter
    w = SummaryWriter(str(run_dir / "tb"))
    for offset, value in progress:
        w.add_scalar("progress/wall_s", value, 0, walltime=t0 + offset)
    for offset, version, steps in consumed:
        w.add_scalar("learner/consumed_env_steps", steps, version, walltime=t0 + offset)
    w.close()


def test_seed_interval_is_a_t_interval_over_seeds():
    # rates 0.6, 0.7, 0.8: mean 0.7, sd = sqrt((0.01 + 0 + 0.01) / 2) = 0.1, half = 4.303 * 0.1 / sqrt(3) = 0.24844
    mean, sd, ci = seed_interval([0.6, 0.7, 0.8])
    assert (mean, sd) == (pytest.approx(0.7), pytest.approx(0.1))
    assert ci == pytest.approx([0.7 - 0.248434, 0.7 + 0.248434], abs=1e-5)
    assert seed_interval([0.9, 1.0, 1.0])[2][1] == 1.0  # clipped to [0, 1]
    assert seed_interval([0.4]) == (0.4, 0.0, None)  # one seed: no interval (JSON has no NaN)
    with pytest.raises(ValueError, match="at least one"):
        seed_interval([])


def test_mode_order_rotates_with_the_seed():
    assert [fair.mode_order(s, ("async", "sync")) for s in range(3)] == [
        ("async", "sync"), ("sync", "async"), ("async", "sync")]
    arms = ("model_free", "online", "pretrained")
    assert [fair.mode_order(s, arms)[0] for s in range(3)] == list(arms)  # each arm goes first once


def test_consumed_steps_and_startup_come_from_the_runs_events(tmp_path):
    # runtime start at t0 = 1000 (progress point 0.5 s in, value 0.5); updates at +3 s (v 10, 500 steps consumed),
    # +5 s (v 20, 1,000), +7 s (v 30, 1,500); actors produced 2,400 in a 9 s run
    write_events(tmp_path, 1000.0, [(3.0, 10, 500), (5.0, 20, 1000), (7.0, 30, 1500)])
    tl = fair.read_timeline(tmp_path)
    assert tl["consumed"] == [(10, 500), (20, 1000), (30, 1500)]
    assert tl["startup_s"] == pytest.approx(3.0, abs=1e-3) and tl["update_s"][-1] == pytest.approx(7.0, abs=1e-3)
    summary = {"env_steps": 2400, "wall_s": 9.0, "history": [
        {"version": 0, "split": "val", "env_steps": 0, "wall_s": 0.0},
        {"version": 25, "split": "val", "env_steps": 1800, "wall_s": 6.0}]}
    c = fair.fair_counts(summary, tl)
    assert (c["counted"], c["env_steps"], c["env_steps_produced"]) == ("consumed", 1500, 2400)
    assert c["wall_s"] == pytest.approx(6.0, abs=1e-3) and c["wall_total_s"] == 9.0
    # the evaluation at version 25 is credited with the update at version 20: 1,000 consumed, 6 - 3 = 3 s
    assert c["history"][1]["env_steps"] == 1000 and c["history"][1]["env_steps_produced"] == 1800
    assert c["history"][1]["wall_s"] == pytest.approx(3.0, abs=1e-3) and c["history"][0]["wall_s"] == 0.0
    # a run without the counts keeps the trainer's numbers and says so
    old = fair.run_counts(summary, tmp_path / "missing")
    assert (old["counted"], old["env_steps"], old["wall_s"]) == ("produced", 2400, 9.0)


def test_learner_counts_consumed_real_and_imagined_steps_apart():
    from types import SimpleNamespace

    import numpy as np

    from acce.runtime.learner import Learner
    learner = Learner.__new__(Learner)  # only the counters: no policy needed
    learner.consumed_segments = learner.consumed_env_steps = learner.consumed_imagined_steps = 0
    segs = [SimpleNamespace(exec_len=np.array([4, 4, 2]), source="sim"),
            SimpleNamespace(exec_len=np.array([4, 1]), source="imagined")]
    m = learner.count_consumed(segs)
    assert m == {"learner/consumed_segments": 2.0, "learner/consumed_env_steps": 10.0,
                 "learner/consumed_imagined_steps": 5.0}


# --- headlines from hand-made results -------------------------------------------------------------------------------
def _cell(mean):
    return {"success_mean": mean}


def test_delay_headline_hand_numbers_and_missing_d8():
    cells = {"track/d0/aware": _cell(0.80), "track/d0/naive": _cell(0.80), "track/d4/aware": _cell(0.72),
             "track/d4/naive": _cell(0.50), "reach/d0/aware": _cell(0.5), "reach/d4/aware": _cell(0.25),
             "reach/d4/naive": _cell(0.3)}
    h = headline.delay_headline({"tasks": ["track", "reach"], "delays": [0, 2, 4, 6], "cells": cells})
    # track: 0.72 / 0.80 = 0.9 of d=0 kept; 72 - 50 = 22 points
    assert h["task"] == "track" and h["keep_d4"] == pytest.approx(0.9) and h["gap_d4_pts"] == pytest.approx(22.0)
    assert h["keep_d8"] is None and h["gap_d8_pts"] is None
    assert "not in the bench's delay grid [0, 2, 4, 6]" in h["reasons"]["keep_d8"]
    assert h["per_task"]["reach"]["keep_d4"] == pytest.approx(0.5) and h["per_task"]["reach"]["gap_d4_pts"] == \
        pytest.approx(-5.0)


def _wm_run(final, curve, env_steps=4000):
    return {"final_success": {"reach": final}, "env_steps": env_steps,
            "curve": [{"env_steps": s, "eval/success/reach/val": v} for s, v in curve]}


def test_wm_headline_hand_numbers_and_an_arm_that_never_gets_there():
    runs = {  # model-free ends at 0.6 and 0.8 -> level 0.7; seed 0 reaches 0.7 at 3,000, seed 1 at 4,000 -> 3,500
        "model_free": [_wm_run(0.6, [(0, 0.4), (3000, 0.7), (4000, 0.6)]),
                       _wm_run(0.8, [(0, 0.4), (2000, 0.5), (4000, 0.8)])],
        # online: 1,000 and 1,500 -> 1,250: ratio 3,500 / 1,250 = 2.8
        "online": [_wm_run(0.9, [(0, 0.4), (1000, 0.7)]), _wm_run(0.9, [(0, 0.4), (1500, 0.75)])],
        # pretrained: seed 1 never reaches 0.7 -> no ratio, with the reason
        "pretrained": [_wm_run(0.9, [(0, 0.4), (500, 0.9)]), _wm_run(0.5, [(0, 0.4), (4000, 0.5)])]}
    h = headline.wm_headline({"tasks": ["reach"], "runs": runs})
    assert h["level"] == pytest.approx(0.7) and h["steps_model_free"] == pytest.approx(3500)
    assert h["ratio_online"] == pytest.approx(2.8) and "ratio_online" not in h["reasons"]
    assert h["ratio_pretrained"] is None and h["reasons"]["ratio_pretrained"].startswith("1/2 pretrained seeds never")
    assert h["per_task"]["reach"]["ratio_online"] == pytest.approx(2.8)


def test_wm_headline_model_free_that_never_climbed():
    runs = {"model_free": [_wm_run(0.5, [(0, 0.6), (4000, 0.5)])], "online": [_wm_run(0.9, [(0, 0.6)])]}
    h = headline.wm_headline({"tasks": ["reach"], "runs": runs})
    assert h["ratio_online"] is None and "at version 0" in h["reasons"]["ratio_online"]


def _rl_row(async_wall, sync_wall, censored=(0, 0)):
    return {"target_90pct": 0.72, "wall_to_90pct_s": {"async": async_wall, "sync": sync_wall},
            "censored_runs": {"async": censored[0], "sync": censored[1]}}


def test_rl_headline_hand_numbers_and_reasons():
    # (90 + 150) s sync / (60 + 40) s async = 2.4
    h = headline.rl_headline({"tasks": {"reach": _rl_row(60.0, 90.0), "push": _rl_row(40.0, 150.0)}})
    assert h["async_sync_wall_ratio_default"] == pytest.approx(2.4)
    assert h["async_sync_wall_ratio_long_tail"] is None and "no long-tail" in h["reasons"][
        "async_sync_wall_ratio_long_tail"]
    censored = headline.rl_headline({"tasks": {"reach": _rl_row(60.0, 200.0, censored=(0, 2))}})
    assert censored["async_sync_wall_ratio_default"] is None
    assert "sync 2" in censored["reasons"]["async_sync_wall_ratio_default"]
    at_v0 = headline.rl_headline({"tasks": {"reach": _rl_row(0.0, 0.0)}})
    assert "version 0" in at_v0["reasons"]["async_sync_wall_ratio_default"]
    # a long-tail case run by bench rl is used when the result has one
    lt = headline.rl_headline({"tasks": {"reach": _rl_row(60.0, 90.0)}, "long_tail_tasks": {"reach": _rl_row(
        10.0, 30.0)}})
    assert lt["async_sync_wall_ratio_long_tail"] == pytest.approx(3.0)


def test_recompute_rewrites_a_written_delay_file(tmp_path):
    # per-seed successes out of 10: aware d0 8, 9; aware d4 6, 8; naive d4 4, 4
    runs = {"reach/d0/aware": [{"seed": 0, "successes": 8, "n": 10}, {"seed": 1, "successes": 9, "n": 10}],
            "reach/d4/aware": [{"seed": 0, "successes": 6, "n": 10}, {"seed": 1, "successes": 8, "n": 10}],
            "reach/d4/naive": [{"seed": 0, "successes": 4, "n": 10}, {"seed": 1, "successes": 4, "n": 10}]}
    path = tmp_path / "delay.json"
    path.write_text(json.dumps({"bench": "delay", "machine": {}, "result": {
        "tasks": ["reach"], "delays": [0, 4], "runs": runs, "cells": {}}}))
    from acce.cli import main
    assert main(["bench", "headline", "--in", str(path)]) == 0
    doc = json.loads(path.read_text())
    result = doc["result"]
    # aware d4 0.7 / aware d0 0.85; 70 - 40 = 30 points; the cells now carry t intervals over the two seeds
    assert list(doc) == ["bench", "machine", "headline", "result"] and "headline" not in result
    assert doc["headline"]["keep_d4"] == pytest.approx(0.7 / 0.85)
    assert doc["headline"]["gap_d4_pts"] == pytest.approx(30.0)
    assert "written before" in result["counting"]  # an older file says its steps were produced ones
    # rates 0.6, 0.8: sd 0.1414, half = 12.706 * 0.1414 / sqrt(2) = 1.27 -> clipped to [0, 1]
    assert result["cells"]["reach/d4/aware"]["ci95_seeds"] == [0.0, 1.0]
    assert main(["bench", "headline", "--in", str(tmp_path / "nope.json")]) == 2
    path.write_text(json.dumps({"bench": "sim", "result": {}}))
    assert main(["bench", "headline", "--in", str(path)]) == 2
    assert main(["bench", "headline"]) == 2


def test_run_bench_puts_the_headline_at_the_files_top_level(monkeypatch, tmp_path):
    import acce.bench as bench
    monkeypatch.setitem(bench.BENCHES, "fake", lambda cfg, args: {"cells": {"a": 1}, "headline": {"keep_d4": 0.9}})
    bench.run_bench("fake", None, None, str(tmp_path / "f.json"))
    doc = json.loads((tmp_path / "f.json").read_text())
    assert doc["headline"] == {"keep_d4": 0.9} and doc["result"] == {"cells": {"a": 1}}


@pytest.mark.slow
def test_a_real_run_reports_what_its_learner_consumed(tmp_path):
    """configs/debug.yaml, local async runtime: the counts the benches read back from the run's events are the
    learner's own (its checkpointed total), at most what the actors produced, and start-up is inside the run."""
    from acce.checkpoint import load_checkpoint
    from acce.cli import main
    assert main(["train", "--config", "configs/debug.yaml", f"run.out_dir={tmp_path}", "run.name=run",
                 "runtime.kind=local", "runtime.mode=async", "eval.every_versions=2", "--quiet"]) == 0
    run = tmp_path / "run"
    summary = json.loads((run / "summary.json").read_text())
    c = fair.run_counts(summary, run)
    assert c["counted"] == "consumed" and 0 < c["env_steps"] <= c["env_steps_produced"]
    assert c["env_steps"] == load_checkpoint(run)["learner"]["consumed_env_steps"]
    assert summary["env_steps_consumed"] == c["env_steps"]  # the trainer's own record agrees with the events
    consumed = [h["env_steps_consumed"] for h in summary["history"]]
    assert consumed == sorted(consumed) and consumed[-1] <= summary["env_steps_consumed"]
    assert 0 <= c["startup_s"] < c["wall_total_s"] and c["wall_s"] == pytest.approx(
        c["wall_total_s"] - c["startup_s"])
    val = [h for h in c["history"] if h["split"] == "val"]
    assert val[0]["env_steps"] == 0 and val[-1]["env_steps"] <= val[-1]["env_steps_produced"]
